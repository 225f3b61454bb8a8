package jcs

import (
	"bytes"
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
