// Command kernelctl administers a capkernel data dir: init makes one, demo
// runs a scripted agent session through the kernel, ledger verify checks
// the hash chain.
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
	root.AddCommand(initCmd(), demoCmd(), ledgerCmd())
	err := root.Execute()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "kernelctl:", err)
	var ue *usageError
	// Cobra reports unknown commands and bad argument counts as plain errors.
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), " arg(s)") {
		os.Exit(2)
	}
	os.Exit(1)
}
