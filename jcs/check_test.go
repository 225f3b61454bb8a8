package jcs

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// checkAgrees fails unless CheckCanonical accepts data exactly when
// Canonicalize returns data unchanged.
func checkAgrees(t *testing.T, data []byte) {
	t.Helper()
	out, err := Canonicalize(data)
	want := err == nil && bytes.Equal(out, data)
	if got := CheckCanonical(data); (got == nil) != want {
		t.Fatalf("CheckCanonical(%q) = %v; Canonicalize = %q, %v", data, got, out, err)
	}
}

func TestCheckCanonical(t *testing.T) {
	for _, s := range []string{
		`{}`, `[]`, `0`, `-0`, `1.0`, `1e3`, `1000`, `1e+21`, `1e21`, `0.000001`, `1e-7`, `"a"`, `true`, `null`, `nul`,
		`{"a":1,"b":2}`, `{"b":1,"a":2}`, `{"a":1,"a":1}`, `{ "a":1}`, `{"a":1} `, `[1,2]`, `[1, 2]`,
		`"\u0001"`, `"\u001f"`, `"\u001F"`, `"\n"`, `"\u000a"`, `"\/"`, `"/"`, `"\ud83d\ude00"`, "\"\U0001F600\"",
		"\"\xff\"", "\"\x01\"", `"\\"`, `"\""`, `{"\u0001":1,"a":2}`, `{"a":2,"\u0001":1}`, `{"\\":1,"a":2}`,
		"{\"\u20ac\":1,\"\U0001F600\":2}", "{\"\U0001F600\":1,\"\ufb33\":2}", "{\"\ufb33\":1,\"\U0001F600\":2}",
		`[` + strings.Repeat(`[`, MaxDepth) + strings.Repeat(`]`, MaxDepth+1), `[` + strings.Repeat(`[`, MaxDepth-1) + strings.Repeat(`]`, MaxDepth),
		`{"a":[1,{"b":null}],"c":"d"}`, `1E3`, `01`, `-`, `1.`, `.5`, `+1`, `0x10`, `"`, `{"a"}`, `{"a":}`, ``,
	} {
		checkAgrees(t, []byte(s))
	}
	lines, err := os.ReadFile("testdata/objects.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(lines), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			checkAgrees(t, []byte(l))
		}
	}
}

func FuzzCheckCanonical(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,null,"x\n"]}`, `{"b":1,"a":2}`, `1e21`, `"\u0001"`, "\"\U0001F600\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgrees(t, data)
		if out, err := Canonicalize(data); err == nil {
			checkAgrees(t, out) // canonical forms are accepted
		}
	})
}

func BenchmarkCheckCanonical(b *testing.B) {
	data, err := Canonicalize([]byte(`{"agent_id":"agent-1","args_hash":"blake3:0000000000000000000000000000000000000000000000000000000000000004","autonomy_mode":"autopilot","policy_input":{"args":{"path":"a.txt"},"resources":[{"kind":"fs","op":"read","path":"a.txt"}]},"risk_basis":[],"risk_score":0.25,"status":"ok","tool_id":"echo"}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := CheckCanonical(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestShortDecimalAgrees checks that every number shortDecimal vouches for
// is its own canonical form, over edge cases and random decimals of up to
// 22 digits with every kind of leading and trailing zero: the fast path
// may only ever skip a conversion whose result it already knows.
func TestShortDecimalAgrees(t *testing.T) {
	cases := []string{
		"0", "-0", "1", "-1", "10", "100000000000000000000", "1000000000000000000000",
		"123456789012345", "1234567890123456", "123456789012345000000", "1234567890123450000000",
		"0.1", "0.25", "-0.25", "0.000001", "0.0000001", "0.0000012", "0.10", "00.1", "01", "1.",
		"1.5", "12345678901234.5", "1234567890123.45", "123456789012345.6", "0.123456789012345",
		"0.1234567890123456", "0.000001234567890123", "9007199254740993", "0.30000000000000004",
		"1e5", "1E5", "-", ".5", "+1", "1.0", "-0.0", "0.0",
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 200_000 {
		var b []byte
		if rng.IntN(2) == 0 {
			b = append(b, '-')
		}
		digits := func(n int) {
			for range n {
				b = append(b, byte('0'+rng.IntN(10)))
			}
		}
		if rng.IntN(3) == 0 {
			b = append(b, '0')
		} else {
			b = append(b, byte('1'+rng.IntN(9)))
			digits(rng.IntN(21))
		}
		if rng.IntN(2) == 0 {
			b = append(b, '.')
			b = append(b, bytes.Repeat([]byte("0"), rng.IntN(8))...)
			digits(rng.IntN(17))
			if b[len(b)-1] == '.' || rng.IntN(2) == 0 {
				b = append(b, byte('1'+rng.IntN(9)))
			}
		}
		cases = append(cases, string(b))
	}
	vouched := 0
	for _, s := range cases {
		if !shortDecimal([]byte(s)) {
			continue
		}
		vouched++
		if out, err := Canonicalize([]byte(s)); err != nil || string(out) != s {
			t.Fatalf("shortDecimal(%q) = true, but its canonical form is %q, %v", s, out, err)
		}
	}
	if vouched < len(cases)/4 {
		t.Fatalf("shortDecimal vouched for only %d of %d numbers", vouched, len(cases))
	}
	for _, s := range []string{"0.25", "-17.5", "100", "0.000001"} {
		if !shortDecimal([]byte(s)) {
			t.Errorf("shortDecimal(%q) = false, want true", s)
		}
	}
}

// TestCheckCanonicalNumbersAllocateNothing: a valid number costs no
// allocation, on the fast path or the converting one.
func TestCheckCanonicalNumbersAllocateNothing(t *testing.T) {
	for _, s := range []string{`{"a":0.25}`, `{"a":0.30000000000000004}`, `{"a":1e-7}`} {
		data := []byte(s)
		if n := testing.AllocsPerRun(100, func() {
			if err := CheckCanonical(data); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("CheckCanonical(%s): %v allocations", s, n)
		}
	}
}

// TestPlain8 compares plain8 with a byte-by-byte test over random words
// of the bytes at the edges of what it tests, and words of one odd byte
// among plain ones at every position.
func TestPlain8(t *testing.T) {
	edges := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', 0x23, 'A', 0x5b, '\\', 0x5d, 'z', 0x7e, 0x7f, 0x80, 0x81, 0xa2, 0xdc, 0xfe, 0xff}
	plainByte := func(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && plainByte(c)
		}
		if got := plain8(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("plain8(%q) = %v, want %v", w, got, want)
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for range 1_000_000 {
		var w [8]byte
		for i := range w {
			w[i] = edges[rng.IntN(len(edges))]
		}
		check(w)
	}
	for _, odd := range edges {
		for at := range 8 {
			w := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
			w[at] = odd
			check(w)
		}
	}
}
