package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// openEnvelope opens the commitments of the audit record in the receipt of
// the result envelope in file with the envelope's audit_salt: the record
// must commit to the envelope's result and, with argsFile, to those args.
// It returns "" when file holds no envelope with a salt (a bare receipt),
// else "ok …" or what does not open.
func openEnvelope(file, argsFile string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	var res kernel.Result
	if json.Unmarshal(b, &res) != nil || res.AuditSalt == "" || res.Receipt == nil {
		if argsFile != "" {
			return "not checked: --args needs a result envelope with its audit_salt"
		}
		return ""
	}
	if res.Receipt.Format != receipts.Format {
		return "not checked: the receipt is not proven by the log"
	}
	e, err := ledger.ParseEntry([]byte(res.Receipt.Entry))
	if err != nil {
		return err.Error()
	}
	p := kernel.Payload{Salt: res.AuditSalt, Result: kernel.ResultPart(&res)}
	what := "this result"
	if argsFile != "" {
		a, err := os.ReadFile(argsFile)
		if err != nil {
			return fmt.Sprintf("--args: %v", err)
		}
		p.Args, what = a, "this result and these args"
	}
	if err := kernel.CheckPayload(e, p); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("ok (audit record %d commits to %s under the envelope's audit_salt)", e.Seq, what)
}
