package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// usageError marks a command line the command cannot run (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error { return &usageError{fmt.Errorf(format, args...)} }

// resultError is the failure of a call answered with an error result
// (exit status 1): its class and message, and the HTTP status of the
// answer, 0 for a call made in this process.
type resultError struct {
	class, message string
	status         int
}

// callFailed returns the resultError of r, answered with HTTP status
// (0: none).
func callFailed(r *kernel.Result, status int) error {
	return &resultError{class: r.Error.Class, message: r.Error.Message, status: status}
}

func (e *resultError) Error() string { return e.class + ": " + e.message }

// exitCode is the exit status err ends kernelctl with, as the README
// promises: 2 for a command line the command cannot run, including a
// value the kernel refuses as malformed (HTTP 400: a bad --ttl, --budget,
// --autonomy, --outcome, ...); the agent's own status for run; 1 for every
// other failure.
func exitCode(err error) int {
	var ae agentExit
	if errors.As(err, &ae) {
		return int(ae)
	}
	var ue *usageError
	var api *httpapi.APIError
	switch {
	case errors.As(err, &ue):
		return 2
	case errors.As(err, &api) && api.Status == http.StatusBadRequest:
		return 2
	}
	return 1
}

// errorLine is the one line kernelctl prints for err, which cmd (nil
// before a command was found) returned: "kernelctl VERB: what failed".
// Package and verb prefixes the kernel's errors carry for Go callers
// are dropped, so that nothing is said twice; an answer of the API names
// its class and HTTP status once; a usage error points to --help. The
// message is quoted (cell) when it holds a tab, newline or carriage
// return, so that what a kernel or a file said cannot print lines that
// look like kernelctl's own.
func errorLine(cmd *cobra.Command, err error) string {
	verb := ""
	if cmd != nil && cmd.HasParent() {
		verb = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	}
	msg := err.Error()
	var api *httpapi.APIError
	var res *resultError
	switch {
	case errors.As(err, &api):
		msg = fmt.Sprintf("refused (%s, HTTP %d): %s", api.Class, api.Status, unstutter(api.Message, verb, api.Class))
		if api.Status == http.StatusUnauthorized && cmd != nil {
			msg += credentialSource(cmd)
		}
	case errors.As(err, &res) && res.status != 0:
		msg = fmt.Sprintf("%s (HTTP %d): %s", res.class, res.status, unstutter(res.message, verb, res.class))
	case errors.As(err, &res):
		msg = res.class + ": " + unstutter(res.message, verb, res.class)
	default:
		msg = unstutter(msg, verb, "")
	}
	var ue *usageError
	if errors.As(err, &ue) && cmd != nil && cmd.Name() != "help" {
		msg += " (see " + cmd.CommandPath() + " --help)"
	}
	msg = cell(msg)
	if verb == "" {
		return "kernelctl: " + msg
	}
	return "kernelctl " + verb + ": " + msg
}

// credentialSource says where the admin credential of a refused request
// came from, or how to give one, for a verb that takes one.
func credentialSource(cmd *cobra.Command) string {
	f := cmd.Flags().Lookup("admin-token")
	switch {
	case f == nil || cmd.Flags().Changed("token"):
		return ""
	case f.Changed:
		return " (the credential read from --admin-token " + f.Value.String() + ")"
	case os.Getenv(envAdmin) != "":
		return " (the credential in env " + envAdmin + ")"
	}
	return " (give the admin credential: --admin-token FILE or env " + envAdmin + ")"
}

// unstutter drops from the front of msg the prefixes that repeat what the
// line already says: the verb (whole or any word of it), the error class,
// and the names of the packages whose errors the kernel passes through.
func unstutter(msg, verb, class string) string {
	prefixes := []string{"captoken", "kernel", "server", "httpapi", "ledger"}
	if verb != "" {
		prefixes = append(prefixes, verb)
		prefixes = append(prefixes, strings.Fields(verb)...)
	}
	if class != "" {
		prefixes = append(prefixes, class)
	}
	for again := true; again; {
		again = false
		for _, p := range prefixes {
			if rest, ok := strings.CutPrefix(msg, p+": "); ok {
				msg, again = rest, true
			}
		}
	}
	return msg
}

// helpCmd is "kernelctl help [VERB...]": a verb's help, or a usage error
// for a verb that does not exist (cobra's own prints the usage and exits 0).
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				return usagef("no command %q: kernelctl --help lists them", strings.Join(args, " "))
			}
			return target.Help()
		},
	}
}

// argsAreUsage makes the argument-count errors of c and every command
// under it (cobra's "accepts 1 arg(s), received 0") usage errors, which
// exit 2 and point to the command's --help as unknown flags do.
func argsAreUsage(c *cobra.Command) {
	for _, sub := range c.Commands() {
		argsAreUsage(sub)
	}
	if c.Args == nil {
		return
	}
	check := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &usageError{err}
		}
		return nil
	}
}

// requireSubcommand makes every command of the tree under c that only
// groups others (token, receipts, ledger, ...) refuse to run without a
// known subcommand: an unknown one, or none, is a usage error (exit 2)
// instead of the help text and success.
func requireSubcommand(c *cobra.Command) {
	for _, sub := range c.Commands() {
		requireSubcommand(sub)
	}
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		var names []string
		for _, s := range cmd.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		if len(args) > 0 {
			return usagef("unknown command %q: want one of %s", args[0], strings.Join(names, ", "))
		}
		return usagef("give a command: one of %s", strings.Join(names, ", "))
	}
}
