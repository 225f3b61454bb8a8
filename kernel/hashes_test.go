package kernel

import (
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden returns the vectors in file, which -update first rewrites with
// got; a count that differs from got's fails the test.
func golden[T any](t *testing.T, file string, got []T) []T {
	t.Helper()
	if *update {
		b, _ := json.MarshalIndent(got, "", "  ")
		if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want []T
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(got) {
		t.Fatalf("%s: %d vectors, want %d", file, len(got), len(want))
	}
	return want
}

// hashVector pins args_hash and result_hash: the canonical bytes and their
// digest, so another implementation can check both steps.
type hashVector struct {
	Name       string          `json:"name"`
	Args       json.RawMessage `json:"args,omitempty"`
	Result     *Result         `json:"result_envelope,omitempty"`
	Canonical  string          `json:"canonical"`
	Hash       string          `json:"hash"`
	HashedWhat string          `json:"hashed"`
}

func hashVectors(t *testing.T) []hashVector {
	t.Helper()
	args := []struct{ name, args string }{
		{"args: write", `{"path":"notes.txt","content":"status: draft\n"}`},
		{"args: key order, escapes and numbers", `{"z":1E2,"a":[true,null,-0.0],"é":"\u00e9\t","b":{"y":0.000001,"x":1e21}}`},
		{"args: empty", `{}`},
	}
	var out []hashVector
	for _, a := range args {
		c, err := jcs.Canonicalize([]byte(a.args))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, hashVector{Name: a.name, Args: json.RawMessage(a.args), Canonical: string(c), Hash: digest.Sum(c), HashedWhat: "args"})
	}
	results := []struct {
		name string
		r    Result
	}{
		{"result: ok", Result{Status: StatusOK, Result: json.RawMessage(`{"text":"hello","size":5}`)}},
		{"result: error", Result{Status: StatusError, Error: &Error{Class: ErrScopeDenied, Message: `path "../x": escapes its root`}}},
	}
	for _, r := range results {
		v := map[string]any{"status": r.r.Status}
		if r.r.Error != nil {
			v["error"] = r.r.Error
		} else {
			v["result"] = r.r.Result
		}
		c, err := jcs.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		rr := r.r
		out = append(out, hashVector{Name: r.name, Result: &rr, Canonical: string(c), Hash: resultHash(&rr, nil), HashedWhat: "result"})
	}
	return out
}

// TestHashVectors checks args_hash and result_hash against
// testdata/hashes.json (go test -run TestHashVectors -update rewrites it).
func TestHashVectors(t *testing.T) {
	got := hashVectors(t)
	const file = "testdata/hashes.json"
	want := golden(t, file, got)
	for i := range want {
		if got[i].Canonical != want[i].Canonical || got[i].Hash != want[i].Hash {
			t.Errorf("%s: canonical %s hash %s, want %s %s", want[i].Name, got[i].Canonical, got[i].Hash, want[i].Canonical, want[i].Hash)
		}
		if want[i].Hash != digest.Sum([]byte(want[i].Canonical)) {
			t.Errorf("%s: the golden hash is not blake3 of the golden canonical bytes", want[i].Name)
		}
	}
	// The pipeline uses the same definition.
	h := newHarness(t)
	r := h.invoke("echo", map[string]any{"text": "hello"})
	a := h.audits(0)
	if argsHash, _ := digest.JSON(json.RawMessage(`{"text":"hello"}`)); a[len(a)-1].ArgsHash != argsHash {
		t.Fatalf("audit args_hash %s, want %s", a[len(a)-1].ArgsHash, argsHash)
	}
	if r.ResultHash != resultHash(r, nil) {
		t.Fatal("result_hash does not follow its definition")
	}
}

// resultHash writes the canonical object itself; it must give the hash of
// encoding/json plus RFC 8785 for every result, with the canonical result
// given or not.
func TestResultHashByConstruction(t *testing.T) {
	for _, r := range []Result{
		{Status: StatusOK, Result: json.RawMessage(`{"text":"hello","size":5}`)},
		{Status: StatusOK, Result: json.RawMessage(`{ "b" : [1.0, 2e3, "<&>\u2028"], "a": "\u00e9\n" }`)},
		{Status: StatusOK},
		{Status: StatusError, Error: &Error{Class: ErrScopeDenied, Message: `path "../x": escapes its root`}},
		{Status: StatusError, Error: &Error{Class: ErrExecution, Message: "tab\t, newline\n, nul \x00, <html> & \u2028, é, 😀"}},
		{Status: StatusError, Error: &Error{Class: ErrExecution, Message: "invalid UTF-8 \xff\xfe here"}},
	} {
		want := digest.Sum(resultMarshalled(&r))
		if got := resultHash(&r, nil); got != want {
			t.Errorf("resultHash(%+v) = %s, want %s", r, got, want)
		}
		if r.Result != nil {
			canon, err := jcs.Canonicalize(r.Result)
			if err != nil {
				t.Fatal(err)
			}
			if got := resultHash(&r, canon); got != want {
				t.Errorf("resultHash(%+v, canonical) = %s, want %s", r, got, want)
			}
		}
	}
}
