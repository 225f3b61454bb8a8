package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/syscalls"
)

// Approvals. A call the policy puts in soft_gate or escalated waits, before
// anything of it runs, for a human decision: the kernel records an
// approval request in the ledger, emits tool.confirmation_requested, and
// waits up to Config.ApprovalTimeout. An approver — a token minted with
// role approver, or escalation for escalated calls — allows or denies it;
// the first decision wins and is recorded in the ledger with the
// approver's identity and reason, which also go into the call's audit
// record and receipt. An approval is bound to one action: the tool, the
// args hash, the capability token, the policy hash and the operation id,
// and it expires Config.ApprovalValidity after the decision. It is checked
// again right before the call executes and again at commit: a revoked
// token, another policy or an expired approval fails closed
// (approval_denied), and the transaction rolls back.

// Ledger kinds of approval entries.
const (
	KindApprovalRequested = "approval_requested"
	KindApprovalDecided   = "approval_decided"
	KindApprovalRefused   = "approval_refused" // a decision attempt refused (role, self-approval)
)

// Approval states.
const (
	ApprovalPending   = "pending"
	ApprovalAllowed   = "allowed"
	ApprovalDenied    = "denied"
	ApprovalExpired   = "expired"   // nobody decided in time
	ApprovalAbandoned = "abandoned" // the call was cancelled while waiting
)

// SeesApproval reports whether a holder of role (a token's role; "" for
// the admin credential) sees an approval request that requires required:
// escalated calls are shown only to escalation approvers, and to the
// admin and auditors, who cannot decide; a plain approver does not see
// them (in lists or events), as it cannot decide them either.
func SeesApproval(role, required string) bool {
	return role != captoken.RoleApprover || required != captoken.RoleEscalation
}

// Errors of Decide, wrapped with details.
var (
	ErrApprovalConflict  = errors.New("approval already decided")
	ErrApprovalForbidden = errors.New("not allowed to decide this approval")
)

// ApprovalRequest is what an approver decides on. The JSON field names
// are the wire format of GET /v1/approvals and of the ledger entries.
type ApprovalRequest struct {
	ID                string `json:"approval_id"`
	OperationID       string `json:"operation_id"`
	ToolID            string `json:"tool_id"`
	AgentID           string `json:"agent_id"`
	SessionID         string `json:"session_id,omitempty"`
	CapabilityTokenID string `json:"capability_token_id"`
	ArgsHash          string `json:"args_hash"`
	PolicyHash        string `json:"policy_hash"`
	SideEffect        string `json:"side_effect"`
	Mode              string `json:"autonomy_mode"` // soft_gate or escalated
	RequiredRole      string `json:"required_role"` // approver or escalation
	// SessionConfirm: the policy lets the user of session SessionID
	// decide this soft_gate call through the agent's client (see
	// Kernel.ConfirmInSession); approvers may decide it all the same.
	SessionConfirm   bool     `json:"session_confirm,omitempty"`
	InputSummary     string   `json:"input_summary"`
	ProjectedEffects []string `json:"projected_effects"` // what would change: "write notes.txt", "kv put k"
	RiskScore        float64  `json:"risk_score"`
	RiskBasis        []string `json:"risk_basis"`
	RequestedAt      string   `json:"requested_at"`
	DecideBy         string   `json:"decide_by"` // after this, the call fails with approval_timeout

	State     string `json:"state"`
	DecidedBy string `json:"decided_by,omitempty"` // the approver token's sub, or "session:<id>"
	// Channel is how the decision came: "approver", or "session" for the
	// session's user answering through the agent's client.
	Channel   string `json:"channel,omitempty"`
	TokenID   string `json:"decided_with,omitempty"`
	Reason    string `json:"reason,omitempty"`
	DecidedAt string `json:"decided_at,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"` // an allowed approval's end
}

type approval struct {
	req     ApprovalRequest
	decided chan struct{} // closed on the first decision
	expires time.Time
	view    approvalView // what a console shows of the call (approvalview.go)
	bytes   int64        // what the waiting call holds (waitingBytes)
}

type approvals struct {
	mu      sync.Mutex
	pending map[string]*approval
	recent  []ApprovalRequest // decided, newest last, bounded
	byAgent map[string]int    // pending requests per agent family (agentFamily)
	// bytesByAgent and bytes are what the waiting calls hold
	// (waitingBytes), per agent family and in all.
	bytesByAgent map[string]int64
	bytes        int64
	// draining is set by Drain: a request made from then on is abandoned
	// as soon as it is recorded, since no approver will decide it.
	draining bool
}

// MaxPendingApprovalsPerAgent bounds the approval requests pending for
// one agent with its sub-agents, calls synchronous and background alike
// (a background call's request holds its background slot too): each
// holds a waiting call and what the console shows of it, and the
// approvers' queue is everyone's.
const MaxPendingApprovalsPerAgent = MaxBackgroundPerAgent

// MaxPendingApprovalBytesPerAgent and MaxPendingApprovalBytes bound the
// memory calls waiting for an approval hold (waitingBytes), for one agent
// with its sub-agents and for all: a count alone let one agent pin ~3 MiB
// a waiting call of a 1 MiB envelope, 256 calls of it (rev10-approve F7).
// A call over either bound is refused concurrency_exceeded, as over the
// count.
const (
	MaxPendingApprovalBytesPerAgent int64 = 64 << 20
	MaxPendingApprovalBytes         int64 = 512 << 20
)

// waitingBytes estimates what call c holds while it waits: its envelope's
// bytes as the front end read them, the envelope decoded, and its policy
// input (which carries its args and provenance again), each about the
// envelope's size (envelopeBytes), and its decoded args, about their
// canonical size. Every part of the envelope counts, not its args alone:
// calls with tiny args and 900 KB of provenance each held 2.7 MB and
// counted 4 KiB (rev16a #1).
func waitingBytes(c *call) int64 {
	return 3*envelopeBytes(c.env) + int64(len(c.canonArgs)) + 4096
}

// envelopeBytes is about the size of env encoded: the bytes of each of its
// members (of any size the envelope limit allows), with a few bytes of
// JSON around each.
func envelopeBytes(env *Envelope) int64 {
	n := 256 + len(env.ToolID) + len(env.AgentID) + len(env.CapabilityToken) + len(env.CapabilityTokenID) +
		len(env.StateSnapshotID) + len(env.PolicyHash) + len(env.Provenance) + len(env.OperationID) +
		len(env.TaskClass) + len(env.AutonomyMode) + len(env.IdempotencyKey) + len(env.Args)
	for _, b := range env.RiskBasis {
		n += len(b) + 3
	}
	for _, p := range env.PreconditionRefs {
		n += len(p.Ref) + len(p.Hash) + 64
	}
	return int64(n)
}

const keepDecided = 256

// release ends one pending request of agent family family (under mu).
func (a *approvals) release(family string, bytes int64) {
	if a.byAgent[family]--; a.byAgent[family] <= 0 {
		delete(a.byAgent, family)
	}
	if a.bytesByAgent[family] -= bytes; a.bytesByAgent[family] <= 0 {
		delete(a.bytesByAgent, family)
	}
	a.bytes -= bytes
}

// Approvals lists pending approval requests, oldest first, and with all
// the most recent decided ones too.
func (k *Kernel) Approvals(all bool) []ApprovalRequest {
	k.approvals.mu.Lock()
	defer k.approvals.mu.Unlock()
	out := []ApprovalRequest{}
	for _, a := range k.approvals.pending {
		out = append(out, a.req)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt < out[j].RequestedAt })
	if all {
		out = append(out, k.approvals.recent...)
	}
	return out
}

// awaitApproval asks for and waits for the approval of call c. It returns
// nil with c.approval set when the call may go on, or the call's refusal.
func (k *Kernel) awaitApproval(ctx context.Context, c *call) *Result {
	now := k.cfg.Now()
	a := &approval{decided: make(chan struct{}), req: ApprovalRequest{
		ID: newID(), OperationID: c.env.OperationID, ToolID: c.env.ToolID, AgentID: c.env.AgentID,
		SessionID: c.session, CapabilityTokenID: c.token.Claims.ID, ArgsHash: c.argsHash,
		PolicyHash: k.policy.Hash(), SideEffect: string(c.effect), Mode: c.res.AutonomyMode,
		RequiredRole: captoken.RoleApprover, InputSummary: inputSummary(c), ProjectedEffects: projectedEffects(c),
		RiskScore: c.res.RiskScore, RiskBasis: c.res.RiskBasis, RequestedAt: now.UTC().Format(ledger.TimeLayout),
		DecideBy: now.Add(k.cfg.ApprovalTimeout).UTC().Format(ledger.TimeLayout), State: ApprovalPending,
	}}
	a.view = viewOf(c)
	if c.res.AutonomyMode == policy.Escalated {
		a.req.RequiredRole = captoken.RoleEscalation
	}
	// Only a soft_gate may be confirmed in the session, never an
	// escalated call, whatever the policy says; and only in a session.
	a.req.SessionConfirm = c.sessionConfirm && c.res.AutonomyMode == policy.SoftGate && c.session != ""
	family := agentFamily(c.env.AgentID)
	a.bytes = waitingBytes(c)
	k.approvals.mu.Lock()
	var full string
	switch {
	case k.approvals.byAgent[family] >= MaxPendingApprovalsPerAgent:
		full = fmt.Sprintf("%d approval requests of %s (with its sub-agents) are pending, the most there may be", MaxPendingApprovalsPerAgent, family)
	case k.approvals.bytesByAgent[family]+a.bytes > MaxPendingApprovalBytesPerAgent:
		full = fmt.Sprintf("the calls of %s (with its sub-agents) waiting for approvals hold %d MiB with this one, over the %d MiB one agent's may", family, (k.approvals.bytesByAgent[family]+a.bytes)>>20, MaxPendingApprovalBytesPerAgent>>20)
	case k.approvals.bytes+a.bytes > MaxPendingApprovalBytes:
		full = fmt.Sprintf("the calls waiting for approvals hold %d MiB with this one, over the %d MiB all may", (k.approvals.bytes+a.bytes)>>20, MaxPendingApprovalBytes>>20)
	default:
		// Held until closeApproval.
		k.approvals.byAgent[family]++
		k.approvals.bytesByAgent[family] += a.bytes
		k.approvals.bytes += a.bytes
	}
	k.approvals.mu.Unlock()
	if full != "" {
		return k.deny(ctx, c, ErrConcurrencyExceeded, full+"; retry once some are decided")
	}
	if err := k.appendApproval(KindApprovalRequested, a.req.ledgerBody()); err != nil {
		k.approvals.mu.Lock()
		k.approvals.release(family, a.bytes)
		k.approvals.mu.Unlock()
		return k.deny(ctx, c, ErrInternal, "recording the approval request: "+err.Error())
	}
	requested := a.req
	k.approvals.mu.Lock()
	k.approvals.pending[a.req.ID] = a
	draining := k.approvals.draining
	k.approvals.mu.Unlock()
	if draining {
		// Drain ran before this request was pending: it would wait out
		// its timeout and hold the shutdown for it.
		k.closeApproval(a, ApprovalAbandoned, "", "", shuttingDown)
	}
	e := c.event(EventConfirmationRequested)
	e.Approval = &requested
	k.events.publish(e)

	timer := time.NewTimer(k.cfg.ApprovalTimeout)
	defer timer.Stop()
	select {
	case <-a.decided:
	case <-timer.C:
		k.closeApproval(a, ApprovalExpired, "", "", "no decision within "+k.cfg.ApprovalTimeout.String())
	case <-ctx.Done():
		k.closeApproval(a, ApprovalAbandoned, "", "", "the call was cancelled while waiting")
	}
	<-a.decided
	// Decided requests no longer change; the call and the event get
	// their own copies all the same.
	k.approvals.mu.Lock()
	decided := a.req
	k.approvals.mu.Unlock()
	c.approval = &decided
	resolved := decided.decided() // every approver's stream gets it, not only those who saw it pending
	e = c.event(EventConfirmationResolved)
	e.Approval = &resolved
	k.events.publish(e)
	switch decided.State {
	case ApprovalAllowed:
		c.approvalExpires = a.expires
		return nil
	case ApprovalDenied:
		msg := fmt.Sprintf("approval %s denied by %s", decided.ID, decided.DecidedBy)
		if decided.Reason != "" {
			msg += ": " + decided.Reason
		}
		return k.deny(ctx, c, ErrApprovalDenied, msg)
	case ApprovalExpired:
		return k.deny(ctx, c, ErrApprovalTimeout, fmt.Sprintf("approval %s: no decision within %s", decided.ID, k.cfg.ApprovalTimeout))
	}
	if ctx.Err() != nil {
		class, msg := ctxClass(ctx, "waiting for approval "+decided.ID)
		return k.deny(ctx, c, class, msg)
	}
	return k.deny(ctx, c, ErrCancelled, fmt.Sprintf("approval %s abandoned: %s", decided.ID, decided.Reason))
}

// closeApproval decides a unless it is decided already, records the
// decision, and wakes its call. It reports whether this was the first
// decision.
func (k *Kernel) closeApproval(a *approval, state, by, tokenID, reason string) bool {
	return k.closeApprovalVia(a, state, by, tokenID, reason, "")
}

// decided is r as the list of decided requests keeps it: without what
// the call carried (its input summary, projected effects, unsalted args
// hash and risk basis). An approver needs those to decide a pending call;
// once it is decided they belong to the call's audit record, whose
// payload only the agent, auditors and the admin may read (and which
// erasure removes), not to a list every approver can read.
func (r ApprovalRequest) decided() ApprovalRequest {
	r.InputSummary, r.ProjectedEffects, r.ArgsHash, r.RiskBasis = "", []string{}, "", []string{}
	return r
}

// closeApprovalVia is closeApproval with the decision's channel.
func (k *Kernel) closeApprovalVia(a *approval, state, by, tokenID, reason, channel string) bool {
	k.approvals.mu.Lock()
	defer k.approvals.mu.Unlock()
	if a.req.State != ApprovalPending {
		return false
	}
	now := k.cfg.Now()
	a.req.State, a.req.DecidedBy, a.req.TokenID, a.req.Reason, a.req.Channel = state, by, tokenID, reason, channel
	a.req.DecidedAt = now.UTC().Format(ledger.TimeLayout)
	if state == ApprovalAllowed {
		a.expires = now.Add(k.cfg.ApprovalValidity)
		a.req.ExpiresAt = a.expires.UTC().Format(ledger.TimeLayout)
	}
	// The decision is durable before the call can act on it; if the
	// ledger refuses it, the call must not go ahead.
	if err := k.appendApproval(KindApprovalDecided, a.req.ledgerBody()); err != nil && state == ApprovalAllowed {
		a.req.State, a.req.Reason = ApprovalDenied, "recording the decision failed: "+err.Error()
	}
	delete(k.approvals.pending, a.req.ID)
	k.approvals.release(agentFamily(a.req.AgentID), a.bytes)
	k.approvals.recent = append(k.approvals.recent, a.req.decided())
	if len(k.approvals.recent) > keepDecided {
		k.approvals.recent = k.approvals.recent[len(k.approvals.recent)-keepDecided:]
	}
	close(a.decided)
	return true
}

// checkDecision refuses a decision other than "allow" or "deny" and a
// reason longer than 4096 bytes, for every channel that decides.
func checkDecision(decision, reason string) error {
	if decision != "allow" && decision != "deny" {
		return fmt.Errorf("decision %q is not allow or deny", decision)
	}
	if len(reason) > 4096 {
		return errors.New("reason is longer than 4096 bytes")
	}
	return nil
}

// Decide records an approver's decision ("allow" or "deny") on approval
// id. approverToken must be an approver token of this kernel; for an
// escalated call, one with role escalation; and its subject must not be
// the agent that made the call. Refused attempts on an approval pending
// or recently decided are recorded in the ledger too; one naming no such
// approval is answered as any other (ErrApprovalForbidden for a
// credential that decides nothing, else ErrNotFound) but not recorded.
// It returns the request as decided, or an error wrapping
// ErrNotFound, ErrApprovalForbidden (also for a bad token) or
// ErrApprovalConflict (someone decided first; the request says how).
func (k *Kernel) Decide(id, approverToken, decision, reason string) (ApprovalRequest, error) {
	if err := checkDecision(decision, reason); err != nil {
		return ApprovalRequest{}, err
	}
	k.approvals.mu.Lock()
	a := k.approvals.pending[id]
	var done *ApprovalRequest
	if a == nil {
		for i := range k.approvals.recent {
			if k.approvals.recent[i].ID == id {
				d := k.approvals.recent[i] // a copy: recent changes once unlocked
				done = &d
			}
		}
	}
	// The role and agent the request was made with, pending or decided:
	// a refusal on either grounds is the same (403, recorded), whether or
	// not someone decided first.
	var role, agent string
	switch {
	case a != nil:
		role, agent = a.req.RequiredRole, a.req.AgentID
	case done != nil:
		role, agent = done.RequiredRole, done.AgentID
	}
	k.approvals.mu.Unlock()
	tok, err := k.verifier.VerifyBearer(approverToken, k.cfg.Now())
	refuse := func(why string) (ApprovalRequest, error) {
		if a == nil && done == nil {
			// No approval of that id: the refusal is not recorded (an
			// id of anyone's choosing, with any credential or none,
			// would be written into the ledger).
			return ApprovalRequest{}, fmt.Errorf("%w: %s", ErrApprovalForbidden, why)
		}
		by := ""
		if tok != nil {
			by = tok.Claims.Subject
		}
		return k.refuseDecision(id, decision, why, by, "", tok)
	}
	switch {
	case strings.HasPrefix(approverToken, AdminPrefix):
		// A person decides, accountable by name: the admin credential
		// lists approvals but decides none.
		return refuse("the admin credential cannot decide approvals: mint an approver token for the person deciding (kernelctl token mint --agent NAME --approver) and send it")
	case err != nil:
		return refuse("approver token: " + err.Error())
	case tok.Claims.Cap.Role == "" || tok.Claims.Cap.Role == captoken.RoleAuditor:
		return refuse(fmt.Sprintf("token %s of %s is not an approver token", tok.Claims.ID, tok.Claims.Subject))
	case a == nil && done == nil:
		return ApprovalRequest{}, fmt.Errorf("approval %q: %w", id, ErrNotFound)
	case role == captoken.RoleEscalation && tok.Claims.Cap.Role != captoken.RoleEscalation:
		return refuse(fmt.Sprintf("approval %s is for an escalated call; %s holds role %s, not escalation", id, tok.Claims.Subject, tok.Claims.Cap.Role))
	case captoken.SubAgent(tok.Claims.Subject, agent):
		// A sub-agent speaks for its parent: approving its call is
		// approving one's own.
		return refuse(fmt.Sprintf("%s may not approve a call of its own agent %s", tok.Claims.Subject, agent))
	case a == nil:
		return *done, fmt.Errorf("%w: approval %s is %s (by %s)", ErrApprovalConflict, id, done.State, orNobody(done.DecidedBy))
	}
	return k.decided(a, id, decision, tok.Claims.Subject, tok.Claims.ID, reason, ChannelApprover)
}

// refuseDecision records in the ledger that decision on approval id was
// refused, and why: the would-be approver by and the channel, when known,
// and the id of the token tok it presented, if it verified. It answers
// ErrApprovalForbidden with why.
func (k *Kernel) refuseDecision(id, decision, why, by, channel string, tok *captoken.Token) (ApprovalRequest, error) {
	body := map[string]string{"approval_id": id, "decision": decision, "reason": why}
	if by != "" {
		body["approver"] = by
	}
	if channel != "" {
		body["channel"] = channel
	}
	if tok != nil {
		body["token_id"] = tok.Claims.ID
	}
	_ = k.appendApproval(KindApprovalRefused, body)
	return ApprovalRequest{}, fmt.Errorf("%w: %s", ErrApprovalForbidden, why)
}

// decided closes approval a (id) with decision ("allow" or "deny") by
// by through channel, and answers as Decide does: the closed request, or
// ErrApprovalConflict with the request another decision closed first.
func (k *Kernel) decided(a *approval, id, decision, by, tokenID, reason, channel string) (ApprovalRequest, error) {
	state := ApprovalDenied
	if decision == "allow" {
		state = ApprovalAllowed
	}
	closed := k.closeApprovalVia(a, state, by, tokenID, reason, channel)
	k.approvals.mu.Lock()
	req := a.req
	k.approvals.mu.Unlock()
	if !closed {
		return req.decided(), fmt.Errorf("%w: approval %s is %s (by %s)", ErrApprovalConflict, id, req.State, orNobody(req.DecidedBy))
	}
	return req, nil
}

func orNobody(s string) string {
	if s == "" {
		return "nobody: the kernel"
	}
	return s
}

// checkApproval is the re-check of an allowed approval before execution
// and at commit: still this action, same policy, token (and every
// ancestor of it) not revoked, token not expired, approval not expired. It returns "" or why the approval no longer holds.
func (k *Kernel) checkApproval(c *call) string {
	a := c.approval
	if a == nil || a.State != ApprovalAllowed {
		return ""
	}
	current := k.verifier.Current(c.token.Claims, k.cfg.Now())
	switch {
	case a.OperationID != c.env.OperationID || a.ToolID != c.env.ToolID || a.ArgsHash != c.argsHash || a.CapabilityTokenID != c.token.Claims.ID:
		return fmt.Sprintf("approval %s was given for another action", a.ID)
	case a.PolicyHash != k.policy.Hash():
		return fmt.Sprintf("approval %s was given under policy %s; the active policy is %s", a.ID, a.PolicyHash, k.policy.Hash())
	case current != nil:
		// Revoked (the token or an ancestor) or expired since.
		return fmt.Sprintf("approval %s no longer holds: %s", a.ID, current.Reason)
	case !k.cfg.Now().Before(c.approvalExpires):
		return fmt.Sprintf("approval %s expired at %s", a.ID, a.ExpiresAt)
	}
	return k.movedSince(c, a)
}

// movedSince says how a file c writes or deletes no longer resolves to
// where approval a was given for it (its projected effects), or "": a
// directory on its path replaced by a link while the call waited would
// otherwise take the approved write elsewhere.
func (k *Kernel) movedSince(c *call, a *ApprovalRequest) string {
	var ws *syscalls.Workspace
	for _, r := range c.fs {
		if r.Arg == "" || !r.Access.Writes() {
			continue
		}
		name, _ := c.args[r.Arg].(string)
		if ws == nil {
			var err error
			if ws, err = k.workspace(c); err != nil {
				return fmt.Sprintf("%s: %v", name, err)
			}
		}
		now, err := ws.Resolve(name, r.Access)
		switch {
		case err != nil:
			return fmt.Sprintf("%s no longer resolves as when approval %s was given: %v", name, a.ID, err)
		case now.RealRoot != r.RealRoot || now.Real != r.Real:
			return fmt.Sprintf("%s now leads to %s, not to %s as when approval %s was given", name, path.Join(now.RootPath, now.Real), path.Join(r.RootPath, r.Real), a.ID)
		}
	}
	return ""
}

// appendApproval appends an approval entry to the ledger.
func (k *Kernel) appendApproval(kind string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := ledger.Append(tx, kind, k.cfg.Now(), b)
		return abortIf(err)
	})
}

// inputSummary is a short description of the call for an approver: its
// tool and a summary of its canonical args (argsSummary).
func inputSummary(c *call) string {
	return c.env.ToolID + " " + argsSummary(c.canonArgs)
}

// projectedEffects lists what the call would change, as far as its
// declared resources tell: a file by the path it resolved to (its root as
// the token names it, then the path with every link and ".." resolved),
// which is where the write lands however the agent spelled it.
func projectedEffects(c *call) []string {
	out := []string{}
	for _, r := range c.entry.Def.Resources {
		if !r.Access.Writes() {
			continue
		}
		name, _ := c.args[r.Arg].(string)
		for _, f := range c.fs {
			if f.Arg == r.Arg {
				name = path.Join(f.RootPath, f.Real)
				break
			}
		}
		out = append(out, fmt.Sprintf("%s %s:%s", r.Access, r.Kind, name))
	}
	if r := c.reach; r != nil {
		if r.Workspace {
			out = append(out, "run in the token's fs roots; writes to rw roots are staged and applied at commit")
		}
		for _, h := range r.Hosts {
			out = append(out, fmt.Sprintf("connect %s:%d", h.Host, h.Port))
		}
		if r.Network != "" {
			out = append(out, "network posture "+r.Network)
		}
	}
	if len(out) == 0 && c.effect != syscalls.None && c.effect != syscalls.Read {
		out = append(out, strings.ToLower(string(c.effect))+" (effects not declared in advance)")
	}
	return out
}
