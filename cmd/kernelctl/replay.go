package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/policy"
)

func replayCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "replay", Short: "Prove idempotent replays and re-decide history under another policy"}
	cmd.AddCommand(replayVerifyCmd(), replayShowCmd(), replayPolicyCmd())
	return cmd
}

func replayVerifyCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "verify --data DIR|--server URL",
		Short: "Prove that every idempotency key had at most one committed effect, every replay returned the original result, every receipt matches its entry",
		Long: `verify reads the ledger and the idempotency table and proves, or refutes with
the offending keys, that:
  - every (agent, idempotency key) has at most one committed effect, and the
    idempotency table holds exactly that outcome;
  - every replay answered the same call (tool, args hash, token) with the
    original's result_hash;
  - every audit record has exactly one receipt, and every receipt verifies with
    the kernel's key and matches its ledger entry field by field.
Exit 1 with the problems listed when any is found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("replay verify")
			if err != nil {
				return err
			}
			defer h.Close()
			rep, err := h.ReplayVerify(cmd.Context())
			if err != nil {
				return err
			}
			if t.json {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "%d entries, %d calls, %d idempotency keys (%d committed, %d in flight), %d replays",
					rep.Entries, rep.Calls, rep.Keys, rep.Committed, rep.InFlight, rep.Replays)
				if rep.Receipts > 0 {
					fmt.Fprintf(w, ", %d JWS receipts (v1) matched with their records", rep.Receipts)
				}
				fmt.Fprintln(w)
				if len(rep.Problems) > 0 {
					tw := newTable(w)
					fmt.Fprintln(tw, "SEQ\tPROBLEM\tAGENT\tKEY\tDETAIL")
					for _, p := range rep.Problems {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", p.Seq, p.Kind, cell(p.AgentID), cell(p.Key), cell(p.Detail))
					}
					tw.Flush()
				}
			}
			if len(rep.Problems) > 0 {
				return fmt.Errorf("replay verification FAILED: %d problems", len(rep.Problems))
			}
			if !t.json {
				fmt.Fprintln(cmd.OutOrStdout(), "replay history proven: one committed effect per key, every replay faithful, every receipt matches")
			}
			return nil
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func replayShowCmd() *cobra.Command {
	var t target
	var agent string
	cmd := &cobra.Command{
		Use:   "show KEY [--agent ID] --data DIR|--server URL",
		Short: "Print the original outcome of an idempotency key and every replay of it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := t.openHistory("replay show")
			if err != nil {
				return err
			}
			defer h.Close()
			hs, err := h.ReplayShow(cmd.Context(), args[0], agent)
			if err != nil {
				return err
			}
			if len(hs) == 0 {
				return fmt.Errorf("no call used idempotency key %q", args[0])
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), hs)
			}
			tw := newTable(cmd.OutOrStdout())
			for _, hist := range hs {
				fmt.Fprintf(tw, "agent %s, key %s\n", hist.AgentID, hist.Key)
				fmt.Fprintln(tw, "SEQ\tTIME\tOPERATION\tTOOL\tSTATUS\tTX\tRESULT_HASH\tREPLAY_OF")
				for _, c := range hist.Calls {
					status := c.Status
					if c.ErrorClass != "" {
						status += " (" + c.ErrorClass + ")"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Seq, clip(c.Time, 23), c.OperationID, cell(c.ToolID), status, c.TxOutcome, c.ResultHash, c.ReplayOf)
				}
			}
			return tw.Flush()
		},
	}
	t.addTarget(cmd, true)
	jsonShape(cmd, "one JSON array, a history per agent that used KEY")
	cmd.Flags().StringVar(&agent, "agent", "", "only this agent's key")
	return cmd
}

func replayPolicyCmd() *cobra.Command {
	var t target
	var dir, since, agent string
	cmd := &cobra.Command{
		Use:   "policy --policy DIR [--since TIME] [--agent ID] --data DIR|--server URL",
		Short: "Re-decide recorded calls under another policy bundle and print the decisions that would change",
		Long: `policy re-runs the decision of every recorded call (from the policy input kept
in its audit record) under the bundle in --policy, and prints each call whose
autonomy mode or risk score would change. Calls refused before the policy step
have no input and are counted as skipped; so are calls whose policy input was
erased (ledger erase, retention) or never kept (audit depth commitments_only),
each counted apart. Nothing is written.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return &usageError{errors.New("replay policy: --policy DIR is required")}
			}
			var f kernel.ReplayFilter
			f.AgentID = agent
			if since != "" {
				ts, err := parseSince(since)
				if err != nil {
					return &usageError{err}
				}
				f.Since = ts
			}
			dir, err := bundleDir("--policy", dir)
			if err != nil {
				return err
			}
			eng, err := policy.Load(cmd.Context(), dir)
			if err != nil {
				return err
			}
			h, err := t.openHistory("replay policy")
			if err != nil {
				return err
			}
			defer h.Close()
			out, err := kernel.ReplayPolicy(cmd.Context(), eng, f, func(fn func(kernel.EntryView) error) error {
				return h.ScanViews(cmd.Context(), 0, fn)
			})
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "policy %s: %d calls re-decided, %d skipped (no policy input), %d skipped (policy input erased), %d skipped (policy input not kept), %d would change\n",
				out.PolicyHash, out.Decided, out.Skipped, out.Erased, out.NotKept, len(out.Changes))
			if len(out.Changes) > 0 {
				tw := newTable(w)
				fmt.Fprintln(tw, "SEQ\tOPERATION\tAGENT\tTOOL\tMODE\tRISK\tBASIS")
				for _, c := range out.Changes {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s -> %s\t%.2f -> %.2f\t%s\n", c.Seq, c.OperationID, cell(c.AgentID), cell(c.ToolID), c.OldMode, c.NewMode, c.OldRisk, c.NewRisk, cell(strings.Join(c.NewBasis, "; ")))
				}
				return tw.Flush()
			}
			return nil
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	cmd.Flags().StringVar(&dir, "policy", "", "the policy bundle dir to replay under")
	cmd.Flags().StringVar(&since, "since", "", "only calls since TIME (RFC 3339, or a duration ago such as 24h)")
	cmd.Flags().StringVar(&agent, "agent", "", "only this agent's calls")
	return cmd
}
