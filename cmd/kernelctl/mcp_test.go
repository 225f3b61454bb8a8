package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/receipts"
)

// mcpSession connects a real SDK client to `kernelctl mcp` over stdio
// (kernelctl's own process) or, with httpMode, over streamable HTTP.
func mcpSession(t *testing.T, httpMode bool, args ...string) *mcp.ClientSession {
	t.Helper()
	return mcpSessionWith(t, nil, httpMode, args...)
}

// mcpSessionWith is mcpSession with the client's options.
func mcpSessionWith(t *testing.T, opts *mcp.ClientOptions, httpMode bool, args ...string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	client := mcp.NewClient(&mcp.Implementation{Name: "capkernel-test", Version: "1"}, opts)
	var tr mcp.Transport
	if !httpMode {
		tr = &mcp.CommandTransport{Command: exec.Command(kernelctl, append([]string{"mcp"}, args...)...)}
	} else {
		cmd := exec.Command(kernelctl, append([]string{"mcp", "--http", "127.0.0.1:0"}, args...)...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		line, err := bufio.NewReader(stdout).ReadString('\n')
		url, ok := strings.CutPrefix(strings.TrimSpace(line), "mcp gateway on ")
		if err != nil || !ok {
			t.Fatalf("ready line %q: %v", line, err)
		}
		tr = &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}
	}
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func resultMeta(r *mcp.CallToolResult, key string) string {
	v, _ := r.Meta[key].(string)
	return v
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A real MCP client over stdio and over HTTP (against a served kernel, by
// its URL; over stdio also by its data dir, through the control socket)
// sees only the token's tools, and every call is a governed, receipted
// kernel call.
func TestMCPGateway(t *testing.T) {
	for _, mode := range []string{"stdio", "http", "stdio-data"} {
		t.Run(mode, func(t *testing.T) {
			sv := initServed(t)
			ws := filepath.Join(sv.dir, "ws")
			os.MkdirAll(ws, 0o755)
			os.WriteFile(filepath.Join(ws, "a.txt"), []byte("hello mcp"), 0o644)
			tok := mintCLI(t, sv.server, sv.admin, "--agent", "mcp-agent", "--tools", "echo,fs.read,fs.write", "--fs", ws+":rw")
			at := []string{"--server", sv.url}
			if mode == "stdio-data" {
				at = []string{"--data", sv.server.data}
			}
			cs := mcpSession(t, mode == "http", append(at, "--token", tok.file)...)
			ctx := context.Background()

			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tl := range tools.Tools {
				names = append(names, tl.Name)
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"echo", "fs.read", "fs.write"}) {
				t.Fatalf("tools = %v", names)
			}

			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.read", Arguments: map[string]any{"path": "a.txt"}})
			if err != nil || r.IsError || !strings.Contains(text(r), "hello mcp") {
				t.Fatalf("fs.read: %+v %v", r, err)
			}
			rid := resultMeta(r, mcpgateway.MetaReceiptID)
			if rid == "" {
				t.Fatalf("no receipt id in _meta: %v", r.Meta)
			}
			if out, stderr, code := run(t, "receipts", "verify", rid, "--server", sv.url, "--admin-token", sv.adminFile); code != 0 {
				t.Fatalf("receipts verify %s: %s %s", rid, out, stderr)
			}
			// The receipt itself rides in _meta and verifies offline.
			rcpt, _ := json.Marshal(r.Meta[mcpgateway.MetaReceipt])
			jwksOut, _, _ := run(t, "receipts", "jwks", "--server", sv.url, "--admin-token", sv.adminFile)
			if p, err := receipts.VerifyLogged(rcpt, []byte(jwksOut)); err != nil || p.Receipt.ReceiptID != rid {
				t.Fatalf("the receipt in _meta: %v (%s)", err, rcpt)
			}

			cases := []struct {
				name  string
				tool  string
				args  map[string]any
				class string
			}{
				{"not granted", "proc.exec", map[string]any{"argv": []string{"true"}}, "permission_denied"},
				{"no such tool", "teleport", map[string]any{}, "tool_not_found"},
				{"bad args", "fs.read", map[string]any{"path": 7}, "invalid_args"},
				{"outside the roots", "fs.read", map[string]any{"path": "/etc/passwd"}, "scope_denied"},
			}
			for _, c := range cases {
				r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
				if err != nil || !r.IsError || !strings.HasPrefix(text(r), c.class+": ") || resultMeta(r, mcpgateway.MetaReceiptID) == "" {
					t.Fatalf("%s: %+v %v (text %q)", c.name, r, err, text(r))
				}
			}

			// A write with the client's own idempotency key, sent twice,
			// runs once: the second answer is the first call's.
			params := &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "out.txt", "content": "once"},
				Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: "write-1"}}
			first, err := cs.CallTool(ctx, params)
			if err != nil || first.IsError {
				t.Fatalf("fs.write: %+v %v", first, err)
			}
			second, err := cs.CallTool(ctx, params)
			if err != nil || second.IsError || resultMeta(second, mcpgateway.MetaOperationID) != resultMeta(first, mcpgateway.MetaOperationID) {
				t.Fatalf("repeat: %+v %v, first operation %s", second, err, resultMeta(first, mcpgateway.MetaOperationID))
			}
			// Without a key, each request id is its own call: a mutating
			// call still gets one (derived), so it is not refused for lack
			// of a key.
			for range 2 {
				r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "derived.txt", "content": "x"}})
				if err != nil || r.IsError {
					t.Fatalf("fs.write with a derived key: %+v %v", r, err)
				}
			}
			if first.Meta[mcpgateway.MetaReplayed] != false || second.Meta[mcpgateway.MetaReplayed] != true {
				t.Fatalf("_meta replayed: first %v, repeat %v", first.Meta, second.Meta)
			}
			// The result is on the wire once: its JSON as the one text
			// item, not repeated as structuredContent.
			var sc map[string]any
			if err := json.Unmarshal([]byte(text(first)), &sc); err != nil || sc["path"] != "out.txt" || len(first.Content) != 1 || first.StructuredContent != nil {
				t.Fatalf("result: content %q, structuredContent %v", text(first), first.StructuredContent)
			}
		})
	}
}

// A token that does not verify stops kernelctl mcp before it serves.
func TestMCPGatewayBadToken(t *testing.T) {
	sv := initServed(t)
	bad := filepath.Join(t.TempDir(), "bad.token")
	os.WriteFile(bad, []byte("e30.e30.c2ln\n"), 0o600)
	_, stderr, code := run(t, "mcp", "--server", sv.url, "--token", bad)
	if code == 0 || !strings.Contains(stderr, "token") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

// Over stdio against an embedded kernel (--data): the gateway holds the
// data dir while it serves, and the calls are in its ledger afterwards.
func TestMCPGatewayEmbedded(t *testing.T) {
	f := newRunFixture(t)
	cs := mcpSession(t, false, "--data", f.data, "--token", f.token)
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.read", Arguments: map[string]any{"path": "notes.txt"}})
	if err != nil || r.IsError || !strings.Contains(text(r), "the notes") {
		t.Fatalf("fs.read: %+v %v", r, err)
	}
	rid := resultMeta(r, mcpgateway.MetaReceiptID)
	cs.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, stderr, code := run(t, "receipts", "verify", rid, "--data", f.data)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receipts verify after the gateway ended: %s %s", out, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A call the policy gates (soft_gate) holds its MCP request until an
// approver decides: allowed, it runs and answers; undecided, it ends as
// approval_timeout. Both are receipted.
func TestMCPGatewayApproval(t *testing.T) {
	sv := initServed(t, "--approval-timeout", "5s")
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(ws, 0o755)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "mcp-agent", "--tools", "fs.write", "--fs", ws+":rw")
	approver := mintCLI(t, sv.server, sv.admin, "--agent", "alice", "--approver")
	cs := mcpSession(t, false, "--server", sv.url, "--token", tok.file)
	ctx := context.Background()
	c := &httpapi.Client{BaseURL: sv.url, Credential: approver.Token}

	decided := make(chan error, 1)
	go func() {
		for range 250 {
			pending, err := c.Approvals(ctx, false)
			if err != nil {
				decided <- err
				return
			}
			if len(pending) > 0 {
				_, err := c.Decide(ctx, pending[0].ID, "allow", "looks fine")
				decided <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		decided <- fmt.Errorf("no approval request appeared")
	}()
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "Makefile", "content": "all:\n"}})
	if derr := <-decided; derr != nil {
		t.Fatal(derr)
	}
	if err != nil || r.IsError || resultMeta(r, mcpgateway.MetaReceiptID) == "" {
		t.Fatalf("approved gated write: %+v %v (%s)", r, err, text(r))
	}
	r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "Makefile", "content": "again:\n"}})
	if err != nil || !r.IsError || !strings.HasPrefix(text(r), "approval_timeout: ") || resultMeta(r, mcpgateway.MetaReceiptID) == "" {
		t.Fatalf("undecided gated write: %+v %v (%s)", r, err, text(r))
	}
}

// A gated call through `kernelctl mcp --data` sends notifications/progress
// while it waits for the approver, at --progress-interval, to a client
// that gave a progress token: rising progress, the client's token, none
// after the result. The approval comes through the control socket.
func TestMCPGatewayProgress(t *testing.T) {
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			f := newRunFixture(t)
			aliceFile := filepath.Join(f.dir, "alice.token")
			os.WriteFile(aliceFile, []byte(mustRun(t, "token", "mint", "--data", f.data, "--agent", "alice", "--approver")), 0o600)
			progress := make(chan *mcp.ProgressNotificationParams, 100)
			opts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				progress <- r.Params
			}}
			cs := mcpSessionWith(t, opts, mode == "http", "--data", f.data, "--token", f.token, "--progress-interval", "100ms")
			type answer struct {
				r   *mcp.CallToolResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write",
					Arguments: map[string]any{"path": "Makefile", "content": "approved"}, Meta: mcp.Meta{"progressToken": "tok-1"}})
				done <- answer{r, err}
			}()
			last := 0.0
			for i := range 3 {
				select {
				case p := <-progress:
					if p.ProgressToken != "tok-1" || p.Progress <= last || !strings.Contains(p.Message, "fs.write") {
						t.Fatalf("progress %d: %+v after %v", i, p, last)
					}
					last = p.Progress
				case <-time.After(30 * time.Second):
					t.Fatalf("no progress notification %d while the call waits", i)
				}
			}
			var pending []kernel.ApprovalRequest
			if err := json.Unmarshal([]byte(mustRun(t, "approvals", "list", "--data", f.data, "--json")), &pending); err != nil || len(pending) != 1 {
				t.Fatalf("pending approvals %v %v", pending, err)
			}
			mustRun(t, "approvals", "approve", pending[0].ID, "--token", aliceFile, "--data", f.data)
			a := <-done
			if a.err != nil || a.r.IsError {
				t.Fatalf("the approved call: %+v %v", a.r, a.err)
			}
			// The stop of the sender is waited for: nothing after the result.
			for len(progress) > 0 {
				<-progress
			}
			time.Sleep(300 * time.Millisecond)
			if len(progress) != 0 {
				t.Fatalf("progress after the result: %+v", <-progress)
			}
		})
	}
}

// A token minted --handles: kernelctl mcp (against a data dir, and
// against a served kernel over the API) lists the session's handles, not
// the syscall ids, and answers a call by syscall id as an unknown tool.
func TestMCPGatewayHandles(t *testing.T) {
	for _, mode := range []string{"data", "server"} {
		t.Run(mode, func(t *testing.T) {
			var args []string
			if mode == "data" {
				f := newRunFixture(t)
				tok := filepath.Join(f.dir, "handles.token")
				os.WriteFile(tok, []byte(mustRun(t, "token", "mint", "--data", f.data, "--agent", "agent-1", "--tools", "echo", "--handles")), 0o600)
				args = []string{"--data", f.data, "--token", tok}
			} else {
				sv := initServed(t)
				tok := mintCLI(t, sv.server, sv.admin, "--agent", "agent-1", "--tools", "echo", "--handles")
				args = []string{"--server", sv.url, "--token", tok.file}
			}
			cs := mcpSession(t, false, args...)
			ctx := context.Background()
			lt, err := cs.ListTools(ctx, nil)
			if err != nil || len(lt.Tools) != 1 || !strings.HasPrefix(lt.Tools[0].Name, mcpgateway.HandleToolPrefix) {
				t.Fatalf("tools/list: %+v %v", lt, err)
			}
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: lt.Tools[0].Name, Arguments: map[string]any{"text": "hi"}})
			if err != nil || r.IsError || text(r) != `{"text":"hi"}` {
				t.Fatalf("call by handle: %+v %v", r, err)
			}
			r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
			if err != nil || !r.IsError || text(r) != `tool_not_found: no syscall "echo"` {
				t.Fatalf("call by syscall id: %q %v", text(r), err)
			}
		})
	}
}

// TestMCPGatewayPipe: a client that writes its requests to kernelctl mcp's
// stdin and closes it (a script, not an SDK client) gets every answer
// before the gateway ends, the tools/call's included.
func TestMCPGatewayPipe(t *testing.T) {
	f := newRunFixture(t)
	cmd := exec.Command(kernelctl, "mcp", "--data", f.data, "--token", f.token)
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}
garbage{
{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fs.read","arguments":{"path":"notes.txt"}}}
`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kernelctl mcp: %v: %s", err, out)
	}
	// A line that is no JSON is answered with a parse error, and the
	// lines after it are served.
	for _, want := range []string{`"id":1`, `"id":2`, `{"code":-32700`, `"id":3`, "the notes"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("answers lack %s:\n%s", want, out)
		}
	}
}

// kernelctl mcp (stdio) with a gated call of its client waiting for an
// approver (with a progress token, so the gateway writes again soon)
// ends with exit 0, the call cancelled and audited and its kernel closed,
// when the client exits (both pipes close) and when it is sent SIGTERM
// with its client connected, as --http does. On the client's exit the
// gateway's next write killed the process with SIGPIPE (Go's default on
// fd 1), the call left unaudited (rev10-mcp #2); on SIGTERM it ran on
// until an approver decided or the approval timed out, so the MCP stdio
// shutdown (stdin closed, SIGTERM, SIGKILL) ended in SIGKILL (rev12 #2).
func TestMCPStdioEndCancelsGatedCall(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(cmd *exec.Cmd, stdin, stdout io.Closer)
	}{
		{"the client exits", func(_ *exec.Cmd, stdin, stdout io.Closer) { stdout.Close(); stdin.Close() }},
		{"SIGTERM", func(cmd *exec.Cmd, _, stdout io.Closer) {
			go io.Copy(io.Discard, stdout.(io.Reader))
			cmd.Process.Signal(syscall.SIGTERM)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRunFixture(t)
			cmd := exec.Command(kernelctl, "mcp", "--data", f.data, "--token", f.token, "--progress-interval", "20ms")
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			defer stdin.Close()
			io.WriteString(stdin, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"Makefile","content":"x"},"_meta":{"progressToken":"p1"}}}
`)
			lines := bufio.NewScanner(stdout)
			for lines.Scan() && !strings.Contains(lines.Text(), "notifications/progress") {
			}
			tc.end(cmd, stdin, stdout)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("kernelctl mcp ended: %v (stderr %q)", err, stderr.String())
				}
			case <-time.After(60 * time.Second):
				t.Fatal("kernelctl mcp still serving 60 s later")
			}
			out := mustRun(t, "ledger", "tail", "--data", f.data, "--json")
			audited := false
			for _, l := range strings.Split(out, "\n") {
				audited = audited || strings.Contains(l, `"kind":"audit"`) && strings.Contains(l, `"fs.write"`) && strings.Contains(l, `"cancelled"`)
			}
			if !audited {
				t.Fatalf("no audit record of the cancelled fs.write in the ledger:\n%s", out)
			}
		})
	}
}

// kernelctl mcp --http stops on SIGINT with a client connected, which
// holds its GET stream open to listen (as the Go and TypeScript SDKs do),
// and a gated call of it waiting for an approver: the call is answered
// (cancelled by the kernel's drain, receipted), the session and its
// stream end, and the command exits 0. The stream held the shutdown for
// all of its 30 s, after which the command failed (rev10-mcp #3).
func TestMCPHTTPSignalEndsSessions(t *testing.T) {
	f := newRunFixture(t)
	cmd := exec.Command(kernelctl, "mcp", "--http", "127.0.0.1:0", "--data", f.data, "--token", f.token, "--progress-interval", "20ms")
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "mcp gateway on ")
	if !ok {
		t.Fatalf("ready line %q", line)
	}
	waiting := make(chan struct{}, 1)
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	answered := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "Makefile", "content": "x"},
			Meta: mcp.Meta{"progressToken": "p"}})
		if err != nil {
			t.Errorf("the call in flight at the shutdown: %v", err)
		}
		answered <- r
	}()
	<-waiting // the gated write waits for an approver
	cmd.Process.Signal(syscall.SIGINT)
	if r := <-answered; r != nil && (!r.IsError || !strings.HasPrefix(text(r), "cancelled: ") || resultMeta(r, mcpgateway.MetaReceiptID) == "") {
		t.Errorf("the call in flight at the shutdown: %s %v, want it cancelled with a receipt", text(r), r.Meta)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kernelctl mcp after SIGINT: %v (stderr %q)", err, stderr.String())
	}
}
