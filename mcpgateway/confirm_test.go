package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
)

// sessionPolicy is the default bundle with WRITE calls prompted and
// confirmable in the session.
func sessionPolicy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := "../policy/rego"
	for _, f := range []string{"capkernel.rego"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	var data map[string]any
	b, _ := os.ReadFile(filepath.Join(src, "data.json"))
	if err := json.Unmarshal(b, &data); err != nil {
		t.Fatal(err)
	}
	conf := data["capkernel"].(map[string]any)["config"].(map[string]any)["confirmation"].(map[string]any)
	conf["default"].(map[string]any)["WRITE"] = "prompt"
	conf["session"] = map[string]any{"WRITE": true}
	b, _ = json.Marshal(data)
	os.WriteFile(filepath.Join(dir, "data.json"), b, 0o644)
	return dir
}

// A soft_gate call the policy lets the session confirm is put to the
// user of a client that declares elicitation: the tool, the arguments and
// the risk basis; "allow" runs it, recorded as the session user's
// decision (bound to the call, in the events and the audit record);
// "decline" refuses it. A write under a sensitive path, which the policy
// keeps for approvers, is never put to the user; nor is any call of a
// client without the capability.
//
// Both ways of asking: protocol 2026-07-28's input_required result and
// retry (SEP-2322), and, for a client of 2025-11-25 (the TypeScript SDK's),
// elicitation/create within the request.
func TestElicitationConfirms(t *testing.T) {
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(version, func(t *testing.T) { testElicitation(t, version) })
	}
}

// newGatedWriteGateway opens a kernel whose policy gates fs.write
// (sessionPolicy) with approvals expiring after timeout, and a gateway for
// agent-1's token of fs.write on a fresh workspace ws (cfg.Token, its jti
// cfg.TokenID); confirm makes the gateway ask its clients (ConfirmerOf);
// audit, when not nil, is the kernel's audit configuration.
func newGatedWriteGateway(t *testing.T, timeout time.Duration, confirm bool, audit *kernel.AuditConfig) (k *kernel.Kernel, g *Gateway, ws string, cfg Config) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := kernel.Init(dir); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: dir, PolicyDir: sessionPolicy(t), ApprovalTimeout: timeout, Audit: audit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	ws = t.TempDir()
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent-1", Expiry: time.Now().Add(time.Hour),
		Cap: captoken.Capability{Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defs, _ := k.Tools(tok, "mcp")
	cfg = Config{Invoker: kernelInvoker{k}, Token: tok, TokenID: cl.ID, AgentID: "agent-1", PolicyHash: k.PolicyHash(), StdioSession: "sess-1"}
	if confirm {
		cfg.Confirmer = ConfirmerOf(k)
	}
	if err := json.Unmarshal(defs, &cfg.Tools); err != nil {
		t.Fatal(err)
	}
	return k, New(cfg), ws, cfg
}

func testElicitation(t *testing.T, version string) {
	ctx := context.Background()
	k, g, ws, cfg := newGatedWriteGateway(t, 2*time.Second, true, nil)
	tok := cfg.Token

	var mu sync.Mutex
	var asked []string
	answer := "allow"
	connect := func(elicit bool) *mcp.ClientSession {
		opts := &mcp.ClientOptions{}
		if elicit {
			opts.ElicitationHandler = func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, r.Params.Message)
				if answer == "decline" {
					return &mcp.ElicitResult{Action: "decline"}, nil
				}
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": answer, "reason": "I asked for it"}}, nil
			}
		}
		sc, cc := net.Pipe()
		ct := &mcp.IOTransport{Reader: cc, Writer: cc}
		if _, err := g.server.Connect(ctx, lineTransport{in: sc, out: sc, seals: g.seals}, nil); err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	events := k.Subscribe(kernel.EventFilter{Kinds: []string{kernel.EventConfirmationResolved}}, 16)
	defer events.Close()

	cs := connect(true)
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated protocol %s, want %s", got, version)
	}
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "notes.txt", "content": "hi"}})
	if err != nil || r.IsError {
		t.Fatalf("confirmed write: %v %v", r, err)
	}
	if len(asked) != 1 || !strings.Contains(asked[0], "fs.write") || !strings.Contains(asked[0], `"path":"notes.txt"`) || !strings.Contains(asked[0], "write in scope") {
		t.Fatalf("the question: %q", asked)
	}
	e := <-events.C
	if e.Approval == nil || e.Approval.State != kernel.ApprovalAllowed || e.Approval.Channel != kernel.ChannelSession ||
		e.Approval.DecidedBy != "session:sess-1" || e.Approval.TokenID != cfg.TokenID || e.Approval.ExpiresAt == "" || e.Approval.PolicyHash != k.PolicyHash() {
		t.Fatalf("resolved event: %+v", e.Approval)
	}
	info, err := k.Inspector().Receipt(r.Meta[MetaReceiptID].(string))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(info); !strings.Contains(string(b), "session:sess-1") || !strings.Contains(string(b), "I asked for it") {
		t.Fatalf("the audit record lacks the session user's decision: %s", b)
	}

	answer = "decline"
	r, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "other.txt", "content": "x"}})
	if !r.IsError || !strings.HasPrefix(r.Content[0].(*mcp.TextContent).Text, "approval_denied: ") {
		t.Fatalf("declined write: %v", r.Content[0])
	}
	<-events.C

	// A retry naming no waiting call is refused by the kernel, audited
	// (rev-mcp #4: the gateway refused it alone, unrecorded); nothing runs.
	r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "x.txt", "content": "x"}, RequestState: "bogus"})
	if err != nil || !r.IsError || r.Content[0].(*mcp.TextContent).Text != kernel.ErrInvalidArgs+": "+kernel.StaleRequestState {
		t.Fatalf("unknown requestState: %v %v", r, err)
	}
	rid, _ := r.Meta[MetaReceiptID].(string)
	info, err = k.Inspector().Receipt(rid)
	if err != nil {
		t.Fatalf("the refusal of an unknown requestState has no receipt (%q): %v", rid, err)
	}
	if b, _ := json.Marshal(info); !strings.Contains(string(b), `"error_class":"invalid_args"`) || !strings.Contains(string(b), `"tool_id":"fs.write"`) || !strings.Contains(string(b), `"agent_id":"agent-1"`) {
		t.Fatalf("the audit record of the refusal: %s", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused retry wrote x.txt: %v", err)
	}

	// pending waits for the one pending approval.
	pending := func() kernel.ApprovalRequest {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if p := k.Approvals(false); len(p) == 1 {
				return p[0]
			}
		}
		t.Fatal("no pending approval")
		return kernel.ApprovalRequest{}
	}
	other, _, err := k.MintToken(captoken.Claims{Subject: "agent-2", Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Tools: []string{"fs.write"}}})
	if err != nil {
		t.Fatal(err)
	}

	// Sensitive: the policy keeps it for approvers. The user is never
	// asked, and the kernel refuses a session decision on it.
	mu.Lock()
	n := len(asked)
	mu.Unlock()
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "Makefile", "content": "x"}})
		done <- r
	}()
	ar := pending()
	if ar.SessionConfirm {
		t.Fatalf("a sensitive write is session-confirmable: %+v", ar)
	}
	if _, err := k.ConfirmInSession(ar.ID, tok, "sess-1", "allow", ""); !errors.Is(err, kernel.ErrApprovalForbidden) {
		t.Fatalf("session decision on a sensitive write: %v", err)
	}
	r = <-done
	if !r.IsError || !strings.HasPrefix(r.Content[0].(*mcp.TextContent).Text, "approval_timeout: ") || len(asked) != n {
		t.Fatalf("sensitive write: %v, asked %d times", r.Content[0], len(asked)-n)
	}
	<-events.C

	// A client without elicitation is not asked; the kernel takes a
	// session decision only from the call's own token and session.
	plain := connect(false)
	go func() {
		// (Both clients are in the one session of a stdio gateway: a key
		// of its own keeps the call apart from the first client's.)
		r, _ := plain.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "third.txt", "content": "x"},
			Meta: mcp.Meta{MetaIdempotencyKey: "plain-1"}})
		done <- r
	}()
	ar = pending()
	for _, c := range []struct{ token, session string }{{tok, "sess-2"}, {other, "sess-1"}, {tok, ""}} {
		if _, err := k.ConfirmInSession(ar.ID, c.token, c.session, "allow", ""); !errors.Is(err, kernel.ErrApprovalForbidden) {
			t.Fatalf("session decision by session %q: %v", c.session, err)
		}
	}
	if _, err := k.ConfirmInSession(ar.ID, tok, "sess-1", "allow", "fine"); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.IsError || len(asked) != n {
		t.Fatalf("write confirmed by the session: %v, asked %d times", r.Content[0], len(asked)-n)
	}
}

// A requestState is taken by its own session only: another session naming
// it (refused, as any unknown state) leaves the call pending for its own.
func TestPendingTakenByItsSessionOnly(t *testing.T) {
	p := &pendingCalls{by: map[string]*pendingCall{}}
	pc := &pendingCall{session: "a", done: make(chan struct{})}
	defer close(pc.done)
	state, _ := p.add(pc)
	if p.take(state, "b") != nil {
		t.Fatal("session b took session a's pending call")
	}
	if !p.holds("a") || p.holds("b") {
		t.Fatal("holds: want a's call pending, none of b's")
	}
	if p.take(state, "a") != pc {
		t.Fatal("session a could not take its own call after b named its state")
	}
	if p.take(state, "a") != nil {
		t.Fatal("a state was taken twice")
	}
}

// The end of a stdio session's input is sticky: a call of it that reaches
// its question (ask) or the multi round-trip list (add) after the
// end-of-input sweep is cancelled at once, registered nowhere; another
// session's calls are untouched. The sweep was one-shot: a gated call
// read before the end of a piped input, whose approval request came after
// it, was asked anyway and ran when an approver allowed it (rev12 #1).
func TestEndedInputCancelsLaterCalls(t *testing.T) {
	for _, c := range []struct {
		name     string
		register func(p *pendingCalls, pc *pendingCall) bool
	}{
		{"ask", func(p *pendingCalls, pc *pendingCall) bool { release, ok := p.ask(pc); release(); return ok }},
		{"add", func(p *pendingCalls, pc *pendingCall) bool { _, ok := p.add(pc); return ok }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &pendingCalls{by: map[string]*pendingCall{}}
			p.endInput("a")
			call := func(session string) (pc *pendingCall, cancelled *bool) {
				cancelled = new(bool)
				return &pendingCall{session: session, done: make(chan struct{}), cancel: func() { *cancelled = true }}, cancelled
			}
			pa, ca := call("a")
			if c.register(p, pa) || !*ca {
				t.Errorf("a call of the ended session: registered, cancelled %v; want refused and cancelled", *ca)
			}
			pb, cb := call("b")
			if !c.register(p, pb) || *cb {
				t.Errorf("a call of another session: refused or cancelled (%v)", *cb)
			}
			close(pb.done)
			if p.holds("a") {
				t.Error("the ended session holds a pending call")
			}
		})
	}
}

// A call that asked its client and ended before the client came back is
// answered on the retry as the kernel lets its caller read it then:
// as the kernel answered it while its audit payload is kept (at depth
// commitments_only too, where the caller alone holds the parts), and,
// once an erasure removed that payload, as the kernel stores it after the
// erasure, without the result, the audit salt or an error's message: the
// gateway served the copy it held (rev-leaks #7), from which a short
// erased secret was one brute force away (fs.write's content hash).
func TestResumeAfterErasure(t *testing.T) {
	const content = "4711"
	commitmentsOnly := &kernel.AuditConfig{Depth: map[string]string{"fs.write": kernel.DepthCommitmentsOnly}}
	cases := []struct {
		name     string
		audit    *kernel.AuditConfig
		decision string // the approver's, before the client answers
		erase    bool   // the admin erases the call before the client answers
		want     string // the retry's text; "" for the written file's result
	}{
		{"allowed, kept", nil, "allow", false, ""},
		{"allowed, erased", nil, "allow", true, kernel.ErasedMessage},
		{"denied, erased", nil, "deny", true, kernel.ErrApprovalDenied + ": " + kernel.ErasedMessage},
		{"commitments_only, kept", commitmentsOnly, "allow", false, ""},
		// Nothing is kept, so the erasure is refused (nothing to
		// erase) and the retry gets the caller's own result.
		{"commitments_only, erasure refused", commitmentsOnly, "allow", true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k, g, _, _ := newGatedWriteGateway(t, time.Minute, true, tc.audit)
			approver, err := k.Mint(kernel.TokenRequest{AgentID: "person-1", Role: captoken.RoleApprover})
			if err != nil {
				t.Fatal(err)
			}
			ended := k.Subscribe(kernel.EventFilter{SessionID: "sess-1", Kinds: []string{kernel.EventCompleted, kernel.EventFailed, kernel.EventDenied}}, 16)
			defer ended.Close()
			var op string
			opts := &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				// Before the user answers, an approver decides, the call
				// ends, and (erase) the admin erases it.
				var ar kernel.ApprovalRequest
				for deadline := time.Now().Add(10 * time.Second); ar.ID == "" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					if p := k.Approvals(false); len(p) == 1 {
						ar = p[0]
					}
				}
				op = ar.OperationID
				if _, err := k.Decide(ar.ID, approver.Token, tc.decision, "reason naming "+content); err != nil {
					return nil, err
				}
				for e := range ended.C {
					if e.OperationID == op {
						break
					}
				}
				if tc.erase {
					_, err := k.Erase(ctx, op, "the subject asked")
					if tc.audit != nil && errors.Is(err, kernel.ErrNothingToErase) {
						err = nil
					}
					if err != nil {
						return nil, err
					}
				}
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow"}}, nil
			}}
			sc, cc := net.Pipe()
			if _, err := g.server.Connect(ctx, lineTransport{in: sc, out: sc, seals: g.seals}, nil); err != nil {
				t.Fatal(err)
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(ctx, &mcp.IOTransport{Reader: cc, Writer: cc},
				&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			args := map[string]any{"path": "pin.txt", "content": content}
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: args})
			if err != nil {
				t.Fatal(err)
			}
			text := r.Content[0].(*mcp.TextContent).Text
			salt, _ := r.Meta[MetaAuditSalt].(string)
			if r.Meta[MetaOperationID] != op || r.Meta[MetaReceiptID] == nil {
				t.Fatalf("the retry's _meta %v names no receipt of operation %s", r.Meta, op)
			}
			if tc.want != "" {
				if text != tc.want || salt != "" {
					t.Fatalf("after the erasure the retry got %q, salt %q; want %q and no salt", text, salt, tc.want)
				}
				return
			}
			if r.IsError || !strings.Contains(text, `"hash":"`+digest.Sum([]byte(content))+`"`) {
				t.Fatalf("the retry of a kept call got %q, want the write's result", text)
			}
			info, err := k.Inspector().Receipt(r.Meta[MetaReceiptID].(string))
			if err != nil {
				t.Fatal(err)
			}
			es, err := k.Inspector().Entries(info.Seq, 1)
			if err != nil || len(es) != 1 {
				t.Fatalf("audit entry %d: %v", info.Seq, err)
			}
			sent, _ := json.Marshal(args)
			if err := kernel.CheckPayload(es[0], kernel.Payload{Salt: salt, Args: sent}); err != nil {
				t.Fatalf("the retry's salt %q does not open the record: %v", salt, err)
			}
		})
	}
}

// watchForwarders counts the goroutines of kernelConfirmer.Watch that
// forward a session's confirmation requests.
func watchForwarders() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "mcpgateway.kernelConfirmer.Watch.func1")
}

// A watch whose reader stopped reading (its call asking its client, for
// minutes) ends at its stop however many of the session's confirmation
// requests came meanwhile. Its forwarder blocked on a full channel that
// nobody read again, for the life of the process, once 64 had (rev12 #5).
func TestWatchStopsUnread(t *testing.T) {
	k, _, _, cfg := newGatedWriteGateway(t, time.Minute, true, nil)
	before := watchForwarders()
	_, stop := ConfirmerOf(k).Watch(cfg.StdioSession)
	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	defer func() { cancel(); calls.Wait() }()
	const n = 140 // over the watch's buffers (64 each)
	for i := range n {
		env, _ := json.Marshal(kernel.Envelope{ToolID: "fs.write", AgentID: cfg.AgentID, CapabilityToken: cfg.Token, CapabilityTokenID: cfg.TokenID, PolicyHash: cfg.PolicyHash, IdempotencyKey: fmt.Sprintf("w%d", i),
			Args:       mustJSON(map[string]any{"path": fmt.Sprintf("w%d.txt", i), "content": "x"}),
			Provenance: mustJSON(map[string]any{"session_id": cfg.StdioSession, "source": "mcp"})})
		calls.Add(1)
		go func() {
			defer calls.Done()
			if res, err := cfg.Invoker.Invoke(ctx, env); ctx.Err() == nil {
				t.Errorf("call %d ended before its approval: %v %v", i, res.Error, err)
			}
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); len(k.Approvals(false)) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls asked for an approval", len(k.Approvals(false)), n)
		}
	}
	stop()
	stop() // a second stop is harmless
	for deadline := time.Now().Add(10 * time.Second); watchForwarders() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the watch's forwarder still runs after its stop (%d)", watchForwarders()-before)
		}
	}
}
