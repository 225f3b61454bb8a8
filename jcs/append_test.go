package jcs

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
)

// oddStrings are strings whose encoding differs between a naive writer and
// json.Marshal followed by Canonicalize: invalid UTF-8, surrogates encoded
// in UTF-8, control characters, HTML characters encoding/json escapes,
// U+2028/U+2029, and characters outside the BMP.
var oddStrings = []string{
	"", "plain", `quote " and \ backslash`, "\x00\x01\x1f\x7f", "\b\f\n\r\t",
	"<a href='x'>&amp;</a>", "\u2028\u2029", "é中𝄞😀", "\xff", "a\xc3", "\xed\xa0\x80",
	"\xf4\x90\x80\x80", "\xc0\xaf", "ok\xe2\x82", "\ufffd", "\xef\xbf\xbd\xff\xfe",
}

func TestAppendGoStringMatchesMarshal(t *testing.T) {
	for _, s := range oddStrings {
		checkGoString(t, s)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		checkGoString(t, string(b))
	}
}

func FuzzAppendGoString(f *testing.F) {
	for _, s := range oddStrings {
		f.Add(s)
	}
	f.Fuzz(checkGoString)
}

func checkGoString(t *testing.T, s string) {
	t.Helper()
	want, err := Marshal(s)
	if err != nil {
		t.Fatalf("Marshal(%q): %v", s, err)
	}
	if got := AppendGoString(nil, s); !bytes.Equal(got, want) {
		t.Errorf("AppendGoString(%q) = %q, json.Marshal+Canonicalize = %q", s, got, want)
	}
	if got := AppendGoString([]byte("x"), s); !bytes.Equal(got[1:], want) || got[0] != 'x' {
		t.Errorf("AppendGoString(%q) does not append", s)
	}
}

func TestAppendNumberMatchesCanonicalize(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fs := []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 1e21, 1e-7, 123456789012345680000, 5e-324, math.MaxFloat64, 0.1 + 0.2}
	for range 5000 {
		fs = append(fs, math.Float64frombits(r.Uint64()), r.Float64()*math.Pow(10, float64(r.IntN(60)-30)))
	}
	for _, f := range fs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Canonicalize(b)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendNumber(nil, f); !bytes.Equal(got, want) {
			t.Errorf("AppendNumber(%v) = %s, want %s", f, got, want)
		}
	}
}
