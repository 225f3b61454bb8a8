package jcs

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestNumbers(t *testing.T) {
	f, err := os.Open("testdata/numbers.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		bitsHex, want, _ := strings.Cut(line, " ")
		bits, err := strconv.ParseUint(bitsHex, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		v := math.Float64frombits(bits)
		n++
		if want == "error" {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				t.Errorf("%s: expected a non-finite value", bitsHex)
			}
			continue
		}
		if got := string(AppendNumber(nil, v)); got != want {
			t.Errorf("%s: got %s, want %s", bitsHex, got, want)
		}
		// The same value written out as JSON text canonicalizes alike.
		text := strconv.FormatFloat(v, 'g', -1, 64)
		got, err := Canonicalize([]byte(text))
		if err != nil || string(got) != want {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", text, got, err, want)
		}
	}
	if n < 20 {
		t.Fatalf("only %d vectors read", n)
	}
}

func TestGoldenObjects(t *testing.T) {
	b, err := os.ReadFile("testdata/objects.txt")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines)%2 != 0 {
		t.Fatal("objects.txt must hold input/output pairs")
	}
	for i := 0; i < len(lines); i += 2 {
		got, err := Canonicalize([]byte(lines[i]))
		if err != nil {
			t.Errorf("%s: %v", lines[i], err)
			continue
		}
		if string(got) != lines[i+1] {
			t.Errorf("Canonicalize(%s)\n got %s\nwant %s", lines[i], got, lines[i+1])
		}
	}
}

func TestRefuses(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	cases := map[string]string{
		"empty":             "",
		"only space":        "   ",
		"duplicate key":     `{"a":1,"a":2}`,
		"duplicate escaped": `{"a":1,"\u0061":2}`,
		"lone high":         `"\ud800"`,
		"lone low":          `"\udc00"`,
		"high then text":    `"\ud800x"`,
		"bad utf8":          "\"\xff\"",
		"overflow":          `1e400`,
		"trailing":          `{} {}`,
		"trailing comma":    `[1,]`,
		"leading zero":      `01`,
		"bare minus":        `-`,
		"bad escape":        `"\x"`,
		"control char":      "\"a\x01\"",
		"unterminated":      `{"a":`,
		"single quotes":     `{'a':1}`,
		"too deep":          deep,
		"nan":               `NaN`,
		"missing colon":     `{"a" 1}`,
		"dangling":          `[1 2]`,
	}
	for name, in := range cases {
		if out, err := Canonicalize([]byte(in)); err == nil {
			t.Errorf("%s: accepted %q as %q", name, in, out)
		}
	}
	_, err := Canonicalize([]byte(`{"x":1,"y":{"k":1,"k":2}}`))
	if err == nil || !strings.Contains(err.Error(), `duplicate key "k"`) || !strings.Contains(err.Error(), "offset") {
		t.Fatalf("duplicate key error does not name key and offset: %v", err)
	}
}

func TestSortIsUTF16(t *testing.T) {
	// U+FF61 sorts before U+1F600 in UTF-16 (0xFF61 < 0xD83D is false!):
	// 0xD83D (high surrogate) < 0xFF61, so the emoji comes first.
	got, err := Canonicalize([]byte(`{"\uff61":1,"\ud83d\ude00":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"😀":2,"｡":1}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestMarshal(t *testing.T) {
	got, err := Marshal(map[string]any{"b": 1.50, "a": "<&>"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":"<&>","b":1.5}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func FuzzCanonicalize(f *testing.F) {
	b, _ := os.ReadFile("testdata/objects.txt")
	for _, l := range strings.Split(string(b), "\n") {
		f.Add([]byte(l))
	}
	f.Add([]byte(`{"a":[1,2,{"b":null}],"c":"\u00e9"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q for %q", out, in)
		}
		again, err := Canonicalize(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q (%v)", out, again, err)
		}
		var a, b any
		if json.Unmarshal(in, &a) != nil || json.Unmarshal(out, &b) != nil {
			t.Fatalf("encoding/json disagrees on %q", in)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("value changed: %q -> %q", in, out)
		}
	})
}

func BenchmarkCanonicalize(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		var m = map[string]any{}
		for i := 0; len(mustJSON(m)) < size; i++ {
			m["key"+strconv.Itoa(i)] = map[string]any{"n": float64(i) * 1.25, "s": "value \"quoted\" é", "l": []any{true, nil, i}}
		}
		in := mustJSON(m)
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Canonicalize(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestCanonicalizeExact: numbers whose value a double holds exactly, in
// whatever spelling, canonicalize as Canonicalize does; one more precise
// than a double (which Canonicalize rounds, as RFC 8785 does) is refused,
// naming the number and what it would be read as.
func TestCanonicalizeExact(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" for a refusal
	}{
		{`1`, `1`},
		{`1.0`, `1`},
		{`-0.0`, `0`},
		{`0e-99999999999`, `0`},
		{`10e-1`, `1`},
		{`0.10`, `0.1`},
		{`1E30`, `1e+30`},
		{`4.50`, `4.5`},
		{`2e-3`, `0.002`},
		{`9007199254740992`, `9007199254740992`},
		{`0.30000000000000004`, `0.30000000000000004`},
		{`5e-324`, `5e-324`},
		{`9007199254740993`, ""},
		{`1152921504606846976`, ""},
		{`-9007199254740993`, ""},
		{`333333333.33333329`, ""},
		{`1.00000000000000000000001`, ""},
		{`1e-400`, ""},
		{`1e-99999999999`, ""},
		{`0.1000000000000000055511151231257827`, ""},
		{`{"a":[1,{"b":9007199254740993}]}`, ""},
		{`{"b":2.50,"a":[1.0]}`, `{"a":[1],"b":2.5}`},
	} {
		got, err := CanonicalizeExact([]byte(tc.in))
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), "is not the decimal its canonical form")):
			t.Errorf("%s: %s, %v, want refused as not the decimal of its canonical form", tc.in, got, err)
		case tc.want != "" && (err != nil || string(got) != tc.want):
			t.Errorf("%s: %s, %v, want %s", tc.in, got, err, tc.want)
		}
		if plain, err := Canonicalize([]byte(tc.in)); tc.want != "" && string(plain) != string(got) {
			t.Errorf("%s: Canonicalize %s (%v), CanonicalizeExact %s", tc.in, plain, err, got)
		}
	}
}
