package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/strictjson"
)

// receiptFile is what a file given to receipts verify holds when it
// verifies on its own.
type receiptFile struct {
	// Receipt is the receipt to verify: a receipt proven by the log (the
	// file, or the "receipt" member of a result envelope) or a v1 bundle.
	Receipt []byte
	// Envelope is the result envelope Receipt came in, or nil for a bare
	// receipt or bundle.
	Envelope *kernel.Result
}

// readReceiptFile reads b, the content of a file given to receipts verify.
// ok is false for content that is not a receipt verifying on its own (a
// compact JWS, the output of receipts show --json), left to the v1 path.
// Every JSON object is read by strictjson's rules first, so no member
// another reader would read differently (a duplicate, a case variant of a
// name) is taken: a refusal is an error. A result envelope (no "format",
// a "receipt" object) must be exactly a kernel.Result.
func readReceiptFile(b []byte) (f receiptFile, ok bool, err error) {
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		return f, false, nil
	}
	var top map[string]json.RawMessage
	if err := strictjson.Unmarshal(b, &top); err != nil {
		return f, false, err
	}
	if raw, has := top["format"]; has {
		var format string
		if json.Unmarshal(raw, &format) != nil || (format != receipts.Format && format != kernel.BundleFormat) {
			return f, false, nil
		}
		return receiptFile{Receipt: b}, true, nil
	}
	raw, has := top["receipt"]
	_, seq := top["seq"]
	_, status := top["status"]
	if has && seq && !status && bytes.HasPrefix(raw, []byte("{")) {
		// receipts show --json of a receipt proven by the log: what it
		// says, read from its entry, with no proof to verify.
		return f, false, errors.New("this is receipts show output: what a receipt says, without the proof that it is in the log; verify the receipt by its id (receipts verify ID --server URL) or save its bundle (receipts bundle ID > FILE) and verify that")
	}
	if !has || !bytes.HasPrefix(raw, []byte("{")) {
		// A v1 envelope carries its JWS receipt as a string.
		return f, false, nil
	}
	var res kernel.Result
	if err := strictjson.Unmarshal(b, &res); err != nil {
		return f, false, fmt.Errorf("result envelope: %w", err)
	}
	return receiptFile{Receipt: raw, Envelope: &res}, true, nil
}

// checkEnvelope checks that res, a result envelope whose receipt verified,
// is the call its receipt's audit record attests, and opens the record's
// commitments with res's audit_salt. match is "ok …" or every field that
// differs; commitments is "ok …" or why the result, its risk_basis and
// provenance (and, with argsFile, the args the call sent) are not shown
// to be the record's.
func checkEnvelope(res *kernel.Result, argsFile string) (match, commitments string) {
	e, err := ledger.ParseEntry([]byte(res.Receipt.Entry))
	if err != nil {
		return err.Error(), "not checked"
	}
	c, err := kernel.DecodeCall(e)
	if err != nil {
		return err.Error(), "not checked"
	}
	if err := exactNumbers(res); err != nil {
		return "refused: " + err.Error(), "not checked (the envelope holds a number that canonical JSON rounds, which no commitment tells from the rounded one)"
	}
	part := kernel.ResultPart(res)
	return matchEnvelope(res, c, part), openEnvelope(res, c, e, part, argsFile)
}

// exactNumbers refuses res when its result, provenance or a note holds a
// number that is not the decimal of its canonical form (jcs.CanonicalizeExact):
// the parts are canonicalized before their commitments are opened, which
// rounds every number to a double, so 9007199254740993 in an envelope
// would open the commitment to 9007199254740992 while every reader of
// integers (Python, jq, Go) reads the number written. The kernel refuses
// such numbers in args for the same reason.
func exactNumbers(res *kernel.Result) error {
	if len(res.Result) > 0 {
		if _, err := jcs.CanonicalizeExact(res.Result); err != nil {
			return fmt.Errorf("result: %w", err)
		}
	}
	if len(res.Provenance) > 0 {
		if _, err := jcs.CanonicalizeExact(res.Provenance); err != nil {
			return fmt.Errorf("provenance: %w", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(res.Notes)) {
		if _, err := jcs.CanonicalizeExact(res.Notes[name]); err != nil {
			return fmt.Errorf("notes %q: %w", name, err)
		}
	}
	return nil
}

// resultGone says how res lost its result ("" when it did not): the
// stored envelope of an erased operation, or of a call at audit depth
// commitments_only, keeps no result and no audit_salt (docs/formats.md
// "Erasure"), and an error's message is replaced, so its result part
// no longer hashes to its result_hash.
func resultGone(res *kernel.Result) string {
	if res.AuditSalt != "" {
		return ""
	}
	switch {
	case res.Error != nil && res.Error.Message == kernel.ErasedMessage:
		return "its error message erased with the audit payload"
	case res.Error != nil && res.Error.Message == kernel.NotKeptMessage:
		return "its error message not kept (audit depth commitments_only)"
	case res.Error == nil && len(res.Result) == 0 && res.Status == kernel.StatusOK:
		return "its result erased (or not kept at audit depth commitments_only)"
	}
	return ""
}

// matchEnvelope compares the fields of res with those of c, its receipt's
// audit record, and res's result_hash with the hash of its result part.
// A record from before commitments holds risk_basis and provenance in
// its body: they are compared here (a later record commits to them in its
// context part, opened by openEnvelope).
func matchEnvelope(res *kernel.Result, c *kernel.CallRecord, part []byte) string {
	errClass := ""
	if res.Error != nil {
		errClass = res.Error.Class
	}
	var bad []string
	if res.Error != nil && len(res.Result) > 0 {
		// The result part of an error is the error alone (kernel.ResultPart):
		// a result beside it is nothing the record commits to.
		bad = append(bad, "it holds both an error and a result, and the record commits to the error alone")
	}
	for _, f := range [][3]string{
		{"operation_id", res.OperationID, c.OperationID},
		{"tool_id", res.ToolID, c.ToolID},
		{"agent_id", res.AgentID, c.AgentID},
		{"status", res.Status, c.Status},
		{"error class", errClass, c.ErrorClass},
		{"tx_outcome", res.TxOutcome, c.TxOutcome},
		{"commit_delta_id", res.CommitDeltaID, c.CommitDeltaID},
		{"autonomy_mode", res.AutonomyMode, c.AutonomyMode},
		{"task_class", res.TaskClass, c.TaskClass},
		{"risk_score", fmt.Sprint(res.RiskScore), fmt.Sprint(c.RiskScore)},
		{"ledger_seq", strconv.FormatUint(res.LedgerSeq, 10), strconv.FormatUint(c.Seq, 10)},
		{"receipt_id", res.ReceiptID, receipts.ID(c.Seq, c.Hash)},
		{"state_snapshot_id", res.StateSnapshotID, strconv.FormatUint(c.Seq, 10) + ":" + c.Hash},
	} {
		if f[1] != f[2] {
			bad = append(bad, fmt.Sprintf("%s is %q, the record's %q", f[0], f[1], f[2]))
		}
	}
	if c.PayloadDepth == "" {
		bad = append(bad, plainContextDiffs(res, c)...)
	}
	gone := resultGone(res)
	// result_hash hashes the result part the record commits to (opened
	// below); a record from before commitments holds the hash itself. An
	// envelope whose result is gone cannot recompute it.
	if sum := digest.Sum(part); gone == "" && res.ResultHash != sum {
		bad = append(bad, fmt.Sprintf("result_hash is %q, but the envelope's result hashes to %s", res.ResultHash, sum))
	}
	if c.PayloadDepth == "" && c.ResultHash != "" && res.ResultHash != c.ResultHash {
		bad = append(bad, fmt.Sprintf("result_hash is %q, the record's %q", res.ResultHash, c.ResultHash))
	}
	switch {
	case len(bad) > 0:
		return fmt.Sprintf("the envelope is not the call audit record %d attests: %s", c.Seq, strings.Join(bad, "; "))
	case gone != "":
		return fmt.Sprintf("refused: the envelope is the call audit record %d attests, with %s: its other fields are the record's, "+
			"but its result_hash cannot be recomputed from it (its receipt alone still verifies)", c.Seq, gone)
	}
	return fmt.Sprintf("ok (operation, tool, agent, status, outcome, mode, risk, ledger refs and result_hash are those of audit record %d; "+
		"replayed is not attested: a replay carries its original's receipt)", c.Seq)
}

// plainContextDiffs compares res's risk_basis and provenance with those a
// record from before commitments holds in its body.
func plainContextDiffs(res *kernel.Result, c *kernel.CallRecord) []string {
	var bad []string
	if !slices.Equal(res.RiskBasis, c.RiskBasis) {
		bad = append(bad, fmt.Sprintf("risk_basis is %s, the record's %s", quoteList(res.RiskBasis), quoteList(c.RiskBasis)))
	}
	if have, want := canonicalOrRaw(res.Provenance), canonicalOrRaw(c.Provenance); have != want {
		bad = append(bad, fmt.Sprintf("provenance is %s, the record's %s", orNone(have), orNone(want)))
	}
	return bad
}

// contextPart is the context part of res's audit record as res carries
// it: {"notes","provenance","risk_basis"} (notes and provenance absent
// when res has none, risk_basis [] when none).
func contextPart(res *kernel.Result) ([]byte, error) {
	ctx := struct {
		Notes      map[string]json.RawMessage `json:"notes,omitempty"`
		Provenance json.RawMessage            `json:"provenance,omitempty"`
		RiskBasis  []string                   `json:"risk_basis"`
	}{res.Notes, res.Provenance, res.RiskBasis}
	if ctx.RiskBasis == nil {
		ctx.RiskBasis = []string{}
	}
	b, err := json.Marshal(ctx)
	if err != nil {
		return nil, fmt.Errorf("provenance: %v", err)
	}
	return jcs.Canonicalize(b)
}

// openEnvelope shows that c's audit record (entry e) commits to part,
// res's result part, to res's risk_basis and provenance (its context
// part), and with argsFile to those args: by opening its commitments with
// res's audit_salt, or, for a record from before commitments, by its plain
// hashes. A record committing to a result needs the salt: without it
// nothing ties the envelope's result to the record.
func openEnvelope(res *kernel.Result, c *kernel.CallRecord, e ledger.Entry, part []byte, argsFile string) string {
	var args []byte
	what := "this result"
	if argsFile != "" {
		a, err := os.ReadFile(argsFile)
		if err != nil {
			return fmt.Sprintf("--args: %v", err)
		}
		// Exact, as the kernel reads args (exactNumbers says why).
		if _, err := jcs.CanonicalizeExact(a); err != nil {
			return fmt.Sprintf("refused: --args: %v", err)
		}
		args, what = a, "this result and these args"
	}
	switch {
	case c.Commitments.Result != "":
		if res.AuditSalt == "" {
			return fmt.Sprintf("refused: the envelope has no audit_salt, so nothing shows that audit record %d commits to its result "+
				"(the record holds only a salted commitment to it; an envelope whose payload was erased lost its salt: verify its receipt alone)", c.Seq)
		}
		if !lowerHexSalt(res.AuditSalt) {
			return fmt.Sprintf("refused: the envelope's audit_salt %q is not 64 lowercase hex digits (docs/formats.md: one spelling per salt)", res.AuditSalt)
		}
		p := kernel.Payload{Salt: res.AuditSalt, Result: part, Args: args}
		if err := kernel.CheckPayload(e, p); err != nil {
			return err.Error()
		}
		if msg := openContext(res, c, e); msg != "" {
			return fmt.Sprintf("refused: audit record %d commits to %s under the envelope's audit_salt, but %s", c.Seq, what, msg)
		}
		return fmt.Sprintf("ok (audit record %d commits to %s, its risk_basis and provenance under the envelope's audit_salt)", c.Seq, what)
	case c.PayloadDepth == "" && c.ResultHash != "":
		// A record from before commitments: matchEnvelope compared the
		// hashes of the result.
		if args != nil {
			canon, err := jcs.Canonicalize(args)
			if err != nil {
				return fmt.Sprintf("--args: %v", err)
			}
			if sum := digest.Sum(canon); sum != c.ArgsHash {
				return fmt.Sprintf("audit record %d has args_hash %s; these args hash to %s", c.Seq, c.ArgsHash, sum)
			}
		}
		return fmt.Sprintf("ok (audit record %d, from before commitments, holds the hash of %s)", c.Seq, what)
	}
	return fmt.Sprintf("refused: audit record %d attests no result, so nothing attests the envelope's", c.Seq)
}

// lowerHexSalt reports whether salt is spelled as the contract spells a
// salt, 64 lowercase hex digits. kernel.CheckPayload decodes upper case
// too, which would give one payload 2^64 spellings that all open, where
// the console opens only this one.
func lowerHexSalt(salt string) bool {
	if len(salt) != 2*kernel.SaltSize {
		return false
	}
	for _, c := range []byte(salt) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// openContext opens the context commitment of c's record (entry e) with
// res's audit_salt on res's risk_basis and provenance, and says what is
// not shown ("" when it opens). It names the field it can tell is not the
// record's: a provenance the record does not have when the part opens
// without it.
func openContext(res *kernel.Result, c *kernel.CallRecord, e ledger.Entry) string {
	if c.Commitments.Context == "" {
		if len(res.RiskBasis) == 0 && len(res.Provenance) == 0 {
			return ""
		}
		return "it commits to no context, so nothing attests the envelope's risk_basis and provenance"
	}
	ctx, err := contextPart(res)
	if err != nil {
		return "the envelope's risk_basis and provenance do not make a context part: " + err.Error()
	}
	if kernel.CheckPayload(e, kernel.Payload{Salt: res.AuditSalt, Context: ctx}) == nil {
		return ""
	}
	if len(res.Provenance) > 0 {
		bare := *res
		bare.Provenance = nil
		if b, err := contextPart(&bare); err == nil && kernel.CheckPayload(e, kernel.Payload{Salt: res.AuditSalt, Context: b}) == nil {
			return fmt.Sprintf("provenance %s is not the record's: the record has none (its context commitment opens on the envelope's risk_basis alone)",
				canonicalOrRaw(res.Provenance))
		}
	}
	return fmt.Sprintf("not to its risk_basis %s and provenance %s, with the notes it carries: its context_commitment %s does not open on %s. "+
		"One of them is not the record's (an envelope from a kernel that did not yet return notes lacks those of a "+
		"net.fetch, a proc.exec with network access or a call by handle: then only the record's payload shows them)",
		quoteList(res.RiskBasis), orNone(canonicalOrRaw(res.Provenance)), c.Commitments.Context, ctx)
}

// canonicalOrRaw returns the canonical JSON of raw, raw itself when it is
// not JSON, or "" for none.
func canonicalOrRaw(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	if b, err := jcs.Canonicalize(raw); err == nil {
		return string(b)
	}
	return string(raw)
}

// orNone returns s, or "none" for "".
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// quoteList writes list as a JSON array ([] for none).
func quoteList(list []string) string {
	if list == nil {
		list = []string{}
	}
	b, _ := json.Marshal(list)
	return string(b)
}
