package kernel

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/txn"
)

// auditRecord is the body of an audit ledger entry: every field of TOOL-01
// §3, the call's outcome, and the policy input document the decision was
// made on (absent for calls refused before the policy step).
type auditRecord struct {
	OperationID       string          `json:"operation_id"`
	AgentID           string          `json:"agent_id"`
	PolicyHash        string          `json:"policy_hash"`
	StateSnapshotID   string          `json:"state_snapshot_id"`
	CapabilityTokenID string          `json:"capability_token_id"`
	TokenHash         string          `json:"token_hash,omitempty"`
	ToolID            string          `json:"tool_id"`
	ArgsHash          string          `json:"args_hash"`
	EnvelopeHash      string          `json:"envelope_hash,omitempty"`
	ResultHash        string          `json:"result_hash"`
	Provenance        json.RawMessage `json:"provenance,omitempty"`
	TaskClass         string          `json:"task_class"`
	AutonomyMode      string          `json:"autonomy_mode"`
	RequestedMode     string          `json:"requested_mode,omitempty"`
	DecidedMode       string          `json:"decided_mode,omitempty"`
	RiskScore         float64         `json:"risk_score"`
	RiskBasis         []string        `json:"risk_basis"`
	Status            string          `json:"status"`
	ErrorClass        string          `json:"error_class,omitempty"`
	ErrorMessage      string          `json:"error_message,omitempty"`
	TxOutcome         string          `json:"tx_outcome"`
	CommitDeltaID     string          `json:"commit_delta_id,omitempty"`
	IdempotencyKey    string          `json:"idempotency_key,omitempty"`
	ReplayOf          string          `json:"replay_of,omitempty"`
	StartedAt         string          `json:"started_at"`
	PolicyInput       *policy.Input   `json:"policy_input,omitempty"`
	// The approval of a soft_gate or escalated call: its id, state, the
	// approver's identity (token sub) and reason.
	ApprovalID     string `json:"approval_id,omitempty"`
	ApprovalState  string `json:"approval_state,omitempty"`
	ApprovedBy     string `json:"approved_by,omitempty"`
	ApprovalReason string `json:"approval_reason,omitempty"`
	// Notes are details a syscall adds to its record: proc.exec's and
	// net.fetch's network connections (net_connections), for instance.
	Notes map[string]json.RawMessage `json:"notes,omitempty"`
}

// receiptBody is the body of a receipt ledger entry.
type receiptBody struct {
	ReceiptID   string `json:"receipt_id"`
	OperationID string `json:"operation_id"`
	JWS         string `json:"jws"`
}

// deny records a call refused before it could run and returns its result.
func (k *Kernel) deny(ctx context.Context, c *call, class, msg string) *Result {
	c.setOutcome(nil, class, msg, NoOp)
	if _, err := k.record(context.WithoutCancel(ctx), c, nil); err != nil {
		return k.internal(c, err)
	}
	return &c.res
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
	c.res.ResultHash = resultHash(&c.res)
	return &c.res
}

// record appends the call's audit record and receipt in one group-committed
// transaction. before runs first and may set the call's outcome (it must
// not write when it returns an error); after runs last with the final
// result envelope, for writes that store it. The receipt is signed in the
// batch's concurrent step, off the sequencer's serial path.
func (k *Kernel) record(ctx context.Context, c *call, before func(*bbolt.Tx) error, after ...func(*bbolt.Tx, []byte) error) (*Result, error) {
	c.fill(k)
	// The audit body is built for the outcome known now, outside the
	// sequencer; only when before changes the outcome is it built again.
	planned, err := newAuditEntry(c.audit(k), &c.res)
	if err != nil {
		return nil, err
	}
	plannedRes := c.res
	newToken := false
	var p *pendingReceipt
	err = k.db.Do(ctx, store.Op{
		Prepare: func(tx *bbolt.Tx) error {
			ae := planned
			if before != nil {
				if err := before(tx); err != nil {
					return err
				}
				if !sameOutcome(&c.res, &plannedRes) {
					var err error
					if ae, err = newAuditEntry(c.audit(k), &c.res); err != nil {
						return abortIf(err)
					}
				}
			}
			c.res.ResultHash = ae.resultHash
			var err error
			if newToken, err = k.noteToken(tx, c); err != nil {
				return abortIf(err)
			}
			p, err = k.appendAuditEntry(tx, ae)
			return abortIf(err)
		},
		Work: func() error { return p.sign(k.signer) },
		Finish: func(tx *bbolt.Tx) error {
			if err := k.appendReceipt(tx, p, &c.res); err != nil {
				return err
			}
			envelope, err := json.Marshal(&c.res)
			if err != nil {
				return err
			}
			if err := k.storeOperation(tx, &c.res, envelope); err != nil {
				return err
			}
			for _, f := range after {
				if err := f(tx, envelope); err != nil {
					return err
				}
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	if newToken {
		k.mu.Lock()
		k.seen[c.token.Claims.ID] = true
		k.mu.Unlock()
	}
	return &c.res, nil
}

// storeOperation keeps the result envelope of an operation id, for lookup
// and to refuse the id's reuse. The first record of an id keeps it. A
// no_op call's result is left out (its result_hash stays): reads would
// otherwise copy every byte they return into the kernel's database.
func (k *Kernel) storeOperation(tx *bbolt.Tx, r *Result, envelope []byte) error {
	if txn.GetOperation(tx, r.OperationID) != nil {
		return nil
	}
	if r.TxOutcome == NoOp && r.Result != nil {
		lean := *r
		lean.Result = nil
		var err error
		if envelope, err = json.Marshal(&lean); err != nil {
			return err
		}
	}
	return txn.PutOperation(tx, r.OperationID, envelope)
}

// fill sets the result fields that come from the envelope.
func (c *call) fill(k *Kernel) {
	env := c.env
	if env.OperationID == "" {
		env.OperationID = newID()
	}
	c.res.ToolID, c.res.AgentID, c.res.OperationID = env.ToolID, env.AgentID, env.OperationID
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
		StartedAt: c.start.UTC().Format(ledger.TimeLayout), PolicyInput: c.input,
	}
	if c.token != nil {
		a.TokenHash = c.token.Hash
	}
	if ap := c.approval; ap != nil {
		a.ApprovalID, a.ApprovalState, a.ApprovedBy, a.ApprovalReason = ap.ID, ap.State, ap.DecidedBy, ap.Reason
	}
	c.mu.Lock()
	if len(c.notes) > 0 {
		a.Notes = make(map[string]json.RawMessage, len(c.notes))
		for k, v := range c.notes {
			a.Notes[k] = v
		}
	}
	c.mu.Unlock()
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

// pendingReceipt is a receipt between its audit entry, which it names, and
// its own ledger entry.
type pendingReceipt struct {
	receipt receipts.Receipt
	at      time.Time
	jws     string
	body    ledger.Body // the receipt entry's canonical body
}

// sign signs the receipt and makes its ledger entry's body. It runs in the
// batch's concurrent step, so neither costs the sequencer's serial path.
func (p *pendingReceipt) sign(s *receipts.Signer) (err error) {
	if p.jws, err = s.Sign(&p.receipt); err != nil {
		return err
	}
	rb, err := json.Marshal(receiptBody{ReceiptID: p.receipt.ReceiptID, OperationID: p.receipt.OperationID, JWS: p.jws})
	if err != nil {
		return err
	}
	p.body, err = ledger.Canonicalize(rb)
	return err
}

// auditEntry is an audit record ready to append: the record, with the
// result hash of its outcome, and its canonical body.
type auditEntry struct {
	a          *auditRecord
	resultHash string
	body       ledger.Body
}

// newAuditEntry completes a with r's result hash and canonicalizes it.
func newAuditEntry(a *auditRecord, r *Result) (*auditEntry, error) {
	a.ResultHash = resultHash(r)
	b, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	body, err := ledger.Canonicalize(b)
	if err != nil {
		return nil, err
	}
	return &auditEntry{a: a, resultHash: a.ResultHash, body: body}, nil
}

// appendAuditEntry appends ae and returns the receipt that will name it.
func (k *Kernel) appendAuditEntry(tx *bbolt.Tx, ae *auditEntry) (*pendingReceipt, error) {
	a := ae.a
	now := k.cfg.Now()
	e, err := ledger.AppendCanonical(tx, ledger.KindAudit, now, ae.body)
	if err != nil {
		return nil, err
	}
	return &pendingReceipt{at: now, receipt: receipts.Receipt{
		ReceiptID: newID(), OperationID: a.OperationID, ToolID: a.ToolID, AgentID: a.AgentID,
		CapabilityTokenID: a.CapabilityTokenID, ArgsHash: a.ArgsHash, ResultHash: a.ResultHash,
		TxOutcome: a.TxOutcome, CommitDeltaID: a.CommitDeltaID, PolicyHash: a.PolicyHash,
		AutonomyMode: a.AutonomyMode, RiskScore: a.RiskScore, ErrorClass: a.ErrorClass,
		LedgerSeq: e.Seq, LedgerEntryHash: e.Hash, IssuedAt: now.UTC().Format(ledger.TimeLayout),
		ApprovalID: a.ApprovalID, ApprovedBy: a.ApprovedBy, ApprovalReason: a.ApprovalReason,
	}}, nil
}

// appendReceipt appends the signed receipt p and sets the ledger and
// receipt fields of r.
func (k *Kernel) appendReceipt(tx *bbolt.Tx, p *pendingReceipt, r *Result) error {
	re, err := ledger.AppendCanonical(tx, ledger.KindReceipt, p.at, p.body)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketReceipts).Put([]byte(p.receipt.ReceiptID), binary.BigEndian.AppendUint64(nil, re.Seq)); err != nil {
		return err
	}
	r.ReceiptID, r.Receipt, r.LedgerSeq = p.receipt.ReceiptID, p.jws, p.receipt.LedgerSeq
	r.StateSnapshotID = fmt.Sprintf("%d:%s", re.Seq, re.Hash)
	return nil
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
func resultHash(r *Result) string {
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
	return digest.Sum(b)
}

// recoveryContext is what recovery needs to audit the call should the
// kernel stop before it commits: its audit record as of prepare.
func (c *call) recoveryContext() json.RawMessage {
	b, _ := json.Marshal(&auditRecord{
		OperationID: c.env.OperationID, AgentID: c.env.AgentID, StateSnapshotID: c.env.StateSnapshotID,
		CapabilityTokenID: c.env.CapabilityTokenID, TokenHash: c.token.Hash, ToolID: c.env.ToolID,
		ArgsHash: c.argsHash, Provenance: c.env.Provenance, TaskClass: c.env.TaskClass,
		AutonomyMode: c.res.AutonomyMode, RequestedMode: c.env.AutonomyMode, DecidedMode: c.decided,
		RiskScore: c.res.RiskScore, RiskBasis: c.res.RiskBasis, IdempotencyKey: c.env.IdempotencyKey,
		StartedAt: c.start.UTC().Format(ledger.TimeLayout), PolicyInput: c.input,
	})
	return b
}

// auditRecovery audits a call rolled back by crash recovery.
func (k *Kernel) auditRecovery(tx *bbolt.Tx, in *txn.Intent) error {
	var a auditRecord
	if err := json.Unmarshal(in.Audit, &a); err != nil {
		return fmt.Errorf("intent %s: audit context: %w", in.OperationID, err)
	}
	a.PolicyHash = k.policy.Hash()
	r := &Result{
		OperationID: a.OperationID, ToolID: a.ToolID, AgentID: a.AgentID, Status: StatusError,
		Error:     &Error{Class: ErrInternal, Message: "the kernel stopped before this call committed; rolled back at recovery"},
		TxOutcome: RolledBack, AutonomyMode: a.AutonomyMode, RiskScore: a.RiskScore, RiskBasis: a.RiskBasis,
	}
	if in.External {
		// The request may have reached the other side: never say it did
		// not happen, and never send it again.
		r.Error = &Error{Class: ErrOutcomeUnknown, Message: "the kernel stopped while this call's external effect was in flight; " +
			"whether it happened is unknown (reconcile with the other side); a repeat with the same idempotency key returns this outcome and is never sent again"}
	}
	a.setOutcome(r)
	ae, err := newAuditEntry(&a, r)
	if err != nil {
		return err
	}
	r.ResultHash = ae.resultHash
	p, err := k.appendAuditEntry(tx, ae)
	if err != nil {
		return err
	}
	if err := p.sign(k.signer); err != nil {
		return err
	}
	if err := k.appendReceipt(tx, p, r); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if in.External {
		if err := txn.Unknown(tx, in, b); err != nil {
			return err
		}
	}
	return k.storeOperation(tx, r, b)
}

// salvage reads what it can of an envelope that failed strict decoding, so
// the refusal's audit record names the agent and tool when they are there.
func salvage(data []byte) *Envelope {
	var loose struct {
		ToolID            string `json:"tool_id"`
		AgentID           string `json:"agent_id"`
		CapabilityTokenID string `json:"capability_token_id"`
		OperationID       string `json:"operation_id"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if dec.Decode(&loose) != nil {
		return &Envelope{}
	}
	return &Envelope{ToolID: loose.ToolID, AgentID: loose.AgentID, CapabilityTokenID: loose.CapabilityTokenID}
}
