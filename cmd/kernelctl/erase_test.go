package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// The audit verbs against a real server: an auditor token reads and
// exports every payload, an agent's token exports nothing, the admin
// erases one call's payload, and the export then verifies offline and
// reports the erasure.
func TestAuditVerbsOverServer(t *testing.T) {
	sv := initServed(t)
	s, admin := sv.server, sv.admin
	a := mintCLI(t, s, admin, "--agent", "a1", "--tools", "echo")
	aud := mintCLI(t, s, admin, "--agent", "carol", "--auditor")
	const secret = "whisper-9Q"
	st, res := s.post(envelopeWith(a, s, "echo", map[string]any{"text": secret}, "", nil))
	if st != 200 {
		t.Fatalf("echo: %d %+v", st, res)
	}
	srv := []string{"--server", s.url}
	// The caller proves, from its result envelope alone, that the record
	// commits to its result and args; a guess of other args does not open.
	dir := t.TempDir()
	envFile, jwksFile, argsFile, guessFile := filepath.Join(dir, "res.json"), filepath.Join(dir, "jwks.json"), filepath.Join(dir, "args.json"), filepath.Join(dir, "guess.json")
	envJSON, _ := json.Marshal(res)
	_, jwks := s.get("/.well-known/jwks.json", "")
	for f, b := range map[string][]byte{envFile: envJSON, jwksFile: jwks, argsFile: []byte(`{"text":"` + secret + `"}`), guessFile: []byte(`{"text":"whisper-9R"}`)} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out := mustRun(t, "receipts", "verify", envFile, "--jwks", jwksFile, "--args", argsFile); !strings.Contains(out, "commits to this result and these args") {
		t.Fatalf("receipts verify of the envelope:\n%s", out)
	}
	if out, _, code := run(t, "receipts", "verify", envFile, "--jwks", jwksFile, "--args", guessFile); code != 1 || !strings.Contains(out, "does not commit") {
		t.Fatalf("a guessed argument: exit %d\n%s", code, out)
	}
	var stderr string
	export := func(token string) (string, int) {
		out, errOut, code := run(t, append([]string{"ledger", "export", "--token", token}, srv...)...)
		stderr = errOut
		return out, code
	}
	if out, code := export(aud.file); code != 0 || !strings.Contains(out, secret) {
		t.Fatalf("auditor export: exit %d, secret there: %v", code, strings.Contains(out, secret))
	}
	// Refused with the API's class and message, not its JSON body.
	if _, code := export(a.file); code != 1 || !strings.Contains(stderr, "refused (permission_denied, HTTP 403): exporting the ledger") {
		t.Fatalf("an agent's export: exit %d, want 1, permission_denied:\n%s", code, stderr)
	}
	if out := mustRun(t, append([]string{"ledger", "tail", "-n", "50", "--token", a.file}, srv...)...); strings.Contains(out, secret) || !strings.Contains(out, "args_commitment") {
		t.Fatalf("tail shows the public records:\n%s", out)
	}
	if out, _, code := run(t, append([]string{"ledger", "erase", "--operation", res.OperationID, "--reason", "gdpr", "--admin-token", sv.adminFile}, srv...)...); code != 0 || !strings.Contains(out, "erased the payload") {
		t.Fatalf("erase: exit %d:\n%s", code, out)
	}
	out, code := export(aud.file)
	if code != 0 || strings.Contains(out, secret) {
		t.Fatalf("auditor export after erasure: exit %d, secret there: %v", code, strings.Contains(out, secret))
	}
	f := filepath.Join(t.TempDir(), "ledger.jsonl")
	if err := os.WriteFile(f, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	v := mustRun(t, "ledger", "verify", "--export", f, "--pubkey", filepath.Join(sv.dir, "data", kernel.ReceiptPublicKeyFile))
	if !strings.Contains(v, "ledger intact") || !strings.Contains(v, "1 records erased (1 erasure records)") {
		t.Fatalf("offline verification:\n%s", v)
	}
}
