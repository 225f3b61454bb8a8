package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
)

func initCmd() *cobra.Command {
	var data string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "init --data DIR",
		Short: "Make a new kernel data dir: kernel id, issuer and receipt keys, admin credential",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				return &usageError{errors.New("init: --data DIR is required")}
			}
			res, err := kernel.Init(data)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			admin := filepath.Join(data, kernel.AdminFile)
			if asJSON {
				return printJSON(out, map[string]string{"kernel_id": res.KernelID, "issuer": res.Issuer, "admin_token_file": admin})
			}
			fmt.Fprintf(out, "kernel id:        %s\n", res.KernelID)
			fmt.Fprintf(out, "issuer:           %s\n", res.Issuer)
			fmt.Fprintf(out, "admin credential: %s (keep it secret)\n", filepath.Join(data, kernel.AdminFile))
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "data dir to create")
	addJSON(cmd, &asJSON)
	return cmd
}
