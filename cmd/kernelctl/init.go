package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/kernel"
)

func initCmd() *cobra.Command {
	var data string
	var asJSON, database bool
	cmd := &cobra.Command{
		Use:   "init --data DIR",
		Short: "Make a new kernel data dir: kernel id, issuer and receipt keys, admin credential",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				return &usageError{errors.New("init: --data DIR is required")}
			}
			if database {
				if _, err := os.Stat(filepath.Join(data, kernel.ConfigFile)); err != nil {
					return fmt.Errorf("init --database: %s holds no kernel (%w); make a new data dir with init --data DIR", data, err)
				}
				if err := kernel.CreateDatabase(data); err != nil {
					return fmt.Errorf("init --database: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "made the empty database %s\n", filepath.Join(data, kernel.DBFile))
				return nil
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
	cmd.Flags().BoolVar(&database, "database", false, "only make the empty database (kernel.db) of a data dir an older build made without one and that was never opened; never for a data dir whose kernel.db was lost (restore that from a backup)")
	addJSON(cmd, &asJSON)
	return cmd
}
