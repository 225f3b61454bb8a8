package kernel

import (
	"fmt"
)

// Decision channels of an approval (ApprovalRequest.Channel).
const (
	ChannelApprover = "approver"
	ChannelSession  = "session"
)

// ConfirmInSession records the decision ("allow" or "deny") of the user of
// session on approval id: the human at the agent's own client, asked by
// it (MCP elicitation). It is allowed only when the policy said so for
// the call (ApprovalRequest.SessionConfirm, which only a soft_gate call in
// a session gets), when token is the capability token that made the call
// and session its session. The decision is recorded like an approver's:
// in the ledger and the events, with DecidedBy "session:<session>", the
// token's jti and Channel "session"; an allowed one is bound to the call's
// args hash, token and policy hash and expires as any approval does. A
// refused attempt is recorded in the ledger. It returns the request as
// decided, or an error wrapping ErrNotFound, ErrApprovalForbidden or
// ErrApprovalConflict (as Decide).
func (k *Kernel) ConfirmInSession(id, token, session, decision, reason string) (ApprovalRequest, error) {
	if err := checkDecision(decision, reason); err != nil {
		return ApprovalRequest{}, err
	}
	k.approvals.mu.Lock()
	a := k.approvals.pending[id]
	var req ApprovalRequest
	if a != nil {
		req = a.req
	}
	k.approvals.mu.Unlock()
	tok, err := k.verifier.VerifyBearer(token, k.cfg.Now())
	by := "session:" + session
	refuse := func(why string) (ApprovalRequest, error) {
		return k.refuseDecision(id, decision, why, by, ChannelSession, tok)
	}
	switch {
	case a == nil:
		return ApprovalRequest{}, fmt.Errorf("approval %q: %w", id, ErrNotFound)
	case err != nil:
		return refuse("session token: " + err.Error())
	case session == "" || req.SessionID != session || req.CapabilityTokenID != tok.Claims.ID:
		return refuse(fmt.Sprintf("approval %s is not of a call of token %s in session %q", id, tok.Claims.ID, session))
	case !req.SessionConfirm:
		return refuse(fmt.Sprintf("the policy does not let the session's user decide approval %s (%s)", id, req.Mode))
	}
	return k.decided(a, id, decision, by, tok.Claims.ID, reason, ChannelSession)
}
