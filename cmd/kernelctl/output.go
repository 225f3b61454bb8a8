package main

import (
	"github.com/spf13/cobra"
)

// addJSON adds --json to cmd: print JSON for machines, with the field
// names of the HTTP API, instead of text.
func addJSON(cmd *cobra.Command, asJSON *bool) {
	cmd.Flags().BoolVar(asJSON, "json", false, "print JSON for machines (the HTTP API's field names) instead of text")
}
