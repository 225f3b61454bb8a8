package mcpgateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// askVersion is the protocol of the clients asked within their request
// (elicitation/create), the TypeScript SDK's and the Go SDK's default.
const askVersion = "2025-11-25"

// connectStdio connects a Go SDK client of protocol askVersion with opts
// to g over a stdio-like pipe.
func connectStdio(t *testing.T, g *Gateway, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	sc, cc := net.Pipe()
	if _, err := g.server.Connect(context.Background(), lineTransport{in: sc, out: sc, seals: g.seals}, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(context.Background(),
		&mcp.IOTransport{Reader: cc, Writer: cc}, &mcp.ClientSessionOptions{ProtocolVersion: askVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// onePending waits for k's one pending approval.
func onePending(t *testing.T, k *kernel.Kernel) kernel.ApprovalRequest {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p := k.Approvals(false); len(p) == 1 {
			return p[0]
		}
	}
	t.Fatal("no pending approval")
	return kernel.ApprovalRequest{}
}

// checkCancelled checks that the call of approval ar ended cancelled, in
// an audited event (ended, a subscription of the session's ended calls),
// that its approval is no longer pending, that an approver can no longer
// let it run and that it did not write file.
func checkCancelled(t *testing.T, k *kernel.Kernel, ended *kernel.Subscription, ar kernel.ApprovalRequest, ws, file string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case e := <-ended.C:
			if e.OperationID != ar.OperationID {
				continue
			}
			if e.ErrorClass != kernel.ErrCancelled {
				t.Fatalf("the call ended %s (%s %s), want cancelled", e.Kind, e.ErrorClass, e.Message)
			}
			found = true
		case <-timeout:
			t.Fatalf("the call of approval %s never ended (still pending: %d)", ar.ID, len(k.Approvals(false)))
		}
	}
	if p := k.Approvals(false); len(p) != 0 {
		t.Fatalf("approvals still pending after the call ended: %+v", p)
	}
	alice, err := k.Mint(kernel.TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Decide(ar.ID, alice.Token, "allow", "later"); err == nil {
		t.Error("an approver could still allow the call after it ended")
	}
	if _, err := os.Stat(filepath.Join(ws, file)); err == nil {
		t.Error("the write ran after its request ended")
	}
}

// A gated call whose question is put to its client within the request
// (protocol before 2026-07-28: elicitation/create) ends with its request:
// when the client's elicitation/create fails (no UI, its own timeout),
// when the client cancels the tools/call, when its input ends (stdio)
// and when its session ends (DELETE, the idle end), the call is cancelled
// and audited so, and no approver can let it run later. It waited for
// approvers after its client was told it failed or had cancelled it, and
// wrote when one allowed it; a DELETE hung until the client answered the
// question (rev10-mcp #1 a–c).
func TestQuestionEndsWithRequest(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest
	}{
		{"elicitation fails", func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest {
			var ar kernel.ApprovalRequest
			cs := connectStdio(t, g, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				ar = onePending(t, k)
				return nil, errors.New("no UI to ask the user")
			}})
			r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": file, "content": "hi"}})
			if err != nil {
				t.Fatalf("the client got no result: %v", err)
			}
			if !r.IsError || !strings.HasPrefix(r.Content[0].(*mcp.TextContent).Text, kernel.ErrCancelled+": ") || r.Meta[MetaReceiptID] == nil {
				t.Fatalf("the client got %v %v, want a cancelled call's receipted error", r.Content[0], r.Meta)
			}
			return ar
		}},
		{"client cancels", func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest {
			asked := make(chan kernel.ApprovalRequest, 1)
			cs := connectStdio(t, g, &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				asked <- onePending(t, k)
				<-ctx.Done()
				return nil, ctx.Err()
			}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": file, "content": "hi"}})
				done <- err
			}()
			ar := <-asked
			cancel() // notifications/cancelled
			<-done
			return ar
		}},
		{"stdio input ends", func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			served := make(chan error, 1)
			go func() { served <- g.serveIO(context.Background(), inR, outW) }()
			lines := bufio.NewScanner(outR)
			lines.Buffer(nil, 1<<20)
			go func() {
				io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+askVersion+`","capabilities":{"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}}`+"\n")
				io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
				io.WriteString(inW, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"`+file+`","content":"hi"}}}`+"\n")
			}()
			for lines.Scan() {
				if strings.Contains(lines.Text(), `"method":"elicitation/create"`) {
					break
				}
			}
			ar := onePending(t, k)
			go io.Copy(io.Discard, outR)
			inW.Close() // the client exits with the question open
			select {
			case err := <-served:
				if err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("serveIO: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("serveIO still serving after the client's input ended")
			}
			return ar
		}},
		{"DELETE", func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest {
			url, sid, ar := askOverHTTP(t, k, g, file)
			req, _ := http.NewRequest(http.MethodDelete, url, nil)
			req.Header.Set(sessionIDHeader, sid)
			req.Header.Set(protocolVersionHeader, askVersion)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil {
				t.Fatalf("DELETE of the session with the question open: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent || live(g, sid) {
				t.Fatalf("DELETE: %s, session live %v", resp.Status, live(g, sid))
			}
			return ar
		}},
		{"idle end", func(t *testing.T, k *kernel.Kernel, g *Gateway, file string) kernel.ApprovalRequest {
			_, sid, ar := askOverHTTP(t, k, g, file)
			g.endSession(sid) // what the idle count calls
			if live(g, sid) {
				t.Fatal("the session is live after its end")
			}
			return ar
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, g, ws, _ := newGatedWriteGateway(t, time.Minute, true, nil)
			ended := k.Subscribe(kernel.EventFilter{Kinds: []string{kernel.EventCompleted, kernel.EventFailed, kernel.EventDenied}}, 64)
			defer ended.Close()
			file := strings.ReplaceAll(c.name, " ", "_") + ".txt"
			ar := c.run(t, k, g, file)
			checkCancelled(t, k, ended, ar, ws, file)
		})
	}
}

// askOverHTTP serves g over HTTP to a Go SDK client of protocol
// askVersion that starts a gated write of file and never answers its
// question; it returns once the question is open, with the server's URL,
// the session and the call's approval.
func askOverHTTP(t *testing.T, k *kernel.Kernel, g *Gateway, file string) (url, sid string, ar kernel.ApprovalRequest) {
	t.Helper()
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(srv.Close)
	asked := make(chan kernel.ApprovalRequest, 1)
	opts := &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked <- onePending(t, k)
		<-ctx.Done() // the user never answers; the question is withdrawn
		return nil, ctx.Err()
	}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: askVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": file, "content": "hi"}})
	return srv.URL, cs.ID(), <-asked
}

// When an approver decides while the client's question is open, the
// question is withdrawn (its elicitation/create cancelled) and the
// tools/call answered at once with the call's result: the client waited
// on the moot question until its user answered it (rev10-mcp #1e).
func TestApproverFirstWithdrawsQuestion(t *testing.T) {
	k, g, ws, _ := newGatedWriteGateway(t, time.Minute, true, nil)
	alice, err := k.Mint(kernel.TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	if err != nil {
		t.Fatal(err)
	}
	withdrawn := make(chan struct{})
	cs := connectStdio(t, g, &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		ar := onePending(t, k)
		if _, err := k.Decide(ar.ID, alice.Token, "allow", "fine"); err != nil {
			t.Error(err)
		}
		<-ctx.Done() // the user has not answered
		close(withdrawn)
		return nil, ctx.Err()
	}})
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "a.txt", "content": "hi"}})
	if err != nil || r.IsError {
		t.Fatalf("the approved write: %v %v", r, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); err != nil {
		t.Fatalf("the approved write did not run: %v", err)
	}
	select {
	case <-withdrawn:
	case <-time.After(10 * time.Second):
		t.Fatal("the question was not withdrawn after the call ended")
	}
}

// A client that gave a progress token gets notifications/progress while
// its question is open, as while the call waits for approvers: a client
// that resets its request timeout on progress (the TypeScript SDK's
// resetTimeoutOnProgress) timed the call out while its user read the
// question (rev10-mcp #1d).
func TestProgressWhileAsking(t *testing.T) {
	_, g, _, _ := newGatedWriteGateway(t, time.Minute, true, nil)
	g.progressEvery = 10 * time.Millisecond
	progress := make(chan struct{}, 16)
	cs := connectStdio(t, g, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			// The user reads the question until two notifications came
			// after it was asked.
			for len(progress) > 0 {
				<-progress
			}
			for range 2 {
				select {
				case <-progress:
				case <-time.After(10 * time.Second):
					t.Error("no notifications/progress while the question is open")
				}
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow"}}, nil
		},
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			select {
			case progress <- struct{}{}:
			default:
			}
		},
	})
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "p.txt", "content": "hi"},
		Meta: mcp.Meta{"progressToken": "tok"}})
	if err != nil || r.IsError {
		b, _ := json.Marshal(r)
		t.Fatalf("the confirmed write: %s %v", b, err)
	}
}

// goneWriter is a client's end of stdout that fails with EPIPE once the
// client has gone.
type goneWriter struct {
	mu   sync.Mutex
	gone bool
}

func (w *goneWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return 0, syscall.EPIPE
	}
	return len(p), nil
}

// A stdio client that exits while a gated call waits for an approver
// (with a progress token): the gateway's next write fails, and serving
// ends, the call cancelled and audited. serveIO waited on for the call's
// answer, which the SDK no longer writes after a failed write, forever
// (rev10-mcp #2).
func TestClientGoneEndsStdio(t *testing.T) {
	k, g, ws, _ := newGatedWriteGateway(t, time.Minute, false, nil)
	g.progressEvery = 10 * time.Millisecond
	ended := k.Subscribe(kernel.EventFilter{Kinds: []string{kernel.EventCompleted, kernel.EventFailed, kernel.EventDenied}}, 64)
	defer ended.Close()
	in, client := io.Pipe()
	out := &goneWriter{}
	served := make(chan error, 1)
	go func() { served <- g.serveIO(context.Background(), in, out) }()
	io.WriteString(client, strictInit+"\n"+strictInitialized+"\n")
	io.WriteString(client, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"gone.txt","content":"x"},"_meta":{"progressToken":"p"}}}`+"\n")
	ar := onePending(t, k)
	out.mu.Lock()
	out.gone = true
	out.mu.Unlock()
	client.Close()
	select {
	case <-served:
	case <-time.After(30 * time.Second):
		t.Fatalf("serveIO still serving after its client went (approvals pending %d)", len(k.Approvals(false)))
	}
	checkCancelled(t, k, ended, ar, ws, "gone.txt")
}

// The end of serving stdio (ServeStdio's ctx: kernelctl mcp's SIGTERM or
// SIGINT) ends the session's calls with the client still connected: a
// gated call with its question open, with its question dismissed (the
// client answered cancel: it waits for approvers) and one whose client
// cannot be asked, each cancelled and audited, and serving returns. The
// SDK's close waited for the calls without cancelling them: serving ran
// on until an approver decided or the approval timed out, and an
// approver's allow ran the write after the gateway was stopped (rev12 #2).
func TestStdioServeEndCancelsCalls(t *testing.T) {
	for _, c := range []struct {
		name, caps, answer string // answer: the client's answer to the question, if any
		confirm            bool   // the gateway asks its clients
	}{
		{"question open", `{"elicitation":{}}`, "", true},
		{"question dismissed", `{"elicitation":{}}`, `{"action":"cancel"}`, true},
		{"no question", `{}`, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k, g, ws, _ := newGatedWriteGateway(t, time.Minute, c.confirm, nil)
			ended := k.Subscribe(kernel.EventFilter{Kinds: []string{kernel.EventCompleted, kernel.EventFailed, kernel.EventDenied}}, 64)
			defer ended.Close()
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			defer inW.Close() // the client stays connected throughout
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			served := make(chan error, 1)
			go func() { served <- g.serveIO(ctx, inR, outW) }()
			file := strings.ReplaceAll(c.name, " ", "_") + ".txt"
			go func() {
				io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+askVersion+`","capabilities":`+c.caps+`,"clientInfo":{"name":"t","version":"1"}}}`+"\n")
				io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
				io.WriteString(inW, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"`+file+`","content":"hi"}}}`+"\n")
			}()
			lines := bufio.NewScanner(outR)
			if c.confirm { // the question is put before the approval is read
				for lines.Scan() {
					if l := lines.Text(); strings.Contains(l, `"method":"elicitation/create"`) {
						if c.answer != "" {
							var m struct{ ID json.RawMessage }
							json.Unmarshal([]byte(l), &m)
							io.WriteString(inW, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":`+c.answer+`}`+"\n")
						}
						break
					}
				}
			}
			go io.Copy(io.Discard, outR)
			ar := onePending(t, k)
			stop() // the signal
			select {
			case <-served:
			case <-time.After(30 * time.Second):
				t.Fatalf("serveIO still serving after its ctx ended (approvals pending %d)", len(k.Approvals(false)))
			}
			checkCancelled(t, k, ended, ar, ws, file)
		})
	}
}
