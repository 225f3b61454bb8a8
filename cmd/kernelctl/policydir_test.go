package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// policyLoads returns the policy hashes of the ledger's policy_loaded
// records, in order.
func policyLoads(t *testing.T, data string) []string {
	t.Helper()
	var hashes []string
	for _, line := range strings.Split(strings.TrimSpace(mustRun(t, "ledger", "export", "--data", data)), "\n") {
		var e struct {
			Kind string `json:"kind"`
			Body struct {
				PolicyHash string `json:"policy_hash"`
			} `json:"body"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Kind == ledger.KindPolicyLoaded {
			hashes = append(hashes, e.Body.PolicyHash)
		}
	}
	return hashes
}

// setPolicyDir sets policy_dir in data's kernel.json.
func setPolicyDir(t *testing.T, data, dir string) {
	t.Helper()
	cfg := filepath.Join(data, kernel.ConfigFile)
	var m map[string]any
	b, _ := os.ReadFile(cfg)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["policy_dir"] = dir
	b, _ = json.Marshal(m)
	os.WriteFile(cfg, b, 0o600)
}

// After serve --policy, the verbs that open the stopped kernel in their
// own process refuse to decide under another bundle (the embedded
// default) unless told which with --policy, or the data dir's kernel.json
// names it; nothing is recorded by a refused verb.
func TestStoppedKernelKeepsItsPolicy(t *testing.T) {
	p1 := otherPolicy(t)
	sv := initServed(t, "--policy", p1)
	sv.stop()
	data := sv.data
	p1Hash := strings.TrimSpace(mustRun(t, "policy", "hash", p1))
	defHash := strings.TrimSpace(mustRun(t, "policy", "hash"))
	tokFile := filepath.Join(sv.dir, "a1.token")
	os.WriteFile(tokFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a1", "--tools", "echo", "--policy", p1)), 0o600)
	loads := policyLoads(t, data)
	if len(loads) != 2 || loads[0] != p1Hash || loads[1] != p1Hash {
		t.Fatalf("policy_loaded records %v, want serve's and token mint --policy's, both %s", loads, p1Hash)
	}

	for _, args := range [][]string{
		{"token", "mint", "--data", data, "--agent", "a2", "--tools", "echo"},
		{"token", "inspect", tokFile, "--data", data},
		{"token", "revoke", "01a21ed0-0f45-7000-8000-000000000000", "--data", data},
		{"call", "echo", "--data", data, "--token", tokFile, "--arg-str", "text=hi"},
		{"tools", "--data", data, "--token", tokFile},
		{"run", "--data", data, "--token", tokFile, "--no-sandbox", "--", "/bin/true"},
		{"mcp", "--data", data, "--token", tokFile},
		{"ledger", "erase", "--data", data, "--operation", "01a21ed0-0f45-7000-8000-000000000000", "--reason", "x"},
	} {
		out, stderr, code := run(t, args...)
		for _, want := range []string{"last ran under policy " + p1Hash, "would load " + defHash + ", the embedded default bundle", "--policy DIR"} {
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("kernelctl %v: exit %d, want 1 with %q:\n%s%s", args, code, want, out, stderr)
			}
		}
	}
	if loads := policyLoads(t, data); len(loads) != 2 {
		t.Fatalf("the refused verbs recorded policy loads: %v", loads)
	}

	// --policy names the bundle; so does policy_dir in kernel.json, which
	// is relative to the data dir.
	decidedUnder := func(args ...string) string {
		t.Helper()
		var res kernel.Result
		out := mustRun(t, append([]string{"call", "echo", "--token", tokFile, "--arg-str", "text=hi", "--data", data, "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Status != kernel.StatusOK {
			t.Fatalf("call %v: %s", args, out)
		}
		var list []kernel.ReceiptInfo
		json.Unmarshal([]byte(mustRun(t, "receipts", "list", "--data", data, "--json")), &list)
		return list[len(list)-1].Receipt.PolicyHash
	}
	if h := decidedUnder("--policy", p1); h != p1Hash {
		t.Fatalf("call --policy decided under %s, want %s", h, p1Hash)
	}
	rel, err := filepath.Rel(data, p1)
	if err != nil {
		t.Fatal(err)
	}
	setPolicyDir(t, data, rel)
	if h := decidedUnder(); h != p1Hash {
		t.Fatalf("call with policy_dir %s decided under %s, want %s", rel, h, p1Hash)
	}

	// --policy is for a stopped kernel: a served one keeps its own.
	startServer(t, data)
	if _, stderr, code := run(t, "call", "echo", "--token", tokFile, "--arg-str", "text=hi", "--data", data, "--policy", p1); code != 2 || !strings.Contains(stderr, "runs under the policy it was started with") {
		t.Fatalf("call --policy on a served kernel: exit %d: %s", code, stderr)
	}
}

// A policy_dir in kernel.json that names no directory fails serve and the
// in-process verbs naming the setting and the path it resolves to, where
// they said "stat .: no such file or directory".
func TestPolicyDirNamesTheSetting(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	os.WriteFile(filepath.Join(dir, "file.json"), []byte("{}"), 0o644)
	for _, tt := range []struct{ policyDir, resolved, fault string }{
		{"p1", filepath.Join(data, "p1"), "no such directory"},
		{"../file.json", filepath.Join(dir, "file.json"), "not a directory"},
		{filepath.Join(dir, "nope"), filepath.Join(dir, "nope"), "no such directory"},
	} {
		setPolicyDir(t, data, tt.policyDir)
		want := `policy_dir "` + tt.policyDir + `" (` + tt.resolved + `, resolved against the data dir): ` + tt.fault
		for _, args := range [][]string{
			{"serve", "--data", data, "--listen", "127.0.0.1:0"},
			{"token", "mint", "--data", data, "--agent", "x", "--tools", "echo"},
		} {
			if out, stderr, code := run(t, args...); code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stderr, kernel.ConfigFile) {
				t.Errorf("policy_dir %q: kernelctl %v: exit %d, want 1 with %q:\n%s%s", tt.policyDir, args[:2], code, want, out, stderr)
			}
		}
	}
}
