package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
)

func ledgerCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ledger", Short: "Inspect, export and verify the ledger"}
	cmd.AddCommand(ledgerVerifyCmd(), ledgerHeadCmd(), ledgerTailCmd(), ledgerExportCmd())
	return cmd
}

func ledgerVerifyCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "verify --data DIR|--server URL",
		Short: "Recompute the ledger's hash chain; exit 1 naming the first bad seq if it was tampered with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger verify")
			if err != nil {
				return err
			}
			defer h.Close()
			n, err := h.Verify(cmd.Context())
			var ve *ledger.VerifyError
			if errors.As(err, &ve) {
				if t.json {
					printJSON(cmd.OutOrStdout(), httpapi.LedgerVerification{Entries: n, BadSeq: &ve.Seq, Reason: ve.Reason})
				}
				return fmt.Errorf("ledger TAMPERED: first bad entry is seq %d: %s", ve.Seq, ve.Reason)
			}
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), httpapi.LedgerVerification{Entries: n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ledger intact: %d entries, hash chain verified\n", n)
			return nil
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func ledgerHeadCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "head --data DIR|--server URL",
		Short: "Print the ledger's size and last entry hash",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger head")
			if err != nil {
				return err
			}
			defer h.Close()
			hd, err := h.Head(cmd.Context())
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), httpapi.HeadOf(hd))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "size %d\nhead %s\n", hd.Size, hd.Hash)
			return nil
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func ledgerTailCmd() *cobra.Command {
	var t target
	var n uint64
	var follow bool
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "tail [-n N] [-f] --data DIR|--server URL",
		Short: "Print the last entries; -f keeps printing new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if follow && t.data != "" {
				return &usageError{errors.New("ledger tail -f: follow a running kernel with --server")}
			}
			h, err := t.openHistory("ledger tail")
			if err != nil {
				return err
			}
			defer h.Close()
			ctx := cmd.Context()
			hd, err := h.Head(ctx)
			if err != nil {
				return err
			}
			from := uint64(0)
			if hd.Size > n {
				from = hd.Size - n
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			for {
				err := h.Scan(ctx, from, func(e ledger.Entry) error {
					from = e.Seq + 1
					return printEntry(out, e, t.json)
				})
				if err != nil {
					return err
				}
				if err := out.Flush(); err != nil || !follow {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().Uint64VarP(&n, "lines", "n", 10, "how many of the last entries")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing entries as they are appended (polls --server)")
	cmd.Flags().DurationVar(&every, "poll", 500*time.Millisecond, "how often -f asks for new entries")
	return cmd
}

// printEntry writes one entry: its record (--json) or a summary line.
func printEntry(w io.Writer, e ledger.Entry, asJSON bool) error {
	if asJSON {
		return writeRecord(w, e)
	}
	_, err := fmt.Fprintf(w, "%d\t%s\t%-16s\t%s\t%s\n", e.Seq, clip(e.Time, 23), e.Kind, clip(e.Hash, 19), clip(string(e.Body), 120))
	return err
}

// writeRecord writes e as its canonical record (the stored bytes) and a
// newline.
func writeRecord(w io.Writer, e ledger.Entry) error {
	b, err := jcs.Marshal(e)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func ledgerExportCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "export --data DIR|--server URL > ledger.jsonl",
		Short: "Write every entry as JSON lines: one canonical record a line, in seq order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger export")
			if err != nil {
				return err
			}
			defer h.Close()
			return exportLedger(cmd.Context(), h, cmd.OutOrStdout())
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func exportLedger(ctx context.Context, h history, w io.Writer) error {
	out := bufio.NewWriterSize(w, 1<<20)
	if err := h.Scan(ctx, 0, func(e ledger.Entry) error { return writeRecord(out, e) }); err != nil {
		return err
	}
	return out.Flush()
}
