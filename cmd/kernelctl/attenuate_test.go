package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// An agent hands a sub-agent a narrower token through a served kernel:
// over the CLI (no admin credential, the parent token is the authority)
// and over POST /v1/tokens/attenuate; a widening is refused on both.
func TestTokenAttenuateOverServer(t *testing.T) {
	sv := initServed(t)
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	os.WriteFile(filepath.Join(ws, "sub", "a.txt"), []byte("hello"), 0o644)
	os.WriteFile(filepath.Join(ws, "top.txt"), []byte("parent's only"), 0o644)
	parent := mintCLI(t, sv.server, sv.admin, "--agent", "lead", "--tools", "fs.*", "--fs", ws+":rw", "--budget", "calls=5")

	out, stderr, code := run(t, "token", "attenuate", "--server", sv.url, "--parent", parent.file, "--agent", "lead/helper",
		"--tools", "fs.read", "--fs", filepath.Join(ws, "sub")+":r", "--budget", "calls=2", "--json")
	if code != 0 {
		t.Fatalf("token attenuate: exit %d: %s", code, stderr)
	}
	var child kernel.MintedToken
	if err := json.Unmarshal([]byte(out), &child); err != nil {
		t.Fatal(err)
	}
	if child.Cap.Parent != parent.ID || child.AgentID != "lead/helper" || child.Cap.Budgets["calls"] != 2 {
		t.Fatalf("child = %+v", child)
	}
	_, pb := sv.get("/v1/policy", "")
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	json.Unmarshal(pb, &pol)
	call := func(tool, path string) *kernel.Result {
		_, r := sv.post(envelope(agentToken{MintedToken: child}, pol.PolicyHash, tool, map[string]any{"path": path}, ""))
		return r
	}
	if r := call("fs.read", "a.txt"); r.Status != kernel.StatusOK {
		t.Fatalf("child's read: %+v", r.Error)
	}
	if r := call("fs.read", filepath.Join(ws, "top.txt")); r.Error == nil || r.Error.Class != kernel.ErrScopeDenied {
		t.Fatalf("child's read outside its root: %+v", r)
	}

	_, stderr, code = run(t, "token", "attenuate", "--server", sv.url, "--parent", parent.file, "--tools", "proc.exec")
	if code == 0 || !strings.Contains(stderr, "scope_denied") || !strings.Contains(stderr, "tools") {
		t.Fatalf("widening over the CLI: exit %d: %s", code, stderr)
	}
	body, _ := json.Marshal(kernel.AttenuateRequest{Parent: parent.Token, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}, Budgets: map[string]int64{"calls": 6}})
	status, resp := sv.do(http.MethodPost, "/v1/tokens/attenuate", "", body)
	if status != http.StatusForbidden || !strings.Contains(string(resp), `"scope_denied"`) {
		t.Fatalf("widening over HTTP: %d %s", status, resp)
	}
	status, resp = sv.do(http.MethodPost, "/v1/tokens/attenuate", "", []byte(`{"parent":"not.a.token"}`))
	if status != http.StatusUnauthorized {
		t.Fatalf("forged parent over HTTP: %d %s", status, resp)
	}
}
