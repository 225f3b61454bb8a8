package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
)

func workspaceCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "workspace", Short: "Check the workspace against the committed deltas"}
	cmd.AddCommand(workspaceVerifyCmd())
	return cmd
}

func workspaceVerifyCmd() *cobra.Command {
	var data string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify --data DIR",
		Short: "Prove that every file and kv key is as the last committed delta touching it left it",
		Long: `verify reads the committed deltas of the data dir in commit order and checks the
current state of every file and kv key they touched against the last delta
touching it: a written file must hold the delta's new_hash, a deleted path must
be absent, a made directory must be a directory, a kv key must hold new_hash at
new_version. It also looks for staging and trash files (.capk-stage-*,
.capk-trash-*) left in the roots. Every path that disagrees is named.

Run it with the kernel stopped (after a restart, so that recovery has applied
what was interrupted): a serving kernel changes files while verify reads them.
A file changed outside the kernel shows as a disagreement too: the deltas are
the kernel's record of what it wrote. Exit 1 when anything disagrees.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				data = os.Getenv(envData)
			}
			if data == "" {
				return &usageError{errors.New("workspace verify: --data DIR is required (or env " + envData + ")")}
			}
			in, err := kernel.OpenInspector(data)
			if errors.Is(err, kernel.ErrLocked) {
				return fmt.Errorf("workspace verify: %s is in use by a running kernel: stop it first (verify reads files the kernel may be changing)", data)
			}
			if err != nil {
				return fmt.Errorf("workspace verify: %w", err)
			}
			defer in.Close()
			rep, err := in.VerifyWorkspace()
			if err != nil {
				return fmt.Errorf("workspace verify: %w", err)
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(w, rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(w, "%d committed deltas, %d files and %d kv keys checked", rep.Deltas, rep.Files, rep.Keys)
				if rep.Unindexed > 0 {
					fmt.Fprintf(w, ", %d older deltas not checked (committed before the commit-order index)", rep.Unindexed)
				}
				if rep.Pending > 0 {
					fmt.Fprintf(w, ", %d decided calls not yet applied (their paths not checked: restart the kernel to apply them)", rep.Pending)
				}
				fmt.Fprintln(w)
				if len(rep.Problems) > 0 {
					tw := newTable(w)
					fmt.Fprintln(tw, "KIND\tROOT\tPATH/KEY\tOPERATION\tWANT\tFOUND")
					for _, p := range rep.Problems {
						name := p.Path
						if p.Kind == "kv" {
							name = p.Key
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Kind, cell(p.Root), cell(name), p.OperationID, p.Want, p.Found)
					}
					tw.Flush()
				}
			}
			if n := len(rep.Problems); n > 0 {
				return fmt.Errorf("workspace verify: %d path(s) disagree with the committed deltas", n)
			}
			if !asJSON {
				fmt.Fprintln(w, "the workspace agrees with the committed deltas")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "kernel data dir (default: env "+envData+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
