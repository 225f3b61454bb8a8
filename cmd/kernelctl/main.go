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
	"runtime/debug"

	"github.com/spf13/cobra"
)

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
	root.Version = version()
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.SetHelpCommand(helpCmd())
	// The completion command is added now (cobra adds it when it runs),
	// so that the rules below hold for it too.
	root.InitDefaultCompletionCmd()
	requireSubcommand(root)
	argsAreUsage(root)
	// Every verb prints through terminalSafe (terminal.go): what it
	// prints holds text others made.
	root.SetOut(terminalSafe{os.Stdout})
	root.SetErr(terminalSafe{os.Stderr})
	cmd, err := root.ExecuteC()
	if err == nil {
		return
	}
	var ae agentExit
	if !errors.As(err, &ae) {
		fmt.Fprintln(root.ErrOrStderr(), errorLine(cmd, err))
	}
	os.Exit(exitCode(err))
}

// version is this build's version: the module version and VCS revision
// the Go toolchain recorded, and the Go version.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " (" + rev + modified + ")"
	}
	return v + " " + bi.GoVersion
}
