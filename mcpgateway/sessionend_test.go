package mcpgateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// A client's DELETE of its session ends the calls of it in flight, on the
// lean path and on the SDK's (a call with _meta, such as a progress
// token, goes there): a gated fs.write waiting for an approver is
// cancelled, its approval abandoned, and it never writes — the DELETE is
// answered at once. The SDK's own close of a session waited for the
// calls it served: the DELETE hung, and the write ran once an approver
// allowed it (review rev-mcp #1); and the calls were found by their id and
// POST, so an id past 2^53 (kept as a float64) or a POST the client had
// dropped escaped the DELETE (rev-last #1, #2).
func TestDeleteEndsSessionCalls(t *testing.T) {
	k, g, ws, _ := newGatedWriteGateway(t, time.Minute, false, nil)
	alice, err := k.Mint(kernel.TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	if err != nil {
		t.Fatal(err)
	}
	progress := `,"_meta":{"progressToken":"p"}`
	for _, c := range []struct {
		name, id, meta string
		abandon        bool   // the client drops its POST before the DELETE
		version        string // the DELETE's protocol header, if not the session's
	}{
		{"sdk", "70", progress, false, ""},
		{"lean", "70", "", false, ""},
		{"sdk, id past 2^53", "1764219000123456789", progress, false, ""},
		{"sdk, POST abandoned", "71", progress, true, ""},
		// The SDK takes a DELETE naming any version it supports
		// (rev10-mcp #5: only the session's own ended the calls first).
		{"sdk, another supported version", "72", progress, false, "2025-06-18"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newRawMCP(t, g)
			file := strings.NewReplacer(" ", "_", ",", "", "^", "").Replace(c.name) + ".txt"
			body := `{"jsonrpc":"2.0","id":` + c.id + `,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"` + file + `","content":"x"}` + c.meta + `}}`
			post, drop := context.WithCancel(context.Background())
			defer drop()
			go func() {
				req, _ := http.NewRequestWithContext(post, http.MethodPost, m.url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Mcp-Session-Id", m.cs.ID())
				req.Header.Set("Mcp-Protocol-Version", m.cs.InitializeResult().ProtocolVersion)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			var ar kernel.ApprovalRequest
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if p := k.Approvals(false); len(p) == 1 {
					ar = p[0]
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the call never asked for an approval")
				}
			}
			if c.abandon {
				drop()
				time.Sleep(100 * time.Millisecond) // the SDK's handler of the POST returns
			}
			req, _ := http.NewRequest(http.MethodDelete, m.url, nil)
			req.Header.Set("Mcp-Session-Id", m.cs.ID())
			req.Header.Set("Mcp-Protocol-Version", m.cs.InitializeResult().ProtocolVersion)
			if c.version != "" {
				req.Header.Set("Mcp-Protocol-Version", c.version)
			}
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
			if err != nil {
				t.Fatalf("DELETE of the session: %v", err)
			}
			resp.Body.Close()
			for deadline := time.Now().Add(10 * time.Second); len(k.Approvals(false)) != 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the approval is still pending after the session ended")
				}
			}
			if _, err := k.Decide(ar.ID, alice.Token, "allow", "later"); err == nil {
				t.Error("an approver could still allow the call after its session ended")
			}
			if _, err := os.Stat(filepath.Join(ws, file)); err == nil {
				t.Error("the write ran after its client deleted the session")
			}
		})
	}
}

// A client's own idempotency key in the gateway's namespace (mcp:…) does
// not take a key derived for another session: session A naming
// "mcp:<B>:5" and "mcp:<B>:6" leaves B's calls of ids 5 and 6 their own
// (B's echo not replayed from A's, B's fs.write not an
// idempotency_conflict) (review rev-mcp #3).
func TestClientKeyNotDerived(t *testing.T) {
	ws := t.TempDir()
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo", "fs.write"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}}, Config{})
	a, b := newRawMCP(t, g), newRawMCP(t, g)
	a.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"from A"},"_meta":{"capkernel/idempotency_key":"mcp:` + b.cs.ID() + `:5"}}}`)
	a.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"x.txt","content":"A"},"_meta":{"capkernel/idempotency_key":"mcp:` + b.cs.ID() + `:6"}}}`)
	_, _, echo := b.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"from B"}}}`)
	_, _, write := b.post(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"x.txt","content":"B"}}}`)
	er, _ := echo["result"].(map[string]any)
	wr, _ := write["result"].(map[string]any)
	if er == nil || wr == nil {
		t.Fatalf("answers: %v, %v", echo, wr)
	}
	if m, _ := er["_meta"].(map[string]any); m[MetaReplayed] == true {
		t.Errorf("B's echo was answered from A's call: %v", er["content"])
	}
	if wr["isError"] == true {
		t.Errorf("B's fs.write was refused: %v", wr["content"])
	}
	if b, err := os.ReadFile(filepath.Join(ws, "x.txt")); err != nil || string(b) != "B" {
		t.Errorf("x.txt holds %q (%v), want B's write last", b, err)
	}
}

// A request id with a fraction is refused (-32600), on HTTP and on each
// element of a batch: the SDK would take it cut to an integer (1.5 as 1),
// so two ids would be one and a retry of a read would run again (review
// rev-mcp #5). Integer ids, in any spelling the SDK reads as one, pass.
func TestFractionalIDRefused(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	m := newRawMCP(t, g)
	resp, body, _ := m.post(`{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "-32600") {
		t.Errorf("id 1.5: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct {
		msg    string
		refuse bool
	}{
		{`{"jsonrpc":"2.0","id":4.7,"method":"tools/call","params":{}}`, true},
		{`[{"jsonrpc":"2.0","id":3,"method":"ping"},{"jsonrpc":"2.0","id":0.5,"method":"tools/call","params":{}}]`, true},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}`, false},
		{`{"jsonrpc":"2.0","id":4.0,"method":"tools/call","params":{}}`, false},
		{`{"jsonrpc":"2.0","id":"4.5","method":"tools/call","params":{}}`, false},
	} {
		if _, reject := prepare(g.seals, []byte(c.msg)); (reject != nil) != c.refuse {
			t.Errorf("%s: refused %v (%s), want %v", c.msg, reject != nil, reject, c.refuse)
		}
	}
}

// A batch (protocol 2025-03-26) is read element by element: a
// notifications/cancelled in it cancels the lean call it names, and a
// tools/call in it reusing the id of a call in flight is refused as a
// duplicate before it reaches the kernel (review rev-mcp #6).
func TestBatchElementsCancelAndDuplicate(t *testing.T) {
	gt := newGate()
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{Invoker: gt})
	gt.inner = kernelInvoker{k}
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(srv.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-03-26"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	m := &rawMCP{t: t, url: srv.URL, cs: cs}
	first := make(chan struct{})
	go func() {
		defer close(first)
		m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}}`)
	}()
	gt.wait(t, gt.entered)
	m.post(`[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}]`)
	select {
	case <-gt.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("notifications/cancelled in a batch did not cancel call 7")
	}
	<-first
	second := make(chan struct{})
	go func() {
		defer close(second)
		m.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}}`)
	}()
	gt.wait(t, gt.entered)
	resp, body, _ := m.post(`[{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"b"}}}]`)
	if !strings.Contains(string(body), "duplicate in-flight request ID 8") {
		t.Errorf("a batched call reusing id 8 in flight: %d %s", resp.StatusCode, body)
	}
	gt.release <- struct{}{}
	<-gt.ended
	<-second
}
