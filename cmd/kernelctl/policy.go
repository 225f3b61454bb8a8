package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/policy"
)

func policyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Hash, evaluate and test policy bundles"}
	cmd.AddCommand(policyHashCmd(), policyEvalCmd(), policyTestCmd())
	return cmd
}

func policyHashCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "hash [DIR]",
		Short: "Print the policy_hash of a bundle (the embedded default without DIR)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := bundleDir("", optArg(args))
			if err != nil {
				return err
			}
			h, err := policy.Hash(dir)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]string{"policy_hash": h})
			}
			fmt.Fprintln(cmd.OutOrStdout(), h)
			return nil
		},
	}
	addJSON(cmd, &asJSON)
	return cmd
}

func policyEvalCmd() *cobra.Command {
	var input, dir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "eval --input FILE|- [--policy DIR]",
		Short: "Decide one policy input document (the policy_input of an audit record) and print the decision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if input == "" {
				return &usageError{errors.New("policy eval: --input FILE is required")}
			}
			f := os.Stdin
			if input != "-" {
				var err error
				if f, err = os.Open(input); err != nil {
					return err
				}
				defer f.Close()
			}
			var in policy.Input
			dec := json.NewDecoder(f)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&in); err != nil {
				return fmt.Errorf("policy eval: %s is not a policy input document: %v", input, err)
			}
			dir, err := bundleDir("--policy", dir)
			if err != nil {
				return err
			}
			eng, err := policy.Load(cmd.Context(), dir)
			if err != nil {
				return err
			}
			d, err := eng.Decide(cmd.Context(), &in)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"policy_hash": eng.Hash(), "decision": d})
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintf(tw, "policy_hash\t%s\nautonomy_mode\t%s\nrisk_score\t%v\nrisk_basis\t%s\n", eng.Hash(), d.AutonomyMode, d.RiskScore, strings.Join(d.RiskBasis, "; "))
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&input, "input", "", "policy input document (JSON; - for stdin)")
	cmd.Flags().StringVar(&dir, "policy", "", "bundle dir (default: the embedded bundle)")
	// JSON by default, as the decision is a document; --json=false prints a table.
	cmd.Flags().BoolVar(&asJSON, "json", true, "print the decision as JSON (--json=false: a table)")
	return cmd
}

func policyTestCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "test [DIR]",
		Short: "Run a bundle's Rego tests (the embedded default without DIR); exit 1 if any fails",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := bundleDir("", optArg(args))
			if err != nil {
				return err
			}
			res, err := policy.Test(cmd.Context(), dir)
			if err != nil {
				return err
			}
			failed := 0
			for _, r := range res {
				if !r.Pass {
					failed++
				}
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				tw := newTable(cmd.OutOrStdout())
				for _, r := range res {
					verdict := "PASS"
					if !r.Pass {
						verdict = "FAIL: " + r.Error
					}
					fmt.Fprintf(tw, "%s.%s\t%s\n", r.Package, r.Name, verdict)
				}
				tw.Flush()
				fmt.Fprintf(cmd.OutOrStdout(), "%d passed, %d failed\n", len(res)-failed, failed)
			}
			if failed > 0 {
				return fmt.Errorf("%d Rego tests failed", failed)
			}
			return nil
		},
	}
	addJSON(cmd, &asJSON)
	return cmd
}

func optArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
