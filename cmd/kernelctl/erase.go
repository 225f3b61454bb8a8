package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
)

func ledgerEraseCmd() *cobra.Command {
	var t target
	var op, reason string
	cmd := &cobra.Command{
		Use:   "erase --operation ID --reason TEXT --data DIR|--server URL",
		Short: "Erase the payload of one call's audit record (its args, result, policy input, context) and record why",
		Long: `erase removes what one call carried — its arguments, result, policy input and
context, and the salt that opens their commitments — from beside the ledger, and
appends an erasure record saying what, who (admin), why and when. The audit record
and its commitments stay: the chain, the Merkle tree, checkpoints, inclusion and
consistency proofs and receipts still verify, and ledger verify reports the
payload as erased, never as tampered. The stored result envelope of the operation
loses its result and salt too. Needs the admin credential.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if op == "" || reason == "" {
				return &usageError{errors.New("ledger erase: --operation ID and --reason TEXT are required")}
			}
			if err := t.check("ledger erase"); err != nil {
				return err
			}
			var e *kernel.Erasure
			if t.remote() {
				c, err := t.adminClient()
				if err != nil {
					return err
				}
				if e, err = c.Erase(cmd.Context(), op, reason); err != nil {
					return err
				}
			} else {
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				if e, err = k.Erase(cmd.Context(), op, reason); err != nil {
					return err
				}
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), e)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "erased the payload of operation %s (audit record %v): %s\n", op, e.Seqs, reason)
			return nil
		},
	}
	t.addTarget(cmd, true)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&op, "operation", "", "the operation id of the call")
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the ledger)")
	return cmd
}
