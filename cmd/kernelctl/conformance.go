package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/conformance"
)

// conformanceCmd runs the black-box conformance suite against a running
// kernel endpoint.
func conformanceCmd() *cobra.Command {
	var server, adminFile, workspace, pattern string
	var asJSON, verbose bool
	cmd := &cobra.Command{
		Use:   "conformance --server URL --admin-token FILE [--workspace DIR] [--run PATTERN] [--json]",
		Short: "Run the black-box conformance suite against a kernel endpoint",
		Long: `Run the conformance suite (docs/conformance.md) against the HTTP API at --server.
The suite mints its own tokens with the admin credential and checks every answer
against the ledger, receipts, checkpoints and proofs the endpoint serves.

--workspace is a directory the kernel must see at the same path (the same host, or
a mount shared at the same path): the suite makes a fresh subdirectory in it per
run and grants it to the tokens it mints. The default is a new temporary
directory, which works when the kernel runs on this host.

It needs nothing else from the server: against a default kernelctl serve every
case passes or skips saying why. The suite acts as the approver (with tokens it
mints): a call held for an approval that a case expects refused it denies at
once, proc.exec calls it allows. It first says how many cases will run, about
how long that takes (the whole suite: about 15 s) and what the endpoint lacks,
e.g. an approval timeout too long for the two approval_timeout cases (serve
--approval-timeout 3s runs them).

Prints one line per case as it ends, then the evidence of failures and the
summary "conformance: N passed, N failed, N skipped"; exit status 1 when a case
fails, or when --run matches no case id.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from := "--server"
			if server == "" {
				server, from = os.Getenv(envServer), "env "+envServer
			}
			if server == "" {
				return &usageError{errors.New("--server URL is required")}
			}
			if err := checkServerURL(from, server); err != nil {
				return err
			}
			admin := os.Getenv("CAPKERNEL_ADMIN_TOKEN")
			if adminFile != "" {
				s, err := readSecret(adminFile)
				if err != nil {
					return &usageError{fmt.Errorf("--admin-token: %w", err)}
				}
				admin = s
			}
			if admin == "" {
				return &usageError{errors.New("--admin-token FILE (or env CAPKERNEL_ADMIN_TOKEN) is required")}
			}
			cfg := conformance.Config{Server: server, AdminToken: admin, Workspace: workspace}
			if pattern != "" {
				re, err := regexp.Compile(pattern)
				if err != nil {
					return &usageError{fmt.Errorf("--run: %w", err)}
				}
				cfg.Run = re
			}
			out := cmd.OutOrStdout()
			// The plan goes to stderr with --json, so stdout stays one
			// document; the case lines stream as the cases end.
			planOut := out
			if asJSON {
				planOut = cmd.ErrOrStderr()
			}
			cfg.Started = func(p conformance.Plan) {
				printPlan(planOut, server, p)
				if !asJSON {
					fmt.Fprintln(out, "RESULT  CASE")
				}
			}
			if !asJSON {
				cfg.Done = func(c conformance.CaseResult) {
					fmt.Fprintf(out, "%-6s  %s  %s\n", strings.ToUpper(string(c.Status)), c.ID, c.Title)
				}
			}
			rep := conformance.Run(cmd.Context(), cfg)
			if asJSON {
				enc := json.NewEncoder(jsonSafe{out})
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printReport(out, rep, verbose)
			}
			if rep.Error != "" {
				return errors.New(strings.TrimPrefix(rep.Error, "conformance: "))
			}
			if !rep.OK() {
				return fmt.Errorf("%d conformance case(s) failed", rep.Failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", "", "URL of the kernel endpoint (default: env CAPKERNEL_SERVER)")
	f.StringVar(&adminFile, "admin-token", "", "file holding the admin credential (default: env CAPKERNEL_ADMIN_TOKEN)")
	f.StringVar(&workspace, "workspace", "", "directory the kernel sees at the same path (default: a new temporary dir)")
	f.StringVar(&pattern, "run", "", "run only the cases whose id matches this regular expression")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON, with every case's evidence")
	f.BoolVarP(&verbose, "verbose", "v", false, "print the evidence of every case, not only of failed ones")
	return cmd
}

// printPlan says, before the first case, what the run will do and about
// how long it takes.
func printPlan(w io.Writer, server string, p conformance.Plan) {
	fmt.Fprintf(w, "%s against %s: %d cases, about %s (workspace %s)\n", conformance.Version, server, p.Cases, p.Estimate.Round(time.Second), p.Workspace)
	for _, n := range p.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// printReport writes, after the case lines, the evidence of failures (of
// all cases with verbose), the reasons of skips and the summary line.
func printReport(w io.Writer, rep conformance.Report, verbose bool) {
	for _, c := range rep.Cases {
		if c.Status == conformance.Pass && !verbose {
			continue
		}
		if c.Status == conformance.Skip && !verbose {
			fmt.Fprintf(w, "\nSKIP %s: %s\n", c.ID, c.Message)
			continue
		}
		fmt.Fprintf(w, "\n%s %s (%s): %s\n", strings.ToUpper(string(c.Status)), c.ID, c.Clause, c.Message)
		for _, e := range c.Evidence {
			switch {
			case e.Entry != nil:
				fmt.Fprintf(w, "  %s: %s\n", e.Label, e.Entry)
			default:
				fmt.Fprintf(w, "  %s: %s\n    -> %d %s\n", e.Label, e.Request, e.Status, strings.TrimSpace(e.Response))
			}
		}
	}
	if rep.Error != "" {
		return // the error line says why it could not run
	}
	fmt.Fprintf(w, "\n%s (%s)\n", rep.Summary(), rep.Duration.Round(time.Millisecond))
}
