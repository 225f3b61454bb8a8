package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/txn"
)

// ReplayReport is what ReplayVerify found. The history is proven when
// Problems is empty.
type ReplayReport struct {
	Entries   uint64 `json:"entries"`   // ledger entries read
	Calls     int    `json:"calls"`     // audit records
	Keys      int    `json:"keys"`      // distinct (agent_id, idempotency_key)
	Committed int    `json:"committed"` // committed calls with a key
	Replays   int    `json:"replays"`   // calls answered from a stored outcome
	// Receipts counts the JWS receipt entries (format v1, older ledgers)
	// matched with their audit records; a v2 receipt is its audit record.
	Receipts int             `json:"receipts"`
	InFlight int             `json:"in_flight"` // keys held by a call still running
	Problems []ReplayProblem `json:"problems"`
}

// ReplayProblem is one refutation: what is wrong, for which key or entry.
type ReplayProblem struct {
	Kind    string `json:"kind"`
	AgentID string `json:"agent_id,omitempty"`
	Key     string `json:"idempotency_key,omitempty"`
	Seq     uint64 `json:"seq"` // the ledger entry the problem shows at
	Detail  string `json:"detail"`
}

// Kinds of ReplayProblem.
const (
	ProblemDoubleCommit   = "double_commit"   // a key has two committed effects
	ProblemReplayMismatch = "replay_mismatch" // a replay's result_hash or call differs from the original's
	ProblemReplayOrphan   = "replay_orphan"   // a replay names no committed original
	ProblemIdemTable      = "idempotency_table"
	ProblemReceipt        = "receipt"
	ProblemLedger         = "ledger"
)

// CallRecord is an audit record as replay verification and policy replay
// read it.
type CallRecord struct {
	Seq  uint64
	Hash string
	auditRecord
}

// keyOf is an idempotency key scoped to its agent.
type keyOf struct{ agent, key string }

// ReplayVerify proves, or refutes with the offending keys, that every
// (agent_id, idempotency_key) has at most one committed effect, that the
// idempotency table holds exactly the committed outcome of each key, that
// every replay returned its original's result_hash for the same call
// (tool_id, args_hash, capability token), and, in ledgers written before
// receipts were proven by the log, that no audit record has more than one
// JWS receipt and every JWS receipt verifies with the kernel's receipt key
// and matches its ledger entry field by field. (Since then an audit entry
// is its own receipt.) The ledger's
// hash chain is verified first; a broken chain is the only problem
// reported then.
func (i *Inspector) ReplayVerify() (*ReplayReport, error) {
	rep := &ReplayReport{Problems: []ReplayProblem{}}
	jwks, err := i.JWKS()
	if err != nil {
		return nil, err
	}
	err = i.view(func(tx *bbolt.Tx) error {
		n, err := ledger.Verify(tx)
		rep.Entries = n
		if ve, ok := err.(*ledger.VerifyError); ok {
			rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemLedger, Seq: ve.Seq, Detail: ve.Reason})
			return nil
		}
		if err != nil {
			return err
		}
		calls := map[uint64]*CallRecord{}      // by seq
		byOp := map[string]*CallRecord{}       // original (non-replay) records by operation id
		committed := map[keyOf][]*CallRecord{} // committed originals by key
		var replays []*CallRecord
		receiptsOf := map[uint64]int{}
		var rcpts []ledger.Entry
		keys := map[keyOf]bool{}
		erased := &payloadTally{} // whose payloads were erased: their commitments cannot be reopened
		err = ledger.Scan(tx, 0, func(e ledger.Entry) error {
			switch e.Kind {
			case KindErasure:
				if err := erased.entry(e); err != nil {
					rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemLedger, Seq: e.Seq, Detail: err.Error()})
				}
			case ledger.KindAudit:
				c, err := DecodeCall(e)
				if err != nil {
					rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemLedger, Seq: e.Seq, Detail: err.Error()})
					return nil
				}
				rep.Calls++
				calls[e.Seq] = c
				if c.IdempotencyKey != "" {
					keys[keyOf{c.AgentID, c.IdempotencyKey}] = true
				}
				if c.ReplayOf != "" {
					replays = append(replays, c)
					return nil
				}
				if _, dup := byOp[c.OperationID]; !dup {
					byOp[c.OperationID] = c
				}
				if c.IdempotencyKey != "" && settled(c) {
					k := keyOf{c.AgentID, c.IdempotencyKey}
					committed[k] = append(committed[k], c)
				}
			case ledger.KindReceipt:
				rcpts = append(rcpts, e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for k, cs := range committed {
			rep.Committed++
			if len(cs) > 1 {
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemDoubleCommit, AgentID: k.agent, Key: k.key, Seq: cs[1].Seq,
					Detail: fmt.Sprintf("%d committed effects: operations %s and %s", len(cs), cs[0].OperationID, cs[1].OperationID)})
			}
		}
		for _, r := range replays {
			rep.Replays++
			o, ok := byOp[r.ReplayOf]
			switch {
			case !ok || !settled(o):
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReplayOrphan, AgentID: r.AgentID, Key: r.IdempotencyKey, Seq: r.Seq,
					Detail: fmt.Sprintf("operation %s replays %s, which has no committed record", r.OperationID, r.ReplayOf)})
			case erased.erased[o.Seq] || o.PayloadDepth == DepthCommitmentsOnly:
				// The original's salt went with its payload, or its
				// stored envelope never kept it (depth commitments_only,
				// storedEnvelope): the replay commits under a salt of its
				// own, so only the call's identity (below) can be
				// compared.
				if o.AgentID != r.AgentID || o.IdempotencyKey != r.IdempotencyKey || o.ToolID != r.ToolID || o.CapabilityTokenID != r.CapabilityTokenID {
					rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReplayMismatch, AgentID: r.AgentID, Key: r.IdempotencyKey, Seq: r.Seq,
						Detail: fmt.Sprintf("replay %s (%s %s) answers a different call: %s (%s %s)", r.OperationID, r.ToolID, r.CapabilityTokenID, o.OperationID, o.ToolID, o.CapabilityTokenID)})
				}
			case o.resultID() != r.resultID():
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReplayMismatch, AgentID: r.AgentID, Key: r.IdempotencyKey, Seq: r.Seq,
					Detail: fmt.Sprintf("replay %s returned %s; the original %s returned %s", r.OperationID, r.resultID(), o.OperationID, o.resultID())})
			case o.AgentID != r.AgentID || o.IdempotencyKey != r.IdempotencyKey || o.ToolID != r.ToolID || o.argsID() != r.argsID() || o.CapabilityTokenID != r.CapabilityTokenID:
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReplayMismatch, AgentID: r.AgentID, Key: r.IdempotencyKey, Seq: r.Seq,
					Detail: fmt.Sprintf("replay %s (%s %s %s) answers a different call: %s (%s %s %s)", r.OperationID, r.ToolID, r.argsID(), r.CapabilityTokenID, o.OperationID, o.ToolID, o.argsID(), o.CapabilityTokenID)})
			}
		}
		rep.Keys = len(keys)
		if err := checkIdemTable(tx, committed, rep); err != nil {
			return err
		}
		for _, e := range rcpts {
			rep.Receipts++
			seq, p := checkReceiptEntry(e, jwks, calls)
			if p != "" {
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReceipt, Seq: e.Seq, Detail: p})
				continue
			}
			receiptsOf[seq]++
		}
		for seq, c := range calls {
			if n := receiptsOf[seq]; n > 1 {
				rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemReceipt, AgentID: c.AgentID, Key: c.IdempotencyKey, Seq: seq,
					Detail: fmt.Sprintf("audit record of operation %s has %d JWS receipts, want at most 1", c.OperationID, n)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(rep.Problems, func(a, b int) bool { return rep.Problems[a].Seq < rep.Problems[b].Seq })
	return rep, nil
}

// checkIdemTable compares the idempotency table with the committed
// records: each finished key holds the outcome of its one committed call,
// and each committed call's key holds it.
func checkIdemTable(tx *bbolt.Tx, committed map[keyOf][]*CallRecord, rep *ReplayReport) error {
	seen := map[keyOf]bool{}
	err := txn.ForEachIdem(tx, func(ie txn.IdemEntry) error {
		k := keyOf{ie.Key.AgentID, ie.Key.Key}
		seen[k] = true
		if !ie.Done {
			rep.InFlight++
			return nil
		}
		bad := func(format string, args ...any) {
			rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemIdemTable, AgentID: k.agent, Key: k.key, Detail: fmt.Sprintf(format, args...)})
		}
		cs := committed[k]
		if len(cs) == 0 {
			bad("the table holds operation %s as committed, but the ledger has no committed record for the key", ie.OperationID)
			return nil
		}
		c := cs[0]
		var stored Result
		if err := decodeStored(ie.Result, &stored); err != nil {
			bad("stored outcome: %v", err)
			return nil
		}
		switch {
		case ie.OperationID != c.OperationID:
			bad("the table holds operation %s; the ledger committed %s", ie.OperationID, c.OperationID)
		}
		argsHash, resultHash, err := c.plainHashes(tx)
		if err != nil {
			// A payload that does not decode or open its commitments
			// is damage to report, like any other: the walk goes on.
			bad("payload: %v", err)
			return nil
		}
		switch {
		case ie.ToolID != c.ToolID || (argsHash != "" && ie.ArgsHash != argsHash) || ie.TokenID != c.CapabilityTokenID:
			bad("the table's call (%s %s %s) is not the committed one (%s %s %s)", ie.ToolID, ie.ArgsHash, ie.TokenID, c.ToolID, argsHash, c.CapabilityTokenID)
		case resultHash != "" && stored.ResultHash != resultHash:
			bad("the stored outcome has result_hash %s; the ledger recorded %s", stored.ResultHash, resultHash)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for k, cs := range committed {
		if !seen[k] {
			rep.Problems = append(rep.Problems, ReplayProblem{Kind: ProblemIdemTable, AgentID: k.agent, Key: k.key, Seq: cs[0].Seq,
				Detail: fmt.Sprintf("operation %s committed, but the table does not hold its key, so a repeat would run again", cs[0].OperationID)})
		}
	}
	return nil
}

// checkReceiptEntry verifies the receipt in entry e and matches it with the
// audit record it names. It returns that record's seq, or what is wrong.
func checkReceiptEntry(e ledger.Entry, jwks []byte, calls map[uint64]*CallRecord) (uint64, string) {
	var b receiptBody
	if err := json.Unmarshal(e.Body, &b); err != nil {
		return 0, err.Error()
	}
	r, err := receipts.Verify(b.JWS, jwks)
	if err != nil {
		return 0, err.Error()
	}
	if r.ReceiptID != b.ReceiptID || r.OperationID != b.OperationID {
		return 0, fmt.Sprintf("entry names receipt %s of %s; the signed receipt is %s of %s", b.ReceiptID, b.OperationID, r.ReceiptID, r.OperationID)
	}
	c, ok := calls[r.LedgerSeq]
	if !ok {
		return 0, fmt.Sprintf("receipt %s names seq %d, which is not an audit record", r.ReceiptID, r.LedgerSeq)
	}
	if err := MatchReceipt(r, c); err != nil {
		return 0, err.Error()
	}
	return r.LedgerSeq, ""
}

// MatchReceipt checks that receipt r attests the audit record c: the
// ledger seq and entry hash, and every field the two share.
func MatchReceipt(r *receipts.Receipt, c *CallRecord) error {
	type pair struct{ name, got, want string }
	for _, p := range []pair{
		{"ledger_entry_hash", r.LedgerEntryHash, c.Hash},
		{"operation_id", r.OperationID, c.OperationID},
		{"tool_id", r.ToolID, c.ToolID},
		{"agent_id", r.AgentID, c.AgentID},
		{"capability_token_id", r.CapabilityTokenID, c.CapabilityTokenID},
		{"args_hash", r.ArgsHash, c.ArgsHash},
		{"result_hash", r.ResultHash, c.ResultHash},
		{"tx_outcome", r.TxOutcome, c.TxOutcome},
		{"commit_delta_id", r.CommitDeltaID, c.CommitDeltaID},
		{"policy_hash", r.PolicyHash, c.PolicyHash},
		{"autonomy_mode", r.AutonomyMode, c.AutonomyMode},
		{"error_class", r.ErrorClass, c.ErrorClass},
		{"approval_id", r.ApprovalID, c.ApprovalID},
		{"approved_by", r.ApprovedBy, c.ApprovedBy},
		{"approval_reason", r.ApprovalReason, c.ApprovalReason},
	} {
		if c.PayloadDepth != "" && (p.name == "args_hash" || p.name == "result_hash") {
			// A record with commitments keeps these beside the chain; the
			// receipt states them for its holder, who checks them against
			// the payload and the commitments (CheckPayload).
			continue
		}
		if p.got != p.want {
			return fmt.Errorf("receipt %s: %s is %q; ledger entry %d has %q", r.ReceiptID, p.name, p.got, c.Seq, p.want)
		}
	}
	if r.LedgerSeq != c.Seq {
		return fmt.Errorf("receipt %s: ledger_seq is %d; the entry is %d", r.ReceiptID, r.LedgerSeq, c.Seq)
	}
	if r.RiskScore != c.RiskScore {
		return fmt.Errorf("receipt %s: risk_score is %v; ledger entry %d has %v", r.ReceiptID, r.RiskScore, c.Seq, c.RiskScore)
	}
	return nil
}

// DecodeCall reads the audit record of ledger entry e, which must be of
// kind audit.
func DecodeCall(e ledger.Entry) (*CallRecord, error) {
	if e.Kind != ledger.KindAudit {
		return nil, fmt.Errorf("entry %d is a %s entry, not an audit record", e.Seq, e.Kind)
	}
	c := &CallRecord{Seq: e.Seq, Hash: e.Hash}
	if err := json.Unmarshal(e.Body, &c.auditRecord); err != nil {
		return nil, fmt.Errorf("audit record %d: %w", e.Seq, err)
	}
	return c, nil
}

// ReplayHistory is every call made with one idempotency key: the original
// outcome and each replay of it.
type ReplayHistory struct {
	AgentID string        `json:"agent_id"`
	Key     string        `json:"idempotency_key"`
	Calls   []CallSummary `json:"calls"`
}

// CallSummary is one audit record, briefly.
type CallSummary struct {
	Seq         uint64 `json:"seq"`
	Time        string `json:"time"`
	OperationID string `json:"operation_id"`
	ToolID      string `json:"tool_id"`
	ArgsHash    string `json:"args_hash"`
	Status      string `json:"status"`
	ErrorClass  string `json:"error_class,omitempty"`
	TxOutcome   string `json:"tx_outcome"`
	ResultHash  string `json:"result_hash"`
	ReplayOf    string `json:"replay_of,omitempty"`
}

// ReplayShow returns the calls made with idempotency key key, by agent (every
// agent when empty), one history per agent, in ledger order.
func (i *Inspector) ReplayShow(key, agent string) ([]ReplayHistory, error) {
	byAgent := map[string]*ReplayHistory{}
	var order []string
	err := i.Scan(0, func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit {
			return nil
		}
		c, err := DecodeCall(e)
		if err != nil {
			return err
		}
		if c.IdempotencyKey != key || (agent != "" && c.AgentID != agent) {
			return nil
		}
		h := byAgent[c.AgentID]
		if h == nil {
			h = &ReplayHistory{AgentID: c.AgentID, Key: key}
			byAgent[c.AgentID] = h
			order = append(order, c.AgentID)
		}
		h.Calls = append(h.Calls, CallSummary{Seq: e.Seq, Time: e.Time, OperationID: c.OperationID, ToolID: c.ToolID, ArgsHash: c.argsID(),
			Status: c.Status, ErrorClass: c.ErrorClass, TxOutcome: c.TxOutcome, ResultHash: c.resultID(), ReplayOf: c.ReplayOf})
		return nil
	})
	out := make([]ReplayHistory, 0, len(order))
	for _, a := range order {
		out = append(out, *byAgent[a])
	}
	return out, err
}

// PolicyChange is a recorded decision that another policy would make
// differently.
type PolicyChange struct {
	Seq         uint64   `json:"seq"`
	OperationID string   `json:"operation_id"`
	AgentID     string   `json:"agent_id"`
	ToolID      string   `json:"tool_id"`
	OldMode     string   `json:"old_mode"`
	NewMode     string   `json:"new_mode"`
	OldRisk     float64  `json:"old_risk"`
	NewRisk     float64  `json:"new_risk"`
	NewBasis    []string `json:"new_basis"`
}

// PolicyReplay is the outcome of re-deciding recorded calls.
type PolicyReplay struct {
	PolicyHash string         `json:"policy_hash"` // of the bundle replayed
	Decided    int            `json:"decided"`     // calls re-decided
	Skipped    int            `json:"skipped"`     // calls refused before the policy step (no policy input), and replays
	Erased     int            `json:"erased"`      // calls whose policy input was erased (or is not at hand), skipped
	NotKept    int            `json:"not_kept"`    // calls whose policy input was never kept (depth commitments_only), skipped
	Changes    []PolicyChange `json:"changes"`
}

// ReplayFilter selects the calls ReplayPolicy re-decides.
type ReplayFilter struct {
	Since   time.Time
	AgentID string
}

// ReplayPolicy re-decides each recorded call that f selects under eng,
// from the policy input its audit record holds (records before
// commitments) or commits to (its payload), and collects the decisions
// whose mode or risk score would change. Calls refused before the policy
// step have no input and are counted as skipped; calls whose input was
// erased or never kept are skipped and counted as such. scan yields the
// ledger entries in order with their payloads (Inspector.ScanViews, or
// pages from a server).
func ReplayPolicy(ctx context.Context, eng *policy.Engine, f ReplayFilter, scan func(func(EntryView) error) error) (*PolicyReplay, error) {
	out := &PolicyReplay{PolicyHash: eng.Hash(), Changes: []PolicyChange{}}
	err := scan(func(v EntryView) error {
		e := v.Entry
		if e.Kind != ledger.KindAudit {
			return nil
		}
		c, err := DecodeCall(e)
		if err != nil {
			return err
		}
		if f.AgentID != "" && c.AgentID != f.AgentID {
			return nil
		}
		if !f.Since.IsZero() {
			if t, err := time.Parse(time.RFC3339Nano, e.Time); err != nil || t.Before(f.Since) {
				return nil
			}
		}
		if c.PayloadDepth != "" && c.Commitments.PolicyInput != "" && c.ReplayOf == "" {
			switch {
			case v.Payload != nil && v.Payload.PolicyInput != nil:
				if err := json.Unmarshal(v.Payload.PolicyInput, &c.PolicyInput); err != nil {
					return fmt.Errorf("policy input of seq %d: %w", e.Seq, err)
				}
			case c.PayloadDepth == DepthCommitmentsOnly:
				out.NotKept++
				return nil
			default:
				out.Erased++
				return nil
			}
		}
		if c.PolicyInput == nil || c.ReplayOf != "" {
			out.Skipped++
			return nil
		}
		d, err := eng.Decide(ctx, c.PolicyInput)
		if err != nil {
			return fmt.Errorf("re-deciding seq %d: %w", e.Seq, err)
		}
		out.Decided++
		old := c.DecidedMode
		if d.AutonomyMode != old || d.RiskScore != c.RiskScore {
			out.Changes = append(out.Changes, PolicyChange{Seq: e.Seq, OperationID: c.OperationID, AgentID: c.AgentID, ToolID: c.ToolID,
				OldMode: old, NewMode: d.AutonomyMode, OldRisk: c.RiskScore, NewRisk: d.RiskScore, NewBasis: d.RiskBasis})
		}
		return nil
	})
	return out, err
}

// settled reports whether a call's outcome is what its idempotency key
// keeps: a commit, or an outcome_unknown (an external effect that may have
// happened is never executed again, so its key holds that outcome).
func settled(c *CallRecord) bool {
	return c.TxOutcome == Committed || c.ErrorClass == ErrOutcomeUnknown
}
