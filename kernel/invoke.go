package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/sandbox"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// call is the state of one Invoke as it moves down the pipeline.
type call struct {
	env        *Envelope
	res        Result
	start      time.Time
	envHash    string // digest of the raw envelope, when it could not be decoded
	argsHash   string
	staleState bool // provenance has ProvenanceRequestState
	token      *captoken.Token
	entry      *syscalls.Entry
	args       map[string]any       // env.Args decoded (jcs.Decode), as the input schema sees them
	fs         []*syscalls.Resource // resolved fs resources and fs preconditions
	pre        map[int]*syscalls.Resource
	input      *policy.Input
	policyEnc  *policyEncoding // input's canonical encodings (policyPart)
	decided    string
	replayOf   string
	session    string // provenance.session_id
	called     bool   // the syscall started to execute (tool.called was emitted)
	minted     bool   // the kernel minted env.OperationID for this call (checkEnvelope)
	background bool   // a call Start runs, its operation id reserved in Kernel.ops
	reserved   bool   // Start reserved the id the envelope names, its token verified: the id is the call's
	running    int    // calls of the session executing, this one included

	// salt is the audit record's salt (payloads.go), the original's for
	// a replay.
	salt string

	approval        *ApprovalRequest // the decided approval of a gated call
	approvalExpires time.Time
	sessionConfirm  bool // the policy lets the session's user decide a soft_gate (session.go)

	effect syscalls.SideEffect // the call's class: Definition.SideEffect or Reach.Class
	reach  *syscalls.Reach     // for syscalls with a Reach
	grant  *syscalls.Grant     // what the token grants such a call
	ws     workspaceHold       // the workspace the call holds (Kernel.workspace)
	mu     sync.Mutex          // guards used and notes, set by the running syscall
	used   txn.Usage           // consumed by the execution (cpu_ms, net_bytes)
	notes  map[string]json.RawMessage
	obs    *observation    // stage clock, when the kernel has an Observer (observe.go)
	up     *upstreamCall   // an upstream MCP tool's declared resources (declared.go)
	caller context.Context // the caller's context, whose values the Observer reads (observe.go)

	canonArgs     []byte          // the canonical form of env.Args, once checked: what args_hash hashes and the args commitment commits to
	gate          func() error    // a gated syscall's Call.Gate (execgate.go)
	cleanups      cleanups        // work the syscall left running (Call.Cleanup, Call.After; execcleanup.go)
	result, canon json.RawMessage // the syscall's result and its canonical form (execute)
}

// canonResult returns the canonical form of the call's result, when it is
// the one execute checked.
func (c *call) canonResult() []byte {
	if c.canon != nil && c.res.Error == nil && bytes.Equal(c.res.Result, c.result) {
		return c.canon
	}
	return nil
}

// InvokeJSON decodes a call envelope and runs it (see Invoke). Garbage,
// oversize envelopes, unknown fields and wrong types come back as
// invalid_args results, audited like any other call.
func (k *Kernel) InvokeJSON(ctx context.Context, data []byte) *Result {
	c, class, msg := k.decode(data)
	c.caller = ctx
	if !k.calls.enter() {
		return k.publishResult(c, k.closingAnswer(c))
	}
	var r *Result
	if class != "" {
		r = k.deny(ctx, c, class, msg)
	} else {
		r = k.run(ctx, c)
	}
	// Recorded: the call leaves the gate before its event and Observer
	// report, so that an Observer may call Close.
	k.calls.leave()
	return k.publishResult(c, r)
}

// Invoke runs one call through the pipeline and returns its result
// envelope. It never panics and never returns nil: every refusal is a
// result with an error class, and every call — allowed, denied or
// malformed — leaves an audit record and a receipt in the ledger.
func (k *Kernel) Invoke(ctx context.Context, env *Envelope) *Result {
	c := &call{start: k.cfg.Now(), env: env, caller: ctx}
	if !k.calls.enter() {
		if c.env == nil {
			c.env = &Envelope{}
		}
		return k.publishResult(c, k.closingAnswer(c))
	}
	r := k.invoke(ctx, c)
	k.calls.leave() // see InvokeJSON
	return k.publishResult(c, r)
}

func (k *Kernel) invoke(ctx context.Context, c *call) *Result {
	env := c.env
	if env == nil {
		c.env = &Envelope{}
		return k.deny(ctx, c, ErrInvalidArgs, "no envelope")
	}
	// The envelope is encoded to measure it only when its size could
	// exceed the limit.
	if n := maxEncodedSize(env); n < 0 || n > k.cfg.MaxEnvelopeBytes {
		b, err := json.Marshal(env)
		switch {
		case err != nil:
			return k.deny(ctx, c, ErrInvalidArgs, err.Error())
		case int64(len(b)) > k.cfg.MaxEnvelopeBytes:
			return k.deny(ctx, c, ErrInvalidArgs, fmt.Sprintf("envelope is %d bytes; the limit is %d", len(b), k.cfg.MaxEnvelopeBytes))
		}
	}
	args, err := checkObject("args", env.Args, true)
	if err != nil {
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	c.canonArgs = args
	if _, err := checkObject("provenance", env.Provenance, false); err != nil {
		env.Provenance = nil
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	return k.run(ctx, c)
}

// run is the pipeline of docs/kernel.md, steps 1 to 12.
func (k *Kernel) run(ctx context.Context, c *call) *Result {
	defer k.releaseWorkspace(c) // last: the work left running may use it
	defer c.cleanups.wait()
	env := c.env
	k.observe(c)
	if err := k.db.Err(); err != nil {
		return k.notRun(c, err) // failstop.go: nothing runs once durability failed
	}
	// 1. The envelope's own fields.
	if err := k.checkEnvelope(c); err != nil {
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	// 2. The capability token, bound to this agent and token id. Before
	// anything takes the operation id the envelope names: anyone can send
	// an envelope naming any id, and only a verified agent's call may hold
	// one (deny records this refusal under an id of its own).
	tok, class, msg := k.verifyToken(env)
	if class != "" {
		return k.deny(ctx, c, class, msg)
	}
	c.token = tok
	// The envelope's members in the form the record will publish: a
	// well-formed one may still be the admin credential pasted there.
	c.publicClaims()
	// A retry of an MCP call naming no call that waits for its client's
	// answer: the agent's own refused call.
	if c.staleState {
		return k.deny(ctx, c, ErrInvalidArgs, StaleRequestState)
	}
	// From here the call can be cancelled by operation id or session.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// An operation id names one call: a call in flight (its record not
	// yet stored, which the pipeline's checks of the store look for)
	// keeps it, and a later call naming it is refused under an id of its
	// own (its refusal stored under this one would stand for the call in
	// flight). A background call's id is reserved, and cancelled, by
	// Start.
	if !c.background {
		done, ok := k.inflight.add(env.OperationID, &inflight{agent: env.AgentID, session: c.session, cancel: cancel})
		if !ok {
			id := env.OperationID
			c.disown()
			return k.deny(ctx, c, ErrInvalidArgs, fmt.Sprintf("operation_id %s is in use by a call in flight", id))
		}
		defer done()
	}
	// An id the caller chose that another call's record or intent has is
	// refused now, under an id of its own, before any later refusal or a
	// replay could be recorded under it (Start checked a background
	// call's).
	if !c.minted && !c.background {
		used := false
		if err := k.db.View(func(tx *bbolt.Tx) error {
			used = txn.OperationUsed(tx, env.OperationID)
			return nil
		}); err != nil {
			return k.deny(ctx, c, ErrInternal, err.Error())
		}
		if used {
			id := env.OperationID
			c.disown()
			return k.deny(ctx, c, ErrInvalidArgs, fmt.Sprintf("operation_id %s is already used", id))
		}
	}
	// Admitted: what the call holds counts until its record
	// (inflightbytes.go).
	release, full := k.held.admit(c)
	if full != "" {
		return k.deny(ctx, c, ErrConcurrencyExceeded, full)
	}
	defer release()
	// 3. The syscall, by name or by the session's handle, and the token's
	// grant of it.
	tool, ok := k.resolveTool(c)
	entry, found := k.registry.Get(tool)
	if !ok || !found {
		return k.deny(ctx, c, ErrToolNotFound, fmt.Sprintf("no syscall %q", env.ToolID))
	}
	if tool != env.ToolID {
		c.Note("handle", env.ToolID)
		env.ToolID = tool
	}
	c.entry = entry
	if !tok.AllowsTool(env.ToolID) {
		return k.deny(ctx, c, ErrPermissionDenied, fmt.Sprintf("capability token %s does not grant %s", tok.Claims.ID, env.ToolID))
	}
	// 4. Arguments.
	if err := entry.ValidateDecoded(c.args); err != nil {
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	c.effect = entry.Def.SideEffect
	if entry.Def.Reach != nil {
		r, err := entry.Def.Reach(env.Args)
		if err != nil {
			return k.deny(ctx, c, ErrInvalidArgs, err.Error())
		}
		if r.Class != "" {
			if !r.Class.Valid() {
				return k.deny(ctx, c, ErrInternal, fmt.Sprintf("%s: side-effect class %q", env.ToolID, r.Class))
			}
			c.effect = r.Class
		}
		c.reach = &r
	}
	if c.effect.Mutating() && env.IdempotencyKey == "" {
		return k.deny(ctx, c, ErrIdempotencyKeyRequired, fmt.Sprintf("%s is a %s syscall: idempotency_key is required", env.ToolID, c.effect))
	}
	// The policy the caller read, checked before step 5 opens the token's
	// roots for a call it would refuse.
	if env.PolicyHash != k.policy.Hash() {
		return k.deny(ctx, c, ErrPolicyMismatch, fmt.Sprintf("policy_hash %s does not match the active policy %s", quoted(env.PolicyHash), k.policy.Hash()))
	}
	// 5. Resources, inside the token's scopes.
	resources, err := k.resolve(c)
	if err == nil {
		err = k.resolveDeclared(ctx, c)
	}
	if err != nil {
		var se *syscalls.ScopeError
		var busy workspaceBusyError
		switch {
		case errors.As(err, &se):
			return k.deny(ctx, c, ErrScopeDenied, err.Error())
		case errors.As(err, &busy):
			return k.deny(ctx, c, ErrConcurrencyExceeded, err.Error())
		}
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	c.lap(StageVerify)
	// 6. Policy.
	c.input = k.policyInput(c, resources)
	// The input is encoded once, canonically: the policy decides on those
	// bytes and the audit record commits to them (seal).
	c.policyEnc = encodePolicyInput(c.input, c.canonArgs)
	var d policy.Decision
	if c.policyEnc.err == nil {
		// A policy that reads no args decides on what else the call
		// is: its decision is remembered for every call alike but in
		// args.
		key := c.policyEnc.full
		if k.policy.ArgsFree() && c.policyEnc.noArgs != nil {
			key = c.policyEnc.noArgs
		}
		d, err = k.policy.DecideKeyed(ctx, c.policyEnc.full, key)
	} else {
		d, err = k.policy.Decide(ctx, c.input)
	}
	if err != nil && ctx.Err() != nil {
		// The evaluation was stopped by the call's end, not refused.
		class, msg := ctxClass(ctx, "while it waited for its policy decision, before it ran")
		return k.deny(ctx, c, class, msg)
	}
	if err != nil {
		d = policy.Decision{AutonomyMode: policy.NoGo, RiskScore: 1, RiskBasis: []string{"policy error: " + err.Error()}}
	}
	c.decided = d.AutonomyMode
	c.lap(StagePolicy)
	c.res.AutonomyMode = policy.Stricter(policy.Stricter(d.AutonomyMode, env.AutonomyMode), tok.Claims.Cap.Autonomy)
	c.res.RiskScore, c.res.RiskBasis = d.RiskScore, d.RiskBasis
	c.sessionConfirm = d.SessionConfirm
	if c.grant != nil && c.grant.Network == syscalls.NetFull && !d.NetFull {
		c.res.AutonomyMode = policy.NoGo
		c.res.RiskBasis = append(c.res.RiskBasis, "the policy does not allow the full network posture (net_full)")
	}
	// 7. Idempotency: a finished twin is replayed before any gate (the
	// prepare transaction checks again, atomically). An external call
	// (net.fetch's GET too) is prepared durably before it runs even
	// without a key: should the kernel stop while its request is out,
	// recovery records it (outcome_unknown), where a read that stays on
	// the host leaves nothing that needs recording.
	transactional := c.effect.Mutating() || env.IdempotencyKey != "" || c.external()
	if transactional {
		if r := k.lookupReplay(ctx, c); r != nil {
			return r
		}
	}
	// 8. Gate.
	switch c.res.AutonomyMode {
	case policy.Autopilot:
	case policy.SoftGate, policy.Escalated:
		if r := k.awaitApproval(ctx, c); r != nil {
			return r
		}
	default:
		return k.deny(ctx, c, ErrPolicyDenied, "policy decided no_go: "+strings.Join(c.res.RiskBasis, "; "))
	}
	// The session's concurrency cap, then the approval once more: both
	// may have waited.
	release, running, class, msg := k.sessions.acquire(ctx, env.AgentID, c.session)
	if class != "" {
		return k.deny(ctx, c, class, msg)
	}
	defer release()
	c.running = running
	if why := k.checkApproval(c); why != "" {
		return k.deny(ctx, c, ErrApprovalDenied, why)
	}
	c.lap(StageGate)
	// 9-12.
	if transactional {
		return k.transact(ctx, c, resources)
	}
	return k.direct(ctx, c, resources)
}

// verifyToken is step 2: env's capability token, bound to its agent and
// token id, or the error class and message of its refusal.
func (k *Kernel) verifyToken(env *Envelope) (tok *captoken.Token, class, msg string) {
	if strings.HasPrefix(env.CapabilityToken, AdminPrefix) {
		return nil, ErrTokenInvalid, "the admin credential is not a capability token; mint one with kernelctl token mint"
	}
	tok, err := k.verifier.Verify(env.CapabilityToken, captoken.Binding{TokenID: env.CapabilityTokenID, AgentID: env.AgentID}, k.cfg.Now())
	if err != nil {
		var te *captoken.Error
		if errors.As(err, &te) && te.Code == ErrTokenRevoked {
			return nil, ErrTokenRevoked, te.Reason
		}
		return nil, ErrTokenInvalid, err.Error()
	}
	return tok, "", ""
}

// tokenLapsed is the check of c's token again, after the call waited
// and at its commit: revoked (it or an ancestor) or expired since step 2
// verified it. A revocation refuses every call not yet run or committed
// (docs/kernel.md, "Revocation"), not only those that ask later. It
// returns the refusal's class and message, or "" while the token holds.
func (k *Kernel) tokenLapsed(c *call) (class, msg string) {
	e := k.verifier.Current(c.token.Claims, k.cfg.Now())
	switch {
	case e == nil:
		return "", ""
	case e.Code == ErrTokenRevoked:
		return ErrTokenRevoked, e.Reason
	}
	return ErrTokenInvalid, e.Reason
}

// agentIDRule is what an agent id must be: in an envelope, and in the
// tokens minted and attenuated for one (a token for another id could make
// no call).
const agentIDRule = "agent_id must be at most 255 bytes of UTF-8 with no control characters, and not hold " + AdminPrefix

// validAgentID reports whether id obeys agentIDRule. Invalid UTF-8 is
// refused because records hold text: two ids differing only in invalid
// bytes would read as one id in the audit, while the idempotency table
// told them apart; the admin credential's prefix, because an id is
// published, and the credential pasted as one must not be.
func validAgentID(id string) bool { return validLabel(id) && !holdsAdminCredential(id) }

// holdsAdminCredential reports whether s may hold the admin credential:
// it holds its prefix anywhere (pasted after "Bearer ", a space, a
// variable's name), so it is never published as it is.
func holdsAdminCredential(s string) bool { return strings.Contains(s, AdminPrefix) }

// validSessionID reports whether session may name a session: the rule
// of handles' sessions (at most MaxSessionIDBytes of UTF-8, no control
// character) and no admin credential, since events and approval
// requests publish it.
func validSessionID(session string) bool {
	return len(session) <= MaxSessionIDBytes && utf8.ValidString(session) && !strings.ContainsFunc(session, unicode.IsControl) && !holdsAdminCredential(session)
}

// quoted returns s quoted for an error message, which the call's result
// and events carry: whole when it is short text of no secret's form,
// else its size and digest (a value pasted in the wrong member may be a
// token, the admin credential or a megabyte of text).
func quoted(s string) string {
	if len(s) <= 80 && validLabel(s) && !holdsAdminCredential(s) {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("(a value of %d bytes, %s)", len(s), digest.Sum([]byte(s)))
}

// validLabel reports whether s is at most 255 bytes of UTF-8 with no
// control characters: the rule of the envelope's short text members
// (agent_id, idempotency_key, task_class).
func validLabel(s string) bool {
	return len(s) <= 255 && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// checkEnvelope validates the envelope fields the later steps rely on.
func (k *Kernel) checkEnvelope(c *call) error {
	env := c.env
	switch {
	case env.ToolID == "":
		return errors.New("tool_id is required")
	case env.AgentID == "":
		return errors.New("agent_id is required")
	case env.AutonomyMode != "" && !policy.ValidMode(env.AutonomyMode):
		return fmt.Errorf("autonomy_mode %s is not one of no_go, soft_gate, autopilot, escalated", quoted(env.AutonomyMode))
	case env.RiskScore != nil && !(*env.RiskScore >= 0 && *env.RiskScore <= 1):
		return fmt.Errorf("risk_score %v is outside [0,1]", *env.RiskScore)
	case !validAgentID(env.AgentID):
		return errors.New(agentIDRule)
	case !validLabel(env.IdempotencyKey):
		// UTF-8 as agent_id is (validAgentID).
		return errors.New("idempotency_key must be at most 255 bytes of UTF-8 with no control characters")
	case !validLabel(env.TaskClass):
		return errors.New("task_class must be at most 255 bytes of UTF-8 with no control characters")
	case !validSnapshotID(env.StateSnapshotID):
		return errors.New(`state_snapshot_id must be "<seq>:<entry_hash>" (a result's, or GET /v1/ledger/head's)`)
	case len(env.PreconditionRefs) > MaxPreconditions:
		return fmt.Errorf("%d precondition refs; the limit is %d", len(env.PreconditionRefs), MaxPreconditions)
	}
	if env.OperationID == "" {
		env.OperationID, c.minted = newID(), true
	} else if !canonicalUUID(env.OperationID) {
		return fmt.Errorf("operation_id %s is not a UUID in canonical form", quoted(env.OperationID))
	}
	for _, p := range env.PreconditionRefs {
		if err := p.Validate(); err != nil {
			return err
		}
	}
	c.session, c.staleState = sessionOf(env.Provenance)
	if !validSessionID(c.session) {
		// It is published, in approval requests and events (this
		// refusal's too): by its digest.
		c.session = digest.Sum([]byte(c.session))
		return fmt.Errorf("provenance.session_id must be at most %d bytes of UTF-8 with no control characters, and not hold %s", MaxSessionIDBytes, AdminPrefix)
	}
	if c.canonArgs == nil {
		// A call that came through neither decode nor invoke.
		var err error
		if c.canonArgs, err = jcs.CanonicalizeExact(env.Args); err != nil {
			return fmt.Errorf("args: %v", err)
		}
	}
	// From here on every step, the syscall included, reads the args it
	// hashes, audits and shows the policy: the same value as the text the
	// caller sent (no number was rounded: CanonicalizeExact), in one form.
	env.Args = c.canonArgs
	c.argsHash = digest.Sum(c.canonArgs)
	v, err := jcs.Decode(c.canonArgs)
	if err != nil {
		return fmt.Errorf("args: %v", err)
	}
	var ok bool
	if c.args, ok = v.(map[string]any); !ok {
		return errors.New("args must be a JSON object")
	}
	return nil
}

// resolve maps the syscall's resource arguments and the fs preconditions
// to resources inside the token's scopes.
func (k *Kernel) resolve(c *call) ([]*syscalls.Resource, error) {
	var ws *syscalls.Workspace
	workspace := func() (*syscalls.Workspace, error) {
		if ws != nil {
			return ws, nil
		}
		var err error
		ws, err = k.workspace(c)
		return ws, err
	}
	var out []*syscalls.Resource
	for _, ra := range c.entry.Def.Resources {
		name, ok := c.args[ra.Arg].(string)
		if !ok {
			return nil, fmt.Errorf("argument %s: %s, not a string", ra.Arg, jsonKind(c.args[ra.Arg]))
		}
		if ra.Kind == syscalls.KindKV && !c.token.Claims.Cap.AllowsKey(name, ra.Access.Writes()) {
			return nil, kvScopeError(name, ra.Access.Writes())
		}
		if ra.Kind != "fs" {
			out = append(out, &syscalls.Resource{Arg: ra.Arg, Rel: name, Access: ra.Access})
			continue
		}
		w, err := workspace()
		if err != nil {
			return nil, err
		}
		r, err := w.Resolve(name, ra.Access)
		if err != nil {
			return nil, err
		}
		r.Arg = ra.Arg
		out = append(out, r)
		c.fs = append(c.fs, r)
	}
	if err := k.resolveReach(c, workspace); err != nil {
		return nil, err
	}
	for i, p := range c.env.PreconditionRefs {
		kind, name := p.Target()
		if kind == txn.RefKV && !c.token.Claims.Cap.AllowsKey(name, false) {
			return nil, kvScopeError(name, false) // a precondition reads the key's version
		}
		if kind != txn.RefFS {
			continue
		}
		w, err := workspace()
		if err != nil {
			return nil, err
		}
		r, err := w.Resolve(name, syscalls.AccessStat)
		if err != nil {
			return nil, err
		}
		if c.pre == nil {
			c.pre = map[int]*syscalls.Resource{}
		}
		c.pre[i] = r
		c.fs = append(c.fs, r)
	}
	return out, nil
}

// kvScopeError refuses kv key, which no kv scope of the token grants (for
// writing, when write is set).
func kvScopeError(key string, write bool) error {
	how := "reading"
	if write {
		how = "writing"
	}
	return &syscalls.ScopeError{Reason: fmt.Sprintf("kv key %q is outside the capability token's kv scopes (for %s)", key, how)}
}

// resolveReach checks what a call reaches beyond its resource arguments
// (Definition.Reach) against the token and builds the call's Grant.
func (k *Kernel) resolveReach(c *call, workspace func() (*syscalls.Workspace, error)) error {
	if c.reach == nil {
		return nil
	}
	r, cp := c.reach, c.token.Claims.Cap
	g := &syscalls.Grant{AllowsHost: cp.AllowsHost, NamesHost: cp.NamesHost, Network: r.Network}
	for _, h := range r.Hosts {
		if !cp.AllowsHost(h.Host, h.Port) {
			return &syscalls.ScopeError{Path: fmt.Sprintf("%s:%d", h.Host, h.Port), Reason: "is outside the capability token's net patterns"}
		}
	}
	switch r.Network {
	case "", syscalls.NetOff:
		g.Network = syscalls.NetOff
	case syscalls.NetAllowlist:
		if len(cp.Net) == 0 {
			return &syscalls.ScopeError{Path: "network", Reason: "the allowlist posture needs net patterns, and the capability token has none"}
		}
	case syscalls.NetFull:
		if !cp.AllowsAnyHost() {
			return &syscalls.ScopeError{Path: "network", Reason: "the full posture needs the net pattern \"*\" in the capability token"}
		}
	default:
		return fmt.Errorf("network posture %q is not off, allowlist or full", r.Network)
	}
	var seen map[string][]string // where the kernel's directories are visible, read once
	if r.Workspace || r.Dir != "" || r.Network != "" {
		// A sandboxed run: it sees /usr and the like whole.
		seen = k.privateSeen(sandbox.ReadMounts())
		if err := k.checkSystemBinds(seen); err != nil {
			return err
		}
	}
	if r.Workspace || r.Dir != "" {
		w, err := workspace()
		if err != nil {
			return err
		}
		g.Workspace = w
		for _, fr := range cp.FS {
			// The sandbox binds a root by its path, after the check:
			// below a base, a link swapped in between could widen it.
			if fr.Base != "" && fr.Base != fr.Path {
				return &syscalls.ScopeError{Path: fr.Path, Reason: "is a root narrowed below its base " + fr.Base + " by attenuation; commands run only in whole roots (delegate " + fr.Base + ")"}
			}
			g.Roots = append(g.Roots, syscalls.RootSpec{Path: fr.Path, Writable: fr.Mode == "rw"})
		}
		// Checked again at each run, not only when the workspace was
		// opened: the sandbox binds each root by its path as it resolves
		// now, and a root swapped for a link since would bind what it
		// points to.
		if err := k.checkRootsIn(seen, g.Roots); err != nil {
			return err
		}
		if r.Dir != "" {
			d, err := w.Resolve(r.Dir, syscalls.AccessList)
			if err != nil {
				return err
			}
			d.Arg = "cwd"
			g.Dir = d
		}
	}
	c.grant = g
	return nil
}

// policyInput is the document the policy decides on; the audit record keeps
// it so history can be decided again under another policy.
func (k *Kernel) policyInput(c *call, resources []*syscalls.Resource) *policy.Input {
	env := c.env
	in := &policy.Input{
		ToolID:          env.ToolID,
		SideEffect:      string(c.effect),
		AgentID:         env.AgentID,
		TaskClass:       env.TaskClass,
		RequestedMode:   env.AutonomyMode,
		CallerRiskScore: env.RiskScore,
		CallerRiskBasis: env.RiskBasis,
		Ceiling:         c.token.Claims.Cap.Autonomy,
		Provenance:      policyProvenance(env.Provenance),
		Resources:       []policy.Resource{},
	}
	if len(env.Args) <= maxPolicyArgs {
		// The canonical form: the same value, and the policy part of the
		// audit record (canonical) then copies it as it is.
		in.Args = c.canonArgs
	} else {
		// Said, not just left out: a rule on the args would otherwise
		// not fire on a call whose agent padded them.
		in.ArgsOmitted, in.ArgsSize = true, len(env.Args)
	}
	add := func(r *syscalls.Resource, op string) {
		if r.Root == nil {
			in.Resources = append(in.Resources, policy.Resource{Kind: "kv", Op: kvOp(r.Access), Key: r.Rel})
			return
		}
		in.Resources = append(in.Resources, policy.Resource{
			Kind: "fs", Op: op, Path: r.Rel, RealPath: r.Real, Root: r.RootPath, IsDir: r.IsDir, Exists: r.Exists, OtherPaths: r.OtherPaths,
		})
	}
	for _, r := range resources {
		add(r, string(r.Access))
	}
	for _, r := range c.pre {
		add(r, string(syscalls.AccessStat))
	}
	if c.reach != nil {
		for _, h := range c.reach.Hosts {
			in.Resources = append(in.Resources, policy.Resource{Kind: "net", Op: "connect", Host: h.Host, Port: h.Port})
		}
		if c.grant.Dir != nil {
			add(c.grant.Dir, "exec")
		}
		if c.reach.Workspace || c.reach.Network != "" {
			in.Network = &policy.Network{Posture: c.grant.Network, Patterns: append([]string{}, c.token.Claims.Cap.Net...)}
		}
	}
	c.up.addTo(in)
	return in
}

// jsonKind names the JSON type of v, a value jcs.Decode returned (absent
// for nil: a member that is not there, or null).
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "absent or null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a string"
}

// MaxPreconditions bounds the precondition refs of one call.
const MaxPreconditions = 64

// maxPolicyArgs bounds the args copied into the policy input (and so into
// every audit record); larger args are left out, and the input says so
// (args_omitted, args_size).
const maxPolicyArgs = 16 << 10

func kvOp(a syscalls.Access) string {
	if a == syscalls.AccessRead {
		return "read"
	}
	return "write"
}

// lookupReplay returns the stored outcome of a finished twin call, or a
// refusal for a conflicting or running one, or nil.
func (k *Kernel) lookupReplay(ctx context.Context, c *call) *Result {
	var stored json.RawMessage
	err := k.db.View(func(tx *bbolt.Tx) error {
		var err error
		stored, err = txn.Lookup(tx, c.idemKey(), c.idemCall())
		return err
	})
	return k.replayOrRefuse(ctx, c, stored, err)
}

func (k *Kernel) replayOrRefuse(ctx context.Context, c *call, stored json.RawMessage, err error) *Result {
	// A replay answers what the key holds when its record commits: an
	// erasure of the original between the read and the record would
	// otherwise leave the erased salt and result in the replay's record
	// (errOriginalChanged; then it reads the key again).
	for range maxReplayReads {
		switch {
		case err != nil:
			return k.denyErr(ctx, c, err)
		case stored == nil:
			return nil
		}
		var orig Result
		if err := decodeStored(stored, &orig); err != nil {
			return k.deny(ctx, c, ErrInternal, "stored outcome: "+err.Error())
		}
		c.replayOf = orig.OperationID
		// The replay commits with the original's salt, so the two records'
		// commitments are equal exactly when they answer the same call.
		c.salt = orig.AuditSalt
		c.res.ResultHash, c.res.TxOutcome, c.res.CommitDeltaID = orig.ResultHash, NoOp, ""
		// The replay's record carries the original's result, so its
		// result_hash is the original's (replay verify checks this).
		c.res.Status, c.res.Result, c.res.Error = orig.Status, orig.Result, orig.Error
		read := stored
		_, err = k.record(context.WithoutCancel(ctx), c, func(tx *bbolt.Tx) error {
			now, err := txn.Lookup(tx, c.idemKey(), c.idemCall())
			if err == nil && !bytes.Equal(now, read) {
				err = errOriginalChanged
			}
			return err
		})
		if errors.Is(err, errOriginalChanged) {
			err = k.db.View(func(tx *bbolt.Tx) (err error) {
				stored, err = txn.Lookup(tx, c.idemKey(), c.idemCall())
				return err
			})
			continue
		}
		if err != nil {
			return k.internal(c, err)
		}
		orig.Replayed = true
		// The original's receipt: its audit entry, proven under the latest
		// checkpoint.
		if err := k.db.View(func(tx *bbolt.Tx) (err error) {
			if orig.Receipt, err = provenReceipt(tx, orig.LedgerSeq); err != nil {
				return err
			}
			return withLedgerRefs(tx, &orig)
		}); err != nil {
			return k.internal(c, err)
		}
		return &orig
	}
	c.replayOf, c.salt = "", ""
	return k.deny(ctx, c, ErrInternal, fmt.Sprintf("replay: %v %d times in a row", errOriginalChanged, maxReplayReads))
}

// maxReplayReads bounds how often a replay reads its key again after an
// erasure changed it (errOriginalChanged): an erasure happens once.
const maxReplayReads = 3

// errOriginalChanged refuses a replay's record when the key's stored
// outcome is no longer the one the replay read (an erasure of the
// original committed in between).
var errOriginalChanged = errors.New("the replayed call's stored outcome changed while the replay was recorded")

// denyErr refuses c with err: a txn refusal (*txn.Error) under its own
// class and message, anything else as internal.
func (k *Kernel) denyErr(ctx context.Context, c *call, err error) *Result {
	var te *txn.Error
	if errors.As(err, &te) {
		return k.deny(ctx, c, te.Class, te.Message)
	}
	return k.deny(ctx, c, ErrInternal, err.Error())
}

func (c *call) idemKey() txn.IdemKey {
	return txn.IdemKey{AgentID: c.env.AgentID, Key: c.env.IdempotencyKey}
}

func (c *call) idemCall() txn.Call {
	return txn.Call{ToolID: c.env.ToolID, ArgsHash: c.argsHash, TokenID: c.env.CapabilityTokenID}
}

// direct runs a non-mutating call without an idempotency key: check its
// preconditions under its locks (preconditions.go), execute, then check the
// stored ones again, charge the budget and record in one transaction. A
// call refused there had no effect to undo.
func (k *Kernel) direct(ctx context.Context, c *call, resources []*syscalls.Resource) *Result {
	// A call its budget no longer allows is refused before executing,
	// and checked again in the record's transaction (as is an id the
	// caller chose, which a concurrent call may have taken since step 2;
	// one the kernel minted, a UUIDv7 with 74 random bits, no call can):
	// it would otherwise still read, or send a GET, before its record
	// refused it.
	accounts := c.accounts()
	if txn.Limited(accounts) {
		if err := k.db.View(func(tx *bbolt.Tx) error { return txn.Check(tx, accounts, oneCall) }); err != nil {
			return k.denyErr(ctx, c, err)
		}
	}
	unlock, class, msg := k.holdPreconditions(ctx, c, resources)
	defer unlock()
	if class != "" {
		return k.deny(ctx, c, class, msg)
	}
	// Until its charge is recorded (netbudget.go).
	release, refused := k.netTurns.hold(ctx, c)
	if refused != nil {
		return k.deny(ctx, c, refused.Class, refused.Message)
	}
	defer release()
	// The call may have waited since its token verified (its session's
	// slot, precondition locks, a net_bytes turn).
	if class, msg := k.tokenLapsed(c); class != "" {
		return k.deny(ctx, c, class, msg)
	}
	out, class, msg := k.execute(ctx, c, resources, nil)
	c.lap(StageExecute)
	// Decided now, off the sequencer: a cancel from here on is too late.
	if k.inflight.settle(c.env.OperationID) && class == "" {
		out, class, msg = nil, ErrCancelled, cancelledBefore
	}
	c.setOutcome(out, class, msg, NoOp)
	_, err := k.record(context.WithoutCancel(ctx), c, func(tx *bbolt.Tx) error {
		c.setOutcome(out, class, msg, NoOp)
		if !c.minted && txn.OperationUsed(tx, c.env.OperationID) {
			c.setOutcome(nil, ErrInvalidArgs, fmt.Sprintf("operation_id %s is already used", c.env.OperationID), NoOp)
			return nil
		}
		if class, msg := c.storedRefs(tx); class != "" {
			c.setOutcome(nil, class, msg, NoOp)
		}
		// The call counts only if its budget allows; what it consumed
		// running is charged either way.
		err := txn.Charge(tx, accounts, oneCall, c.usage())
		if err == nil {
			return nil
		}
		var te *txn.Error
		if errors.As(err, &te) {
			c.setOutcome(nil, te.Class, te.Message, NoOp)
			return nil
		}
		return err
	})
	if err != nil {
		return k.internal(c, err)
	}
	return &c.res
}

// cancelledBefore is the message of a call cancelled after its syscall
// returned, before its record was committed: the cancel is honoured
// there (nothing commits, a result is withheld), since the caller was
// told the call was cancelled (Kernel.Cancel).
const cancelledBefore = "cancelled on request before its commit"

// oneCall is the charge of one call; never modified.
var oneCall = txn.Usage{txn.BudgetCalls: 1}

// transact runs a mutating (or keyed) call as prepare, execute, commit or
// rollback, then apply.
func (k *Kernel) transact(ctx context.Context, c *call, resources []*syscalls.Resource) *Result {
	var fsKeys, kvKeys []string
	var rels = map[string][]string{}
	for _, r := range c.fs {
		// Real paths, so that two spellings of one file share a lock.
		fsKeys = append(fsKeys, r.LockNames()...)
		rels[r.RootPath] = append(rels[r.RootPath], r.Rel)
	}
	for _, r := range resources {
		if r.Root == nil {
			kvKeys = append(kvKeys, "kv:"+r.Rel)
		}
	}
	fsKeys = append(fsKeys, c.up.lockKeys()...)
	var wsDirs []txn.StageDir
	if c.grant != nil && c.reach.Workspace {
		// The call may write anywhere in its rw roots: each is locked
		// whole, and its top is where staging pools go.
		for _, m := range c.grant.Roots {
			if m.Writable {
				r, err := c.grant.Workspace.Resolve(m.Path, syscalls.AccessStat)
				if err != nil {
					return k.deny(ctx, c, ErrScopeDenied, err.Error())
				}
				fsKeys = append(fsKeys, r.RealRoot)
				wsDirs = append(wsDirs, txn.StageDir{Root: m.Path, Dir: "."})
			}
		}
	}
	for _, p := range c.env.PreconditionRefs {
		if kind, name := p.Target(); kind == txn.RefKV {
			kvKeys = append(kvKeys, "kv:"+name)
		}
	}
	locks, err := k.locks.plan(fsKeys, kvKeys)
	if err != nil {
		return k.deny(ctx, c, ErrInvalidArgs, err.Error())
	}
	if err := k.locks.lock(ctx, locks); err != nil {
		class, msg := ctxClass(ctx, "while it waited for its paths' locks, before it ran")
		return k.deny(ctx, c, class, msg)
	}
	held := true // until finish takes the locks over
	defer func() {
		if held {
			k.locks.unlock(locks)
		}
	}()

	// Until its charge is recorded at commit, rollback or settle
	// (netbudget.go).
	release, refused := k.netTurns.hold(ctx, c)
	if refused != nil {
		return k.deny(ctx, c, refused.Class, refused.Message)
	}
	defer release()
	if class, msg := c.checkFiles(); class != "" {
		return k.deny(ctx, c, class, msg)
	}
	// The call may have waited since its token verified (its session's
	// slot, path locks, a net_bytes turn).
	if class, msg := k.tokenLapsed(c); class != "" {
		return k.deny(ctx, c, class, msg)
	}
	prep := txn.Prepare{
		Intent: txn.Intent{
			OperationID: c.env.OperationID, AgentID: c.env.AgentID, IdemKey: c.env.IdempotencyKey,
			TokenID: c.token.Claims.ID, Ancestors: c.accounts()[1:], Reserved: txn.Usage{txn.BudgetCalls: 1},
			Audit: c.recoveryContext(), External: c.external(), Read: c.external() && !c.effect.Mutating(),
		},
		Call:          c.idemCall(),
		Limits:        txn.Usage(c.token.Claims.Cap.Budgets),
		Preconditions: c.env.PreconditionRefs,
	}
	for root, rs := range rels {
		prep.Intent.Dirs = append(prep.Intent.Dirs, txn.Dirs(root, rs...)...)
	}
	prep.Intent.Dirs = append(prep.Intent.Dirs, wsDirs...)
	var replay json.RawMessage
	stage := txn.NewStage(c.env.OperationID, k.kv, k.syncer)
	var gated *gatedExec
	if c.entry.Def.Gated {
		gated = k.startGated(ctx, c, resources, stage) // execgate.go
	}
	err = prep.Encode() // off the sequencer
	if err == nil {
		err = k.db.Update(ctx, func(tx *bbolt.Tx) error {
			defer k.onSequencer(time.Now())
			var err error
			replay, err = prep.Run(tx)
			return err
		})
	}
	if replay != nil || err != nil {
		gated.refuse(stage)
		if errors.Is(err, txn.ErrOperationUsed) {
			c.disown()
		}
		var te *txn.Error
		if errors.As(err, &te) {
			return k.deny(ctx, c, te.Class, te.Message)
		}
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			class, msg := ctxClass(ctx, "while it waited to be prepared, before it ran")
			return k.deny(ctx, c, class, msg)
		}
		if err != nil {
			return k.deny(ctx, c, ErrInternal, "prepare: "+err.Error())
		}
		return k.replayOrRefuse(ctx, c, replay, nil)
	}
	crashPoint("prepared")
	c.lap(StagePrepare)
	// From here on the call owns a durable intent: it ends in commit or
	// rollback even if the caller goes away.
	done := context.WithoutCancel(ctx)
	in := &prep.Intent
	var out json.RawMessage
	var class, msg string
	if gated != nil {
		out, class, msg = gated.open(k, c)
	} else {
		out, class, msg = k.execute(ctx, c, resources, stage)
	}
	// An external call that ran to its end has had its effect: whatever
	// refuses it from here on, its key keeps that outcome (a syscall that
	// failed says whether its effect may have happened: outcome_unknown).
	// An external read (a GET) has none to keep: refused, it rolls back.
	effected := in.External && !in.Read && class == ""
	if class == "" {
		class, msg = c.checkFiles()
	}
	if class == "" && c.reach != nil && c.reach.Workspace {
		class, msg = k.decideDelta(ctx, c, stage.Touched())
	}
	if class == "" {
		// Staged files must be durable before the commit is.
		if err := k.syncer.Sync(stage.FileRoots()...); err != nil {
			// The intent stays prepared: the next start rolls it back.
			return k.stopped(c, k.failStop("syncfs (making staged files durable) of", rootNames(stage), err))
		}
	}
	in.Used = c.usage()
	c.lap(StageExecute)
	if class != "" {
		return k.rollback(done, c, in, stage, class, msg, effected || class == ErrOutcomeUnknown)
	}
	crashPoint("staged")
	effects := stage.Effects()
	deltaID, delta, err := txn.NewDelta(c.env.OperationID, effects)
	var decision *txn.Decision
	if err == nil {
		decision, err = txn.Decide(in, effects, deltaID) // off the sequencer
	}
	if err != nil {
		return k.rollback(done, c, in, stage, ErrInternal, err.Error(), effected)
	}
	// A refusal at commit rolls the intent back, or, for an effected call,
	// leaves it to after, which settles it with the refusal's envelope.
	refuse := func(tx *bbolt.Tx, class, msg string) error {
		if effected {
			c.setOutcome(nil, ErrOutcomeUnknown, settledMessage(class, msg), RolledBack)
			return nil
		}
		c.setOutcome(nil, class, msg, RolledBack)
		return txn.Rollback(tx, in)
	}
	committed := false
	c.setOutcome(out, "", "", Committed) // the expected outcome; CanCommit decides
	c.res.CommitDeltaID = deltaID
	_, err = k.record(done, c, func(tx *bbolt.Tx) error {
		committed = false
		if why := k.checkApproval(c); why != "" {
			return refuse(tx, ErrApprovalDenied, why)
		}
		if class, msg := k.tokenLapsed(c); class != "" {
			return refuse(tx, class, msg)
		}
		if k.inflight.settle(c.env.OperationID) {
			return refuse(tx, ErrCancelled, cancelledBefore)
		}
		err := txn.CanCommit(tx, in, c.env.PreconditionRefs, prep.Limits, effects)
		var te *txn.Error
		if errors.As(err, &te) {
			return refuse(tx, te.Class, te.Message)
		}
		if err != nil {
			return err
		}
		// Charged here, where it was checked: the next call of the
		// batch checks against it.
		if err := txn.Spend(tx, in, effects); err != nil {
			return err
		}
		committed = true
		c.setOutcome(out, "", "", Committed)
		c.res.CommitDeltaID = deltaID
		return nil
	}, func(tx *bbolt.Tx, envelope []byte) error {
		if !committed {
			if effected {
				return txn.Settle(tx, in, envelope)
			}
			return nil
		}
		if err := txn.Commit(tx, decision, delta, envelope); err != nil || len(effects) > 0 {
			return err
		}
		// Nothing to apply (a command that wrote nothing, a NETWORK call):
		// the intent is finished in the commit's own transaction, which
		// saves the call a third one.
		if err := txn.Finish(tx, in.OperationID); err != nil {
			return store.Abort(err)
		}
		return nil
	})
	c.lap(StageLedger)
	if err != nil {
		return k.recordFailed(done, c, in, stage, err, effected)
	}
	if !committed {
		stage.Discard()
		return &c.res
	}
	crashPoint("decided")
	if r := k.apply(c, effects, stage); r != nil {
		return r
	}
	crashPoint("applied")
	if len(effects) == 0 {
		return &c.res // finished at commit
	}
	held = false
	k.finish(in.OperationID, stage, func() { k.locks.unlock(locks) })
	return &c.res
}

// checkFiles checks the fs preconditions (under the call's path locks).
func (c *call) checkFiles() (class, msg string) {
	for i, r := range c.pre {
		if err := txn.CheckFile(c.env.PreconditionRefs[i], r); err != nil {
			var te *txn.Error
			if errors.As(err, &te) {
				return te.Class, te.Message
			}
			return ErrInternal, err.Error()
		}
	}
	return "", ""
}

// rollback ends a prepared call that does not commit with the refusal
// class and msg: nothing staged is applied. With settled (an external
// effect happened, or may have: the call ran to its end, or its outcome is
// unknown), the call ends outcome_unknown, the refusal in its message, and
// its idempotency key keeps that outcome (txn.Settle), so that a repeat is
// answered with it and never executes again; otherwise the intent is
// rolled back and its key is free for a retry.
func (k *Kernel) rollback(ctx context.Context, c *call, in *txn.Intent, stage *txn.Stage, class, msg string, settled bool) *Result {
	if err := stage.Discard(); err != nil {
		msg += "; removing staged files: " + err.Error()
	}
	var err error
	if settled {
		if class != ErrOutcomeUnknown {
			class, msg = ErrOutcomeUnknown, settledMessage(class, msg)
		}
		c.setOutcome(nil, class, msg, RolledBack)
		_, err = k.record(ctx, c, nil, func(tx *bbolt.Tx, envelope []byte) error { return txn.Settle(tx, in, envelope) })
	} else {
		c.setOutcome(nil, class, msg, RolledBack)
		_, err = k.record(ctx, c, func(tx *bbolt.Tx) error { return txn.Rollback(tx, in) })
	}
	if err != nil {
		return k.unresolved(c, in, err)
	}
	return &c.res
}

// settledMessage is the outcome_unknown message of an external call
// refused with class and msg after it ran: the kernel committed nothing of
// it, but the other side may have acted (it did, unless it failed).
func settledMessage(class, msg string) string {
	return "the call's external effect was made, then the call was refused (" + class + ": " + msg +
		"); nothing of it was committed here: reconcile with the other side. A repeat with the same idempotency key returns this outcome and never executes again"
}

// execute runs the syscall under its timeout, turning panics and errors
// into error classes. stage is nil for calls without effects.
func (k *Kernel) execute(ctx context.Context, c *call, resources []*syscalls.Resource, stage *txn.Stage) (out json.RawMessage, class, msg string) {
	timeout := c.entry.Def.Timeout
	if timeout <= 0 {
		timeout = k.cfg.timeout(c.effect)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if c.gate == nil {
		k.calledEvent(c) // a gated call's, when its gate opens
	}
	sc := &syscalls.Call{
		Args: c.sendArgs(), Resources: resources, KV: k.kv, MaxReadBytes: k.cfg.MaxReadBytes,
		Host: c, Gate: c.gate,
	}
	if stage != nil {
		sc.Stage = stage
	}
	if c.grant != nil {
		// Nothing is left to count of budgets no account limits.
		if accounts := c.accounts(); txn.Limited(accounts) {
			if err := k.db.View(func(tx *bbolt.Tx) error {
				left, err := txn.Remaining(tx, accounts)
				c.grant.Left = left
				return err
			}); err != nil {
				return nil, ErrInternal, err.Error()
			}
		}
		sc.Grant = c.grant
	}
	type outcome struct {
		out      syscalls.Output
		err      error
		panicked bool
	}
	ch := make(chan outcome, 1)
	go func() {
		var o outcome
		defer func() {
			if p := recover(); p != nil {
				o.err, o.panicked = fmt.Errorf("%s panicked: %v\n%s", c.env.ToolID, p, debug.Stack()), true
			}
			ch <- o
		}()
		o.out, o.err = c.entry.New().Execute(ctx, sc)
	}()
	var o outcome
	var done <-chan struct{}
	if !c.entry.Def.SelfTimed {
		done = ctx.Done()
	}
	select {
	case o = <-ch:
	case <-done:
		// A syscall that heeds its context returns soon; one that does not
		// is abandoned after the grace period. Either way nothing of it
		// is committed.
		grace := time.NewTimer(k.cfg.CancelGrace)
		select {
		case <-ch:
		case <-grace.C:
		}
		grace.Stop()
		if stage != nil {
			stage.Discard()
		}
		class, msg = ErrCancelled, fmt.Sprintf("%s was cancelled: %v", c.env.ToolID, context.Cause(ctx))
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			class, msg = ErrTimeout, fmt.Sprintf("%s did not finish within %s", c.env.ToolID, timeout)
		}
		class, msg = c.unusable(class, msg)
		return nil, class, msg
	}
	if o.err != nil {
		class, msg = failure(ctx, c, timeout, o.err)
		if o.panicked {
			class, msg = c.unusable(class, msg)
		}
		return nil, class, msg
	}
	canon, err := o.out.Canonical, error(nil)
	if canon == nil {
		canon, err = jcs.Canonicalize(o.out.Result)
	}
	if err != nil || len(canon) == 0 || canon[0] != '{' {
		class, msg := c.unusable(ErrExecution, fmt.Sprintf("%s returned a result that is not a JSON object", c.env.ToolID))
		return nil, class, msg
	}
	c.result, c.canon = o.out.Result, canon // the result hash reuses canon
	return o.out.Result, "", ""
}

// unusable is the class and message of a call whose syscall was
// abandoned (its timeout, a cancel), panicked, or returned a result the
// kernel cannot use: as given, but for a mutating external call (see
// external) outcome_unknown, since its effect may have happened all the
// same, so that its key is settled rather than freed for a repeat that
// would act again.
func (c *call) unusable(class, msg string) (string, string) {
	if !c.effect.Mutating() || !c.external() {
		return class, msg
	}
	return ErrOutcomeUnknown, msg + "; its external effect may have happened all the same: reconcile with the other side. A repeat with the same idempotency key returns this outcome and never executes again"
}

// external reports whether c's effect happens outside the kernel: a
// NETWORK call, a syscall whose Definition says External, one that sends
// bytes to hosts (its Reach names some: net.fetch's GET sends its URL,
// headers and body as a POST does), or one granted a network posture
// other than off (proc.exec with network: its command may act
// elsewhere). Its intent is marked so (txn.Intent.External): recovery
// never says such a call did not happen.
func (c *call) external() bool {
	return c.effect == syscalls.Network || c.entry.Def.External || c.reach != nil && len(c.reach.Hosts) > 0 ||
		(c.grant != nil && c.grant.Network != "" && c.grant.Network != syscalls.NetOff)
}

// failure is the error class and message of err, which c's syscall
// returned under ctx with timeout. It is apart from execute because the
// targets errors.As fills escape: a call that succeeds allocates none.
func failure(ctx context.Context, c *call, timeout time.Duration, err error) (class, msg string) {
	var ae *syscalls.ArgsError
	var fl *syscalls.Failure
	switch {
	case errors.As(err, &ae):
		return ErrInvalidArgs, err.Error()
	case errors.As(err, &fl):
		return fl.Class, fl.Message
	case ctx.Err() != nil && c.entry.Def.SelfTimed:
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ErrTimeout, fmt.Sprintf("%s did not finish within %s: %v", c.env.ToolID, timeout, err)
		}
		return ErrCancelled, fmt.Sprintf("%s was cancelled: %v", c.env.ToolID, err)
	}
	return ErrExecution, err.Error()
}

// accounts are the budgets c is charged to: its token's, then those of
// every token it was attenuated from (see txn.Account).
func (c *call) accounts() []txn.Account {
	cp := c.token.Claims.Cap
	as := make([]txn.Account, 0, 1+len(cp.Ancestors))
	as = append(as, txn.Account{TokenID: c.token.Claims.ID, Limits: txn.Usage(cp.Budgets)})
	for _, a := range cp.Ancestors {
		as = append(as, txn.Account{TokenID: a.ID, Limits: txn.Usage(a.Budgets)})
	}
	return as
}

// disown gives c's refusal an operation id of its own, keeping the one
// its envelope names in the record's notes (requested_operation_id): that
// id belongs to another call, in flight or recorded, or c has not shown it
// may name it (its token did not verify), and a refusal recorded under it
// would stand for the call that owns it (the first envelope stored under
// an id keeps it, and readers and erasure find the id's record).
func (c *call) disown() {
	if c.minted || c.reserved || c.env.OperationID == "" {
		return
	}
	// An id of a form no call has (any string up to the envelope's
	// size) is noted by its digest.
	requested := c.env.OperationID
	if !canonicalUUID(requested) {
		requested = digest.Sum([]byte(requested))
	}
	c.Note("requested_operation_id", requested)
	c.env.OperationID = ""
}

// Charge records budget units the running syscall consumed
// (syscalls.Host: the call is its syscall's host).
func (c *call) Charge(budget string, n int64) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used == nil {
		c.used = txn.Usage{}
	}
	c.used[budget] += n
}

// Cleanup runs f, work the syscall leaves, in the background (see
// cleanups).
func (c *call) Cleanup(f func()) { c.cleanups.start(f) }

// After runs f once the call has been answered (see cleanups).
func (c *call) After(f func()) { c.cleanups.later(f) }

// Note adds a detail to the call's audit record.
func (c *call) Note(key string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notes == nil {
		c.notes = map[string]json.RawMessage{}
	}
	c.notes[key] = b
}

// usage returns a copy of what the execution consumed.
func (c *call) usage() txn.Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.used) == 0 {
		return nil
	}
	u := txn.Usage{}
	for n, v := range c.used {
		u[n] = v
	}
	return u
}

// setOutcome sets the status, result or error, and transaction outcome.
func (c *call) setOutcome(out json.RawMessage, class, msg, tx string) {
	c.res.TxOutcome = tx
	c.res.CommitDeltaID = ""
	if class != "" {
		c.res.Status, c.res.Result, c.res.Error = StatusError, nil, &Error{Class: class, Message: msg}
		return
	}
	c.res.Status, c.res.Result, c.res.Error = StatusOK, out, nil
}

// crashHook, when set (by crash-recovery tests only), is called at the
// named points of a transaction so a test can kill the process there.
var crashHook func(point string)

func crashPoint(p string) {
	if crashHook != nil {
		crashHook(p)
	}
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }
