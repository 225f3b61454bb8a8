package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// Handle mode over HTTP: a token minted --handles gets per-session handles,
// calls by handle, is refused by name, and loses the handles when the
// session ends.
func TestHandlesOverServer(t *testing.T) {
	sv := initServed(t)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "a1", "--tools", "echo", "--handles")
	status, body := sv.do(http.MethodPost, "/v1/sessions/s1/handles", tok.Token, nil)
	var list httpapi.HandleList
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Handles) != 1 || list.Handles[0].Tool != "echo" {
		t.Fatalf("handles: %d %s", status, body)
	}
	h := list.Handles[0].Handle
	// kernelctl tools would list names the token cannot call: it refuses
	// the token, pointing to the handles, and call takes a handle.
	if _, stderr, code := run(t, "tools", "--token", tok.file, "--server", sv.url); code != 1 ||
		!strings.Contains(stderr, "is in handle mode (minted --handles): it calls its syscalls only through a session's handles") || !strings.Contains(stderr, "POST /v1/sessions/{id}/handles") {
		t.Fatalf("tools with a handle-mode token: exit %d: %s", code, stderr)
	}
	if out := mustRun(t, "call", h, "--token", tok.file, "--session", "s1", "--arg", "text=hi", "--server", sv.url); !strings.HasPrefix(out, "echo ok") {
		t.Fatalf("call HANDLE --session: %s", out)
	}
	_, pb := sv.get("/v1/policy", "")
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	json.Unmarshal(pb, &pol)
	callAs := func(tool string) *kernel.Result {
		var m map[string]any
		json.Unmarshal(envelope(tok, pol.PolicyHash, tool, map[string]any{"text": "hi"}, ""), &m)
		m["provenance"] = map[string]any{"session_id": "s1"}
		b, _ := json.Marshal(m)
		_, r := sv.post(b)
		return r
	}
	if r := callAs(h); r.Status != kernel.StatusOK || r.ToolID != "echo" {
		t.Fatalf("call by handle: %+v", r)
	}
	if r := callAs("echo"); r.Error == nil || r.Error.Class != kernel.ErrToolNotFound {
		t.Fatalf("call by name in handle mode: %+v", r)
	}
	status, body = sv.do(http.MethodPost, "/v1/sessions/s1/end", tok.Token, nil)
	if status != http.StatusOK || string(body) == "" {
		t.Fatalf("end: %d %s", status, body)
	}
	if r := callAs(h); r.Error == nil || r.Error.Class != kernel.ErrToolNotFound {
		t.Fatalf("call after the session ended: %+v", r)
	}
}
