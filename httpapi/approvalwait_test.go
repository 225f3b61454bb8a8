package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// TestApprovedAfterWriteTimeout: a synchronous call approved after the
// server's WriteTimeout (kernelctl serve: 15 minutes, here 1 s) still
// gets its result; the client sends it with no timeout of its own.
func TestApprovedAfterWriteTimeout(t *testing.T) {
	root := t.TempDir()
	dir, ws := filepath.Join(root, "data"), filepath.Join(root, "ws")
	if _, err := kernel.Init(dir); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(ws, 0o755)
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: dir, ApprovalTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	srv := httptest.NewUnstartedServer(httpapi.New(k))
	const writeTimeout = time.Second
	srv.Config.WriteTimeout = writeTimeout
	srv.Start()
	defer srv.Close()
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent-a", Expiry: time.Now().Add(time.Hour),
		Cap: captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	approver, _, err := k.MintToken(captoken.Claims{Subject: "alice", Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Role: captoken.RoleApprover}})
	if err != nil {
		t.Fatal(err)
	}
	env, _ := json.Marshal(kernel.Envelope{ToolID: "fs.write", Args: json.RawMessage(`{"path":"notes.txt","content":"approved"}`),
		AgentID: "agent-a", CapabilityToken: tok, CapabilityTokenID: cl.ID, PolicyHash: k.PolicyHash(), IdempotencyKey: "k1", AutonomyMode: "soft_gate"})
	type answer struct {
		res *kernel.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, _, err := (&httpapi.Client{BaseURL: srv.URL}).Call(context.Background(), env)
		done <- answer{r, err}
	}()
	var id string
	for id == "" {
		if l := k.Approvals(false); len(l) > 0 {
			id = l[0].ID
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(writeTimeout + 500*time.Millisecond) // the approver decides after the write deadline
	if _, err := k.Decide(id, approver, "allow", "looked at it"); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.res.Status != kernel.StatusOK || a.res.TxOutcome != kernel.Committed {
		t.Fatalf("the approved call's client got %+v, %v; want its committed result", a.res, a.err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "notes.txt")); err != nil || string(b) != "approved" {
		t.Fatalf("notes.txt: %q, %v", b, err)
	}
}
