package mcpgateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
)

// Confirmer lets the gateway put a call that waits for an approval to the
// user of its MCP session, through the client (elicitation). The kernel
// in this process is one (ConfirmerOf); a gateway without one leaves every
// approval to the approvers.
type Confirmer interface {
	// Watch delivers the approval requests of session's calls as the
	// kernel makes them, until stop is called; stop may be called more
	// than once, and frees the watch whether or not requests are read.
	Watch(session string) (requests <-chan kernel.ApprovalRequest, stop func())
	// ConfirmInSession records the session user's decision, as
	// kernel.Kernel.ConfirmInSession.
	ConfirmInSession(id, token, session, decision, reason string) (kernel.ApprovalRequest, error)
	// Reread returns res, the result the kernel answered a call with, as
	// the call's agent may read it now: res itself while the call's
	// audit payload is kept; once an erasure removed that payload, the
	// call's result envelope as the kernel stores it since (without the
	// result, audit salt, provenance, risk basis and error message),
	// with res's receipt and replayed flag, and erased true.
	Reread(res *kernel.Result) (now *kernel.Result, erased bool, err error)
}

// ConfirmerOf is the Confirmer of an in-process kernel.
func ConfirmerOf(k *kernel.Kernel) Confirmer { return kernelConfirmer{k} }

type kernelConfirmer struct{ k *kernel.Kernel }

func (c kernelConfirmer) Watch(session string) (<-chan kernel.ApprovalRequest, func()) {
	sub := c.k.Subscribe(kernel.EventFilter{SessionID: session, Kinds: []string{kernel.EventConfirmationRequested}}, 64)
	out := make(chan kernel.ApprovalRequest, 64)
	stopped := make(chan struct{})
	go func() {
		defer close(out)
		for e := range sub.C {
			if e.Approval == nil {
				continue
			}
			// A reader that stopped reading (its call is asking its
			// client, for minutes) may never read out again: the stop
			// frees the forwarder whatever out holds.
			select {
			case out <- *e.Approval:
			case <-stopped:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() { once.Do(func() { close(stopped); sub.Close() }) }
}

func (c kernelConfirmer) ConfirmInSession(id, token, session, decision, reason string) (kernel.ApprovalRequest, error) {
	return c.k.ConfirmInSession(id, token, session, decision, reason)
}

func (c kernelConfirmer) Reread(res *kernel.Result) (*kernel.Result, bool, error) {
	if res.LedgerSeq == 0 {
		return res, false, nil // no audit record: nothing to erase
	}
	in := c.k.Inspector()
	// A call's audit record at depth full keeps its payload until an
	// erasure removes it, in the transaction that rewrites the stored
	// envelope: a payload still there means res is as the kernel would
	// answer it now. At depth commitments_only nothing is kept, so
	// nothing can be erased (kernel.ErrNothingToErase): res stands.
	kept, err := payloadKept(in, res.LedgerSeq)
	if err != nil || kept {
		return res, false, err
	}
	b, err := in.Operation(res.OperationID)
	if err != nil {
		return nil, false, err
	}
	var now kernel.Result
	if err := json.Unmarshal(b, &now); err != nil {
		return nil, false, fmt.Errorf("operation %s: stored result envelope: %w", res.OperationID, err)
	}
	// The receipt is the audit entry, which an erasure leaves whole.
	now.Receipt, now.Replayed = res.Receipt, res.Replayed
	return &now, true, nil
}

// payloadKept reports whether the audit record seq still holds its
// payload, or never held one to erase (depth commitments_only).
func payloadKept(in *kernel.Inspector, seq uint64) (bool, error) {
	kept := false
	err := in.ScanViews(seq, kernel.AccessAll, func(v kernel.EntryView) error {
		if v.Seq != seq {
			return errScanned
		}
		var body struct {
			Depth string `json:"payload_depth"`
		}
		if err := json.Unmarshal(v.Body, &body); err != nil {
			return fmt.Errorf("audit record %d: %w", seq, err)
		}
		kept = v.Payload != nil || body.Depth == kernel.DepthCommitmentsOnly
		return errScanned
	})
	if errors.Is(err, errScanned) {
		err = nil
	}
	return kept, err
}

// errScanned ends payloadKept's scan at its first entry.
var errScanned = errors.New("scanned")

// Elicitation answers and what they decide.
const (
	elicitAllow = "allow"
	elicitDeny  = "deny"
)

// confirmable reports whether the gateway may ask req's client: it has a
// Confirmer and the client declared the elicitation capability (form).
func (g *Gateway) confirmable(req *mcp.CallToolRequest) bool {
	if g.confirmer == nil || req.Session == nil {
		return false
	}
	ip := req.Session.InitializeParams()
	if ip == nil || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil {
		return false
	}
	el := ip.Capabilities.Elicitation
	return el.Form != nil || el.URL == nil
}

// confirmInput is the id of the gateway's one input request.
const confirmInput = "capkernel/confirm"

// pendingGrace is how long a call that asked its client stays resumable
// after it ended without the client coming back for its result.
const pendingGrace = 5 * time.Minute

// pendingCall is a call that asked its client for a decision and runs on
// in the kernel: until the client's retry (with the answer) resumes it
// (multi round-trip), or, asked within its request (ask), until it ends.
type pendingCall struct {
	session, tool, name string
	approval            kernel.ApprovalRequest
	cancel              context.CancelFunc
	done                chan struct{} // closed when res, err are set
	res                 *kernel.Result
	err                 error
}

// pendingCalls are the calls waiting for their client's retry, by the
// requestState handed out (128 random bits), and the calls whose
// question is open within their request (asking).
type pendingCalls struct {
	mu     sync.Mutex
	by     map[string]*pendingCall
	asking map[*pendingCall]bool
	// ended are the sessions whose input ended for good (stdio: the end
	// of stdin, the end of serving), kept so that a call reaching its
	// question after the sweep is cancelled too: the kernel evaluates a
	// call's policy after its line was read, so its question can come
	// after the end of the input that carried it.
	ended map[string]bool
}

// ask records pc as asking its client within its request, until the
// returned release: the end of its session (endSession) cancels it. For a
// session that ended for good (endInput) it cancels pc at once and
// reports false: no question is to be put.
func (p *pendingCalls) ask(pc *pendingCall) (release func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended[pc.session] {
		pc.cancel()
		return func() {}, false
	}
	if p.asking == nil {
		p.asking = map[*pendingCall]bool{}
	}
	p.asking[pc] = true
	return func() {
		p.mu.Lock()
		delete(p.asking, pc)
		p.mu.Unlock()
	}, true
}

// endSession cancels the calls of session that wait for their client's
// answer, which can no longer come (the session or its input ended):
// those asking within their request, and those waiting for a retry,
// which are forgotten (a retry naming one is refused as stale). The
// kernel ends each as cancelled, audited; no approver can let it run.
func (p *pendingCalls) endSession(session string) { p.end(session, false) }

// endInput ends session as endSession does, and for good: a call of it
// registered later (ask, add) is cancelled at once. The mark and the
// sweep are one step under p.mu, so no registration falls between them.
// Only for the stdio session, which is one per gateway: an HTTP
// session's mark would be kept for the life of the process.
func (p *pendingCalls) endInput(session string) { p.end(session, true) }

func (p *pendingCalls) end(session string, sticky bool) {
	p.mu.Lock()
	if sticky {
		if p.ended == nil {
			p.ended = map[string]bool{}
		}
		p.ended[session] = true
	}
	var ended []*pendingCall
	for pc := range p.asking {
		if pc.session == session {
			ended = append(ended, pc)
		}
	}
	for state, pc := range p.by {
		if pc.session == session {
			ended = append(ended, pc)
			delete(p.by, state)
		}
	}
	p.mu.Unlock()
	for _, pc := range ended {
		pc.cancel()
	}
}

// add records pc as waiting for its client's retry and returns the
// requestState naming it; for a session that ended for good (endInput)
// it cancels pc at once and reports false: no retry can come.
func (p *pendingCalls) add(pc *pendingCall) (state string, ok bool) {
	state = rand.Text()
	p.mu.Lock()
	if p.ended[pc.session] {
		p.mu.Unlock()
		pc.cancel()
		return "", false
	}
	p.by[state] = pc
	p.mu.Unlock()
	go func() {
		<-pc.done
		time.AfterFunc(pendingGrace, func() { p.take(state, pc.session) })
	}()
	return state, true
}

// holds reports whether a call of session is pending: running, or
// ended less than pendingGrace ago, its client yet to resume it.
func (p *pendingCalls) holds(session string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.by {
		if pc.session == session {
			return true
		}
	}
	return false
}

// take returns the call of session pending under state, which it
// forgets, or nil when state names none of session's (another session's
// stays pending).
func (p *pendingCalls) take(state, session string) *pendingCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.by[state]
	if pc == nil || pc.session != session {
		return nil
	}
	delete(p.by, state)
	return pc
}

// invokeConfirmable runs the call env (operation op) of req in the
// kernel and watches for its approval request. It returns the call's
// result, or, when the policy lets the session's user decide it, asks
// the user through the client: a client of protocol 2026-07-28 or later
// gets an input_required result (SEP-2322 multi round-trip: it answers in
// a retry carrying the requestState, which resume takes up); a client of
// an earlier protocol is asked with elicitation/create within the request
// (ask). The call runs on meanwhile, bounded by the kernel's approval
// timeout, so an approver can still decide first.
func (g *Gateway) invokeConfirmable(ctx context.Context, req *mcp.CallToolRequest, session, op, tool string, env []byte) (*kernel.Result, error, *mcp.CallToolResult) {
	reqs, unwatch := g.confirmer.Watch(session)
	defer unwatch()
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	pc := &pendingCall{session: session, tool: tool, name: req.Params.Name, cancel: cancel, done: make(chan struct{})}
	go func() {
		pc.res, pc.err = g.invoker.Invoke(cctx, env)
		close(pc.done)
	}()
	for {
		select {
		case <-pc.done:
			cancel()
			return pc.res, pc.err, nil
		case <-ctx.Done():
			cancel() // the kernel ends the call as cancelled, audited
			<-pc.done
			return pc.res, pc.err, nil
		case ar, ok := <-reqs:
			if !ok {
				reqs = nil
				continue
			}
			if ar.OperationID != op || !ar.SessionConfirm {
				continue
			}
			pc.approval = ar
			unwatch() // the call's own request is found: the session's others are not its to hold
			if !multiRoundTrip(req.Session) {
				g.ask(ctx, req.Session, pc)
				cancel()
				return pc.res, pc.err, nil
			}
			state, ok := g.pending.add(pc)
			if !ok {
				<-pc.done // cancelled: its input ended
				return pc.res, pc.err, nil
			}
			return nil, nil, &mcp.CallToolResult{RequestState: state,
				InputRequests: mcp.InputRequestMap{confirmInput: confirmParams(pc.approval)}}
		}
	}
}

// multiRoundTrip reports whether the client of ss negotiated a protocol
// with multi round-trip requests (SEP-2322), which answers a question in
// a retry of its request rather than within it.
func multiRoundTrip(ss *mcp.ServerSession) bool {
	ip := ss.InitializeParams()
	return ip != nil && ip.ProtocolVersion >= leanProtocolLimit
}

// ask puts pc's question to the client of ss within the call's request
// (ctx: elicitation/create) and returns once pc has ended. The call is
// bound to its request as any other: when the client cannot answer (its
// elicitation/create fails), cancels the request, or its session or input
// ends (pendingCalls.endSession), the call is cancelled, and the kernel
// ends it as cancelled, audited, so that no approver can let it run after
// its client was told it failed; when the call ends first (an approver
// decided, the approval timed out), the question is withdrawn (the SDK
// sends notifications/cancelled for it) and the call's result answered at
// once. The caller's progress notifications go on throughout.
func (g *Gateway) ask(ctx context.Context, ss *mcp.ServerSession, pc *pendingCall) {
	qctx, withdraw := context.WithCancel(ctx)
	defer withdraw()
	go func() {
		select {
		case <-pc.done:
			withdraw()
		case <-qctx.Done():
		}
	}()
	release, ok := g.pending.ask(pc)
	if !ok {
		<-pc.done // cancelled: its input ended, nobody can answer
		return
	}
	ans, err := ss.Elicit(qctx, confirmParams(pc.approval))
	release()
	select {
	case <-pc.done:
		return // decided first: the answer, if any, comes too late
	default:
	}
	if err != nil {
		pc.cancel()
		<-pc.done
		return
	}
	g.decide(pc, ans)
	select {
	case <-pc.done:
	case <-ctx.Done():
		pc.cancel()
		<-pc.done
	}
}

// resume takes up pc, a call that asked its client (req, the client's
// retry, carries its requestState and the answer): it records a clear
// answer as the session user's decision and returns the call's result
// once the kernel has it.
func (g *Gateway) resume(ctx context.Context, req *mcp.CallToolRequest, pc *pendingCall) (*mcp.CallToolResult, error) {
	p := req.Params
	if ans, ok := p.InputResponses[confirmInput].(*mcp.ElicitResult); ok {
		g.decide(pc, ans)
	}
	stop := g.progress(ctx, req)
	defer stop()
	select {
	case <-pc.done:
	case <-ctx.Done():
		pc.cancel()
		<-pc.done
	}
	pc.cancel()
	if pc.err != nil {
		return result(nil, pc.err, pc.tool, pc.name, g.typed[pc.name]), nil
	}
	// The call may have ended long before the retry, and been erased
	// since: the result is read again rather than served as held.
	res, erased, err := g.confirmer.Reread(pc.res)
	if err != nil {
		return errorResult(kernel.ErrInternal, fmt.Sprintf("operation %s ended, but its result could not be read again: %v", pc.res.OperationID, err), nil), nil
	}
	r := result(res, nil, pc.tool, pc.name, g.typed[pc.name])
	if erased && !r.IsError {
		r.Content = []mcp.Content{&mcp.TextContent{Text: kernel.ErasedMessage}}
	}
	return r, nil
}

// decide records the user's answer: accept with "allow" allows, accept
// with "deny" or decline denies. A dismissed question (cancel) leaves the
// approval to the approvers: the call waits on, as it would without a
// client that can ask.
func (g *Gateway) decide(pc *pendingCall, ans *mcp.ElicitResult) {
	decision, reason := "", ""
	switch ans.Action {
	case "accept":
		decision, _ = ans.Content["decision"].(string)
		reason, _ = ans.Content["reason"].(string)
	case "decline":
		decision = elicitDeny
	}
	if decision != elicitAllow && decision != elicitDeny {
		return
	}
	if reason == "" {
		reason = "answered through the MCP client (elicitation)"
	}
	// A refusal (an approver decided first, the policy changed) is in
	// the ledger; the call goes on with whatever decision stands.
	_, _ = g.confirmer.ConfirmInSession(pc.approval.ID, g.token, pc.session, decision, reason)
}

// confirmParams is the question: a form with the decision and a reason.
func confirmParams(ar kernel.ApprovalRequest) *mcp.ElicitParams {
	return &mcp.ElicitParams{
		Mode:    "form",
		Message: confirmMessage(ar),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"decision": map[string]any{"type": "string", "enum": []string{elicitAllow, elicitDeny}, "title": "Decision",
					"description": "allow runs the call once, as shown; deny refuses it"},
				"reason": map[string]any{"type": "string", "title": "Reason", "description": "recorded in the audit log"},
			},
			"required": []string{"decision"},
		},
	}
}

// confirmMessage is what the user reads: the tool, a summary of the
// arguments, what it would change and why it needs a decision.
func confirmMessage(ar kernel.ApprovalRequest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Allow %s (%s) for agent %s?\n", ar.ToolID, ar.SideEffect, ar.AgentID)
	fmt.Fprintf(&b, "Call: %s\n", ar.InputSummary)
	if len(ar.ProjectedEffects) > 0 {
		fmt.Fprintf(&b, "Effects: %s\n", strings.Join(ar.ProjectedEffects, "; "))
	}
	fmt.Fprintf(&b, "Risk %.2f: %s\n", ar.RiskScore, strings.Join(ar.RiskBasis, "; "))
	fmt.Fprintf(&b, "Approval %s, decide by %s.", ar.ID, ar.DecideBy)
	return b.String()
}

// newOperationID names a call before the kernel sees it, so its approval
// request can be told apart from the session's other calls.
func newOperationID() string { return uuid.Must(uuid.NewV7()).String() }
