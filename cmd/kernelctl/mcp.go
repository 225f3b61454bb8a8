package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/syscalls"
)

// drainMCP is how long calls in flight may finish when the HTTP gateway stops.
const drainMCP = 30 * time.Second

func mcpCmd() *cobra.Command {
	var t target
	var tokenFile, httpAddr string
	var progressEvery, sessionIdle time.Duration
	var origins []string
	cmd := &cobra.Command{
		Use:   "mcp --data DIR|--server URL --token FILE [--http 127.0.0.1:PORT]",
		Short: "Serve the syscalls a token may call as an MCP server (stdio, or streamable HTTP)",
		Long: `mcp serves, to one MCP client on stdin/stdout (or, with --http, to MCP
clients over streamable HTTP on a loopback address), the syscalls the token
may call as MCP tools. Each tools/call is a call envelope under the token:
the kernel checks, decides, audits and receipts it, and the MCP result holds
the syscall's result (its JSON as text, once) or, with isError, its error
class and message; _meta holds capkernel/receipt_id, capkernel/operation_id
and capkernel/ledger_seq.

A call that waits (for an approval, or runs long) sends notifications/progress
every --progress-interval when the client gave a progressToken, so a client that
resets its request timeout on progress never times out while a human decides.

Over HTTP, a request with an Origin header that is not a loopback origin or
one given by --allow-origin is answered 403; request bodies are limited to 8 MiB;
a session idle for --session-idle (no request of it served, no call of it
running) ends, its calls and handles with it; its client must connect again.
One with no request after its initialize ends after a minute. At most 1024
sessions live at once: an initialize past them is answered 503.

The idempotency key of a call is the client's _meta "capkernel/idempotency_key"
if it sends one, else "mcp:<MCP session>:<JSON-RPC request id>". See docs/mcp.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check("mcp"); err != nil {
				return err
			}
			if progressEvery < 0 {
				return &usageError{fmt.Errorf("mcp --progress-interval %s: give a positive duration", progressEvery)}
			}
			for _, o := range origins {
				if err := mcpgateway.ValidOrigin(o); err != nil {
					return &usageError{fmt.Errorf("mcp --allow-origin: %w", err)}
				}
			}
			if httpAddr != "" {
				if err := checkListen("--http", httpAddr, false, mcpOffLoopback); err != nil {
					return &usageError{err}
				}
			}
			useServerGC()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ak, err := t.agentKernel(ctx, "mcp", tokenFile, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer ak.close()
			defs, err := ak.tools(ctx, syscalls.FormatMCP)
			if err != nil {
				return fmt.Errorf("mcp: %w", err)
			}
			cfg := mcpgateway.Config{Invoker: ak.invoker, Token: ak.token, TokenID: ak.jti, AgentID: ak.sub, PolicyHash: ak.policyHash,
				StdioSession: uuid.Must(uuid.NewV7()).String(), Version: "1", ProgressInterval: progressEvery, Handles: ak.handles}
			// The kernel in this process can put a call waiting for
			// approval to the client's user (elicitation), when the policy
			// lets the session confirm it; a remote one leaves it to approvers.
			var drain func() // the kernel's, when it runs in this process
			if ki, ok := ak.invoker.(kernelInvoker); ok {
				cfg.Confirmer = mcpgateway.ConfirmerOf(ki.k)
				drain = ki.k.Drain
			}
			if err := json.Unmarshal(defs, &cfg.Tools); err != nil {
				return fmt.Errorf("mcp: tool definitions: %w", err)
			}
			g := mcpgateway.New(cfg)
			if httpAddr == "" {
				// A client that exits closes our stdout: the next answer
				// fails with EPIPE, which ends the session (its calls
				// cancelled, audited, the kernel closed), where Go's
				// default for fd 1 killed the process mid-call.
				signal.Ignore(syscall.SIGPIPE)
				return g.ServeStdio(ctx)
			}
			return serveMCPHTTP(ctx, cmd, g, mcpgateway.HTTPOptions{AllowedOrigins: origins, SessionIdle: sessionIdle}, httpAddr, drain)
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&tokenFile, "token", "", "file holding the capability token whose syscalls are served (- for stdin)")
	cmd.Flags().DurationVar(&progressEvery, "progress-interval", mcpgateway.DefaultProgressInterval,
		"how often a waiting call sends notifications/progress to a client that gave a progressToken")
	cmd.Flags().StringArrayVar(&origins, "allow-origin", nil,
		"with --http, a browser origin (scheme://host[:port]) allowed besides loopback ones; repeatable")
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this loopback address instead of stdio (port 0 picks one)")
	cmd.Flags().DurationVar(&sessionIdle, "session-idle", mcpgateway.DefaultSessionIdle,
		"with --http, end a session idle this long (no request of it served, no call of it running; 0 never)")
	cmd.AddCommand(mcpDeclarationsCmd())
	return cmd
}

// mcpOffLoopback says what mcp supports when --http names another address.
const mcpOffLoopback = "mcp serves streamable HTTP on loopback only (127.0.0.1:PORT, [::1]:PORT or localhost:PORT), " +
	"for MCP clients on this host, because it has no TLS and any client reaching it acts with its token; " +
	"for a client elsewhere run kernelctl mcp on that host over stdio (--server URL reaches this kernel), " +
	"or put an authenticating TLS proxy in front of a loopback --http"

// serveMCPHTTP serves g over HTTP with o until ctx ends, printing
// "mcp gateway on http://ADDR/" on stdout when it accepts clients. drain,
// unless nil, runs when the shutdown begins (kernel.Drain: calls waiting
// for an approval end cancelled rather than hold the shutdown). The
// shutdown stops accepting, lets the calls in flight finish (for up to
// drainMCP), ends the sessions, whose GET streams would hold it for all
// of drainMCP otherwise, and returns nil once every connection closed.
func serveMCPHTTP(ctx context.Context, cmd *cobra.Command, g *mcpgateway.Gateway, o mcpgateway.HTTPOptions, addr string, drain func()) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	// serve's read timeouts: a request read slowly holds a connection of
	// LimitConns, which closes only quiet ones, for at most readTimeout.
	srv := &http.Server{Handler: g.HTTPHandler(o), ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		MaxHeaderBytes: maxHeaderBytes, IdleTimeout: idleTimeout}
	// Each connection is a descriptor of this process, which may run the
	// kernel (--data).
	ln = httpapi.LimitConns(srv, ln, httpapi.MaxConns())
	if drain != nil {
		srv.RegisterOnShutdown(drain)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "mcp gateway on http://%s/\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("mcp: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), drainMCP)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }()
	g.Shutdown(sctx)
	if err := <-shut; err != nil {
		srv.Close()
		return fmt.Errorf("mcp: requests still open %s after the shutdown began, cut off: %w", drainMCP, err)
	}
	return nil
}
