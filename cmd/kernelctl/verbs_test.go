package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// TestVerbsOnDataDir runs the verbs on a stopped kernel's data dir, as an
// operator would after the demo.
func TestVerbsOnDataDir(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if out, stderr, code := run(t, "demo", "--data", data); code != 0 {
		t.Fatalf("demo: %s %s", out, stderr)
	}
	must := func(args ...string) string {
		t.Helper()
		out, stderr, code := run(t, args...)
		if code != 0 {
			t.Fatalf("kernelctl %v: exit %d: %s %s", args, code, out, stderr)
		}
		return out
	}

	// Tokens: mint prints the token alone; inspect verifies it; revoke
	// makes inspect refuse it (exit 1, saying why).
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(ws, 0o755)
	tok := strings.TrimSpace(must("token", "mint", "--data", data, "--agent", "ops", "--tools", "echo,fs.read", "--fs", ws+":r", "--budget", "calls=10,disk_write_bytes=1KiB", "--ttl", "30m"))
	out := must("token", "inspect", tok, "--data", data, "--json")
	// The claims carry the token's own (wire) names, as the API's do.
	var ins struct {
		Valid  bool `json:"valid"`
		Claims struct {
			ID  string `json:"jti"`
			Sub string `json:"sub"`
			Exp int64  `json:"exp"`
			Cap struct {
				Budgets map[string]int64 `json:"budgets"`
				FS      []struct{ Path, Mode string }
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &ins); err != nil || !ins.Valid || ins.Claims.Sub != "ops" || ins.Claims.Exp == 0 || ins.Claims.Cap.Budgets["disk_write_bytes"] != 1024 ||
		len(ins.Claims.Cap.FS) != 1 || ins.Claims.Cap.FS[0].Mode != "r" {
		t.Fatalf("token inspect: %s (%v)", out, err)
	}
	must("token", "revoke", ins.Claims.ID, "--data", data, "--reason", "test")
	if out, stderr, code := run(t, "token", "inspect", tok, "--data", data); code != 1 || !strings.Contains(stderr, "revoked") {
		t.Fatalf("inspect of a revoked token: exit %d: %s %s", code, out, stderr)
	}
	if _, stderr, code := run(t, "token", "inspect", "not-a-token", "--data", data); code != 1 {
		t.Fatalf("inspect of garbage: exit %d: %s", code, stderr)
	}
	for _, bad := range [][]string{
		{"token", "mint", "--data", data, "--agent", "x"},                                      // no tools
		{"token", "mint", "--data", data, "--agent", "x", "--tools", "*", "--fs", "ws:rwx"},    // bad mode
		{"token", "mint", "--data", data, "--agent", "x", "--tools", "*", "--budget", "calls"}, // no value
		{"token", "mint", "--data", data, "--server", "http://x", "--agent", "x", "--tools", "*"},
	} {
		if _, stderr, code := run(t, bad...); code != 2 {
			t.Errorf("kernelctl %v: exit %d, want 2: %s", bad, code, stderr)
		}
	}

	// Receipts: list filters, show, verify against the data dir.
	var list []kernel.ReceiptInfo
	json.Unmarshal([]byte(must("receipts", "list", "--data", data, "--outcome", "committed", "--json")), &list)
	if len(list) != 4 {
		t.Fatalf("%d committed receipts after the demo, want 4 (write, patch, kv put, the approved build)", len(list))
	}
	for _, r := range list {
		if r.Receipt.TxOutcome != kernel.Committed {
			t.Fatalf("filter let through %+v", r.Receipt)
		}
	}
	if out := must("receipts", "list", "--data", data, "--tool", "echo"); strings.Count(out, "\n") != 5 { // header + 4 echo calls
		t.Fatalf("receipts list --tool echo:\n%s", out)
	}
	if out := must("receipts", "show", list[0].ReceiptID, "--data", data); !strings.Contains(out, list[0].Receipt.ArgsHash) {
		t.Fatalf("receipts show:\n%s", out)
	}
	if out := must("receipts", "verify", list[0].ReceiptID, "--data", data); !strings.Contains(out, "ledger match: ok") {
		t.Fatalf("receipts verify:\n%s", out)
	}

	// Ledger: head, tail, export; the export re-hashes entry by entry.
	var head struct{ Size uint64 }
	json.Unmarshal([]byte(must("ledger", "head", "--data", data, "--json")), &head)
	if head.Size < 30 {
		t.Fatalf("head size %d", head.Size)
	}
	if out := must("ledger", "tail", "-n", "3", "--data", data); strings.Count(out, "\n") != 4 || !strings.HasPrefix(out, "SEQ\tTIME\tKIND") {
		t.Fatalf("tail -n 3:\n%s", out)
	}
	exp := must("ledger", "export", "--data", data)
	var entries, checkpoints uint64
	for i, l := range strings.Split(strings.TrimSpace(exp), "\n") {
		if strings.HasPrefix(l, `{"checkpoint":`) {
			checkpoints++
			continue
		}
		if strings.HasPrefix(l, `{"payload":`) {
			continue // what the next audit record commits to (docs/formats.md)
		}
		var e ledger.Entry
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("export line %d: %v", i, err)
		}
		if h, err := ledger.EntryHash(e); err != nil || h != e.Hash || e.Seq != entries {
			t.Fatalf("export line %d does not re-hash: %v", i, err)
		}
		entries++
	}
	if entries != head.Size || checkpoints == 0 {
		t.Fatalf("export has %d entries and %d checkpoints; the ledger has %d entries", entries, checkpoints, head.Size)
	}
	// ...and verifies offline with the public key alone, as PEM or JWKS.
	expFile := filepath.Join(dir, "ledger.jsonl")
	os.WriteFile(expFile, []byte(exp), 0o644)
	jwksFile := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwksFile, []byte(must("receipts", "jwks", "--data", data)), 0o644)
	for _, key := range []string{filepath.Join(data, "keys", "receipt.pub"), jwksFile} {
		if out := must("ledger", "verify", "--export", expFile, "--pubkey", key); !strings.Contains(out, fmt.Sprintf("ledger intact: %d entries, %d checkpoints", entries, checkpoints)) {
			t.Fatalf("verify --export --pubkey %s:\n%s", key, out)
		}
	}
	if _, stderr, code := run(t, "ledger", "tail", "-f", "--data", data); code != 1 || !strings.Contains(stderr, "no kernel is running") {
		t.Fatalf("tail -f on a data dir: exit %d: %s", code, stderr)
	}

	// Replay: the demo's history proves; show lists the original and its replay.
	if out := must("replay", "verify", "--data", data); !strings.Contains(out, "proven") {
		t.Fatalf("replay verify:\n%s", out)
	}

	// Policy: hash of the embedded bundle equals the kernel's; a frozen-writes
	// bundle would change the demo's writes; Rego tests pass.
	hash := strings.TrimSpace(must("policy", "hash"))
	if !strings.HasPrefix(hash, "blake3:") || !strings.Contains(must("receipts", "show", list[0].ReceiptID, "--data", data), hash) {
		t.Fatalf("policy hash %s is not the one the receipts name", hash)
	}
	pol := filepath.Join(dir, "frozen")
	os.MkdirAll(pol, 0o755)
	os.WriteFile(filepath.Join(pol, "p.rego"), []byte(`package capkernel
decision := {"autonomy_mode": "no_go", "risk_score": 1, "risk_basis": ["frozen"]} if input.side_effect == "WRITE"
else := {"autonomy_mode": "autopilot", "risk_score": 0.1, "risk_basis": []}
`), 0o644)
	var rp kernel.PolicyReplay
	json.Unmarshal([]byte(must("replay", "policy", "--policy", pol, "--data", data, "--json")), &rp)
	frozen := 0
	for _, c := range rp.Changes {
		if c.NewMode == "no_go" && c.OldMode == "autopilot" {
			frozen++
		}
	}
	if frozen != 4 || rp.Skipped == 0 { // write, patch, stale write, kv put; refusals before the policy are skipped
		t.Fatalf("replay policy: %+v", rp)
	}
	if out := must("policy", "test"); !strings.Contains(out, " 0 failed") {
		t.Fatalf("policy test:\n%s", out)
	}
	input := filepath.Join(dir, "input.json")
	os.WriteFile(input, []byte(`{"tool_id":"fs.write","side_effect":"WRITE","agent_id":"a","resources":[]}`), 0o644)
	if out, stderr, code := run(t, "policy", "eval", "--input", input); code != 0 || !strings.Contains(out, "autonomy_mode") {
		t.Fatalf("policy eval: exit %d: %s %s", code, out, stderr)
	}
	if out := must("completion", "bash"); !strings.Contains(out, "kernelctl") {
		t.Fatal("no bash completion")
	}
}
