package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// The verifiable-ledger verbs against a real server: checkpoints remembered
// and proven consistent, inclusion and consistency proofs, receipts proven
// and bundled, the export verified offline with the public key alone.
func TestLedgerProofsOverServer(t *testing.T) {
	sv := initServed(t)
	s, dir, data, adminFile, admin := sv.server, sv.dir, sv.data, sv.adminFile, sv.admin
	srv := []string{"--server", s.url, "--admin-token", adminFile}
	must := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	fail := func(want string, args ...string) {
		t.Helper()
		out, stderr, code := run(t, args...)
		if code != 1 || !strings.Contains(out+stderr, want) {
			t.Fatalf("%v: exit %d, want 1 with %q:\n%s%s", args, code, want, out, stderr)
		}
	}
	tok := mintCLI(t, s, admin, "--agent", "a1", "--tools", "echo")
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	_, b := s.get("/v1/policy", "")
	json.Unmarshal(b, &pol)
	var last *kernel.Result
	calls := func(n int) {
		for i := range n {
			_, last = s.post(envelope(tok, pol.PolicyHash, "echo", map[string]any{"text": fmt.Sprint(i)}, ""))
		}
	}
	calls(5)

	// ledger checkpoint: verified, remembered, then proven consistent.
	state := filepath.Join(dir, "state")
	cp := func() string { return must(append([]string{"ledger", "checkpoint", "--state", state}, srv...)...) }
	if out := cp(); !strings.Contains(out, "signature   ok") || !strings.Contains(out, "first checkpoint seen") {
		t.Fatalf("first checkpoint:\n%s", out)
	}
	calls(3)
	if out := cp(); !strings.Contains(out, "proved an extension of the checkpoint of size") {
		t.Fatalf("second checkpoint:\n%s", out)
	}
	if out := cp(); !strings.Contains(out, "same as the checkpoint seen") {
		t.Fatalf("unchanged checkpoint:\n%s", out)
	}
	var latest kernel.SignedCheckpoint
	if err := json.Unmarshal([]byte(must(append([]string{"ledger", "checkpoint", "--state", "", "--json"}, srv...)...)), &latest); err != nil {
		t.Fatal(err)
	}
	if out := must(append([]string{"ledger", "checkpoint", "--stable", "--state", ""}, srv...)...); !strings.Contains(out, "signature   ok") {
		t.Fatalf("stable checkpoint:\n%s", out)
	}

	// A remembered checkpoint the kernel's history contradicts: signed with
	// the kernel's own key (a key holder rewriting history), so only
	// consistency can tell.
	key, err := kernel.LoadKey(filepath.Join(data, kernel.ReceiptKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := ledger.NewCheckpointSigner(latest.Origin, key)
	remember := func(c ledger.Checkpoint) string {
		note, err := ledger.SignCheckpoint(signer, c)
		if err != nil {
			t.Fatal(err)
		}
		d := t.TempDir()
		b, _ := json.Marshal(seenCheckpoint{Note: string(note), SeenAt: "2026-01-01T00:00:00Z"})
		os.WriteFile(filepath.Join(d, url64(latest.Origin)), b, 0o600)
		return d
	}
	root, err := ledger.PeekCheckpoint([]byte(latest.Note))
	if err != nil {
		t.Fatal(err)
	}
	forked := root
	forked.Root[0] ^= 1
	fail("FORK", append([]string{"ledger", "checkpoint", "--state", remember(forked)}, srv...)...)
	longer := root
	longer.Size += 100
	fail("fewer than", append([]string{"ledger", "checkpoint", "--state", remember(longer)}, srv...)...)
	shorter := root
	shorter.Size -= 2
	fail("INCONSISTENT", append([]string{"ledger", "checkpoint", "--state", remember(shorter)}, srv...)...)

	// Proofs.
	if out := must(append([]string{"ledger", "prove", "--seq", "3"}, srv...)...); !strings.Contains(out, "entry 3 ") || !strings.Contains(out, "verified against the checkpoint") {
		t.Fatalf("prove:\n%s", out)
	}
	if out := must(append([]string{"ledger", "prove", "--seq", "3", "--size", "6"}, srv...)...); !strings.Contains(out, "tree of 6 entries") {
		t.Fatalf("prove --size:\n%s", out)
	}
	fail("out of range", append([]string{"ledger", "prove", "--seq", "100000"}, srv...)...)
	if out := must(append([]string{"ledger", "consistency", "--from", "2", "--to", "7"}, srv...)...); !strings.Contains(out, "the tree of 2 entries") {
		t.Fatalf("consistency:\n%s", out)
	}
	fail("out of range", append([]string{"ledger", "consistency", "--from", "7", "--to", "2"}, srv...)...)

	// Receipts: proven against the newest checkpoint, and bundled for
	// offline checks with the JWKS alone.
	if out := must(append([]string{"receipts", "verify", last.ReceiptID, "--prove"}, srv...)...); !strings.Contains(out, "inclusion:    ok") {
		t.Fatalf("receipts verify --prove:\n%s", out)
	}
	bundle := filepath.Join(dir, "bundle.json")
	os.WriteFile(bundle, []byte(must(append([]string{"receipts", "bundle", last.ReceiptID}, srv...)...)), 0o644)
	jwks := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwks, []byte(must(append([]string{"receipts", "jwks"}, srv...)...)), 0o644)
	if out := must("receipts", "verify", bundle, "--jwks", jwks); !strings.Contains(out, "inclusion:    ok") {
		t.Fatalf("bundle offline:\n%s", out)
	}
	raw, _ := os.ReadFile(bundle)
	bad := filepath.Join(dir, "bad.json")
	tampered := strings.Replace(string(raw), `\"tool_id\":\"echo\"`, `\"tool_id\":\"echp\"`, 1)
	if tampered == string(raw) {
		t.Fatal("the bundle's entry names no tool_id to tamper with")
	}
	os.WriteFile(bad, []byte(tampered), 0o644)
	fail("FAILED", "receipts", "verify", bad, "--jwks", jwks)

	// Export over HTTP, verified offline; another key is refused.
	exp := filepath.Join(dir, "ledger.jsonl")
	os.WriteFile(exp, []byte(must(append([]string{"ledger", "export"}, srv...)...)), 0o644)
	pub := filepath.Join(data, kernel.ReceiptPublicKeyFile)
	if out := must("ledger", "verify", "--export", exp, "--pubkey", pub); !strings.Contains(out, "ledger intact") || !strings.Contains(out, "latest checkpoint: size ") {
		t.Fatalf("verify --export:\n%s", out)
	}
	var check kernel.LedgerCheck
	if err := json.Unmarshal([]byte(must("ledger", "verify", "--export", exp, "--pubkey", pub, "--json")), &check); err != nil {
		t.Fatal(err)
	}
	if c := check.Latest; !check.Intact || c == nil || c.Size != check.Entries || c.Root != check.Root || c.Origin != latest.Origin {
		t.Fatalf("verify --export --json: %+v, latest checkpoint %+v", check, c)
	}
	// Without its last checkpoint line the export's last entries are
	// signed by nothing.
	cut := filepath.Join(dir, "cut.jsonl")
	whole, _ := os.ReadFile(exp)
	os.WriteFile(cut, whole[:bytes.LastIndex(whole, []byte(`{"checkpoint":`))], 0o644)
	fail("no checkpoint signs", "ledger", "verify", "--export", cut, "--pubkey", pub)
	other := filepath.Join(dir, "other")
	run(t, "init", "--data", other)
	fail("TAMPERED", "ledger", "verify", "--export", exp, "--pubkey", filepath.Join(other, kernel.ReceiptPublicKeyFile))
	if out := must(append([]string{"ledger", "verify"}, srv...)...); !strings.Contains(out, "ledger intact") {
		t.Fatalf("ledger verify --server:\n%s", out)
	}

	// The API: checkpoint and proofs are public, the export is not; bad
	// parameters are 400, proofs outside the ledger 404.
	for _, c := range []struct {
		path, cred string
		status     int
	}{
		{"/v1/ledger/checkpoint", "", http.StatusOK},
		{"/v1/ledger/checkpoint?stable=true", "", http.StatusOK},
		{"/v1/ledger/checkpoint?stable=maybe", "", http.StatusBadRequest},
		{"/v1/ledger/proof/inclusion?seq=1", "", http.StatusOK},
		{"/v1/ledger/proof/inclusion?seq=1&size=4", "", http.StatusOK},
		{"/v1/ledger/proof/inclusion", "", http.StatusBadRequest},
		{"/v1/ledger/proof/inclusion?seq=-1", "", http.StatusBadRequest},
		{"/v1/ledger/proof/inclusion?seq=99999", "", http.StatusNotFound},
		{"/v1/ledger/proof/consistency?from=1&to=4", "", http.StatusOK},
		{"/v1/ledger/proof/consistency?from=1", "", http.StatusBadRequest},
		{"/v1/ledger/proof/consistency?from=1&to=99999", "", http.StatusNotFound},
		{"/v1/ledger/export", "", http.StatusUnauthorized},
		{"/v1/ledger/export", admin, http.StatusOK},
		{"/v1/ledger/export", tok.Token, http.StatusForbidden}, // admin and auditors export
		{"/v1/receipts/" + last.ReceiptID + "/bundle", "", http.StatusUnauthorized},
		{"/v1/receipts/" + last.ReceiptID + "/bundle", tok.Token, http.StatusOK},
		{"/v1/receipts/nope/bundle", admin, http.StatusNotFound},
	} {
		if got, body := s.get(c.path, c.cred); got != c.status {
			t.Errorf("GET %s: %d, want %d: %s", c.path, got, c.status, body)
		}
	}
}
