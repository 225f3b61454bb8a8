package conformance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
)

const (
	gEnvelope = "TOOL-01 §2 result envelope"
	gRecord   = "TOOL-01 §3 audit record"
	gReceipt  = "DESIGN receipts"
	gLedger   = "DESIGN ledger proofs"

	cEnvelope = "seed 003 TOOL-01 §2"
	cRecord   = "seed 003 TOOL-01 §3"
	cReceipt  = "DESIGN.md Receipts; docs/formats.md Receipts"
	cLedger   = "DESIGN.md Ledger; docs/formats.md Checkpoints, proofs"
)

// fullEnvelope sets every optional TOOL-01 §1 field a caller may send.
func fullEnvelope(t *T, snapshot string) func(map[string]any) {
	return func(m map[string]any) {
		m["provenance"] = map[string]any{"session_id": "s-" + t.env.runID, "turn_id": "turn-1", "model": "conformance", "note": "ü ∑"}
		m["task_class"] = "conformance-check"
		m["state_snapshot_id"] = snapshot
		m["risk_score"] = 0.25
		m["risk_basis"] = []string{"conformance suite"}
		m["autonomy_mode"] = "autopilot"
	}
}

func sameJSON(a, b []byte) bool {
	ca, err1 := jcs.Canonicalize(a)
	cb, err2 := jcs.Canonicalize(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

func headSnapshot(t *T) string {
	var h struct {
		StateSnapshotID string `json:"state_snapshot_id"`
	}
	t.GetJSON("/v1/ledger/head", "", &h)
	return h.StateSnapshotID
}

func envelopeCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gEnvelope, cEnvelope, title, fn) }
	return []Case{
		c("TOOL01-ENV-001", "an ok read's result envelope has every §2 field, well-formed: no_op, no commit_delta_id, replayed false", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/e.txt", "e")
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/e.txt"}, fullEnvelope(t, headSnapshot(t)))
			t.ExpectOK(r)
			if r.R.TxOutcome != "no_op" || r.R.CommitDeltaID != "" || r.R.Replayed == nil || *r.R.Replayed {
				t.Failf("tx_outcome %q commit_delta_id %q replayed %v", r.R.TxOutcome, r.R.CommitDeltaID, r.R.Replayed)
			}
			for _, f := range []string{"provenance", "task_class", "risk_basis", "result"} {
				if _, ok := r.R.raw[f]; !ok {
					t.Failf("no %s in the result envelope", f)
				}
			}
		}),
		c("TOOL01-ENV-002", "a committed write's envelope has tx_outcome committed and a blake3 commit_delta_id", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/w.txt", "content": "w"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectOK(r)
			if r.R.TxOutcome != "committed" || !hashRE.MatchString(r.R.CommitDeltaID) {
				t.Failf("tx_outcome %q commit_delta_id %q", r.R.TxOutcome, r.R.CommitDeltaID)
			}
		}),
		c("TOOL01-ENV-003", "an error result has status error, error {class, message}, no result, and is not committed", func(t *T) {
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": 42}, nil)
			t.ExpectClass(r, "invalid_args")
			if len(r.R.Result) > 0 && string(r.R.Result) != "null" {
				t.Failf("an error result carries a result %s", r.R.Result)
			}
		}),
		c("TOOL01-ENV-004", "provenance and task_class come back exactly as sent; agent_id and tool_id are the call's", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "p"}, fullEnvelope(t, headSnapshot(t)))
			t.ExpectOK(r)
			sent, _ := json.Marshal(map[string]any{"session_id": "s-" + t.env.runID, "turn_id": "turn-1", "model": "conformance", "note": "ü ∑"})
			if !sameJSON(r.R.Provenance, sent) {
				t.Failf("provenance %s, sent %s", r.R.Provenance, sent)
			}
			if r.R.TaskClass != "conformance-check" || r.R.AgentID != tok.AgentID || r.R.ToolID != "echo" {
				t.Failf("task_class %q agent_id %q tool_id %q", r.R.TaskClass, r.R.AgentID, r.R.ToolID)
			}
		}),
		c("TOOL01-ENV-005", "operation_id: echoed when the caller sets one, a canonical UUID assigned when absent", func(t *T) {
			tok := t.Full("a")
			mine := newUUID()
			r := t.Call(tok, "echo", map[string]any{"text": "1"}, func(m map[string]any) { m["operation_id"] = mine })
			t.ExpectOK(r)
			if r.R.OperationID != mine {
				t.Failf("operation_id %q, sent %q", r.R.OperationID, mine)
			}
			r2 := t.Call(tok, "echo", map[string]any{"text": "2"}, nil)
			t.ExpectOK(r2)
			if !isUUID(r2.R.OperationID) || r2.R.OperationID == mine {
				t.Failf("assigned operation_id %q is not a fresh canonical UUID", r2.R.OperationID)
			}
		}),
		c("TOOL01-ENV-006", "result_hash recomputes for ok and for error results (blake3 of RFC 8785 {status, result|error})", func(t *T) {
			tok := t.Full("a")
			for _, r := range []*Resp{
				t.Call(tok, "echo", map[string]any{"text": "ok"}, nil),
				t.Call(tok, "no.such.tool", map[string]any{}, nil),
			} {
				t.CheckEnvelope(r)
				if h, err := resultHash(r.R); err != nil || h != r.R.ResultHash {
					t.Failf("%s result_hash %s, recomputed %s (%v)", r.R.Status, r.R.ResultHash, h, err)
				}
			}
		}),
		c("TOOL01-ENV-007", "state_snapshot_id advances: a later call's snapshot is a later ledger position", func(t *T) {
			tok := t.Full("a")
			a := t.Call(tok, "echo", map[string]any{"text": "1"}, nil)
			b := t.Call(tok, "echo", map[string]any{"text": "2"}, nil)
			t.ExpectOK(a)
			t.ExpectOK(b)
			sa, _, ok1 := seqOf(a.R.StateSnapshotID)
			sb, _, ok2 := seqOf(b.R.StateSnapshotID)
			if !ok1 || !ok2 || sb <= sa {
				t.Failf("snapshots %q then %q", a.R.StateSnapshotID, b.R.StateSnapshotID)
			}
		}),
		c("TOOL01-ENV-008", "the stored operation (GET /v1/operations/{id}) is the result envelope the caller got", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "stored"}, nil)
			t.ExpectOK(r)
			var stored Result
			t.GetJSON("/v1/operations/"+r.R.OperationID, tok.Token, &stored)
			if stored.OperationID != r.R.OperationID || stored.ResultHash != r.R.ResultHash || stored.ReceiptID != r.R.ReceiptID {
				t.Failf("stored operation differs from the answer")
			}
		}),
		c("TOOL01-ENV-009", "a refused call still gets the §2 fields: its agent and tool as sent, mode and risk, tx_outcome not committed", func(t *T) {
			tok := t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}})
			r := t.Call(tok, "fs.write", map[string]any{"path": "x", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectRefused(r, "permission_denied")
			if r.R.AgentID != tok.AgentID || r.R.ToolID != "fs.write" {
				t.Failf("agent_id %q tool_id %q", r.R.AgentID, r.R.ToolID)
			}
		}),
	}
}

func newUUID() string { return uuid.NewString() }

// §3 fields.
var recordFields = []string{"agent_id", "policy_hash", "state_snapshot_id", "capability_token_id", "tool_id",
	"args_hash", "result_hash", "provenance", "task_class", "autonomy_mode", "risk_score", "risk_basis"}

func missingFields(body map[string]json.RawMessage, fields []string) []string {
	var out []string
	for _, f := range fields {
		if _, ok := body[f]; !ok {
			out = append(out, f)
		}
	}
	return out
}

func recordCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gRecord, cRecord, title, fn) }
	return []Case{
		c("TOOL01-AUDREC-001", "an allowed call's audit record holds every §3 field with the call's values", func(t *T) {
			tok := t.Full("a")
			snap := headSnapshot(t)
			args := map[string]any{"text": "record"}
			r := t.Call(tok, "echo", args, fullEnvelope(t, snap))
			t.ExpectOK(r)
			_, body := t.Audit(r)
			if m := missingFields(body, recordFields); len(m) > 0 {
				t.Failf("audit record lacks %v", m)
			}
			want := map[string]string{"agent_id": tok.AgentID, "policy_hash": t.PolicyHash(), "state_snapshot_id": snap,
				"capability_token_id": tok.ID, "tool_id": "echo", "args_hash": argsHash(args), "result_hash": r.R.ResultHash,
				"task_class": "conformance-check", "autonomy_mode": r.R.AutonomyMode}
			for f, v := range want {
				if got := str(body[f]); got != v {
					t.Failf("audit record %s = %q, want %q", f, got, v)
				}
			}
			if !sameJSON(body["provenance"], r.R.Provenance) {
				t.Failf("audit provenance %s, result's %s", body["provenance"], r.R.Provenance)
			}
		}),
		c("TOOL01-AUDREC-002", "a refused call's audit record (scope_denied) holds every §3 field too", func(t *T) {
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": "../../etc/passwd"}, fullEnvelope(t, headSnapshot(t)))
			t.ExpectRefused(r, "scope_denied")
			_, body := t.Audit(r)
			if m := missingFields(body, recordFields); len(m) > 0 {
				t.Failf("audit record lacks %v", m)
			}
		}),
		c("TOOL01-AUDREC-003", "a call refused at the token step is recorded with the tool and args hash it named, and the agent and token id it claimed as claims (claimed_agent_id, claimed_capability_token_id)", func(t *T) {
			tok := unsigned(t.Full("a"))
			args := map[string]any{"text": "x"}
			r := t.Call(tok, "echo", args, nil)
			t.ExpectClass(r, "token_invalid")
			_, body := t.Audit(r)
			if m := missingFields(body, []string{"claimed_agent_id", "tool_id", "claimed_capability_token_id", "args_hash", "result_hash", "policy_hash", "autonomy_mode", "risk_score"}); len(m) > 0 {
				t.Failf("audit record lacks %v", m)
			}
			if str(body["claimed_capability_token_id"]) != tok.ID || str(body["claimed_agent_id"]) != tok.AgentID || str(body["args_hash"]) != argsHash(args) {
				t.Failf("audit record claimed token id %q, claimed agent %q, args_hash %q", str(body["claimed_capability_token_id"]), str(body["claimed_agent_id"]), str(body["args_hash"]))
			}
			if str(body["agent_id"]) != "" || str(body["capability_token_id"]) != "" {
				t.Failf("a refusal whose token did not verify is attributed to agent %q, token %q", str(body["agent_id"]), str(body["capability_token_id"]))
			}
		}),
		c("TOOL01-AUDREC-004", "a state mutation's audit record holds its outcome: committed and the commit_delta_id", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/m.txt", "content": "m"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectOK(r)
			_, body := t.Audit(r)
			if str(body["tx_outcome"]) != "committed" || str(body["commit_delta_id"]) != r.R.CommitDeltaID {
				t.Failf("audit record tx_outcome %q commit_delta_id %q", str(body["tx_outcome"]), str(body["commit_delta_id"]))
			}
		}),
		c("TOOL01-AUDREC-005", "risk_score and risk_basis in the record are the kernel's decision (as in the result), not the caller's estimate", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, func(m map[string]any) {
				m["risk_score"] = 0.99
				m["risk_basis"] = []string{"caller estimate"}
			})
			t.ExpectOK(r)
			_, body := t.Audit(r)
			var basis []string
			var risk float64
			json.Unmarshal(body["risk_basis"], &basis)
			json.Unmarshal(body["risk_score"], &risk)
			if risk != *r.R.RiskScore || !slices.Equal(basis, r.R.RiskBasis) {
				t.Failf("audit risk %v %v, result's %v %v", risk, basis, *r.R.RiskScore, r.R.RiskBasis)
			}
		}),
		c("TOOL01-AUDREC-006", "audit records are readable by the agent's own capability token (GET /v1/ledger/entries)", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "mine"}, nil)
			t.ExpectOK(r)
			rc := t.VerifyReceipt(r)
			status, b := t.Get(fmt.Sprintf("/v1/ledger/entries?from=%d&limit=1", *rc.LedgerSeq), tok.Token)
			if status != 200 || !strings.Contains(string(b), r.R.OperationID) {
				t.Failf("GET /v1/ledger/entries with the agent's token: %d", status)
			}
		}),
	}
}

func receiptCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gReceipt, cReceipt, title, fn) }
	return []Case{
		c("DESIGN-RCPT-001", "the JWKS publishes Ed25519 signature keys by the rule of docs/formats.md: strict JSON, x canonical, kid the RFC 7638 thumbprint, no private part, no kid twice", func(t *T) {
			if len(t.JWKS()) == 0 {
				t.Failf("no key")
			}
		}),
		c("DESIGN-RCPT-002", "an ok call's receipt verifies against the JWKS and agrees with the result and the audit entry it names", func(t *T) {
			tok := t.Full("a")
			args := map[string]any{"text": "receipt"}
			r := t.Call(tok, "echo", args, nil)
			t.ExpectOK(r)
			rc := t.VerifyReceipt(r)
			t.Audit(r)
			if rc.ArgsCommitment != "" {
				// The record commits to the args under the caller's salt.
				b, _ := json.Marshal(args)
				canon, _ := jcs.Canonicalize(b)
				if got, err := commitment(r.R.AuditSalt, "args", canon); err != nil || got != rc.ArgsCommitment {
					t.Failf("the receipt's record does not commit to the args sent under the result's audit_salt")
				}
				rc.ArgsHash = argsHash(args)
			}
			if rc.CapabilityTokenID != tok.ID || rc.ArgsHash != argsHash(args) || rc.PolicyHash != t.PolicyHash() {
				t.Failf("receipt token %q args_hash %q policy %q", rc.CapabilityTokenID, rc.ArgsHash, rc.PolicyHash)
			}
		}),
		c("DESIGN-RCPT-003", "a refused call's receipt verifies too and carries its error_class", func(t *T) {
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": "/etc/passwd"}, nil)
			t.ExpectRefused(r, "scope_denied")
			if rc := t.VerifyReceipt(r); rc.ErrorClass != "scope_denied" {
				t.Failf("receipt error_class %q", rc.ErrorClass)
			}
		}),
		c("DESIGN-RCPT-004", "GET /v1/receipts/{id} serves the receipt the result names", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "x"}, nil)
			t.ExpectOK(r)
			rc := t.VerifyReceipt(r)
			var info struct {
				ReceiptID string `json:"receipt_id"`
				Seq       uint64 `json:"seq"`
			}
			t.GetJSON("/v1/receipts/"+rc.ReceiptID, tok.Token, &info)
			if info.ReceiptID != rc.ReceiptID || info.Seq != *rc.LedgerSeq {
				t.Failf("the served receipt %s (seq %d) is not the result's %s (seq %d)", info.ReceiptID, info.Seq, rc.ReceiptID, *rc.LedgerSeq)
			}
		}),
		c("DESIGN-RCPT-005", "GET /v1/receipts/{id}/bundle serves the receipt proven under the latest checkpoint, verifiable offline", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "bundle"}, nil)
			t.ExpectOK(r)
			rc := t.VerifyReceipt(r)
			status, b := t.Get("/v1/receipts/"+rc.ReceiptID+"/bundle", tok.Token)
			if status != 200 {
				t.Failf("GET /v1/receipts/%s/bundle: %d", rc.ReceiptID, status)
			}
			_, doc := t.jwks()
			e, err := verifyLogged(b, doc)
			if err != nil {
				t.Failf("bundle: %v", err)
			}
			if e.Seq != *rc.LedgerSeq || e.Hash != rc.LedgerEntryHash {
				t.Failf("bundle entry %d %s, receipt names %d %s", e.Seq, e.Hash, *rc.LedgerSeq, rc.LedgerEntryHash)
			}
		}),
		c("DESIGN-RCPT-006", "a receipt with its audit entry altered does not verify under the JWKS (the check is not vacuous)", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, nil)
			t.ExpectOK(r)
			var l LoggedReceipt
			if err := json.Unmarshal(r.R.Receipt, &l); err != nil {
				t.Failf("receipt: %v", err)
			}
			l.Entry = strings.Replace(l.Entry, `"tx_outcome":"no_op"`, `"tx_outcome":"committed"`, 1)
			forged, _ := json.Marshal(l)
			_, doc := t.jwks()
			if _, err := verifyLogged(forged, doc); err == nil {
				t.Failf("an altered receipt verified")
			}
		}),
	}
}

func ledgerCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gLedger, cLedger, title, fn) }
	return []Case{
		c("DESIGN-LEDGER-001", "the latest checkpoint is a C2SP signed note by a JWKS key named after its origin; its fields are the note's", func(t *T) {
			t.VerifiedCheckpoint("")
		}),
		c("DESIGN-LEDGER-002", "once a call is answered its audit record is under a signed checkpoint, and the inclusion proof verifies", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "proved"}, nil)
			t.ExpectOK(r)
			e, _ := t.Audit(r)
			_, c := t.VerifiedCheckpoint("")
			if c.Size <= e.Seq {
				t.Failf("the latest checkpoint (size %d) does not cover the answered call's record %d", c.Size, e.Seq)
			}
			t.VerifyInclusion(e, c)
		}),
		c("DESIGN-LEDGER-003", "an inclusion proof without size comes with its signed checkpoint and verifies against it", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, nil)
			t.ExpectOK(r)
			e, _ := t.Audit(r)
			var p InclusionProof
			t.GetJSON(fmt.Sprintf("/v1/ledger/proof/inclusion?seq=%d", e.Seq), "", &p)
			if p.Checkpoint == nil {
				t.Failf("no checkpoint with the proof")
			}
			c, err := openCheckpoint(*p.Checkpoint, t.JWKS())
			if err != nil {
				t.Failf("checkpoint: %v", err)
			}
			if err := verifyInclusion(p, e, c); err != nil {
				t.Failf("%v", err)
			}
		}),
		c("DESIGN-LEDGER-004", "two signed checkpoints taken around some calls are consistent (consistency proof verifies)", func(t *T) {
			_, c1 := t.VerifiedCheckpoint("")
			tok := t.Full("a")
			for i := range 3 {
				t.ExpectOK(t.Call(tok, "echo", map[string]any{"text": fmt.Sprint(i)}, nil))
			}
			_, c2 := t.VerifiedCheckpoint("")
			if c2.Size <= c1.Size {
				t.Failf("the checkpoint did not grow (%d → %d)", c1.Size, c2.Size)
			}
			var p ConsistencyProof
			t.GetJSON(fmt.Sprintf("/v1/ledger/proof/consistency?from=%d&to=%d", c1.Size, c2.Size), "", &p)
			if p.Size1 != c1.Size || p.Size2 != c2.Size {
				t.Failf("asked for the proof from %d to %d, got %d to %d", c1.Size, c2.Size, p.Size1, p.Size2)
			}
			if err := p.Consistency.Verify(c1.Root, c2.Root); err != nil {
				t.Failf("%v", err)
			}
		}),
		c("DESIGN-LEDGER-005", "the stable checkpoint, when there is one, verifies like the latest", func(t *T) {
			status, _, _ := t.env.do(t.ctx, http.MethodGet, "/v1/ledger/checkpoint?stable=true", "", nil)
			if status == http.StatusNotFound {
				t.Skipf("GET /v1/ledger/checkpoint?stable=true is 404: no stable checkpoint marked yet (they are marked on a timer)")
			}
			t.VerifiedCheckpoint("?stable=true")
		}),
		c("DESIGN-LEDGER-006", "proof endpoints refuse what is not in the ledger (404) and malformed parameters (400)", func(t *T) {
			for _, q := range []struct {
				path   string
				status int
			}{
				{"/v1/ledger/proof/inclusion?seq=999999999", 404},
				{"/v1/ledger/proof/inclusion?seq=x", 400},
				{"/v1/ledger/proof/inclusion", 400},
				{"/v1/ledger/proof/consistency?from=1&to=999999999", 404},
				{"/v1/ledger/proof/consistency?from=1", 400},
			} {
				if status, _ := t.Get(q.path, ""); status != q.status {
					t.Failf("GET %s: %d, want %d", q.path, status, q.status)
				}
			}
		}),
		c("DESIGN-LEDGER-007", "a page of ledger entries is one hash chain: every entry_hash recomputes and links to the one before", func(t *T) {
			head := t.Head()
			from := uint64(0)
			if head > 200 {
				from = head - 200
			}
			es := t.Entries(from, 200)
			if len(es) == 0 {
				t.Failf("no entries")
			}
			for i, e := range es {
				if e.Seq != from+uint64(i) {
					t.Failf("entry %d at position %d", e.Seq, from+uint64(i))
				}
				if err := checkEntryHash(e); err != nil {
					t.Failf("entry %d: %v", e.Seq, err)
				}
				if i > 0 && e.PrevHash != es[i-1].Hash {
					t.Failf("entry %d does not link to entry %d", e.Seq, es[i-1].Seq)
				}
				if e.Seq == 0 && e.PrevHash != "blake3:"+strings.Repeat("0", 64) {
					t.Failf("entry 0 prev_hash %s", e.PrevHash)
				}
			}
		}),
		c("DESIGN-LEDGER-008", "the export needs a credential and holds the call's audit record exactly as the entries endpoint serves it", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "echo", map[string]any{"text": "exported"}, nil)
			t.ExpectOK(r)
			e, _ := t.Audit(r)
			if status, _, _ := t.env.do(t.ctx, http.MethodGet, "/v1/ledger/export", "", nil); status != 401 {
				t.Failf("GET /v1/ledger/export without a credential: %d, want 401", status)
			}
			status, b, err := t.env.do(t.ctx, http.MethodGet, "/v1/ledger/export", tok.Token, nil)
			if err == nil && status == 403 {
				t.Skipf("the endpoint exports only to its auditors (GET /v1/ledger/export with an agent's token: 403)")
			}
			if err != nil || status != 200 {
				t.Failf("GET /v1/ledger/export: %d %v", status, err)
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 8<<20)
			for sc.Scan() {
				if !bytes.Contains(sc.Bytes(), []byte(e.Hash)) {
					continue
				}
				x, err := ledger.ParseEntry(sc.Bytes())
				if err == nil && x.Seq == e.Seq && x.Hash == e.Hash && sameJSON(x.Body, e.Body) {
					return
				}
			}
			t.Failf("the export has no line with entry %d (%s)", e.Seq, e.Hash)
		}),
		c("DESIGN-LEDGER-009", "the endpoint's own full verification (GET /v1/admin/ledger/verify) reports the ledger intact", func(t *T) {
			head := t.Head()
			var chk struct {
				Intact  bool   `json:"intact"`
				Entries uint64 `json:"entries"`
				Reason  string `json:"reason"`
			}
			t.GetJSON("/v1/admin/ledger/verify", t.Admin(), &chk)
			if !chk.Intact || chk.Entries < head {
				t.Failf("intact %v after %d of at least %d entries: %s", chk.Intact, chk.Entries, head, chk.Reason)
			}
		}),
	}
}
