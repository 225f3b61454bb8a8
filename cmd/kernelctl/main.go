// Command kernelctl serves and administers a capkernel kernel: init makes a
// data dir, serve runs the HTTP API, token mints and revokes capability
// tokens, call makes a syscall, receipts / ledger / replay inspect and
// verify history, policy hashes, evaluates and tests bundles, demo runs a
// scripted agent session. Verbs that read work on a stopped kernel's data
// dir (--data, opened read-only) or on a running one (--server).
//
// Exit status: 0 success, 1 failure (including a tampered ledger), 2 usage.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// usageError marks a command line the command cannot run (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

func main() {
	root := &cobra.Command{
		Use:           "kernelctl",
		Short:         "Administer and inspect a capkernel syscall kernel",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.AddCommand(initCmd(), serveCmd(), demoCmd(), tokenCmd(), callCmd(), toolsCmd(), receiptsCmd(), ledgerCmd(), replayCmd(), policyCmd(),
		approvalsCmd(), waitCmd(), cancelCmd(), eventsCmd(), conformanceCmd(), runCmd(), mcpCmd(), workspaceCmd())
	err := root.Execute()
	if err == nil {
		return
	}
	var ae agentExit
	if errors.As(err, &ae) {
		os.Exit(int(ae))
	}
	fmt.Fprintln(os.Stderr, "kernelctl:", err)
	var ue *usageError
	// Cobra reports unknown commands and bad argument counts as plain errors.
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), " arg(s)") {
		os.Exit(2)
	}
	os.Exit(1)
}
