package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/txn"
)

// Erasure removes audit payloads (payloads.go) and appends an erasure
// record saying what, who, why and when. The audit records themselves,
// their commitments, the chain, the tree, checkpoints and receipts are
// untouched, so every proof still verifies; verification reports the
// erased parts as erased, never as tampered.

// KindErasure is the ledger kind of an erasure record.
const KindErasure = "erasure"

// Erasers named in erasure records.
const (
	ErasedByAdmin     = "admin"
	ErasedByRetention = "retention"
)

// maxErasedPerRecord bounds the seqs one erasure record lists (and one
// retention transaction erases).
var maxErasedPerRecord = 4096

// Erasure is the body of an erasure record.
type Erasure struct {
	// Seqs are the audit entries whose payloads were removed: every part,
	// and the salt.
	Seqs        []uint64       `json:"seqs"`
	OperationID string         `json:"operation_id,omitempty"` // an erasure by operation
	By          string         `json:"by"`                     // ErasedByAdmin or ErasedByRetention
	Reason      string         `json:"reason"`
	Rule        *RetentionRule `json:"rule,omitempty"`   // the retention rule that erased them
	Before      string         `json:"before,omitempty"` // retention: records older than this time
}

// ErrNothingToErase is returned (wrapped) by Erase when the operation's
// record holds no payload any more.
var ErrNothingToErase = errors.New("nothing to erase")

// Erase removes the payload of operation id's audit record (and the result
// and salt kept in its stored result envelope), and those of its recorded
// replays, and records the erasure with reason. It fails with ErrNotFound
// for an unknown operation and ErrNothingToErase when none of these
// payloads is left.
func (k *Kernel) Erase(ctx context.Context, id, reason string) (*Erasure, error) {
	if reason == "" {
		return nil, errors.New("erase: a reason is required")
	}
	var out *Erasure
	var replays []string
	err := k.db.Update(ctx, func(tx *bbolt.Tx) error {
		r, err := storedResult(tx, id)
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("operation %q: %w", id, ErrNotFound)
		}
		e, err := ledger.Get(tx, r.LedgerSeq)
		if err != nil {
			return fmt.Errorf("operation %q: audit record %d: %w", id, r.LedgerSeq, err)
		}
		var who recordOwner
		if e.Kind != ledger.KindAudit || json.Unmarshal(e.Body, &who) != nil || who.OperationID != id {
			return fmt.Errorf("operation %q: ledger entry %d is not its audit record", id, r.LedgerSeq)
		}
		out = &Erasure{OperationID: id, By: ErasedByAdmin, Reason: reason}
		if erased, err := erasePayload(tx, e.Seq, who); err != nil {
			return abortIf(err)
		} else if erased {
			out.Seqs = append(out.Seqs, e.Seq)
		}
		// Its replays too, also when its own payload went before them (a
		// repeat of the key after an erasure records the args again).
		seqs, rops, err := eraseReplays(tx, []string{id})
		if err != nil {
			return abortIf(err)
		}
		out.Seqs, replays = append(out.Seqs, seqs...), rops
		if len(out.Seqs) == 0 {
			return fmt.Errorf("operation %q (audit record %d): %w: its payload was erased or never kept", id, e.Seq, ErrNothingToErase)
		}
		return abortIf(k.appendErasure(tx, out))
	})
	if err != nil {
		return nil, err
	}
	k.ops.forgetResult(id)
	for _, op := range replays {
		k.ops.forgetResult(op)
	}
	return out, nil
}

// eraseReplays erases the payloads and stored results of the recorded
// replays of the operations ops (replaysOf), which carry their originals'
// args, results and salts, and returns their seqs and operation ids.
func eraseReplays(tx *bbolt.Tx, ops []string) (seqs []uint64, replayOps []string, err error) {
	for _, op := range ops {
		for _, seq := range replaysOf(tx, op) {
			e, err := ledger.Get(tx, seq)
			if err != nil {
				return nil, nil, fmt.Errorf("replay of %s: audit record %d: %w", op, seq, err)
			}
			var who recordOwner
			if err := json.Unmarshal(e.Body, &who); err != nil {
				return nil, nil, fmt.Errorf("replay of %s: audit record %d: %w", op, seq, err)
			}
			erased, err := erasePayload(tx, seq, who)
			if err != nil {
				return nil, nil, err
			}
			if erased {
				seqs, replayOps = append(seqs, seq), append(replayOps, who.OperationID)
			}
		}
	}
	return seqs, replayOps, nil
}

// erasePayload removes the payload of audit record seq, of the operation
// who names, and reports whether it had one; forgetStored does the rest.
func erasePayload(tx *bbolt.Tx, seq uint64, who recordOwner) (bool, error) {
	had, err := ledger.Detach(tx, seq)
	if err != nil || !had {
		return false, err // erased already, or never kept
	}
	return true, forgetStored(tx, who, seq)
}

// forgetStored removes from the stored result envelope of the operation
// who names what the erasure of record seq's payload removes
// (forgetResult), when that envelope is the record's: an operation id
// whose first record is another keeps its envelope.
func forgetStored(tx *bbolt.Tx, who recordOwner, seq uint64) error {
	res, err := storedResult(tx, who.OperationID)
	if err != nil || res == nil || res.LedgerSeq != seq {
		return nil
	}
	return forgetResult(tx, who, res)
}

// storedResult decodes the stored result envelope of operation id (one a
// kernel of any version stored), or returns nil when there is none. Its
// ledger refs are not set (withLedgerRefs does that for reads).
func storedResult(tx *bbolt.Tx, id string) (*Result, error) {
	env, err := txn.GetOperation(tx, id)
	if env == nil || err != nil {
		return nil, err
	}
	var r Result
	if err := decodeStored(env, &r); err != nil {
		return nil, fmt.Errorf("operation %q: stored result: %w", id, err)
	}
	return &r, nil
}

// recordOwner is what erasure reads of an audit record's body.
type recordOwner struct {
	OperationID    string `json:"operation_id"`
	ToolID         string `json:"tool_id"`
	AgentID        string `json:"agent_id"`
	ClaimedAgentID string `json:"claimed_agent_id"`
	IdempotencyKey string `json:"idempotency_key"`
}

// agent is the agent a retention rule takes the record for: its own, or,
// for a call whose token did not verify (expired, revoked), the agent its
// envelope claimed. Anyone may claim any agent; erasing such a refusal's
// payload under that agent's rule errs towards erasing.
func (o *recordOwner) agent() string {
	if o.AgentID != "" {
		return o.AgentID
	}
	return o.ClaimedAgentID
}

// forgetResult rewrites the stored result envelope r of the operation of
// record o without what erasure removes (Result.erase), in the operations
// table and in the idempotency table: the stored copies of an erased
// payload. The key's row also forgets the args hash (txn.EraseResult),
// even when the envelope had nothing left to remove: compared with a
// repeat's, it would confirm guesses of the erased args.
func forgetResult(tx *bbolt.Tx, o recordOwner, r *Result) error {
	changed := r.erase()
	b, err := storedEnvelope(r, DepthFull)
	if err != nil {
		return err
	}
	if changed {
		if err := txn.PutOperation(tx, o.OperationID, txn.PackOperation(b)); err != nil {
			return err
		}
	}
	if o.IdempotencyKey == "" {
		return nil
	}
	return txn.EraseResult(tx, txn.IdemKey{AgentID: o.AgentID, Key: o.IdempotencyKey}, o.OperationID, b)
}

func (k *Kernel) appendErasure(tx *bbolt.Tx, e *Erasure) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = ledger.Append(tx, KindErasure, k.cfg.Now(), b)
	return err
}

// Retain runs the retention rules once: for each rule, the payloads of
// the audit records it covers that are older than its age are removed,
// with one erasure record per transaction of at most maxErasedPerRecord
// of them. It returns how many payloads were erased.
func (k *Kernel) Retain(ctx context.Context) (int, error) {
	total := 0
	for i := range k.audit.retention {
		r := k.audit.retention[i]
		before := k.cfg.Now().Add(-r.age)
		for from := uint64(0); ; {
			n, next, err := k.retainBatch(ctx, r, before, from)
			total += n
			if err != nil {
				return total, fmt.Errorf("retention rule %d: %w", i, err)
			}
			if next == 0 {
				break
			}
			from = next
		}
	}
	return total, nil
}

// retainBatch erases up to maxErasedPerRecord payloads rule r covers
// whose records are older than before, found from entry from on, and
// returns how many it erased and where the next batch starts (0: the walk
// reached the end). The walk, over the payloads from from on (the ledger's
// attachments), runs in a read transaction, off the sequencer; the write
// transaction erases the payloads found that are still there.
func (k *Kernel) retainBatch(ctx context.Context, r retention, before time.Time, from uint64) (n int, next uint64, err error) {
	cutoff := before.UTC().Format(ledger.TimeLayout)
	var seqs []uint64
	var whos []recordOwner
	err = k.db.View(func(tx *bbolt.Tx) error {
		seqs, whos, next = seqs[:0], whos[:0], 0
		err := ledger.Attachments(tx, from, func(seq uint64, _ []byte) error {
			if len(seqs) == maxErasedPerRecord {
				next = seq
				return errStop
			}
			e, err := ledger.Get(tx, seq)
			if err != nil {
				return err
			}
			if e.Time >= cutoff {
				return nil
			}
			var who recordOwner
			if err := json.Unmarshal(e.Body, &who); err != nil {
				return fmt.Errorf("audit record %d: %w", seq, err)
			}
			if r.matches(who.ToolID, who.agent()) {
				seqs, whos = append(seqs, seq), append(whos, who)
			}
			return nil
		})
		if errors.Is(err, errStop) {
			err = nil
		}
		return err
	})
	if err != nil || len(seqs) == 0 {
		return 0, next, err
	}
	var ops []string
	err = k.db.Update(ctx, func(tx *bbolt.Tx) error {
		n, ops = 0, ops[:0]
		var erased []uint64
		for i, seq := range seqs {
			had, err := ledger.Detach(tx, seq)
			if err != nil {
				return abortIf(err)
			}
			if !had {
				continue // erased since the walk
			}
			erased, ops = append(erased, seq), append(ops, whos[i].OperationID)
			if err := forgetStored(tx, whos[i], seq); err != nil {
				return abortIf(err)
			}
		}
		if len(erased) == 0 {
			return nil
		}
		// Their replays hold copies of what goes: they go too.
		rseqs, rops, err := eraseReplays(tx, ops)
		if err != nil {
			return abortIf(err)
		}
		erased, ops = append(erased, rseqs...), append(ops, rops...)
		rule := r.RetentionRule
		n = len(erased)
		return abortIf(k.appendErasure(tx, &Erasure{Seqs: erased, By: ErasedByRetention, Rule: &rule, Before: cutoff,
			Reason: fmt.Sprintf("retention: payloads older than %s", r.OlderThan)}))
	})
	if err != nil {
		return 0, 0, err
	}
	for _, id := range ops {
		k.ops.forgetResult(id)
	}
	return n, next, nil
}

// startRetention runs the retention rules once now and then every
// interval until Close.
func (k *Kernel) startRetention(ctx context.Context) error {
	if len(k.audit.retention) == 0 {
		return nil
	}
	if _, err := k.Retain(ctx); err != nil {
		return fmt.Errorf("open: audit retention: %w", err)
	}
	k.retention, k.retained = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(k.retained)
		t := time.NewTicker(k.audit.interval)
		defer t.Stop()
		for {
			select {
			case <-k.retention:
				return
			case <-t.C:
				if _, err := k.Retain(context.Background()); err != nil {
					k.cfg.Logger.Error("audit retention failed", "err", err)
				}
			}
		}
	}()
	return nil
}

func (k *Kernel) stopRetention() {
	if k.retention != nil {
		close(k.retention)
		<-k.retained
		k.retention = nil
	}
}

// PayloadReport is what a verification found of the audit payloads.
type PayloadReport struct {
	Records        int `json:"records"`          // audit records with commitments
	Opened         int `json:"opened"`           // parts kept that open their commitments (checked with the payloads at hand)
	NotKept        int `json:"not_kept"`         // parts never kept (depth commitments_only)
	Erased         int `json:"erased"`           // records whose payloads an erasure record removed
	ErasureRecords int `json:"erasure_records"`  // erasure records
	Absent         int `json:"absent,omitempty"` // export verification: records kept in full, not erased, whose payload the export does not carry
}

// payloadTally counts, as verified entries stream by in seq order, the
// audit records with commitments and the erasure records.
type payloadTally struct {
	rep    PayloadReport
	erased map[uint64]bool
}

// open tallies the parts of payload p (nil for none) of audit record seq
// against its commitments c at depth, the parts in erased as erased. A
// part that does not open its commitment, or a committed part a kept
// payload lacks, is tampering.
func (t *payloadTally) open(seq uint64, c Commitments, depth string, p *Payload, erased map[string]bool) error {
	states := OpenPayload(c, depth, p, erased)
	for _, name := range Parts {
		switch st := states[name]; st {
		case PartMatches:
			t.rep.Opened++
		case PartNotKept:
			t.rep.NotKept++
		case PartMismatch, PartMissing:
			return fmt.Errorf("audit record %d: payload part %s is %s (tampered)", seq, name, st)
		}
	}
	return nil
}

func (t *payloadTally) entry(e ledger.Entry) error {
	switch e.Kind {
	case ledger.KindAudit:
		if bytes.Contains(e.Body, []byte(`"payload_depth"`)) {
			t.rep.Records++
		}
	case KindErasure:
		var er Erasure
		if err := json.Unmarshal(e.Body, &er); err != nil {
			return fmt.Errorf("erasure record %d: %w", e.Seq, err)
		}
		t.rep.ErasureRecords++
		if t.erased == nil {
			t.erased = map[uint64]bool{}
		}
		for _, s := range er.Seqs {
			if s >= e.Seq {
				return fmt.Errorf("erasure record %d names entry %d, which comes after it", e.Seq, s)
			}
			if !t.erased[s] {
				t.erased[s] = true
				t.rep.Erased++
			}
		}
	}
	return nil
}

// checkPayloads verifies every stored payload against the commitments of
// its audit record, in one read transaction: a part that does not open
// its commitment, a committed part neither kept nor erased, or a payload
// with no audit record is tampering, reported at the record's seq.
func checkPayloads(tx *bbolt.Tx) (PayloadReport, *ledger.VerifyError, error) {
	t := &payloadTally{}
	var bad *ledger.VerifyError
	committed := map[uint64]bool{} // audit records with commitments
	stop := errors.New("stop")
	// Erasure records come after the records they name: read them first.
	err := ledger.Scan(tx, 0, func(e ledger.Entry) error {
		if err := t.entry(e); err != nil {
			bad = &ledger.VerifyError{Seq: e.Seq, Reason: err.Error()}
			return stop
		}
		return nil
	})
	if err != nil || bad != nil {
		if errors.Is(err, stop) {
			err = nil
		}
		return t.rep, bad, err
	}
	err = ledger.Scan(tx, 0, func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit {
			return nil
		}
		c, depth, err := commitmentsOf(e.Body)
		if err != nil || depth == "" {
			return nil // a record from before commitments: nothing beside it
		}
		committed[e.Seq] = true
		p, err := getPayload(tx, e.Seq)
		if err != nil {
			bad = &ledger.VerifyError{Seq: e.Seq, Reason: fmt.Sprintf("audit record %d: its payload does not decode (tampered): %v", e.Seq, err)}
			return stop
		}
		if p == nil && !t.erased[e.Seq] && depth == DepthFull {
			bad = &ledger.VerifyError{Seq: e.Seq, Reason: fmt.Sprintf("audit record %d: its payload is missing and no erasure record names it (tampered)", e.Seq)}
			return stop
		}
		erased := map[string]bool{}
		if t.erased[e.Seq] {
			for _, name := range Parts {
				erased[name] = true
			}
		}
		if err := t.open(e.Seq, c, depth, p, erased); err != nil {
			bad = &ledger.VerifyError{Seq: e.Seq, Reason: err.Error()}
			return stop
		}
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	if err != nil || bad != nil {
		return t.rep, bad, err
	}
	// A payload no audit record commits to was put there by hand.
	h, err := ledger.HeadOf(tx)
	if err != nil {
		return t.rep, nil, err
	}
	err = ledger.Attachments(tx, 0, func(seq uint64, _ []byte) error {
		switch {
		case seq >= h.Size || !committed[seq]:
			bad = &ledger.VerifyError{Seq: seq, Reason: fmt.Sprintf("a payload is stored for entry %d, which is no audit record with commitments (tampered)", seq)}
		case t.erased[seq]:
			bad = &ledger.VerifyError{Seq: seq, Reason: fmt.Sprintf("a payload is stored for audit record %d, which an erasure record says was erased (tampered)", seq)}
		default:
			return nil
		}
		return stop
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return t.rep, bad, err
}

// verifyPayloads adds the payload check to an intact ledger check.
func (i *Inspector) verifyPayloads(check *LedgerCheck) error {
	return i.view(func(tx *bbolt.Tx) error {
		rep, bad, err := checkPayloads(tx)
		switch {
		case err != nil:
			return err
		case bad != nil:
			*check = LedgerCheck{Entries: check.Entries, BadSeq: &bad.Seq, Reason: bad.Error()}
		default:
			check.Payloads = &rep
		}
		return nil
	})
}

// ErasedMessage replaces an error's message in the stored result envelope
// of an erased operation: the message is part of the erased result.
const ErasedMessage = "(erased with the audit payload)"

// NotKeptMessage replaces an error's message in the stored result
// envelope of a call audited at depth commitments_only: the message is
// part of the result, which that depth never stores.
const NotKeptMessage = "(not kept: audit depth commitments_only)"

// erase removes from r what an erasure of its audit payload removes
// (withhold) and reports whether anything was left to remove.
func (r *Result) erase() bool { return r.withhold(ErasedMessage) }

// withhold removes from r what its audit payload holds: the result, the
// salt, the provenance and risk basis (the context part: the caller
// chose the one, the other may quote args) and an error's message (part
// of the result), which becomes msg; and the result_hash, the plain hash
// of the result, against which a reader could test guesses of a short
// one (a PIN). Status, error class and the rest stay. It reports whether
// anything changed.
func (r *Result) withhold(msg string) bool {
	changed := r.Result != nil || r.AuditSalt != "" || len(r.RiskBasis) > 0 || r.Provenance != nil || r.Notes != nil || r.ResultHash != ""
	r.Result, r.AuditSalt, r.RiskBasis, r.Provenance, r.Notes, r.ResultHash = nil, "", nil, nil, nil, ""
	if r.Error != nil && r.Error.Message != msg {
		r.Error = &Error{Class: r.Error.Class, Message: msg}
		changed = true
	}
	return changed
}
