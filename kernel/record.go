package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// auditRecord is an audit record: every field of TOOL-01 §3, the call's
// outcome, and the policy input document the decision was made on (absent
// for calls refused before the policy step). Its ledger body is its public
// part (publicBody): the fields marked private are replaced there by
// commitments, and kept beside the chain (payloads.go).
type auditRecord struct {
	OperationID       string `json:"operation_id"`
	AgentID           string `json:"agent_id"`
	PolicyHash        string `json:"policy_hash"`
	StateSnapshotID   string `json:"state_snapshot_id"`
	CapabilityTokenID string `json:"capability_token_id"`
	// ClaimedAgentID and ClaimedTokenID are what an envelope whose token
	// did not verify said of its agent and token: anyone can send one
	// naming anyone, so such a record is attributed to no agent
	// (AgentID and CapabilityTokenID empty) and keeps the claim here.
	ClaimedAgentID string          `json:"claimed_agent_id,omitempty"`
	ClaimedTokenID string          `json:"claimed_capability_token_id,omitempty"`
	TokenHash      string          `json:"token_hash,omitempty"`
	ToolID         string          `json:"tool_id"`
	ArgsHash       string          `json:"args_hash,omitempty"` // private
	EnvelopeHash   string          `json:"envelope_hash,omitempty"`
	ResultHash     string          `json:"result_hash,omitempty"` // private
	Provenance     json.RawMessage `json:"provenance,omitempty"`  // private
	TaskClass      string          `json:"task_class"`
	AutonomyMode   string          `json:"autonomy_mode"`
	RequestedMode  string          `json:"requested_mode,omitempty"`
	DecidedMode    string          `json:"decided_mode,omitempty"`
	RiskScore      float64         `json:"risk_score"`
	RiskBasis      []string        `json:"risk_basis,omitempty"` // private: it may quote args
	Status         string          `json:"status"`
	ErrorClass     string          `json:"error_class,omitempty"`
	ErrorMessage   string          `json:"error_message,omitempty"` // private
	TxOutcome      string          `json:"tx_outcome"`
	CommitDeltaID  string          `json:"commit_delta_id,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	ReplayOf       string          `json:"replay_of,omitempty"`
	StartedAt      string          `json:"started_at"`
	PolicyInput    *policy.Input   `json:"policy_input,omitempty"` // private
	// The approval of a soft_gate or escalated call: its id, state, the
	// approver's identity (token sub) and reason.
	ApprovalID     string `json:"approval_id,omitempty"`
	ApprovalState  string `json:"approval_state,omitempty"`
	ApprovedBy     string `json:"approved_by,omitempty"`
	ApprovalReason string `json:"approval_reason,omitempty"`
	// Notes are details a syscall adds to its record: proc.exec's and
	// net.fetch's network connections (net_connections), for instance.
	Notes map[string]json.RawMessage `json:"notes,omitempty"` // private

	// The commitments to the private parts, and how much of them is kept.
	Commitments
	PayloadDepth string `json:"payload_depth,omitempty"`
	// RecoverySalt and RecoveryArgs carry the salt and canonical args in a
	// recovery context (never in a ledger body), so a call audited by
	// crash recovery commits to its args like any other.
	RecoverySalt string          `json:"recovery_salt,omitempty"`
	RecoveryArgs json.RawMessage `json:"recovery_args,omitempty"`

	// policyEnc, when it is of PolicyInput, is its canonical encoding,
	// made when the policy decided (seal reuses it).
	policyEnc *policyEncoding
}

// receiptBody is the body of a receipt ledger entry: one per call in
// ledgers written before receipts were proven by the log (a JWS receipt,
// format v1). They are still verified where they occur.
type receiptBody struct {
	ReceiptID   string `json:"receipt_id"`
	OperationID string `json:"operation_id"`
	JWS         string `json:"jws"`
}

// deny records a call refused before it could run and returns its result.
func (k *Kernel) deny(ctx context.Context, c *call, class, msg string) *Result {
	if c.token == nil {
		c.disown() // anyone may send an envelope naming any id
	}
	c.publicClaims()
	c.setOutcome(nil, class, msg, NoOp)
	if _, err := k.record(context.WithoutCancel(ctx), c, nil); err != nil {
		return k.internal(c, err)
	}
	return &c.res
}

// withholdProvenance replaces a provenance over RefusedArgsLimit bytes
// of a call refused before the policy step, its token verified or not
// (the calls whose args argsPart digests), by the note
// "provenance_withheld": the digest form (argsDigestPart) of its
// canonical bytes. Kept, it would stand in the record's context part and
// the stored envelope, as args would, for anyone to send, or any agent
// holding a token at no cost to its budget: a token granting only echo
// stored 0.86 MB per call of another tool (rev16a #2). From the policy
// step on, the policy input holds it anyway.
func (c *call) withholdProvenance() {
	if c.input != nil || c.res.Error == nil || len(c.env.Provenance) <= RefusedArgsLimit {
		return
	}
	canon, err := jcs.Canonicalize(c.env.Provenance)
	if err != nil {
		canon = c.env.Provenance // refused as it is: its bytes
	}
	c.Note("provenance_withheld", json.RawMessage(argsDigestPart(canon)))
	c.env.Provenance = nil
}

// argsPart is the args part of c's audit record: its canonical args, or
// their digest form (argsDigestPart) for a call refused before the policy
// step whose token did not verify, or whose args are over
// RefusedArgsLimit. Refusals cost no budget and, before the token, need
// no credential: kept whole, each would store up to an envelope's
// megabyte in kernel.db (rev14 F5). From the policy step on, the policy
// input, which the record keeps whole for replay policy, holds the args
// anyway.
func (c *call) argsPart() []byte {
	if c.canonArgs != nil && c.input == nil && c.res.Error != nil && (c.token == nil || len(c.canonArgs) > RefusedArgsLimit) {
		return argsDigestPart(c.canonArgs)
	}
	return c.canonArgs
}

// internal is the result of a call whose recording failed, returned
// without an audit record. After a fail stop the outcome is unknown
// (failstop.go); otherwise nothing was written, so nothing was committed.
func (k *Kernel) internal(c *call, err error) *Result {
	if store.IsFatal(err) {
		return k.stopped(c, err)
	}
	c.fill(k)
	c.setOutcome(nil, ErrInternal, "recording the call failed: "+err.Error(), c.res.TxOutcome)
	if c.res.TxOutcome == "" || c.res.TxOutcome == Committed {
		c.res.TxOutcome = NoOp
	}
	c.res.ResultHash = resultHash(&c.res, nil)
	return &c.res
}

// record appends the call's audit record in one group-committed
// transaction and gives the result its receipt: the record, proven by the
// log under the checkpoint that ends the transaction (receipts.Logged).
// before runs first and may set the call's outcome (it must not write when
// it returns an error); after runs last with the whole result envelope
// (its receipt aside), for writes that store it.
//
// The sequencer's serial share is small: the audit body is built and
// canonicalized before the transaction (again only when before changes the
// outcome), the stored envelope is marshalled in the batch's concurrent
// step, and the inclusion proof is computed after the commit, from the
// batch's tree edge in memory.
func (k *Kernel) record(ctx context.Context, c *call, before func(*bbolt.Tx) error, after ...func(*bbolt.Tx, []byte) error) (*Result, error) {
	c.withholdProvenance() // before fill copies it into the result
	c.fill(k)
	r := &recording{k: k, c: c, before: before, after: after, depth: k.recordDepth(c)}
	var err error
	if r.planned, err = newAuditEntry(c.audit(k), &c.res, c.canonResult(), c.salt, r.depth, c.argsPart()); err != nil {
		return nil, err
	}
	r.plannedRes = c.res
	if err := k.db.DoSteps(ctx, r); err != nil {
		return nil, err
	}
	if r.newToken {
		k.mu.Lock()
		k.seen[c.token.Claims.ID] = true
		k.mu.Unlock()
	}
	if c.res.Receipt, err = logged(r.a); err != nil {
		// The record is durable: an error here must not read as "not
		// committed" to callers that would then roll the call back (and
		// free a committed call's key). The kernel's ledger state in
		// memory disagrees with what it committed, so it fails stop.
		return nil, k.failStop("making the receipt of the committed record of operation "+c.res.OperationID+" in", k.db.Path(), err)
	}
	return &c.res, nil
}

// recordDepth is the audit depth of c's record: its tool's. A call by a
// handle refused before the handle resolved (an expired or ended handle,
// another session's, a token refused) still names the handle: its depth
// is that of the handle's tool when the handle table still binds it to
// c's verified token, else the strictest depth configured, since the
// tool is unknown.
func (k *Kernel) recordDepth(c *call) string {
	id := c.env.ToolID
	if strings.HasPrefix(id, HandlePrefix) && c.token != nil {
		if tool, ok := k.handles.boundTool(id, c.token.Claims.ID); ok {
			return k.depthOf(tool)
		}
	}
	return k.resultDepth(id)
}

// recording is one record's state across its transaction's steps (a
// store.Steps), in one allocation: closures would each capture their
// variables apart, and method values allocate each.
type recording struct {
	k          *Kernel
	c          *call
	before     func(*bbolt.Tx) error
	after      []func(*bbolt.Tx, []byte) error
	depth      string
	planned    *auditEntry
	plannedRes Result
	newToken   bool
	a          ledger.Appended
	stored     []byte // the envelope kept for the operation id
	envelope   []byte // the whole envelope, for after
	op         txn.Operation
}

// Prepare appends the audit entry (planned, unless before changed the
// outcome) and keeps its payload.
func (r *recording) Prepare(tx *bbolt.Tx) error {
	k, c := r.k, r.c
	defer k.onSequencer(time.Now())
	ae := r.planned
	if r.before != nil {
		if err := r.before(tx); err != nil {
			return err
		}
		if !sameOutcome(&c.res, &r.plannedRes) {
			var err error
			if ae, err = newAuditEntry(c.audit(k), &c.res, c.canonResult(), c.salt, r.depth, c.argsPart()); err != nil {
				return abortIf(err)
			}
		}
	}
	c.res.ResultHash = ae.resultHash
	var err error
	if r.newToken, err = k.noteToken(tx, c); err != nil {
		return abortIf(err)
	}
	if r.a, err = k.appendAudit(tx, ae, &c.res); err != nil {
		return abortIf(err)
	}
	if c.replayOf != "" {
		// A replay's payload copies its original's: indexed under it in
		// the same step, where an erasure of the original finds it (an
		// erasure in the same group commit runs its steps in between).
		if err := putReplay(tx, c.replayOf, r.a.Seq); err != nil {
			return abortIf(err)
		}
	}
	return abortIf(putPayload(tx, r.a.Seq, ae.payload))
}

// Work encodes the envelopes to store, in the batch's concurrent step.
func (r *recording) Work() (err error) {
	c := r.c
	res := &c.res
	if c.replayOf != "" {
		// A replay's stored envelope keeps no copy of its original's
		// salt, nor of a risk basis that may quote the args: an erasure
		// of the original, perhaps in this very group commit, finds them
		// nowhere else.
		cp := *res
		cp.AuditSalt, cp.RiskBasis = "", nil
		res = &cp
	}
	if r.stored, err = storedEnvelope(res, r.depth); err != nil {
		return err
	}
	if r.op = txn.PackOperation(r.stored); len(r.after) == 0 {
		return nil
	}
	r.envelope = r.stored
	if leanStored(&c.res) && r.depth != DepthCommitmentsOnly {
		r.envelope, err = json.Marshal(&c.res)
	}
	return err
}

// Finish stores the envelope under the operation id, then runs after.
func (r *recording) Finish(tx *bbolt.Tx) error {
	k, c := r.k, r.c
	defer k.onSequencer(time.Now())
	if err := k.storeOperation(tx, c.res.OperationID, r.op); err != nil {
		return err
	}
	for _, f := range r.after {
		if err := f(tx, r.envelope); err != nil {
			return err
		}
	}
	return nil
}

// logged is the receipt of the committed audit entry a.
func logged(a ledger.Appended) (*receipts.Logged, error) {
	in, err := a.Batch.Prove(a.Seq)
	if err != nil {
		return nil, fmt.Errorf("receipt of entry %d: %w", a.Seq, err)
	}
	return &receipts.Logged{Format: receipts.Format, Entry: a.RecordText(), Inclusion: in, Checkpoint: a.Batch.SignedNote()}, nil
}

// storedEnvelope is the result envelope kept for r's operation id, of a
// call audited at depth. A no_op call's result is left out (its
// result_hash stays): reads would otherwise copy every byte they return
// into the kernel's database. So are its state_snapshot_id and
// receipt_id, which name its audit entry (at ledger_seq) and are read
// back from it (withLedgerRefs). At depth commitments_only the envelope
// keeps what an erasure leaves (Result.withhold, NotKeptMessage): that
// depth stores no part of the call, and this envelope is also what the
// operation's idempotency key answers.
func storedEnvelope(r *Result, depth string) ([]byte, error) {
	s := *r
	if s.LedgerSeq > 0 {
		s.StateSnapshotID, s.ReceiptID = "", ""
	}
	switch {
	case depth == DepthCommitmentsOnly:
		s.withhold(NotKeptMessage)
	case leanStored(r):
		s.Result = nil
	}
	return json.Marshal(&s)
}

// withLedgerRefs sets the state_snapshot_id and receipt_id that a stored
// envelope r leaves out (storedEnvelope) from its audit entry; envelopes
// stored with them are left as they are.
func withLedgerRefs(tx *bbolt.Tx, r *Result) error {
	if r.LedgerSeq == 0 || (r.StateSnapshotID != "" && r.ReceiptID != "") {
		return nil
	}
	e, err := ledger.Get(tx, r.LedgerSeq)
	if err != nil {
		return fmt.Errorf("operation %s: its audit entry: %w", r.OperationID, err)
	}
	r.setLedgerRefs(e.Seq, e.Hash)
	return nil
}

// setLedgerRefs sets the fields of r that name its audit entry, seq with
// entry hash hash: ledger_seq, receipt_id and state_snapshot_id.
func (r *Result) setLedgerRefs(seq uint64, hash string) {
	r.ReceiptID, r.LedgerSeq = receipts.ID(seq, hash), seq
	r.StateSnapshotID = strconv.FormatUint(seq, 10) + ":" + hash
}

func leanStored(r *Result) bool { return r.TxOutcome == NoOp && r.Result != nil }

// storeOperation keeps the stored result envelope of an operation id, for
// lookup and to refuse the id's reuse. The first record of an id keeps
// it.
func (k *Kernel) storeOperation(tx *bbolt.Tx, id string, op txn.Operation) error {
	if txn.HasOperation(tx, id) {
		return nil
	}
	return txn.PutOperation(tx, id, op)
}

// agent is the agent c is attributed to: the envelope's agent once its
// token verified (the token is bound to it), else none. An envelope whose
// token did not verify may name any agent; its refusal is recorded with
// that claim as claimed_agent_id (audit), never as the agent's own call.
func (c *call) agent() string {
	if c.token == nil {
		return ""
	}
	return c.env.AgentID
}

// fill sets the result fields that come from the envelope.
func (c *call) fill(k *Kernel) {
	env := c.env
	if env.OperationID == "" {
		env.OperationID = newID()
	}
	c.res.ToolID, c.res.AgentID, c.res.OperationID = env.ToolID, c.agent(), env.OperationID
	c.res.AuditSalt = c.auditSalt()
	c.res.Provenance, c.res.TaskClass = env.Provenance, env.TaskClass
	if c.res.AutonomyMode == "" {
		// Refused before the policy step: nothing was allowed.
		c.res.AutonomyMode, c.res.RiskScore = policy.NoGo, 1
	}
	if c.res.RiskBasis == nil {
		c.res.RiskBasis = []string{}
	}
}

// noteToken records a verified token the first time the ledger sees it, so
// the audit trail holds the grants every later record refers to.
func (k *Kernel) noteToken(tx *bbolt.Tx, c *call) (bool, error) {
	if c.token == nil {
		return false, nil
	}
	jti := c.token.Claims.ID
	k.mu.RLock()
	seen := k.seen[jti]
	k.mu.RUnlock()
	if seen || tx.Bucket(bucketTokens).Get([]byte(jti)) != nil {
		return false, nil
	}
	cl := c.token.Claims
	body, err := json.Marshal(map[string]any{
		"jti": jti, "sub": cl.Subject, "iss": cl.Issuer, "aud": cl.Audience,
		"iat": cl.IssuedAt.Unix(), "nbf": cl.NotBefore.Unix(), "exp": cl.Expiry.Unix(),
		"cap": cl.Cap, "token_hash": c.token.Hash,
	})
	if err != nil {
		return false, err
	}
	if err := tx.Bucket(bucketTokens).Put([]byte(jti), body); err != nil {
		return false, err
	}
	_, err = ledger.Append(tx, ledger.KindTokenSeen, k.cfg.Now(), body)
	return err == nil, err
}

// setApproval copies the approval the call waited for (nil: none) into
// its record.
func (a *auditRecord) setApproval(ap *ApprovalRequest) {
	if ap != nil {
		a.ApprovalID, a.ApprovalState, a.ApprovedBy, a.ApprovalReason = ap.ID, ap.State, ap.DecidedBy, ap.Reason
	}
}

// audit builds the call's audit record from its current state.
func (c *call) audit(k *Kernel) *auditRecord {
	env, r := c.env, &c.res
	a := &auditRecord{
		OperationID: r.OperationID, AgentID: env.AgentID, PolicyHash: k.policy.Hash(),
		StateSnapshotID: env.StateSnapshotID, CapabilityTokenID: env.CapabilityTokenID,
		ToolID: env.ToolID, ArgsHash: c.argsHash, EnvelopeHash: c.envHash,
		Provenance: env.Provenance, TaskClass: env.TaskClass,
		AutonomyMode: r.AutonomyMode, RequestedMode: env.AutonomyMode, DecidedMode: c.decided,
		RiskScore: r.RiskScore, RiskBasis: r.RiskBasis,
		IdempotencyKey: env.IdempotencyKey, ReplayOf: c.replayOf,
		StartedAt: ledger.FormatTime(c.start), PolicyInput: c.input, policyEnc: c.policyEnc,
	}
	if c.token != nil {
		a.TokenHash = c.token.Hash
	} else {
		a.ClaimedAgentID, a.ClaimedTokenID = a.AgentID, a.CapabilityTokenID
		a.AgentID, a.CapabilityTokenID = "", ""
	}
	a.setApproval(c.approval)
	c.mu.Lock()
	if len(c.notes) > 0 {
		a.Notes = make(map[string]json.RawMessage, len(c.notes))
		for k, v := range c.notes {
			a.Notes[k] = v
		}
	}
	c.mu.Unlock()
	// The answer carries the notes its record commits to (read-only from
	// here on, shared by both).
	r.Notes = a.Notes
	a.setOutcome(r)
	return a
}

func (a *auditRecord) setOutcome(r *Result) {
	a.Status, a.TxOutcome, a.CommitDeltaID = r.Status, r.TxOutcome, r.CommitDeltaID
	a.ErrorClass, a.ErrorMessage = "", ""
	if r.Error != nil {
		a.ErrorClass, a.ErrorMessage = r.Error.Class, r.Error.Message
	}
}

// auditEntry is an audit record ready to append: the record, with the
// result hash of its outcome, its canonical body and the payload to keep
// beside it.
type auditEntry struct {
	a          *auditRecord
	resultHash string
	body       ledger.Body
	payload    []byte
}

// newAuditEntry completes a with r's result hash (canon: see
// resultCanonical) and a's commitments under salt to args (canonical) and
// its private parts, and canonicalizes its public part; depth says what of
// the payload to keep.
func newAuditEntry(a *auditRecord, r *Result, canon []byte, salt, depth string, args []byte) (*auditEntry, error) {
	// The result part is scratch: hashed, and copied into the payload.
	bp := packBufs.Get().(*[]byte)
	res := appendResultCanonical((*bp)[:0], r, canon)
	a.ResultHash = digest.Sum(res)
	s, err := a.seal(salt, depth, args, res)
	putBuf(bp, res)
	if err != nil {
		return nil, err
	}
	// So is the body: the ledger's Body holds a copy.
	bp = packBufs.Get().(*[]byte)
	b, err := appendAuditBody((*bp)[:0], a)
	if err != nil {
		return nil, err
	}
	body, err := ledger.Canonical(b)
	putBuf(bp, b)
	if err != nil {
		return nil, err
	}
	return &auditEntry{a: a, resultHash: a.ResultHash, body: body, payload: s.payload}, nil
}

// appendAudit appends the audit entry ae through the kernel's ledger
// writer and sets the ledger fields of r: its receipt id, ledger seq and
// state snapshot (the entry itself).
func (k *Kernel) appendAudit(tx *bbolt.Tx, ae *auditEntry, r *Result) (ledger.Appended, error) {
	a, err := k.lw.AppendCanonical(tx, ledger.KindAudit, k.cfg.Now(), ae.body)
	if err != nil {
		return a, err
	}
	r.setLedgerRefs(a.Seq, a.Hash)
	return a, nil
}

// sameOutcome reports whether a and b have the same status, result or
// error, and transaction outcome: whether an audit entry built for one
// serves the other. It is cheaper than comparing result hashes.
func sameOutcome(a, b *Result) bool {
	if a.Status != b.Status || a.TxOutcome != b.TxOutcome || a.CommitDeltaID != b.CommitDeltaID ||
		(a.Result == nil) != (b.Result == nil) || !bytes.Equal(a.Result, b.Result) {
		return false
	}
	if a.Error == nil || b.Error == nil {
		return a.Error == b.Error
	}
	return *a.Error == *b.Error
}

// resultHash is the digest of the canonical {"status","result"} or
// {"status","error"} object of r (see docs/formats.md).
func resultHash(r *Result, canon []byte) string { return digest.Sum(resultCanonical(r, canon)) }

// resultCanonical is the canonical {"status","result"} or
// {"status","error"} object of r, written in canonical form directly: what
// result_hash hashes and the audit record's result commitment commits to.
// canon, if not nil, is the canonical form of r.Result, which execute made
// when it checked the result.
func resultCanonical(r *Result, canon []byte) []byte {
	return appendResultCanonical(nil, r, canon)
}

// appendResultCanonical appends resultCanonical(r, canon) to b.
func appendResultCanonical(b []byte, r *Result, canon []byte) []byte {
	if r.Error != nil && (!utf8.ValidString(r.Error.Class) || !utf8.ValidString(r.Error.Message)) {
		// encoding/json's replacement of invalid UTF-8 decides the bytes.
		return append(b, resultMarshalled(r)...)
	}
	b = slices.Grow(b, 96+len(canon))
	if r.Error != nil {
		b = append(b, `{"error":{"class":`...)
		b = jcs.AppendString(b, r.Error.Class)
		b = append(b, `,"message":`...)
		b = jcs.AppendString(b, r.Error.Message)
		b = append(b, `},"status":`...)
	} else {
		switch {
		case canon != nil:
		case r.Result == nil:
			canon = []byte("null")
		default:
			var err error
			if canon, err = jcs.Canonicalize(r.Result); err != nil {
				return append(b, resultMarshalled(r)...)
			}
		}
		b = append(b, `{"result":`...)
		b = append(b, canon...)
		b = append(b, `,"status":`...)
	}
	b = jcs.AppendString(b, r.Status)
	return append(b, '}')
}

// resultMarshalled is resultCanonical by encoding/json and RFC 8785
// canonicalization, for the results resultCanonical does not write itself.
func resultMarshalled(r *Result) []byte {
	v := map[string]any{"status": r.Status}
	if r.Error != nil {
		v["error"] = r.Error
	} else {
		v["result"] = r.Result
	}
	b, err := jcs.Marshal(v)
	if err != nil {
		// Results are canonicalized before they get here; an error means
		// the result is unhashable, which the hash of the failure records.
		b = []byte(err.Error())
	}
	return b
}

// recoveryContext is what recovery needs to audit the call should the
// kernel stop before it commits: its audit record as of prepare.
func (c *call) recoveryContext() json.RawMessage {
	a := &auditRecord{
		OperationID: c.env.OperationID, AgentID: c.env.AgentID, StateSnapshotID: c.env.StateSnapshotID,
		CapabilityTokenID: c.env.CapabilityTokenID, TokenHash: c.token.Hash, ToolID: c.env.ToolID,
		ArgsHash: c.argsHash, Provenance: c.env.Provenance, TaskClass: c.env.TaskClass,
		AutonomyMode: c.res.AutonomyMode, RequestedMode: c.env.AutonomyMode, DecidedMode: c.decided,
		RiskScore: c.res.RiskScore, RiskBasis: c.res.RiskBasis, IdempotencyKey: c.env.IdempotencyKey,
		StartedAt: ledger.FormatTime(c.start), PolicyInput: c.input,
		RecoverySalt: c.auditSalt(), RecoveryArgs: c.canonArgs,
		// The policy the call was decided under (step 6 checked the
		// envelope names the active one): the restart may load another.
		PolicyHash: c.env.PolicyHash,
	}
	a.setApproval(c.approval) // as its record would have said
	b, _ := json.Marshal(a)
	return b
}

// auditRecovery audits a call rolled back by crash recovery.
func (k *Kernel) auditRecovery(tx *bbolt.Tx, in *txn.Intent) error {
	var a auditRecord
	if err := json.Unmarshal(in.Audit, &a); err != nil {
		return fmt.Errorf("intent %s: audit context: %w", in.OperationID, err)
	}
	if a.PolicyHash == "" {
		a.PolicyHash = k.policy.Hash() // an intent written before it was kept
	}
	r := &Result{
		OperationID: a.OperationID, ToolID: a.ToolID, AgentID: a.AgentID, Status: StatusError,
		Error:     &Error{Class: ErrInternal, Message: "the kernel stopped before this call committed; rolled back at recovery"},
		TxOutcome: RolledBack, AutonomyMode: a.AutonomyMode, RiskScore: a.RiskScore, RiskBasis: a.RiskBasis,
	}
	switch {
	case in.External && in.Read:
		// The request may have gone out; it changed nothing, so its key
		// was released (txn.Recover) and a repeat runs again.
		r.Error = &Error{Class: ErrOutcomeUnknown, Message: "the kernel stopped while this call's request was out; " +
			"whether it reached the other side is unknown; being a read, it changed nothing there, and a repeat runs again"}
	case in.External:
		// The request may have reached the other side: never say it did
		// not happen, and never send it again.
		r.Error = &Error{Class: ErrOutcomeUnknown, Message: "the kernel stopped while this call's external effect was in flight; " +
			"whether it happened is unknown (reconcile with the other side); a repeat with the same idempotency key returns this outcome and is never sent again"}
	}
	a.setOutcome(r)
	salt, args := a.RecoverySalt, a.RecoveryArgs
	if salt == "" {
		salt = NewSalt() // an intent written before commitments
	}
	r.AuditSalt = salt
	depth := k.depthOf(a.ToolID)
	ae, err := newAuditEntry(&a, r, nil, salt, depth, args)
	if err != nil {
		return err
	}
	r.ResultHash = ae.resultHash
	a2, err := k.appendAudit(tx, ae, r)
	if err != nil {
		return err
	}
	if err := putPayload(tx, a2.Seq, ae.payload); err != nil {
		return err
	}
	b, err := storedEnvelope(r, depth)
	if err != nil {
		return err
	}
	// The operation first: the key's row then refers to its envelope
	// rather than holding a copy (see txn.Settle).
	if err := k.storeOperation(tx, r.OperationID, txn.PackOperation(b)); err != nil {
		return err
	}
	if in.External && !in.Read {
		return txn.Settle(tx, in, b)
	}
	return nil
}

// publicClaims puts what the envelope says and nothing vouches for in a
// form its record may publish: a tool id that is neither a syscall id's
// nor a handle's form; an idempotency key, task class or autonomy mode,
// and a state snapshot id, that break their own rules (checkEnvelope
// refuses such an envelope, and this is its refusal's record); and, for
// a call whose token did not verify, an agent id that breaks agentIDRule
// and a capability token id that is no UUID in canonical form; and any of
// them that holds AdminPrefix (the admin credential pasted there):
// each becomes the digest of its bytes ("blake3:<hex>", which stays as it
// is). Such a record is public and its body is never erased: kept as
// sent, these members would publish whatever a client put there — its
// token, pasted in the wrong field, or a megabyte of text of anyone's
// choosing.
func (c *call) publicClaims() {
	env := c.env
	type claim struct {
		v  *string
		ok func(string) bool
	}
	claims := []claim{
		{&env.ToolID, validToolForm},
		{&env.IdempotencyKey, validLabel},
		{&env.TaskClass, validLabel},
		{&env.AutonomyMode, policy.ValidMode},
		{&env.StateSnapshotID, validSnapshotID},
	}
	if c.token == nil {
		claims = append(claims, claim{&env.AgentID, validAgentID}, claim{&env.CapabilityTokenID, canonicalUUID})
	}
	for _, m := range claims {
		// The admin credential obeys the label rule: it is digested by
		// its prefix wherever it was pasted.
		if *m.v != "" && (!m.ok(*m.v) || holdsAdminCredential(*m.v)) && !isDigest(*m.v) {
			*m.v = digest.Sum([]byte(*m.v))
		}
	}
}

// canonicalUUID reports whether s is a UUID in canonical form.
func canonicalUUID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

// validSnapshotID reports whether s has a state_snapshot_id's form,
// "<seq>:<entry_hash>" (docs/formats.md), or is empty.
func validSnapshotID(s string) bool {
	seq, hash, ok := strings.Cut(s, ":")
	if !ok || seq == "" || len(seq) > 20 || strings.Trim(seq, "0123456789") != "" {
		return s == ""
	}
	return isDigest(hash)
}

// validToolForm reports whether id may stand in a record as sent: empty,
// a syscall id's form, a handle's, a front end's name for a call no
// syscall serves ("front:what", each part a syscall id's form, at most 64
// bytes: runner.InvalidLineTool), or a digest publicClaims made.
func validToolForm(id string) bool {
	if name, ok := strings.CutPrefix(id, HandlePrefix); ok {
		return len(name) == handleNameLen && strings.Trim(name, "abcdefghijklmnopqrstuvwxyz234567") == ""
	}
	if front, what, ok := strings.Cut(id, ":"); ok && len(id) <= 64 && syscalls.ValidID(front) && syscalls.ValidID(what) {
		return true
	}
	return id == "" || syscalls.ValidID(id) || isDigest(id)
}

// isDigest reports whether s is a digest in its text form.
func isDigest(s string) bool {
	_, err := digest.Parse(s)
	return err == nil
}

// salvage reads what it can of an envelope that failed strict decoding, so
// the refusal's audit record names the agent, tool and token when they are
// there: the string members tool_id, agent_id and capability_token_id of
// the top-level object, read member by member up to the first thing that
// does not decode (a body cut at the size limit keeps what came before
// the cut; the first of a duplicated member counts).
func salvage(data []byte) *Envelope {
	env := &Envelope{}
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	if t, err := dec.ReadToken(); err != nil || t.Kind() != '{' {
		return env
	}
	fields := map[string]*string{"tool_id": &env.ToolID, "agent_id": &env.AgentID, "capability_token_id": &env.CapabilityTokenID}
	for dec.PeekKind() == '"' {
		tok, err := dec.ReadToken()
		if err != nil {
			break
		}
		name := tok.String() // a token is valid until the next read
		dst := fields[name]
		if dst == nil || dec.PeekKind() != '"' {
			if dec.SkipValue() != nil {
				break
			}
			continue
		}
		v, err := dec.ReadToken()
		if err != nil {
			break
		}
		*dst = v.String()
		delete(fields, name)
	}
	return env
}
