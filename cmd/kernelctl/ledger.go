package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

func ledgerCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ledger", Short: "Inspect and verify the ledger"}
	var data string
	verify := &cobra.Command{
		Use:   "verify --data DIR",
		Short: "Recompute the ledger's hash chain; exit 1 naming the first bad seq if it was tampered with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				return &usageError{errors.New("ledger verify: --data DIR is required")}
			}
			n, err := kernel.VerifyDataDir(data)
			var ve *ledger.VerifyError
			if errors.As(err, &ve) {
				return fmt.Errorf("ledger TAMPERED: first bad entry is seq %d: %s", ve.Seq, ve.Reason)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ledger intact: %d entries, hash chain verified\n", n)
			return nil
		},
	}
	verify.Flags().StringVar(&data, "data", "", "kernel data dir")
	cmd.AddCommand(verify)
	return cmd
}
