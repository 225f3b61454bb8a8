package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

func receiptsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "receipts", Short: "List, show and verify signed receipts"}
	cmd.AddCommand(receiptsListCmd(), receiptsShowCmd(), receiptsVerifyCmd())
	return cmd
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 2, 4, 2, ' ', 0) }

func receiptsListCmd() *cobra.Command {
	var t target
	var f kernel.ReceiptFilter
	var since string
	cmd := &cobra.Command{
		Use:   "list [--agent ID] [--tool ID] [--outcome committed|rolled_back|no_op|ok|error] [--since TIME] --data DIR|--server URL",
		Short: "List receipts in ledger order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since != "" {
				ts, err := parseSince(since)
				if err != nil {
					return &usageError{err}
				}
				f.Since = ts
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
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.ReceiptID, clip(p.IssuedAt, 19), p.AgentID, p.ToolID, p.TxOutcome, p.ErrorClass)
			}
			return tw.Flush()
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&f.AgentID, "agent", "", "only this agent's")
	cmd.Flags().StringVar(&f.ToolID, "tool", "", "only this tool's")
	cmd.Flags().StringVar(&f.TxOutcome, "outcome", "", "committed, rolled_back, no_op, ok or error")
	cmd.Flags().StringVar(&since, "since", "", "only receipts issued since TIME (RFC 3339, or a duration ago such as 1h)")
	cmd.Flags().IntVar(&f.Limit, "limit", 0, "at most this many")
	return cmd
}

// clip returns at most the first n bytes of s.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// parseSince reads an RFC 3339 time or a duration before now.
func parseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
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
		Short: "Print a receipt: its claims and the compact JWS",
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
			printReceipt(cmd.OutOrStdout(), info.Receipt)
			fmt.Fprintf(cmd.OutOrStdout(), "receipt entry seq\t%d\njws\t%s\n", info.Seq, info.JWS)
			return nil
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func printReceipt(w io.Writer, r *receipts.Receipt) {
	tw := newTable(w)
	for _, kv := range [][2]string{
		{"receipt_id", r.ReceiptID}, {"operation_id", r.OperationID}, {"tool_id", r.ToolID}, {"agent_id", r.AgentID},
		{"capability_token_id", r.CapabilityTokenID}, {"args_hash", r.ArgsHash}, {"result_hash", r.ResultHash},
		{"tx_outcome", r.TxOutcome}, {"commit_delta_id", r.CommitDeltaID}, {"error_class", r.ErrorClass},
		{"policy_hash", r.PolicyHash}, {"autonomy_mode", r.AutonomyMode}, {"risk_score", fmt.Sprint(r.RiskScore)},
		{"ledger_seq", fmt.Sprint(r.LedgerSeq)}, {"ledger_entry_hash", r.LedgerEntryHash}, {"issued_at", r.IssuedAt},
	} {
		if kv[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
		}
	}
	tw.Flush()
}

// ReceiptCheck is what receipts verify found.
type ReceiptCheck struct {
	ReceiptID   string `json:"receipt_id"`
	Signature   string `json:"signature"`    // "ok" or the failure
	LedgerMatch string `json:"ledger_match"` // "ok", "not checked" or the failure
}

func receiptsVerifyCmd() *cobra.Command {
	var t target
	var jwksFile string
	cmd := &cobra.Command{
		Use:   "verify FILE|RECEIPT_ID [--jwks FILE] [--data DIR|--server URL]",
		Short: "Verify a receipt's signature and that it matches its ledger entry",
		Long: `verify checks a receipt's Ed25519 signature against the kernel's JWKS
(--jwks FILE, else fetched from the data dir or server), then fetches the ledger
entry it names, recomputes that entry's hash and compares every field the
receipt attests. FILE may hold the compact JWS, a result envelope (its
"receipt") or the JSON of receipts show --json. With only FILE and --jwks the
ledger match is not checked (it says so). Exit 1 on any failure.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var h history
			if t.data != "" || t.server != "" {
				var err error
				if h, err = t.openHistory("receipts verify"); err != nil {
					return err
				}
				defer h.Close()
			}
			jws, err := receiptArg(ctx, args[0], h)
			if err != nil {
				return err
			}
			var jwks []byte
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
			check := ReceiptCheck{Signature: "ok", LedgerMatch: "not checked (give --data or --server)"}
			r, err := receipts.Verify(jws, jwks)
			if err != nil {
				check.Signature = err.Error()
			} else {
				check.ReceiptID = r.ReceiptID
				if h != nil {
					check.LedgerMatch = "ok"
					if err := matchLedger(ctx, h, r); err != nil {
						check.LedgerMatch = err.Error()
					}
				}
			}
			if t.json {
				if err := printJSON(cmd.OutOrStdout(), check); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "receipt %s\nsignature:    %s\nledger match: %s\n", check.ReceiptID, check.Signature, check.LedgerMatch)
			}
			if check.Signature != "ok" || (h != nil && check.LedgerMatch != "ok") {
				return errors.New("receipt verification FAILED")
			}
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&jwksFile, "jwks", "", "JWKS file with the kernel's receipt key (e.g. saved from /.well-known/jwks.json)")
	return cmd
}

// receiptArg returns the compact JWS named by arg: a file's content or a
// receipt id looked up in h.
func receiptArg(ctx context.Context, arg string, h history) (string, error) {
	b, err := os.ReadFile(arg)
	if err != nil {
		if h == nil {
			return "", fmt.Errorf("%s: %w (a receipt id needs --data or --server)", arg, err)
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
	return "", fmt.Errorf("%s holds no receipt (want a compact JWS, a result envelope or receipts show --json)", arg)
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
