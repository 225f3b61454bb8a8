package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

func receiptsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "receipts", Short: "List, show and verify signed receipts"}
	cmd.AddCommand(receiptsListCmd(), receiptsShowCmd(), receiptsVerifyCmd(), receiptsBundleCmd(), receiptsJWKSCmd())
	return cmd
}

func receiptsListCmd() *cobra.Command {
	var t target
	var f kernel.ReceiptFilter
	var since string
	cmd := &cobra.Command{
		Use:   "list [--agent ID] [--tool ID] [--outcome committed|rolled_back|no_op|ok|error] [--since TIME] --data DIR|--server URL",
		Short: "List receipts in ledger order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The API's own rule for the filter, so that --data and
			// --server refuse the same values.
			if _, err := httpapi.ParseReceiptFilter(map[string][]string{"outcome": {f.TxOutcome}}); err != nil {
				return usagef("--%v", err)
			}
			if since != "" {
				ts, err := parseSince(since)
				if err != nil {
					return &usageError{err}
				}
				f.Since = ts
			}
			// 0, the default, lists every receipt; a limit given must
			// be one, as the API's ?limit= is.
			if cmd.Flags().Changed("limit") && f.Limit < 1 {
				return usagef("--limit %d: want 1 or more (without --limit, every receipt is listed)", f.Limit)
			}
			h, err := t.openHistory("receipts list")
			if err != nil {
				return err
			}
			defer h.Close()
			list, err := h.Receipts(cmd.Context(), f)
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "SEQ\tRECEIPT\tISSUED\tAGENT\tTOOL\tOUTCOME\tERROR")
			for _, r := range list {
				p := r.Receipt
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.ReceiptID, clip(p.IssuedAt, 19), cell(p.AgentID), cell(p.ToolID), p.TxOutcome, p.ErrorClass)
			}
			return tw.Flush()
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	cmd.Flags().StringVar(&f.AgentID, "agent", "", "only this agent's")
	cmd.Flags().StringVar(&f.ToolID, "tool", "", "only this tool's")
	cmd.Flags().StringVar(&f.TxOutcome, "outcome", "", "committed, rolled_back, no_op, ok or error")
	cmd.Flags().StringVar(&since, "since", "", "only receipts issued since TIME (RFC 3339, or a duration ago such as 1h)")
	jsonShape(cmd, `one JSON array of the receipts (GET /v1/receipts wraps the same array in {"receipts": [...]})`)
	cmd.Flags().IntVar(&f.Limit, "limit", 0, "at most this many, 1 or more (default: all)")
	return cmd
}

// clip returns at most the first n bytes of s, for fields cut to a
// precision (a time to the millisecond); text is cut with ellipsize.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ellipsize returns s if it has at most n runes, else its start up to a
// word boundary (or, for a long word such as a hash, at n-1 runes) and
// "…", so that a cut is never silent: at most n runes in all.
func ellipsize(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	cut := n - 1
	if i := strings.LastIndexAny(string(r[:cut+1]), " \t"); i > 0 && utf8.RuneCountInString(s[:i]) > n/2 {
		cut = utf8.RuneCountInString(s[:i])
	}
	return strings.TrimRight(string(r[:cut]), " \t,;:") + "…"
}

// parseSince reads an RFC 3339 time or a duration before now, which may
// not be negative (a time to come, which nothing was issued since).
func parseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: a duration is how long ago, and it is negative (1h: the last hour)", s)
		}
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want RFC 3339 (2026-01-02T15:04:05Z) or a duration (1h)", s)
	}
	return t, nil
}

func receiptsShowCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "show RECEIPT_ID --data DIR|--server URL",
		Short: "Print a receipt: what its audit entry says (and, for a v1 receipt, its compact JWS)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := t.openHistory("receipts show")
			if err != nil {
				return err
			}
			defer h.Close()
			info, err := h.Receipt(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), info)
			}
			extra := [][2]string{{"entry seq", fmt.Sprint(info.Seq)}, {"jws (v1)", info.JWS}, {"withheld", strings.Join(info.Withheld, ", ")}}
			printReceipt(cmd.OutOrStdout(), info.Receipt, extra...)
			return nil
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	return cmd
}

// printReceipt prints the fields of r that are set, then the extra rows
// that are.
func printReceipt(w io.Writer, r *receipts.Receipt, extra ...[2]string) {
	tw := newTable(w)
	for _, kv := range append([][2]string{
		{"receipt_id", r.ReceiptID}, {"operation_id", r.OperationID}, {"tool_id", r.ToolID}, {"agent_id", r.AgentID},
		{"capability_token_id", r.CapabilityTokenID}, {"args_hash", r.ArgsHash}, {"result_hash", r.ResultHash},
		{"tx_outcome", r.TxOutcome}, {"commit_delta_id", r.CommitDeltaID}, {"error_class", r.ErrorClass},
		{"policy_hash", r.PolicyHash}, {"autonomy_mode", r.AutonomyMode}, {"risk_score", fmt.Sprint(r.RiskScore)},
		{"ledger_seq", fmt.Sprint(r.LedgerSeq)}, {"ledger_entry_hash", r.LedgerEntryHash}, {"issued_at", r.IssuedAt},
		{"approval_id", r.ApprovalID}, {"approval_state", r.ApprovalState}, {"approved_by", r.ApprovedBy}, {"approval_reason", r.ApprovalReason},
	}, extra...) {
		if kv[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", kv[0], cell(kv[1]))
		}
	}
	tw.Flush()
}

// ReceiptCheck is what receipts verify found.
type ReceiptCheck struct {
	ReceiptID   string `json:"receipt_id"`
	Signature   string `json:"signature"`           // "ok …" or the failure
	LedgerMatch string `json:"ledger_match"`        // "ok", "not checked" or the failure
	Inclusion   string `json:"inclusion,omitempty"` // with --prove or a bundle: "ok …" or the failure
	// Envelope, for a result envelope: "ok …" when its fields (operation,
	// tool, agent, status, error class, outcome, mode, risk, ledger refs,
	// result_hash) are those of the receipt's audit record, else what
	// differs, or why they are not all shown (a result erased).
	Envelope string `json:"envelope,omitempty"`
	// Commitments, for a result envelope (or --args): whether the
	// receipt's record commits to the envelope's result, its risk_basis
	// and provenance (and --args), opened with the envelope's audit_salt.
	Commitments string `json:"commitments,omitempty"`
}

func (c ReceiptCheck) ok(needLedger, needInclusion bool) bool {
	return strings.HasPrefix(c.Signature, "ok") && (!needLedger || strings.HasPrefix(c.LedgerMatch, "ok")) &&
		(!needInclusion || strings.HasPrefix(c.Inclusion, "ok")) &&
		(c.Envelope == "" || strings.HasPrefix(c.Envelope, "ok")) && (c.Commitments == "" || strings.HasPrefix(c.Commitments, "ok"))
}

func receiptsVerifyCmd() *cobra.Command {
	var t target
	var jwksFile, argsFile string
	var prove bool
	cmd := &cobra.Command{
		Use:   "verify FILE|RECEIPT_ID [--prove] [--jwks FILE] [--args FILE] [--data DIR|--server URL]",
		Short: "Verify a receipt: its audit entry, the checkpoint's signature and the inclusion proof",
		Long: `verify checks a receipt proven by the log (docs/formats.md, capkernel-receipt/v2)
with the kernel's JWKS alone (--jwks FILE, else fetched from the data dir or
server): its audit entry is canonical and its hash recomputes, the checkpoint
carries the Ed25519 signature of a JWKS key, and the inclusion proof leads from
the entry to the checkpoint's root.

FILE may hold the receipt (receipts bundle, GET /v1/receipts/{id}/bundle) or a
result envelope (its "receipt"): it verifies entirely offline. A receipt id
(r<seq>-<hex>) is fetched from the data dir or server, proven under the newest
checkpoint, and verified the same way. A result envelope is read strictly (no
duplicate or unknown member, names matched exactly) and must be the call its
receipt attests: its operation, tool, agent, status, error class, outcome,
commit delta, mode, task class, risk, ledger_seq, receipt_id, state_snapshot_id
and result_hash are the audit record's, the record's result commitment opens
with the envelope's audit_salt on exactly the envelope's result (and, with
--args FILE, the args object sent, on those args), and its context commitment
on the envelope's risk_basis and provenance. An envelope without its
audit_salt is refused: nothing else ties its result to the record. So is one
whose record's context also holds notes (net.fetch, proc.exec with network
access, a call by handle), which an envelope does not carry. replayed is not
attested: a replay carries its original's receipt.

Receipts of format v1 (older ledgers) are still checked: a compact JWS (a file
or its UUID) has its signature checked, then the ledger entry it names is
fetched, re-hashed and compared field by field; --prove also verifies its
inclusion under the newest signed checkpoint. A v1 bundle verifies offline.
Exit 1 on any failure.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var h history
			// The data dir or server comes from the flags, or from the
			// environment when the check needs one: no --jwks, --prove,
			// or a receipt id rather than a file (a file verified with
			// --jwks stays offline whatever the environment says).
			_, statErr := os.Stat(args[0])
			needed := jwksFile == "" || prove || statErr != nil
			if t.given() || (needed && (os.Getenv(envData) != "" || os.Getenv(envServer) != "")) {
				var err error
				if h, err = t.openHistory("receipts verify"); err != nil {
					return err
				}
				defer h.Close()
			}
			if prove && h == nil {
				return &usageError{errors.New("receipts verify --prove: give --data or --server to fetch the checkpoint and proof (or verify a bundle offline)")}
			}
			var jwks []byte
			var err error
			switch {
			case jwksFile != "":
				if jwks, err = os.ReadFile(jwksFile); err != nil {
					return err
				}
			case h != nil:
				if jwks, err = h.JWKS(ctx); err != nil {
					return err
				}
			default:
				return &usageError{errors.New("receipts verify: give --jwks FILE, or --data/--server to fetch the key")}
			}
			if statErr == nil {
				b, err := os.ReadFile(args[0])
				if err != nil {
					return err
				}
				f, ok, err := readReceiptFile(b)
				if err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
				if ok {
					check := verifyBundleFile(f.Receipt, jwks)
					switch {
					case !strings.HasPrefix(check.Signature, "ok"):
					case f.Envelope != nil:
						check.Envelope, check.Commitments = checkEnvelope(f.Envelope, argsFile)
					case argsFile != "":
						check.Commitments = "not checked: --args needs a result envelope"
					}
					return reportCheck(cmd, t.json, check, true, true)
				}
			}
			if _, _, ok := receipts.ParseID(args[0]); ok && h != nil {
				// A receipt proven by the log: fetch it under the newest
				// checkpoint and verify it as a file would be.
				b, err := h.Bundle(ctx, args[0])
				if err != nil {
					return err
				}
				raw, err := json.Marshal(b)
				if err != nil {
					return err
				}
				return reportCheck(cmd, t.json, verifyBundleFile(raw, jwks), true, true)
			}
			jws, err := receiptArg(ctx, args[0], h)
			if err != nil {
				return err
			}
			check := ReceiptCheck{Signature: "ok", LedgerMatch: "not checked (give --data or --server)"}
			r, pub, err := receipts.VerifyJWKS(jws, jwks)
			if err != nil {
				check.Signature = err.Error()
				if d, err := receipts.Decode(jws); err == nil {
					check.ReceiptID = d.ReceiptID // what it claims, to say which receipt failed
				}
			} else {
				check.ReceiptID = r.ReceiptID
				if h != nil {
					check.LedgerMatch = "ok"
					if err := matchLedger(ctx, h, r); err != nil {
						check.LedgerMatch = err.Error()
					}
				}
				if prove {
					check.Inclusion = proveReceipt(ctx, h, r, pub)
				}
			}
			return reportCheck(cmd, t.json, check, h != nil, prove)
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	cmd.Flags().StringVar(&jwksFile, "jwks", "", "JWKS file with the kernel's receipt key (e.g. saved from /.well-known/jwks.json)")
	cmd.Flags().BoolVar(&prove, "prove", false, "also verify the entry's inclusion proof against the newest signed checkpoint")
	cmd.Flags().StringVar(&argsFile, "args", "", "for a result envelope: the args object the call sent, to check the record commits to it")
	return cmd
}

func reportCheck(cmd *cobra.Command, asJSON bool, check ReceiptCheck, needLedger, needInclusion bool) error {
	if asJSON {
		if err := printJSON(cmd.OutOrStdout(), check); err != nil {
			return err
		}
	} else {
		// The id of a receipt that did not verify, and the messages that
		// quote it, are what its author chose: each value is one cell
		// (written terminal safe, as all output), so that a forged receipt
		// can neither print lines of its own nor hide the verdict
		// (ESC [ 8 m).
		w := cmd.OutOrStdout()
		id := cell(check.ReceiptID)
		switch {
		case check.ReceiptID == "":
			id = "(no id: none could be read from it)"
		case !strings.HasPrefix(check.Signature, "ok"):
			id += " (claimed: not verified)"
		}
		fmt.Fprintf(w, "receipt %s\nsignature:    %s\nledger match: %s\n", id, cell(check.Signature), cell(check.LedgerMatch))
		for _, l := range []struct{ name, value string }{
			{"inclusion:   ", check.Inclusion}, {"envelope:    ", check.Envelope}, {"commitments: ", check.Commitments},
		} {
			if l.value != "" {
				fmt.Fprintf(w, "%s %s\n", l.name, cell(l.value))
			}
		}
	}
	if !check.ok(needLedger, needInclusion) {
		return errors.New("receipt verification FAILED")
	}
	return nil
}

// proveReceipt verifies the inclusion of r's audit record under the newest
// checkpoint, signed by pub, and says how it went.
func proveReceipt(ctx context.Context, h history, r *receipts.Receipt, pub ed25519.PublicKey) string {
	p, err := h.ProveInclusion(ctx, r.LedgerSeq, 0)
	if err != nil {
		return err.Error()
	}
	if p.Checkpoint == nil {
		return "the kernel sent no checkpoint with the proof"
	}
	cp, err := openSigned(*p.Checkpoint, pub)
	if err != nil {
		return "checkpoint signature: " + err.Error()
	}
	if p.LeafIndex != r.LedgerSeq || p.LeafHash != r.LedgerEntryHash || p.TreeSize != cp.Size {
		return fmt.Sprintf("the proof is for entry %d (%s) in a tree of %d; the receipt names entry %d (%s), the checkpoint %d entries",
			p.LeafIndex, p.LeafHash, p.TreeSize, r.LedgerSeq, r.LedgerEntryHash, cp.Size)
	}
	if err := p.Inclusion.VerifyAt(r.LedgerSeq, cp.Size, cp.Root); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("ok (entry %d under the signed checkpoint of %s, size %d, %d hashes)", r.LedgerSeq, cp.Origin, cp.Size, len(p.Proof))
}

func verifyBundleFile(b, jwks []byte) ReceiptCheck {
	c, err := kernel.VerifyBundle(b, jwks)
	if err != nil {
		return ReceiptCheck{ReceiptID: claimedID(b), Signature: "not ok: " + err.Error(), LedgerMatch: "not checked", Inclusion: err.Error()}
	}
	sig := "ok"
	if c.Format == receipts.Format {
		sig = "ok (the checkpoint's: the receipt is proven by the log)"
	}
	return ReceiptCheck{
		ReceiptID: c.Receipt.ReceiptID, Signature: sig, LedgerMatch: "ok (the receipt's audit record)",
		Inclusion: fmt.Sprintf("ok (entry %d under the signed checkpoint of %s, size %d)", c.Receipt.LedgerSeq, c.Checkpoint.Origin, c.Checkpoint.Size),
	}
}

// claimedID returns the receipt id that b, a receipt or bundle that did
// not verify, claims: from its entry's seq and entry_hash (a receipt proven
// by the log) or its JWS payload (a v1 bundle), read without checking
// them, so that the report says which receipt failed; "" when b names
// none.
func claimedID(b []byte) string {
	var f struct {
		Entry   string `json:"entry"`
		Receipt string `json:"receipt"`
	}
	if json.Unmarshal(b, &f) != nil {
		return ""
	}
	if f.Receipt != "" {
		if r, err := receipts.Decode(f.Receipt); err == nil {
			return r.ReceiptID
		}
	}
	var e struct {
		Seq  *uint64 `json:"seq"`
		Hash string  `json:"entry_hash"`
	}
	if json.Unmarshal([]byte(f.Entry), &e) != nil || e.Seq == nil || e.Hash == "" {
		return ""
	}
	return receipts.ID(*e.Seq, e.Hash)
}

func receiptsBundleCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "bundle RECEIPT_ID --data DIR|--server URL > receipt.bundle.json",
		Short: "Write a self-contained receipt bundle (receipt, audit record, signed checkpoint, inclusion proof)",
		Long: `bundle writes one JSON file that anyone holding the kernel's public key (its
JWKS) can verify offline with receipts verify FILE --jwks JWKS: the receipt's
signature, the audit record it attests, the newest signed checkpoint and the
record's inclusion proof in that checkpoint's tree. docs/formats.md specifies it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := t.openHistory("receipts bundle")
			if err != nil {
				return err
			}
			defer h.Close()
			b, err := h.Bundle(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), b)
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	return cmd
}

func receiptsJWKSCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "jwks --data DIR|--server URL > jwks.json",
		Short: "Print the JWKS of the kernel's receipt key (it also signs the ledger checkpoints)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("receipts jwks")
			if err != nil {
				return err
			}
			defer h.Close()
			b, err := h.JWKS(cmd.Context())
			if err != nil {
				return err
			}
			// The kernel's JSON, escaped as JSON rather than as text.
			_, err = fmt.Fprintf(jsonSafe{cmd.OutOrStdout()}, "%s\n", b)
			return err
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

// receiptArg returns the compact JWS named by arg: a file's content or a
// receipt id looked up in h.
func receiptArg(ctx context.Context, arg string, h history) (string, error) {
	b, err := os.ReadFile(arg)
	if err != nil {
		if h == nil {
			return "", &usageError{fmt.Errorf("%s: %w (a receipt id needs --data or --server)", arg, err)}
		}
		info, err := h.Receipt(ctx, arg)
		if err != nil {
			return "", err
		}
		return info.JWS, nil
	}
	s := strings.TrimSpace(string(b))
	if !strings.HasPrefix(s, "{") {
		return s, nil
	}
	var holder struct {
		Receipt json.RawMessage `json:"receipt"`
		JWS     string          `json:"jws"`
	}
	if err := json.Unmarshal([]byte(s), &holder); err != nil {
		return "", fmt.Errorf("%s: %v", arg, err)
	}
	var jws string
	if holder.JWS != "" {
		return holder.JWS, nil
	}
	if json.Unmarshal(holder.Receipt, &jws) == nil && jws != "" {
		return jws, nil
	}
	return "", fmt.Errorf("%s holds no receipt (want a receipt, its bundle, a result envelope, a compact JWS or the receipts show --json of a JWS receipt)", arg)
}

// matchLedger fetches the entry r attests, recomputes its hash and
// compares the fields.
func matchLedger(ctx context.Context, h history, r *receipts.Receipt) error {
	es, err := h.Entries(ctx, r.LedgerSeq, 1)
	if err != nil {
		return err
	}
	if len(es) == 0 || es[0].Seq != r.LedgerSeq {
		return fmt.Errorf("the ledger has no entry %d", r.LedgerSeq)
	}
	e := es[0]
	sum, err := ledger.EntryHash(e)
	if err != nil {
		return err
	}
	if sum != e.Hash {
		return fmt.Errorf("ledger entry %d does not hash to its entry_hash (%s, recomputed %s)", e.Seq, e.Hash, sum)
	}
	c, err := kernel.DecodeCall(e)
	if err != nil {
		return err
	}
	return kernel.MatchReceipt(r, c)
}
