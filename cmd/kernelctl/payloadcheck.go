package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
// differs; commitments is "ok …" or why the result (and, with argsFile,
// the args the call sent) is not shown to be the record's.
func checkEnvelope(res *kernel.Result, argsFile string) (match, commitments string) {
	e, err := ledger.ParseEntry([]byte(res.Receipt.Entry))
	if err != nil {
		return err.Error(), "not checked"
	}
	c, err := kernel.DecodeCall(e)
	if err != nil {
		return err.Error(), "not checked"
	}
	part := kernel.ResultPart(res)
	return matchEnvelope(res, c, part), openEnvelope(res, c, e, part, argsFile)
}

// matchEnvelope compares the fields of res with those of c, its receipt's
// audit record, and res's result_hash with the hash of its result part.
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
	// result_hash hashes the result part the record commits to (opened
	// below); a record from before commitments holds the hash itself.
	if sum := digest.Sum(part); res.ResultHash != sum {
		bad = append(bad, fmt.Sprintf("result_hash is %q, but the envelope's result hashes to %s", res.ResultHash, sum))
	}
	if c.PayloadDepth == "" && c.ResultHash != "" && res.ResultHash != c.ResultHash {
		bad = append(bad, fmt.Sprintf("result_hash is %q, the record's %q", res.ResultHash, c.ResultHash))
	}
	if len(bad) > 0 {
		return fmt.Sprintf("the envelope is not the call audit record %d attests: %s", c.Seq, strings.Join(bad, "; "))
	}
	return fmt.Sprintf("ok (operation, tool, agent, outcome, ledger refs and result_hash are those of audit record %d)", c.Seq)
}

// openEnvelope shows that c's audit record (entry e) commits to part,
// res's result part, and with argsFile to those args: by opening its
// commitments with res's audit_salt, or, for a record from before
// commitments, by its plain hashes. A record committing to a result needs
// the salt: without it nothing ties the envelope's result to the record.
func openEnvelope(res *kernel.Result, c *kernel.CallRecord, e ledger.Entry, part []byte, argsFile string) string {
	var args []byte
	what := "this result"
	if argsFile != "" {
		a, err := os.ReadFile(argsFile)
		if err != nil {
			return fmt.Sprintf("--args: %v", err)
		}
		args, what = a, "this result and these args"
	}
	switch {
	case c.Commitments.Result != "":
		if res.AuditSalt == "" {
			return fmt.Sprintf("refused: the envelope has no audit_salt, so nothing shows that audit record %d commits to its result "+
				"(the record holds only a salted commitment to it; an envelope whose payload was erased lost its salt: verify its receipt alone)", c.Seq)
		}
		p := kernel.Payload{Salt: res.AuditSalt, Result: part, Args: args}
		if err := kernel.CheckPayload(e, p); err != nil {
			return err.Error()
		}
		return fmt.Sprintf("ok (audit record %d commits to %s under the envelope's audit_salt)", c.Seq, what)
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
