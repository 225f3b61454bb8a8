package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Gated calls. A call the endpoint holds for an approval waits, by default,
// for the endpoint's approval timeout (5 minutes for kernelctl serve). The
// suite never waits that long: a case that checks a gated call is refused
// before it runs decides the approval itself, with an approver token it
// mints through the admin API, and only the two approval_timeout cases
// wait for the timeout, when setup found it short (maxApprovalWait).

// maxApprovalWait is the longest approval timeout the approval_timeout
// cases wait out; against a longer one they skip, saying so.
const maxApprovalWait = 45 * time.Second

// pendingApproval is an entry of GET /v1/approvals.
type pendingApproval struct {
	ID           string `json:"approval_id"`
	OperationID  string `json:"operation_id"`
	RequiredRole string `json:"required_role"`
	State        string `json:"state"`
	DecideBy     string `json:"decide_by"`
}

// findApproval returns the pending approval of operation op, if GET
// /v1/approvals lists one.
func (e *env) findApproval(ctx context.Context, op string) (pendingApproval, bool) {
	var list struct {
		Approvals []pendingApproval `json:"approvals"`
	}
	status, b, _ := e.do(ctx, http.MethodGet, "/v1/approvals", e.admin, nil)
	if status != http.StatusOK || json.Unmarshal(b, &list) != nil {
		return pendingApproval{}, false
	}
	for _, a := range list.Approvals {
		if a.OperationID == op && (a.State == "" || a.State == "pending") {
			return a, true
		}
	}
	return pendingApproval{}, false
}

// decide posts decision ("allow" or "deny") on approval a with a fresh
// approver token of the role it requires, and returns the HTTP status.
func (e *env) decide(ctx context.Context, a pendingApproval, decision string) (int, error) {
	approver, err := e.mint(ctx, TokenRequest{AgentID: e.agent("approver"), Role: a.RequiredRole})
	if err != nil {
		return 0, fmt.Errorf("minting an approver token: %w", err)
	}
	body, _ := json.Marshal(map[string]string{"decision": decision, "reason": "conformance"})
	status, _, err := e.do(ctx, http.MethodPost, "/v1/approvals/"+a.ID, approver.Token, body)
	return status, err
}

// goCall makes a call with operation id op in the background; the channel
// yields its answer, or nil when the call failed the case.
func goCall(t *T, tok *Token, tool, op string, args map[string]any, edit func(map[string]any)) <-chan *Resp {
	done := make(chan *Resp, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- nil
			}
		}()
		done <- t.Call(tok, tool, args, func(m map[string]any) {
			m["operation_id"] = op
			if edit != nil {
				edit(m)
			}
		})
	}()
	return done
}

// answer returns the call's answer, ending the case when the call failed
// it (its Failf set the message).
func answer(t *T, r *Resp) *Resp {
	if r == nil {
		panic(stop{})
	}
	return r
}

// heldCall makes a call that the endpoint may hold for an approval. If it
// is held, the case denies it at once (as an approver would), so the call
// ends with approval_denied before anything ran, instead of after the
// endpoint's approval timeout; a call not held is answered as it is. The
// cases that use it check a gated call is refused and has no effect,
// which holds for either ending.
func heldCall(t *T, tok *Token, tool string, args map[string]any, edit func(map[string]any)) *Resp {
	if !approvalsAPI(t) {
		return t.Call(tok, tool, args, edit)
	}
	op := newUUID()
	done := goCall(t, tok, tool, op, args, edit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return answer(t, r)
		case <-t.ctx.Done():
			t.Failf("the call %s neither ended nor appeared in GET /v1/approvals: %v", op, t.ctx.Err())
		case <-tick.C:
			a, ok := t.env.findApproval(t.ctx, op)
			if !ok {
				continue
			}
			t.Logf("held for approval %s (%s); denied by the suite", a.ID, a.RequiredRole)
			if status, err := t.env.decide(t.ctx, a, "deny"); err != nil || status != http.StatusOK {
				t.Failf("denying approval %s: %d %v", a.ID, status, err)
			}
			select {
			case r := <-done:
				return answer(t, r)
			case <-time.After(30 * time.Second):
				t.Failf("the call did not end after its approval was denied")
			}
		}
	}
}

// decideGated makes a call that waits for an approval, finds its request in
// GET /v1/approvals, decides it ("allow" or "deny") with a fresh approver
// token of the role the request names, and returns the call's answer.
func decideGated(t *T, tok *Token, tool string, args map[string]any, edit func(map[string]any), decision string) *Resp {
	op := newUUID()
	done := goCall(t, tok, tool, op, args, edit)
	var req pendingApproval
	for deadline := time.Now().Add(20 * time.Second); req.ID == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		req, _ = t.env.findApproval(t.ctx, op)
	}
	if req.ID == "" {
		t.Failf("the gated call never appeared in GET /v1/approvals")
	}
	approver := t.Mint("approver", TokenRequest{Role: req.RequiredRole})
	body, _ := json.Marshal(map[string]string{"decision": decision, "reason": "conformance"})
	if status, _ := t.Do("POST", "/v1/approvals/"+req.ID, approver.Token, body); status != http.StatusOK {
		t.Failf("POST /v1/approvals/%s (%s): %d", req.ID, decision, status)
	}
	if status, _ := t.Do("POST", "/v1/approvals/"+req.ID, approver.Token, body); status != http.StatusConflict {
		t.Failf("a second decision on %s: %d, want 409", req.ID, status)
	}
	select {
	case r := <-done:
		return answer(t, r)
	case <-time.After(30 * time.Second):
		t.Failf("the call did not end after its approval was decided")
	}
	return nil
}

// probeApprovalTimeout measures the endpoint's approval timeout: it makes
// a soft_gate call, reads the decide_by of its approval request, and
// denies it. It returns 0 when the endpoint has no approval API or holds
// no such call.
func (e *env) probeApprovalTimeout(ctx context.Context) (time.Duration, error) {
	if status, _, err := e.do(ctx, http.MethodGet, "/v1/approvals", e.admin, nil); err != nil || status != http.StatusOK {
		return 0, err
	}
	tok, err := e.mint(ctx, TokenRequest{AgentID: e.agent("probe-gate"), Tools: []string{"echo"}, Autonomy: "soft_gate"})
	if err != nil {
		return 0, err
	}
	op := newUUID()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.rawCall(ctx, e.envelope(tok, "echo", map[string]any{"text": "probe"}, func(m map[string]any) { m["operation_id"] = op }))
	}()
	defer func() { <-done }()
	start := time.Now()
	for {
		select {
		case <-done:
			return 0, nil // not held: answered at once
		case <-ctx.Done():
			return 0, fmt.Errorf("a soft_gate echo call neither ended nor appeared in GET /v1/approvals")
		case <-time.After(50 * time.Millisecond):
		}
		a, ok := e.findApproval(ctx, op)
		if !ok {
			continue
		}
		var d time.Duration
		if by, err := time.Parse(time.RFC3339Nano, a.DecideBy); err == nil {
			// decide_by was set when the call was held, after start.
			d = by.Sub(start).Round(time.Second)
		}
		if _, err := e.decide(ctx, a, "deny"); err != nil {
			return d, err
		}
		return d, nil
	}
}

// approvalTimeout leaves a gated call undecided until the endpoint gives
// up on it; it skips when setup found the endpoint's approval timeout
// longer than maxApprovalWait.
func approvalTimeout(t *T) {
	if !approvalsAPI(t) {
		t.Skipf("no approval API (GET /v1/approvals is 404): a gated call is refused at once (approval_denied), it never waits, so it cannot time out")
	}
	if d := t.env.approvalTimeout; d > maxApprovalWait {
		t.Skipf("the endpoint's approval timeout is %s, longer than this case waits (%s): start the kernel with a shorter one (kernelctl serve --approval-timeout 3s) to run it", d, maxApprovalWait)
	}
	ctx, cancel := context.WithTimeout(t.ctx, maxApprovalWait+10*time.Second)
	defer cancel()
	tok := t.Mint("gated-timeout", TokenRequest{Tools: []string{"echo"}, Autonomy: "soft_gate"})
	status, r, err := t.env.rawCall(ctx, t.env.envelope(tok, "echo", map[string]any{"text": "x"}, nil))
	if err != nil {
		t.Failf("a gated call nobody decides did not end within %s: %v", maxApprovalWait+10*time.Second, err)
	}
	t.ExpectClass(&Resp{Status: status, R: r}, "approval_timeout")
}

// autoDecide decides the approval of operation op with decision, should
// the endpoint hold the call for one, until the returned stop is called.
// The suite acts as the approver a deployment has, so that cases about
// what a call does once it runs (proc.exec, which the default policy
// gates) run against a kernel with the default policy and timeout.
func (t *T) autoDecide(op, decision string) (stop func()) {
	ctx, cancel := context.WithCancel(t.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			if a, ok := t.env.findApproval(ctx, op); ok {
				t.Logf("held for approval %s (%s); %s by the suite", a.ID, a.RequiredRole, decision)
				t.env.decide(ctx, a, decision)
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
