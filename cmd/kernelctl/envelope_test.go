package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// receipts verify on result envelopes from a real server: honest ones (an
// ok call, an error, a replay) verify; an envelope that is not the call
// its receipt attests (another tool, agent, operation, seq, outcome,
// result or result_hash), one without its audit_salt, and one another
// reader would read differently (duplicate or case-variant names) fail.
func TestReceiptsVerifyEnvelope(t *testing.T) {
	sv := initServed(t)
	s := sv.server
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(ws, 0o755)
	tok := mintCLI(t, s, sv.admin, "--agent", "a1", "--tools", "echo,fs.*", "--fs", ws+":rw")
	dir := t.TempDir()
	post := func(name string, env []byte) string {
		t.Helper()
		st, b := s.do(http.MethodPost, "/v1/syscalls", "", env)
		if st == 0 || !strings.Contains(string(b), `"receipt":{`) {
			t.Fatalf("%s: %d %s", name, st, b)
		}
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, b, 0o600)
		return f
	}
	okFile := post("ok", envelopeWith(tok, s, "echo", map[string]any{"text": "hello"}, "", nil))
	errFile := post("err", envelopeWith(tok, s, "fs.read", map[string]any{"path": filepath.Join(ws, "missing.txt")}, "", nil))
	write := envelopeWith(tok, s, "fs.write", map[string]any{"path": filepath.Join(ws, "a.txt"), "content": "x"}, "k1", nil)
	post("write", write)
	replayFile := post("replay", write)
	for f, want := range map[string]string{errFile: `"status":"error"`, replayFile: `"replayed":true`} {
		if b, _ := os.ReadFile(f); !strings.Contains(string(b), want) {
			t.Fatalf("%s has no %s:\n%s", f, want, b)
		}
	}
	_, jwks := s.get("/.well-known/jwks.json", "")
	jwksFile := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwksFile, jwks, 0o600)
	argsFile := filepath.Join(dir, "args.json")
	os.WriteFile(argsFile, []byte(`{"text":"hello"}`), 0o600)

	okRaw, _ := os.ReadFile(okFile)
	var members map[string]json.RawMessage
	if err := json.Unmarshal(okRaw, &members); err != nil {
		t.Fatal(err)
	}
	// editFile writes the envelope in file with members set ("": removed).
	editFile := func(file, name string, set map[string]string) string {
		raw, _ := os.ReadFile(file)
		m := map[string]json.RawMessage{}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		for k, v := range set {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = json.RawMessage(v)
			}
		}
		b, _ := json.Marshal(m)
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, b, 0o600)
		return f
	}
	// edit writes the ok envelope with members set.
	edit := func(name string, set map[string]string) string { return editFile(okFile, name, set) }
	// prefix writes the ok envelope with text inserted as its first members.
	prefix := func(name, text string) string {
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, []byte("{"+text+","+strings.TrimPrefix(strings.TrimSpace(string(okRaw)), "{")), 0o600)
		return f
	}
	bare := filepath.Join(dir, "bare.json")
	os.WriteFile(bare, members["receipt"], 0o600)
	var rid string
	json.Unmarshal(members["receipt_id"], &rid)
	showOut, _, _ := run(t, "receipts", "show", rid, "--server", s.url, "--admin-token", sv.adminFile, "--json")
	show := filepath.Join(dir, "show.json")
	os.WriteFile(show, []byte(showOut), 0o600)
	forged := `{"text":"FORGED"}`

	for _, c := range []struct {
		name, file string
		args       bool
		code       int
		want       string
	}{
		{"honest ok", okFile, false, 0, "commitments:  ok"},
		{"honest ok with its args", okFile, true, 0, "commits to this result and these args"},
		{"honest error", errFile, false, 0, "envelope:     ok"},
		{"honest replay", replayFile, false, 0, "commitments:  ok"},
		{"bare receipt", bare, false, 0, "inclusion:    ok"},
		{"receipts show output", show, false, 1, "receipts bundle ID"},
		{"no audit_salt", edit("nosalt", map[string]string{"audit_salt": ""}), false, 1, "no audit_salt"},
		{"forged result, no audit_salt", edit("forged-nosalt", map[string]string{"audit_salt": "", "result": forged}), false, 1, "no audit_salt"},
		{"forged result", edit("forged", map[string]string{"result": forged}), false, 1, "does not commit to this result"},
		{"another tool", edit("tool", map[string]string{"tool_id": `"fs.write"`}), false, 1, `tool_id is "fs.write"`},
		{"another agent", edit("agent", map[string]string{"agent_id": `"bob"`}), false, 1, `agent_id is "bob"`},
		{"another operation", edit("op", map[string]string{"operation_id": `"01a21a88-0000-7000-8000-000000000000"`}), false, 1, "operation_id is"},
		{"another seq", edit("seq", map[string]string{"ledger_seq": "999"}), false, 1, `ledger_seq is "999"`},
		{"another receipt id", edit("rid", map[string]string{"receipt_id": `"r999-0000000000000000"`}), false, 1, "receipt_id is"},
		{"another outcome", edit("outcome", map[string]string{"tx_outcome": `"committed"`}), false, 1, `tx_outcome is "committed"`},
		{"an error claimed", edit("status", map[string]string{"status": `"error"`}), false, 1, `status is "error"`},
		{"an error with a forged result", editFile(errFile, "err-result", map[string]string{"result": forged}), false, 1, "both an error and a result"},
		{"another result_hash", edit("hash", map[string]string{"result_hash": `"blake3:1111111111111111111111111111111111111111111111111111111111111111"`}), false, 1, "result_hash is"},
		{"duplicate result", prefix("dup", `"result":`+forged), false, 1, "duplicate member name"},
		{"case-variant result", prefix("case", `"Result":`+forged), false, 1, `unknown field "Result"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"receipts", "verify", c.file, "--jwks", jwksFile}
			if c.args {
				args = append(args, "--args", argsFile)
			}
			out, stderr, code := run(t, args...)
			if code != c.code || !strings.Contains(out+stderr, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, c.code, c.want, out, stderr)
			}
		})
	}
}
