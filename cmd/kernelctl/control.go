package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// controlClient is a client of the running kernel (--server, or --data's
// control socket) carrying --token FILE (an approver or capability token)
// or else the admin credential.
func (t *target) controlClient(verb, tokenFile string) (*httpapi.Client, error) {
	if err := t.check(verb); err != nil {
		return nil, err
	}
	if !t.remote() {
		return nil, fmt.Errorf("%s: no kernel is running on %s (approvals, events and cancellation live in a running kernel: kernelctl serve, mcp or run on that data dir, or give --server URL)", verb, t.data)
	}
	if tokenFile != "" {
		tok, err := readToken("--token", tokenFile)
		if err != nil {
			return nil, err
		}
		return t.client(tok), nil
	}
	return t.adminClient()
}

func approvalsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "approvals", Short: "List and decide the approvals soft_gate and escalated calls wait for"}
	cmd.AddCommand(approvalsListCmd(), approvalsShowCmd(), decideCmd("approve", "allow"), decideCmd("deny", "deny"))
	return cmd
}

// approvalsShowCmd prints one approval request whole: what an approver
// needs to decide it (the call's input, its risk and why, the session,
// where it acts; for a pending one its args and files as they are now),
// which the list's table has no room for.
func approvalsShowCmd() *cobra.Command {
	var t target
	var tokenFile string
	cmd := &cobra.Command{
		Use:   "show APPROVAL_ID --data DIR|--server URL [--token APPROVER_TOKEN_FILE]",
		Short: "Print an approval request whole: the call's input, args and files, risk and basis, session and effects",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := t.controlClient("approvals show", tokenFile)
			if err != nil {
				return err
			}
			// A pending one whole; one decided since, as the list keeps it.
			d, err := c.ApprovalDetail(cmd.Context(), args[0])
			pending := err == nil
			var apiErr *httpapi.APIError
			if !pending {
				if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
					return err
				}
				if d.ApprovalRequest, err = recentApproval(cmd.Context(), c, args[0]); err != nil {
					return err
				}
			}
			if t.json {
				if pending {
					return printJSON(cmd.OutOrStdout(), d)
				}
				return printJSON(cmd.OutOrStdout(), d.ApprovalRequest)
			}
			return printApproval(cmd.OutOrStdout(), d, pending)
		},
	}
	t.addTarget(cmd, true)
	jsonShape(cmd, "one JSON object: a pending approval as GET /v1/approvals/{id} answers it (with args and files), a decided one as GET /v1/approvals lists it")
	cmd.Flags().StringVar(&tokenFile, "token", "", "approver token file (default: the admin credential)")
	return cmd
}

// recentApproval finds approval id among those pending or recently
// decided that c's credential sees.
func recentApproval(ctx context.Context, c *httpapi.Client, id string) (kernel.ApprovalRequest, error) {
	list, err := c.Approvals(ctx, true)
	if err != nil {
		return kernel.ApprovalRequest{}, err
	}
	for _, a := range list {
		if a.ID == id {
			return a, nil
		}
	}
	return kernel.ApprovalRequest{}, fmt.Errorf("approvals show: no approval %q pending or recently decided that this credential may see", id)
}

// printApproval writes approval d as a table of its request, then, when
// it is pending (withFiles), the whole of what the call carries, which
// the input's summary cuts: its args, and each file as it is now.
func printApproval(w io.Writer, d kernel.ApprovalDetail, withFiles bool) error {
	a := d.ApprovalRequest
	tw := newTable(w)
	for _, f := range [][2]string{
		{"approval", a.ID}, {"state", a.State}, {"mode", a.Mode}, {"role", a.RequiredRole},
		{"agent", a.AgentID}, {"session", orDash(a.SessionID)}, {"tool", a.ToolID}, {"operation", a.OperationID},
		{"input", a.InputSummary}, {"risk", fmt.Sprintf("%.2f", a.RiskScore)}, {"risk basis", strings.Join(a.RiskBasis, "; ")},
		{"effects", strings.Join(a.ProjectedEffects, "; ")}, {"side effect", a.SideEffect},
		{"requested", a.RequestedAt}, {"decide by", a.DecideBy}, {"decided by", orDash(a.DecidedBy)}, {"reason", orDash(a.Reason)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], cell(f[1]))
	}
	if err := tw.Flush(); err != nil || !withFiles {
		return err
	}
	out := terminalSafe{w}
	var args bytes.Buffer
	if json.Indent(&args, d.Args, "", "  ") != nil {
		args.Write(d.Args)
	}
	fmt.Fprintf(out, "\nargs:\n%s\n", args.Bytes())
	for _, f := range d.Files {
		state := "absent"
		or := ""
		if f.More {
			or = " or more"
		}
		switch {
		case f.Link != "":
			state = "a link to " + f.Link
		case f.Dir:
			state = fmt.Sprintf("a directory of %d%s entries, %d%s bytes in files", f.Entries, or, f.Size, or)
		case f.Exists:
			state = fmt.Sprintf("%d bytes", f.Size)
		}
		fmt.Fprintf(out, "\nfile %s (now %s):\n", filepath.Join(f.Root, f.Path), state)
		if f.Content != "" {
			fmt.Fprintln(out, f.Content)
		}
	}
	return nil
}

func approvalsListCmd() *cobra.Command {
	var t target
	var tokenFile string
	var all bool
	cmd := &cobra.Command{
		Use:   "list --data DIR|--server URL [--token APPROVER_TOKEN_FILE] [--all]",
		Short: "List pending approval requests (--all: and recent decisions)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := t.controlClient("approvals list", tokenFile)
			if err != nil {
				return err
			}
			list, err := c.Approvals(cmd.Context(), all)
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "APPROVAL\tSTATE\tMODE\tROLE\tAGENT\tTOOL\tEFFECTS\tDECIDE BY\tDECIDED BY")
			for _, a := range list {
				// The effects whole: cut, a long path could hide where
				// the write lands.
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.State, a.Mode, a.RequiredRole, cell(a.AgentID), cell(a.ToolID),
					cell(strings.Join(a.ProjectedEffects, ", ")), clip(a.DecideBy, 19), cell(orDash(a.DecidedBy)))
			}
			return tw.Flush()
		},
	}
	t.addTarget(cmd, true)
	jsonShape(cmd, `one JSON array of the approvals (GET /v1/approvals wraps the same array in {"approvals": [...]})`)
	cmd.Flags().StringVar(&tokenFile, "token", "", "approver token file (default: the admin credential)")
	cmd.Flags().BoolVar(&all, "all", false, "include recent decisions")
	return cmd
}

func decideCmd(verb, decision string) *cobra.Command {
	var t target
	var tokenFile, reason string
	cmd := &cobra.Command{
		Use:   verb + " APPROVAL_ID --token APPROVER_TOKEN_FILE --data DIR|--server URL [--reason TEXT]",
		Short: fmt.Sprintf("Decide %s on an approval request (first decision wins)", decision),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tokenFile == "" {
				return &usageError{fmt.Errorf("approvals %s: --token is required: an approver token (token mint --approver)", verb)}
			}
			c, err := t.controlClient("approvals "+verb, tokenFile)
			if err != nil {
				return err
			}
			a, err := c.Decide(cmd.Context(), args[0], decision, reason)
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approval %s %s by %s (%s %s of %s)\n", a.ID, a.State, a.DecidedBy, a.ToolID, a.OperationID, a.AgentID)
			return nil
		},
	}
	t.addTarget(cmd, false)
	cmd.Flags().StringVar(&tokenFile, "token", "", "approver token file")
	cmd.Flags().StringVar(&reason, "reason", "", "why; recorded in the ledger and the call's receipt")
	return cmd
}

func waitCmd() *cobra.Command {
	var t target
	var tokenFile string
	var timeout, poll time.Duration
	cmd := &cobra.Command{
		Use:   "wait OPERATION_ID --data DIR|--server URL [--token FILE] [--timeout 10m]",
		Short: "Wait for an asynchronous call (call --async) and print its result; exit 1 on an error result",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := t.controlClient("wait", tokenFile)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			for {
				st, err := c.OperationStatus(ctx, args[0])
				if err != nil {
					return err
				}
				if st.State == kernel.OpDone {
					if err := printResult(cmd, st.Result, t.json); err != nil {
						return err
					}
					if st.Result.Error != nil {
						return callFailed(st.Result, 0)
					}
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait %s: still %s after %s", args[0], st.State, timeout)
				case <-time.After(poll):
				}
			}
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&tokenFile, "token", "", "capability token file of the call's agent (default: the admin credential)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long (exit 1)")
	cmd.Flags().DurationVar(&poll, "poll", 200*time.Millisecond, "how often to ask")
	return cmd
}

func cancelCmd() *cobra.Command {
	var t target
	var tokenFile, session string
	cmd := &cobra.Command{
		Use:   "cancel (OPERATION_ID | --session ID) --data DIR|--server URL [--token FILE]",
		Short: "Cancel a call in flight, or every call of a session; they roll back with class cancelled",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (session != "") {
				return &usageError{errors.New("cancel: give an operation id or --session, one of them")}
			}
			c, err := t.controlClient("cancel", tokenFile)
			if err != nil {
				return err
			}
			if session != "" {
				n, err := c.CancelSession(cmd.Context(), session)
				if err != nil {
					return err
				}
				if t.json {
					return printJSON(cmd.OutOrStdout(), map[string]any{"session_id": session, "cancelled": n})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "cancelled %d calls of session %s\n", n, session)
				return nil
			}
			if err := c.Cancel(cmd.Context(), args[0]); err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"operation_id": args[0], "cancelled": true})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancelled %s\n", args[0])
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&tokenFile, "token", "", "capability token file of the calls' agent (default: the admin credential)")
	cmd.Flags().StringVar(&session, "session", "", "cancel every call in flight of this session")
	return cmd
}

// errEnoughEvents ends an event stream after --count events.
var errEnoughEvents = errors.New("enough events")

func eventsCmd() *cobra.Command {
	var t target
	var tokenFile, session, agent, kinds string
	var follow bool
	var count int
	cmd := &cobra.Command{
		Use:   "events --data DIR|--server URL [--follow] [--session ID] [--agent ID] [--kind K,K] [--token FILE]",
		Short: "Stream the kernel's tool.* events (calls, completions, failures, denials, confirmations)",
		Long: `events prints the kernel's events as they happen, one line each (--json: one
JSON object a line): tool.called, tool.completed, tool.failed, tool.input_invalid,
tool.denied, tool.confirmation_requested, tool.confirmation_resolved. Events are
live only: nothing is replayed from before the stream started (the ledger is the
record). It runs until interrupted (--follow, the default) or until --count
events have arrived. A line "dropped N" means this client fell behind and lost
events. The admin credential and approver tokens see every agent; a capability
token (--token) only its own agent.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := t.controlClient("events", tokenFile)
			if err != nil {
				return err
			}
			f := kernel.EventFilter{SessionID: session, AgentID: agent}
			if kinds != "" {
				f.Kinds = splitList(kinds)
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			n := 0
			out := cmd.OutOrStdout()
			if !t.json {
				fmt.Fprintf(out, "%s\t%-28s\t%s\t%s\t%s\t%s\t%s\n", "TIME", "KIND", "AGENT", "SESSION", "TOOL", "OPERATION", "DETAIL")
			}
			err = c.Events(ctx, f, func(e kernel.Event) error {
				if t.json {
					printJSONLine(out, e)
				} else {
					detail := e.ErrorClass
					if e.Approval != nil {
						detail = strings.TrimSpace(fmt.Sprintf("%s %s %s", e.Approval.ID, e.Approval.State, e.Approval.DecidedBy))
					}
					fmt.Fprintf(out, "%s\t%-28s\t%s\t%s\t%s\t%s\t%s\n", clip(e.Time, 23), e.Kind, cell(e.AgentID), cell(orDash(e.SessionID)), cell(e.ToolID), cell(e.OperationID), cell(detail))
				}
				// Stop at once: events already read from the stream must
				// not be printed past --count.
				if n++; count > 0 && n >= count {
					return errEnoughEvents
				}
				return nil
			}, func(d uint64) { fmt.Fprintf(os.Stderr, "dropped %d events so far (this client fell behind)\n", d) })
			if errors.Is(err, errEnoughEvents) {
				return nil
			}
			return err
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&tokenFile, "token", "", "approver or capability token file (default: the admin credential)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", true, "keep streaming (the default; events are live only)")
	cmd.Flags().StringVar(&session, "session", "", "only this session's events")
	cmd.Flags().StringVar(&agent, "agent", "", "only this agent's events")
	cmd.Flags().StringVar(&kinds, "kind", "", "only these kinds, comma-separated")
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many events")
	return cmd
}
