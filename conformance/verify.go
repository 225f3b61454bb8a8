package conformance

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// The closed sets of DESIGN.md.
var (
	errorClasses = []string{"tool_not_found", "invalid_args", "token_invalid", "token_revoked",
		"permission_denied", "scope_denied", "policy_mismatch", "policy_denied", "approval_denied",
		"approval_timeout", "precondition_failed", "budget_exceeded", "idempotency_key_required",
		"idempotency_conflict", "idempotency_in_flight", "outcome_unknown", "timeout", "cancelled",
		"execution_error", "upstream_unavailable", "upstream_error", "internal"}
	modes      = []string{"no_go", "soft_gate", "autopilot", "escalated"}
	txOutcomes = []string{"committed", "rolled_back", "no_op"}
	// statusOf is the status table of docs/http.md.
	statusOf = map[string]int{
		"": 200, "invalid_args": 400, "idempotency_key_required": 400,
		"token_invalid": 401, "token_revoked": 401,
		"permission_denied": 403, "scope_denied": 403, "policy_denied": 403, "approval_denied": 403,
		"tool_not_found": 404, "idempotency_in_flight": 409, "precondition_failed": 409, "policy_mismatch": 409,
		"idempotency_conflict": 422, "budget_exceeded": 429, "cancelled": 499,
		"execution_error": 502, "upstream_unavailable": 502, "upstream_error": 502, "outcome_unknown": 502, "timeout": 504, "approval_timeout": 504, "internal": 500,
	}
	hashRE     = regexp.MustCompile(`^blake3:[0-9a-f]{64}$`)
	snapshotRE = regexp.MustCompile(`^([0-9]+):(blake3:[0-9a-f]{64})$`)
)

func isUUID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

// Expect requires the answer's HTTP status and error class ("" for ok) and
// the fields every result envelope carries whatever happened.
func (t *T) Expect(r *Resp, status int, class string) {
	if r.Status != status || r.Class() != class {
		msg := ""
		if r.R.Error != nil {
			msg = ": " + r.R.Error.Message
		}
		t.Failf("got %d %q, want %d %q%s", r.Status, r.Class(), status, class, msg)
	}
	t.CheckEnvelope(r)
}

// ExpectOK requires a 200 ok answer.
func (t *T) ExpectOK(r *Resp) { t.Expect(r, http.StatusOK, "") }

// ExpectClass requires error class and its status of docs/http.md.
func (t *T) ExpectClass(r *Resp, class string) { t.Expect(r, statusOf[class], class) }

// ExpectRefused requires an error answer of one of classes, with the
// status docs/http.md gives it, that committed nothing.
func (t *T) ExpectRefused(r *Resp, classes ...string) {
	if !slices.Contains(classes, r.Class()) {
		t.Failf("got %d %q, want one of %v", r.Status, r.Class(), classes)
	}
	t.Expect(r, statusOf[r.Class()], r.Class())
	if r.R.TxOutcome == "committed" || r.R.CommitDeltaID != "" {
		t.Failf("a refused call reports tx_outcome %q, commit_delta_id %q", r.R.TxOutcome, r.R.CommitDeltaID)
	}
}

// CheckEnvelope checks the TOOL-01 §2 fields of any result envelope:
// present, well-formed and consistent with status.
func (t *T) CheckEnvelope(r *Resp) {
	if err := envelopeProblem(r.R); err != nil {
		t.Failf("result envelope: %v", err)
	}
	if want, ok := statusOf[r.Class()]; ok && r.Status != want && !(r.Class() == "invalid_args" && r.Status == http.StatusRequestEntityTooLarge) {
		t.Failf("status %d for class %q; docs/http.md says %d", r.Status, r.Class(), want)
	}
}

// envelopeProblem says what a result envelope lacks.
func envelopeProblem(r *Result) error {
	var missing []string
	for _, f := range []string{"tool_id", "agent_id", "state_snapshot_id", "status", "result_hash", "operation_id", "autonomy_mode", "risk_score", "tx_outcome"} {
		if _, ok := r.raw[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	switch {
	case r.Status != "ok" && r.Status != "error":
		return fmt.Errorf("status %q is not ok or error", r.Status)
	case !hashRE.MatchString(r.ResultHash):
		return fmt.Errorf("result_hash %q is not blake3:<64 hex>", r.ResultHash)
	case r.OperationID == "":
		return errors.New("empty operation_id")
	case !slices.Contains(modes, r.AutonomyMode):
		return fmt.Errorf("autonomy_mode %q is not one of %v", r.AutonomyMode, modes)
	case r.RiskScore == nil || *r.RiskScore < 0 || *r.RiskScore > 1 || math.IsNaN(*r.RiskScore):
		return fmt.Errorf("risk_score %v is not a number in [0,1]", r.RiskScore)
	case !slices.Contains(txOutcomes, r.TxOutcome):
		return fmt.Errorf("tx_outcome %q is not one of %v", r.TxOutcome, txOutcomes)
	case r.TxOutcome == "committed" && !hashRE.MatchString(r.CommitDeltaID):
		return fmt.Errorf("committed without a commit_delta_id (%q)", r.CommitDeltaID)
	case r.TxOutcome != "committed" && r.CommitDeltaID != "":
		return fmt.Errorf("commit_delta_id %q on a %s call", r.CommitDeltaID, r.TxOutcome)
	case r.Status == "ok" && (r.Error != nil || len(r.Result) == 0 || r.Result[0] != '{'):
		return errors.New("status ok needs a result object and no error")
	case r.Status == "error" && (r.Error == nil || r.Error.Class == "" || r.Error.Message == ""):
		return errors.New("status error needs error {class, message}")
	case r.Status == "error" && !slices.Contains(errorClasses, r.Error.Class):
		return fmt.Errorf("error class %q is not in DESIGN.md's closed enum", r.Error.Class)
	case r.Status == "error" && r.TxOutcome == "committed":
		return errors.New("an error result reports committed")
	case len(r.Receipt) == 0 || r.Receipt[0] != '{':
		return errors.New("no receipt object")
	}
	if r.StateSnapshotID != "" && !snapshotRE.MatchString(r.StateSnapshotID) {
		return fmt.Errorf("state_snapshot_id %q is not <seq>:blake3:<hex>", r.StateSnapshotID)
	}
	if rr, ok := r.raw["replayed"]; ok && string(rr) != "true" && string(rr) != "false" {
		return fmt.Errorf("replayed %s is not a boolean", rr)
	}
	return nil
}

// resultHash recomputes result_hash (docs/formats.md "Call hashes").
func resultHash(r *Result) (string, error) {
	var v any
	if r.Status == "ok" {
		v = map[string]any{"status": "ok", "result": r.Result}
	} else {
		v = map[string]any{"status": "error", "error": r.Error}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return digest.JSON(b)
}

// argsHash is blake3 of the canonical args.
func argsHash(args any) string {
	b, _ := json.Marshal(args)
	c, err := jcs.Canonicalize(b)
	if err != nil {
		return ""
	}
	return digest.Sum(c)
}

// ---- JWKS and receipts (docs/formats.md "Receipts"), verified by the
// contract's rules with the JWKS alone (receipts.SignatureKeys and
// receipts.VerifyLogged, pure functions of the JWKS and the receipt), so
// that what the suite accepts is what every verifier accepts.

// JWKS fetches the endpoint's JWK Set and returns its Ed25519 signature
// keys by kid, read by the rule of docs/formats.md ("The kernel's JWKS"):
// strict JSON, each Ed25519 signature key well formed (x canonical
// base64url of 32 bytes, kid its RFC 7638 thumbprint, no d) and no kid
// twice.
func (t *T) JWKS() map[string]ed25519.PublicKey {
	keys, _ := t.jwks()
	return keys
}

// jwks returns the endpoint's JWKS keys and the document they come from.
func (t *T) jwks() (map[string]ed25519.PublicKey, []byte) {
	t.env.mu.Lock()
	keys, doc := t.env.jwks, t.env.jwksDoc
	t.env.mu.Unlock()
	if keys != nil {
		return keys, doc
	}
	status, b := t.Get("/.well-known/jwks.json", "")
	if status != http.StatusOK {
		t.Failf("GET /.well-known/jwks.json: %d", status)
	}
	keys, err := receipts.SignatureKeys(b)
	if err != nil {
		t.Failf("JWKS: %v", err)
	}
	t.env.mu.Lock()
	t.env.jwks, t.env.jwksDoc = keys, b
	t.env.mu.Unlock()
	return keys, b
}

func thumbprint(x string) string {
	s := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	return base64.RawURLEncoding.EncodeToString(s[:])
}

// Receipt is what a receipt attests (docs/formats.md): the fields of the
// audit entry it proves, and the entry's place in the ledger.
type Receipt struct {
	ReceiptID         string   `json:"-"`
	OperationID       string   `json:"operation_id"`
	ToolID            string   `json:"tool_id"`
	AgentID           string   `json:"agent_id"`
	CapabilityTokenID string   `json:"capability_token_id"`
	ArgsHash          string   `json:"args_hash"`
	ResultHash        string   `json:"result_hash"`
	TxOutcome         string   `json:"tx_outcome"`
	CommitDeltaID     string   `json:"commit_delta_id"`
	PolicyHash        string   `json:"policy_hash"`
	AutonomyMode      string   `json:"autonomy_mode"`
	TaskClass         string   `json:"task_class"`
	RiskScore         *float64 `json:"risk_score"`
	ErrorClass        string   `json:"error_class"`
	// A record with commitments holds these instead of the plain hashes
	// (docs/formats.md "Payloads and commitments"); its context
	// commitment stands for its provenance, notes and risk_basis.
	ArgsCommitment    string  `json:"args_commitment"`
	ResultCommitment  string  `json:"result_commitment"`
	ContextCommitment string  `json:"context_commitment"`
	LedgerSeq         *uint64 `json:"-"`
	LedgerEntryHash   string  `json:"-"`
	IssuedAt          string  `json:"-"`
}

// LoggedReceipt is a receipt proven by the log (capkernel-receipt/v2), as
// the cases edit one.
type LoggedReceipt struct {
	Format     string         `json:"format"`
	Entry      string         `json:"entry"`
	Inclusion  InclusionProof `json:"inclusion"`
	Checkpoint string         `json:"checkpoint"`
}

// verifyLogged checks a receipt proven by the log with the JWKS document
// jwks alone, by every rule of docs/formats.md (receipts.VerifyLogged):
// the exact members (no unknown, duplicate, case-variant, missing or null
// one), the entry's canonical bytes, hash and receipt fields, the
// checkpoint's signature by a JWKS signature key and its size, and the
// inclusion proof. It returns the audit entry.
func verifyLogged(raw, jwks []byte) (ledger.Entry, error) {
	p, err := receipts.VerifyLogged(raw, jwks)
	if err != nil {
		return ledger.Entry{}, err
	}
	return p.Entry, nil
}

// VerifyReceipt checks r's receipt against the JWKS and its fields against
// the result envelope, and returns what it attests.
func (t *T) VerifyReceipt(r *Resp) *Receipt {
	_, doc := t.jwks()
	e, err := verifyLogged(r.R.Receipt, doc)
	if err != nil {
		t.Failf("receipt: %v", err)
	}
	var rc Receipt
	if err := json.Unmarshal(e.Body, &rc); err != nil {
		t.Failf("receipt's audit entry: %v", err)
	}
	seq := e.Seq
	rc.ReceiptID = fmt.Sprintf("r%d-%s", e.Seq, strings.TrimPrefix(e.Hash, "blake3:")[:16])
	rc.LedgerSeq, rc.LedgerEntryHash, rc.IssuedAt = &seq, e.Hash, e.Time
	res := r.R
	if rc.ResultCommitment != "" {
		// The record commits to the result under the salt the caller got:
		// the receipt states the result's hash once it opens.
		canon, err := resultCanonical(res)
		if err != nil {
			t.Failf("the result envelope's result: %v", err)
		}
		got, err := commitment(res.AuditSalt, "result", canon)
		if err != nil {
			t.Failf("the result envelope's audit_salt: %v", err)
		}
		if got != rc.ResultCommitment {
			t.Failf("the receipt's record does not commit to the result envelope's result under its audit_salt (%s, recomputed %s)", rc.ResultCommitment, got)
		}
		rc.ResultHash = digest.Sum(canon)
		if hashRE.MatchString(rc.ArgsCommitment) {
			rc.ArgsHash = rc.ArgsCommitment
		}
	}
	var diffs []string
	cmp := func(name, got, want string) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s %q ≠ result's %q", name, got, want))
		}
	}
	cmp("operation_id", rc.OperationID, res.OperationID)
	cmp("tool_id", rc.ToolID, res.ToolID)
	cmp("agent_id", rc.AgentID, res.AgentID)
	cmp("result_hash", rc.ResultHash, res.ResultHash)
	cmp("tx_outcome", rc.TxOutcome, res.TxOutcome)
	cmp("commit_delta_id", rc.CommitDeltaID, res.CommitDeltaID)
	cmp("autonomy_mode", rc.AutonomyMode, res.AutonomyMode)
	cmp("task_class", rc.TaskClass, res.TaskClass)
	cmp("error_class", rc.ErrorClass, res.errClass())
	if res.ReceiptID != "" {
		cmp("receipt_id", rc.ReceiptID, res.ReceiptID)
	}
	if rc.RiskScore == nil || res.RiskScore == nil || *rc.RiskScore != *res.RiskScore {
		diffs = append(diffs, "risk_score differs from the result's")
	}
	// An envelope that could not be decoded (refused as invalid_args) has
	// no args to hash, though the record may name what of its tool and
	// agent came before the fault.
	argsOK := hashRE.MatchString(rc.ArgsHash) || (rc.ArgsHash == "" && res.errClass() == "invalid_args")
	if !argsOK || !hashRE.MatchString(rc.PolicyHash) {
		diffs = append(diffs, "args_hash or policy_hash missing or malformed")
	}
	if rc.ContextCommitment != "" {
		diffs = append(diffs, t.contextDiffs(res, &rc)...)
	}
	if len(diffs) > 0 {
		t.Failf("receipt disagrees with the result envelope: %s", strings.Join(diffs, "; "))
	}
	return &rc
}

// contextDiffs says how the result envelope res's risk_basis, provenance
// and notes differ from those rc's record commits to (docs/formats.md,
// "Receipts", step 4): the context commitment must open under res's
// audit_salt on the canonical {"notes","provenance","risk_basis"} of res
// (notes and provenance absent when res has none).
func (t *T) contextDiffs(res *Result, rc *Receipt) []string {
	basis := res.RiskBasis
	if basis == nil {
		basis = []string{}
	}
	part := map[string]any{"risk_basis": basis}
	if len(res.Provenance) > 0 {
		part["provenance"] = res.Provenance
	}
	if len(res.Notes) > 0 {
		part["notes"] = res.Notes
	}
	b, err := exactMarshal(part)
	if err != nil {
		return []string{fmt.Sprintf("the envelope's provenance or notes are not exact canonical JSON: %v", err)}
	}
	got, err := commitment(res.AuditSalt, "context", b)
	if err != nil {
		return []string{fmt.Sprintf("the envelope's audit_salt: %v", err)}
	}
	if got == rc.ContextCommitment {
		return nil
	}
	return []string{fmt.Sprintf("the record does not commit to the envelope's context %s under its audit_salt: its risk_basis, provenance or notes are not the record's", b)}
}

// canonicalOf returns the canonical JSON of raw, "" for none, or raw
// itself when it is not JSON.
func canonicalOf(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	b, err := jcs.Canonicalize(raw)
	if err != nil {
		return string(raw)
	}
	return string(b)
}

// ---- Ledger.

// Entries fetches up to limit entries from seq from (admin credential).
func (t *T) Entries(from uint64, limit int) []Entry {
	var page struct {
		Entries []Entry `json:"entries"`
	}
	status, b, err := t.env.do(t.ctx, http.MethodGet, fmt.Sprintf("/v1/ledger/entries?from=%d&limit=%d", from, limit), t.env.admin, nil)
	if err != nil || status != http.StatusOK {
		t.addEvidence(Evidence{Label: "http", Request: fmt.Sprintf("GET /v1/ledger/entries?from=%d&limit=%d", from, limit), Status: status, Response: shorten(string(b))})
		t.Failf("GET /v1/ledger/entries: %d %v", status, err)
	}
	if err := json.Unmarshal(b, &page); err != nil {
		t.Failf("GET /v1/ledger/entries: %v", err)
	}
	return page.Entries
}

// Entry fetches entry seq and checks its entry_hash recomputes.
func (t *T) Entry(seq uint64) Entry {
	es := t.Entries(seq, 1)
	if len(es) != 1 || es[0].Seq != seq {
		t.Failf("GET /v1/ledger/entries?from=%d&limit=1 did not answer entry %d", seq, seq)
	}
	e := es[0]
	b, _ := json.Marshal(e)
	t.addEvidence(Evidence{Label: "ledger entry", Entry: json.RawMessage(t.env.redact(string(b)))})
	if err := checkEntryHash(e); err != nil {
		t.Failf("ledger entry %d: %v", seq, err)
	}
	return e
}

func checkEntryHash(e Entry) error {
	h, err := ledger.EntryHash(ledger.Entry{Seq: e.Seq, Kind: e.Kind, Time: e.Time, PrevHash: e.PrevHash, Body: e.Body})
	if err != nil {
		return fmt.Errorf("entry_hash cannot be recomputed: %v", err)
	}
	if h != e.Hash {
		return fmt.Errorf("entry_hash %s does not recompute (%s)", e.Hash, h)
	}
	return nil
}

// Head returns the ledger's size.
func (t *T) Head() uint64 {
	var h struct {
		Size uint64 `json:"size"`
	}
	t.GetJSON("/v1/ledger/head", "", &h)
	return h.Size
}

// Audit returns the audit record of r's call: the entry its verified
// receipt names, checked to be an audit record of the same operation.
func (t *T) Audit(r *Resp) (Entry, map[string]json.RawMessage) {
	rc := t.VerifyReceipt(r)
	e := t.Entry(*rc.LedgerSeq)
	if e.Hash != rc.LedgerEntryHash {
		t.Failf("receipt names entry %d with hash %s, the ledger has %s", e.Seq, rc.LedgerEntryHash, e.Hash)
	}
	if e.Kind != "audit" {
		t.Failf("the receipt's entry %d is of kind %q, want audit", e.Seq, e.Kind)
	}
	body := t.OpenBody(e)
	if str(body["operation_id"]) != r.R.OperationID {
		t.Failf("audit record %d is of operation %s, the call's is %s", e.Seq, str(body["operation_id"]), r.R.OperationID)
	}
	return e, body
}

// AuditRecords scans the ledger from seq from to its end and returns the
// audit records (and receipt entries) of operation op.
func (t *T) AuditRecords(from uint64, op string) (audits, receiptEntries []Entry) {
	for {
		page := t.Entries(from, 1000)
		for _, e := range page {
			var b struct {
				OperationID string `json:"operation_id"`
			}
			json.Unmarshal(e.Body, &b)
			if b.OperationID != op {
				continue
			}
			switch e.Kind {
			case "audit":
				audits = append(audits, e)
			case "receipt":
				receiptEntries = append(receiptEntries, e)
			}
		}
		if len(page) < 1000 {
			return
		}
		from = page[len(page)-1].Seq + 1
	}
}

// str decodes a JSON string ("" otherwise).
func str(raw json.RawMessage) string {
	var s string
	json.Unmarshal(raw, &s)
	return s
}

// ---- Checkpoints and proofs.

// VerifiedCheckpoint fetches the latest signed checkpoint and verifies its
// note with the endpoint's verifier key, which must hold a JWKS key.
func (t *T) VerifiedCheckpoint(query string) (Checkpoint, ledger.Checkpoint) {
	var cp Checkpoint
	t.GetJSON("/v1/ledger/checkpoint"+query, "", &cp)
	c, err := openCheckpoint(cp, t.JWKS())
	if err != nil {
		t.Failf("checkpoint: %v", err)
	}
	return cp, c
}

// openNote opens a signed checkpoint note with whichever JWKS key signed
// it under the note's own origin as key name; a note no published key
// signed is refused (anyone could sign one with a key of their own). It
// returns the checkpoint and the key's note verifier key string.
func openNote(signed string, keys map[string]ed25519.PublicKey) (ledger.Checkpoint, string, error) {
	unverified, err := ledger.PeekCheckpoint([]byte(signed))
	if err != nil {
		return ledger.Checkpoint{}, "", err
	}
	for _, k := range keys {
		v, err := ledger.NewCheckpointVerifier(unverified.Origin, k)
		if err != nil {
			continue
		}
		if c, err := ledger.OpenCheckpoint([]byte(signed), v); err == nil {
			vk, err := ledger.CheckpointVerifierKey(unverified.Origin, k)
			return c, vk, err
		}
	}
	return ledger.Checkpoint{}, "", errors.New("the signed note carries no valid signature by a key of the JWKS under its origin")
}

// openCheckpoint verifies a checkpoint answer: its note signed by a JWKS
// key, its verifier_key that key's, and its other fields the note's.
func openCheckpoint(cp Checkpoint, keys map[string]ed25519.PublicKey) (ledger.Checkpoint, error) {
	c, vk, err := openNote(cp.Note, keys)
	if err != nil {
		return ledger.Checkpoint{}, err
	}
	if vk != cp.VerifierKey {
		return ledger.Checkpoint{}, fmt.Errorf("verifier_key %q is not the signing key's %q", cp.VerifierKey, vk)
	}
	if c.Origin != cp.Origin || c.Size != cp.Size || digest.Format(c.Root) != cp.Root {
		return ledger.Checkpoint{}, fmt.Errorf("the answer's origin/size/root (%s %d %s) are not the note's (%s %d %s)", cp.Origin, cp.Size, cp.Root, c.Origin, c.Size, digest.Format(c.Root))
	}
	return c, nil
}

// VerifyInclusion checks that entry e is in the tree of the checkpoint c
// with the endpoint's proof.
func (t *T) VerifyInclusion(e Entry, c ledger.Checkpoint) {
	var p InclusionProof
	t.GetJSON(fmt.Sprintf("/v1/ledger/proof/inclusion?seq=%d&size=%d", e.Seq, c.Size), "", &p)
	if err := verifyInclusion(p, e, c); err != nil {
		t.Failf("inclusion proof of entry %d in the checkpoint of size %d: %v", e.Seq, c.Size, err)
	}
}

func verifyInclusion(p InclusionProof, e Entry, c ledger.Checkpoint) error {
	if p.LeafIndex != e.Seq || p.TreeSize != c.Size || p.LeafHash != e.Hash {
		return fmt.Errorf("proof is of leaf %d/%d %s, want %d/%d %s", p.LeafIndex, p.TreeSize, p.LeafHash, e.Seq, c.Size, e.Hash)
	}
	return p.Inclusion.Verify(c.Root)
}

// seqOf parses the seq of a state_snapshot_id.
func seqOf(snapshot string) (uint64, string, bool) {
	m := snapshotRE.FindStringSubmatch(snapshot)
	if m == nil {
		return 0, "", false
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	return n, m[2], err == nil
}
