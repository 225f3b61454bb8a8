package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/upstream"
)

// mcpDeclarationsCmd prints the shipped declarations of the MCP reference
// servers (upstream/declarations.json).
func mcpDeclarationsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "declarations [NAME]",
		Short: "Print the shipped resource declarations of the MCP reference servers",
		Long: `declarations prints, as JSON, the resource declarations the kernel ships for
the official MCP reference servers (filesystem, git, fetch, memory, everything):
for each, the class of its tools and which arguments are file paths, URLs or kv
keys. A server in kernel.json uses them with "declare": NAME; its own
"resources" entries come first and may override them. With NAME, prints that
server's "resources" list alone, ready to edit into kernel.json. See docs/mcp.md.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			refs := upstream.References()
			var v any = refs
			if len(args) == 1 {
				r, ok := refs[args[0]]
				if !ok {
					names := slices.Sorted(maps.Keys(refs))
					return &usageError{fmt.Errorf("mcp declarations: no shipped declarations %q (there are %s)", args[0], strings.Join(names, ", "))}
				}
				v = r.Resources
			}
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
			return err
		},
	}
	// It prints JSON anyway; --json, which every verb printing a result
	// takes, is accepted so that scripts may give it.
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (it does without --json too)")
	return cmd
}
