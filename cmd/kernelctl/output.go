package main

import (
	"github.com/spf13/cobra"
)

// addJSON adds --json to cmd: print JSON for machines, with the field
// names of the HTTP API, instead of text.
func addJSON(cmd *cobra.Command, asJSON *bool) {
	cmd.Flags().BoolVar(asJSON, "json", false, "print JSON for machines (the HTTP API's field names) instead of text")
}

// jsonShape says in the help of cmd's --json what it prints, for a verb
// whose JSON is not one object: a bare array, or one object a line.
// Scripts depend on these shapes; they are documented, not changed.
func jsonShape(cmd *cobra.Command, shape string) {
	cmd.Flags().Lookup("json").Usage = "print JSON for machines (the HTTP API's field names) instead of text: " + shape
}
