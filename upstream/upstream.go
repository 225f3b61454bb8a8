// Package upstream connects the kernel to upstream MCP servers and keeps
// their tools in the syscall table as mcp.<server>.<tool>, so they are
// governed like any built-in syscall (token globs, policy, approvals,
// transactions, audit, receipts).
//
// Each configured server is started (a stdio command) or connected (a
// streamable HTTP URL) by Start; its tools are listed and registered with
// one Registry.ReplacePrefix, and again whenever the server sends
// notifications/tools/list_changed, so the table changes atomically: a
// call that resolved its entry before the change runs against it, a later
// call sees the new set.
package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/syscalls"
)

// Server configures one upstream MCP server (kernel.json mcp_servers,
// keyed by the server's name). Exactly one of Command and URL is set.
type Server struct {
	// Command is the argv of a server speaking MCP over stdin/stdout.
	Command []string `json:"command,omitempty"`
	// Env is added to the command's environment (the kernel's own
	// environment is not passed on; PATH and HOME are).
	Env map[string]string `json:"env,omitempty"`
	// URL is a streamable HTTP MCP endpoint.
	URL string `json:"url,omitempty"`
	// SideEffect is the class of the server's tools (default EXECUTE).
	SideEffect syscalls.SideEffect `json:"side_effect,omitempty"`
	// Tools overrides the class of single tools, by upstream tool name.
	Tools map[string]syscalls.SideEffect `json:"tools,omitempty"`
	// Timeout bounds a call of the server's tools (default: the kernel's
	// bound for the tool's class).
	Timeout Duration `json:"timeout,omitempty"`
	// Declare names shipped declarations to apply (References:
	// "filesystem", "git", "fetch", "memory", "everything").
	Declare string `json:"declare,omitempty"`
	// Resources declares what the arguments of the server's tools are;
	// the first entry whose glob matches a tool applies, before any of
	// Declare's.
	Resources []Declaration `json:"resources,omitempty"`
	// Paths maps the kernel's directories onto the upstream's path space
	// (default: one space).
	Paths []PathMap `json:"paths,omitempty"`
	// MaxResultBytes caps the size of a tool's result (default
	// DefaultMaxResultBytes); a larger one is an error result.
	MaxResultBytes int `json:"max_result_bytes,omitempty"`
}

// DefaultMaxResultBytes is the default cap on an upstream tool's result:
// well under the 10 MiB an MCP TypeScript client takes in one message and
// the 16 MiB of one stdio frame of the SDKs.
const DefaultMaxResultBytes = 4 << 20

// maxResult is the server's result cap.
func (s Server) maxResult() int {
	if s.MaxResultBytes > 0 {
		return s.MaxResultBytes
	}
	return DefaultMaxResultBytes
}

// declarations are the server's declarations in the order they apply.
func (s Server) declarations() []Declaration {
	ds := slices.Clone(s.Resources)
	if r, ok := references[s.Declare]; ok {
		ds = append(ds, r.Resources...)
	}
	return ds
}

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// label is one label of a syscall id (see syscalls.Registry.Register).
var label = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// Prefix is the id prefix of server name's syscalls.
func Prefix(name string) string { return "mcp." + name + "." }

// check refuses a server configuration that cannot work.
func (s Server) check(name string) error {
	if !label.MatchString(name) {
		return fmt.Errorf("mcp server %q: the name must be lowercase letters and digits with single underscores inside", name)
	}
	if (len(s.Command) == 0) == (s.URL == "") {
		return fmt.Errorf("mcp server %s: set exactly one of command and url", name)
	}
	if s.SideEffect != "" && !s.SideEffect.Valid() {
		return fmt.Errorf("mcp server %s: side_effect %q is not one of NONE, READ, WRITE, EXECUTE, NETWORK", name, s.SideEffect)
	}
	for t, se := range s.Tools {
		if !se.Valid() {
			return fmt.Errorf("mcp server %s: tool %s: side_effect %q is not one of NONE, READ, WRITE, EXECUTE, NETWORK", name, t, se)
		}
	}
	if _, ok := references[s.Declare]; s.Declare != "" && !ok {
		return fmt.Errorf("mcp server %s: declare %q is not one of the shipped declarations (%s)", name, s.Declare, referenceNames())
	}
	for i, d := range s.Resources {
		if err := d.check(fmt.Sprintf("mcp server %s: resources[%d]", name, i)); err != nil {
			return err
		}
	}
	for i, m := range s.Paths {
		if !filepath.IsAbs(m.Root) || !filepath.IsAbs(m.Upstream) {
			return fmt.Errorf("mcp server %s: paths[%d]: root %q and upstream %q must both be absolute", name, i, m.Root, m.Upstream)
		}
	}
	if s.MaxResultBytes < 0 {
		return fmt.Errorf("mcp server %s: max_result_bytes %d is negative", name, s.MaxResultBytes)
	}
	return nil
}

// class is the side-effect class of the server's tool: its tools entry,
// else its declaration's, else the server's, else EXECUTE.
func (s Server) class(tool string) syscalls.SideEffect {
	if se, ok := s.Tools[tool]; ok {
		return se
	}
	if d, ok := declarationFor(s.declarations(), tool); ok && d.SideEffect != "" {
		return d.SideEffect
	}
	if s.SideEffect != "" {
		return s.SideEffect
	}
	return syscalls.Execute
}

// Bounds on what one upstream server can make the kernel do at a
// connection (and again at each refresh of its tools): the MCP handshake
// and the listing of its tools (every page) must each end within their
// time, and the listing may have at most maxListPages pages, maxTools
// tools in all, and no cursor twice. Past one, the connection (at Open:
// kernel.Open) or the refresh fails.
const (
	maxListPages = 100
	maxTools     = 10000
)

// handshakeTimeout and listTimeout are variables for the tests.
var (
	handshakeTimeout = 30 * time.Second
	listTimeout      = 30 * time.Second
)

// Set is the connected upstream servers of a kernel.
type Set struct {
	conns []*conn
}

// Start connects to every server of cfg and registers its tools in reg.
// A server that cannot be started or connected, or whose tools cannot be
// listed, fails Start (fail closed: a configured server is never silently
// missing); what was connected is closed again. Tools that cannot be made
// syscalls (see docs/mcp.md) are left out with a warning on log.
func Start(ctx context.Context, reg *syscalls.Registry, cfg map[string]Server, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.Default()
	}
	names := make([]string, 0, len(cfg))
	for n := range cfg {
		names = append(names, n)
	}
	sort.Strings(names)
	set := &Set{}
	for _, n := range names {
		if err := cfg[n].check(n); err != nil {
			set.Close()
			return nil, err
		}
		c := &conn{name: n, cfg: cfg[n], reg: reg, log: log.With("mcp_server", n), dial: make(chan struct{}, 1),
			handshake: handshakeTimeout, listing: listTimeout}
		c.life, c.end = context.WithCancel(context.WithoutCancel(ctx))
		if _, err := c.connect(ctx); err != nil {
			c.end()
			set.Close()
			return nil, err
		}
		set.conns = append(set.conns, c)
	}
	return set, nil
}

// Close disconnects every server (stopping stdio commands) and removes
// their tools from the table. It ends what is in flight on each session
// first — a call so cut is outcome_unknown for a mutating tool — so it
// never waits for an upstream's answer; the servers are closed at once,
// each within the SDK's own bounds (an HTTP session's DELETE waits 5 s at
// most; a stdio command is killed 4 s after its stdin is closed).
func (s *Set) Close() error {
	errs := make([]error, len(s.conns))
	var wg sync.WaitGroup
	for i, c := range s.conns {
		wg.Go(func() { errs[i] = c.close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// conn is one upstream server: its current session, reconnected when it
// has died, and the tools it registered.
type conn struct {
	name string
	cfg  Server
	reg  *syscalls.Registry
	log  *slog.Logger

	handshake, listing time.Duration // the bounds of a connection's steps

	// life ends when the conn is closed (end), before its session's
	// Close, which waits for every request in flight: every request
	// made on the conn's sessions ends with it.
	life context.Context
	end  context.CancelFunc

	dial    chan struct{} // a token: serializes connects, waited for within a call's time
	refresh sync.Mutex    // serializes tool-table refreshes
	mu      sync.Mutex    // guards sess, dead, closed, refreshing, pending
	sess    *mcp.ClientSession
	dead    error // why sess ended (nil while it lives)
	closed  bool

	refreshing bool               // a refresh runs
	pending    *mcp.ClientSession // the session of the refresh wanted after it
}

// refreshTools lists sess's tools again after tools/list_changed, on a
// goroutine of its own (not the session's reading goroutine: listing
// waits for a response that goroutine must read). Refreshes coalesce: at
// most one runs and one waits per server, so a notification while one
// waits adds nothing — the waiting one lists what changed.
func (c *conn) refreshTools(sess *mcp.ClientSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refreshing {
		c.pending = sess
		return
	}
	c.refreshing = true
	go func() {
		for sess != nil {
			if err := c.load(c.life, sess); err != nil && c.life.Err() == nil {
				c.log.Warn("refreshing the tools after tools/list_changed failed", "err", err)
			}
			c.mu.Lock()
			sess, c.pending = c.pending, nil
			c.refreshing = sess != nil
			c.mu.Unlock()
		}
	}()
}

// connect starts a new session, unless a live one exists, and loads the
// tool table from it.
func (c *conn) connect(ctx context.Context) (*mcp.ClientSession, error) {
	select {
	case c.dial <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("mcp server %s: waiting for the reconnection: %w", c.name, ctx.Err())
	}
	defer func() { <-c.dial }()
	c.mu.Lock()
	closed, live := c.closed, c.sess != nil && c.dead == nil
	sess := c.sess
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("mcp server %s: the kernel is closing", c.name)
	}
	if live {
		return sess, nil
	}
	if sess != nil {
		// The dead session's process (or HTTP session) may linger: end
		// it, without holding up the reconnection.
		go sess.Close()
	}
	// A message may be the cap plus room for the JSON-RPC envelope around
	// a result at the cap.
	limit := c.cfg.maxResult() + 64<<10
	var t mcp.Transport
	if c.cfg.URL != "" {
		// MaxEventSize bounds the standalone SSE stream's events too,
		// which answer no request.
		t = &mcp.StreamableClientTransport{Endpoint: c.cfg.URL, MaxRetries: -1, MaxEventSize: limit,
			HTTPClient: &http.Client{Transport: sentTransport{base: http.DefaultTransport, limit: limit}}}
	} else {
		cmd := exec.Command(c.cfg.Command[0], c.cfg.Command[1:]...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		for k, v := range c.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = os.Stderr
		t = &stdioTransport{cmd: cmd, limit: limit, log: c.log}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "capkernel", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(_ context.Context, req *mcp.ToolListChangedRequest) {
			c.refreshTools(req.Session)
		},
	})
	ctx, stop := c.within(ctx)
	defer stop()
	hctx, cancel := context.WithTimeout(ctx, c.handshake)
	defer cancel()
	sess, err := client.Connect(hctx, t, nil)
	if err != nil {
		if ctx.Err() == nil && hctx.Err() != nil {
			return nil, fmt.Errorf("mcp server %s: connect: the MCP handshake did not end within %v: %w", c.name, c.handshake, err)
		}
		return nil, fmt.Errorf("mcp server %s: connect: %w", c.name, err)
	}
	c.mu.Lock()
	c.sess, c.dead = sess, nil
	c.mu.Unlock()
	go func() { c.markDead(sess, sess.Wait()) }()
	if err := c.load(ctx, sess); err != nil {
		c.mu.Lock()
		c.sess = nil
		c.mu.Unlock()
		sess.Close()
		return nil, err
	}
	return sess, nil
}

// within returns ctx, ended too when the conn is closed, and the function
// releasing it.
func (c *conn) within(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.life, cancel)
	return ctx, func() { stop(); cancel() }
}

// load lists the session's tools and makes them the server's syscalls in
// one step.
func (c *conn) load(ctx context.Context, sess *mcp.ClientSession) error {
	c.refresh.Lock()
	defer c.refresh.Unlock()
	tools, err := c.list(ctx, sess)
	if err != nil {
		return err
	}
	ids := map[string][]string{}
	for _, t := range tools {
		id := Prefix(c.name) + strings.ReplaceAll(t.Name, "-", "_")
		ids[id] = append(ids[id], t.Name)
	}
	var fs []syscalls.Factory
	for _, t := range tools {
		id := Prefix(c.name) + strings.ReplaceAll(t.Name, "-", "_")
		if len(ids[id]) > 1 {
			c.log.Warn("tool left out: its syscall id is shared", "tool", t.Name, "id", id, "upstream_names", ids[id])
			continue
		}
		if name := strings.TrimPrefix(id, Prefix(c.name)); !label.MatchString(name) {
			c.log.Warn("tool left out: its name is not lowercase letters and digits with single dashes or underscores inside", "tool", t.Name)
			continue
		}
		def, err := c.definition(id, t)
		if err != nil {
			c.log.Warn("tool left out", "tool", t.Name, "err", err)
			continue
		}
		decl := &Tool{Server: c.name, Name: t.Name, Paths: c.cfg.Paths}
		if d, ok := declarationFor(c.cfg.declarations(), t.Name); ok {
			decl.Declared, decl.Args = true, d.Args
		}
		fs = append(fs, func() syscalls.Syscall { return &tool{conn: c, name: t.Name, def: def, decl: decl} })
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.sess != sess {
		return nil // a list from a session that is no longer the server's
	}
	for _, err := range c.reg.ReplacePrefix(Prefix(c.name), fs) {
		c.log.Warn("tool left out", "err", err)
	}
	return nil
}

// list lists the session's tools, page by page, within the bounds on a
// listing (see maxListPages).
func (c *conn) list(ctx context.Context, sess *mcp.ClientSession) ([]*mcp.Tool, error) {
	lctx, cancel := context.WithTimeout(ctx, c.listing)
	defer cancel()
	var tools []*mcp.Tool
	seen := map[string]bool{"": true}
	cursor := ""
	for page := 1; ; page++ {
		res, err := sess.ListTools(lctx, &mcp.ListToolsParams{Cursor: cursor})
		switch {
		case err != nil && ctx.Err() == nil && lctx.Err() != nil:
			return nil, fmt.Errorf("mcp server %s: tools/list: the listing did not end within %v (page %d): %w", c.name, c.listing, page, err)
		case err != nil:
			return nil, fmt.Errorf("mcp server %s: tools/list: %w", c.name, err)
		}
		tools = append(tools, res.Tools...)
		switch {
		case len(tools) > maxTools:
			return nil, fmt.Errorf("mcp server %s: tools/list: more than %d tools", c.name, maxTools)
		case res.NextCursor == "":
			return tools, nil
		case seen[res.NextCursor]:
			return nil, fmt.Errorf("mcp server %s: tools/list: page %d gives a cursor given before", c.name, page)
		case page == maxListPages:
			return nil, fmt.Errorf("mcp server %s: tools/list: more than %d pages", c.name, maxListPages)
		}
		cursor = res.NextCursor
		seen[cursor] = true
	}
}

// definition makes the syscall definition of upstream tool t.
func (c *conn) definition(id string, t *mcp.Tool) (syscalls.Definition, error) {
	var schema map[string]any
	b, err := json.Marshal(t.InputSchema)
	if err == nil {
		err = json.Unmarshal(b, &schema)
	}
	if err != nil || schema == nil {
		return syscalls.Definition{}, fmt.Errorf("input schema is not a JSON object")
	}
	// $schema only names the dialect; the registry's subset is the same
	// in every draft that MCP servers use.
	delete(schema, "$schema")
	if b, err = json.Marshal(schema); err != nil {
		return syscalls.Definition{}, err
	}
	desc := t.Description
	if desc == "" {
		desc = t.Title
	}
	var out json.RawMessage
	if t.OutputSchema != nil {
		if out, err = outputSchema(t.OutputSchema); err != nil {
			// The tool can be called without it; listed, a schema
			// MCP clients cannot take would make them refuse the
			// whole tool list (the TypeScript SDK does).
			c.log.Warn("output schema left out", "tool", t.Name, "err", err)
			out = nil
		}
	}
	se := c.cfg.class(t.Name)
	return syscalls.Definition{
		ID:           id,
		Description:  desc,
		InputSchema:  b,
		OutputSchema: out,
		MCPResult:    true,
		SideEffect:   se,
		Timeout:      time.Duration(c.cfg.Timeout),
		External:     se.Mutating(),
		// CallTool returns as soon as its context ends (telling the
		// upstream with notifications/cancelled); the kernel waits for
		// it, so a mutating call that timed out after it was sent ends
		// as outcome_unknown, not as a rollback.
		SelfTimed: true,
	}, nil
}

// outputSchema returns an upstream tool's output schema as the kernel
// lists it, or an error unless it is what an MCP output schema must be —
// a JSON object schema with "type": "object" — within the kernel's schema
// subset, checked exactly as input schemas are (syscalls.CheckSchema).
// $schema is dropped, as from input schemas.
func outputSchema(v any) (json.RawMessage, error) {
	var schema map[string]any
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, &schema)
	}
	if err != nil || schema == nil {
		return nil, fmt.Errorf("output schema is not a JSON object")
	}
	delete(schema, "$schema")
	if b, err = json.Marshal(schema); err != nil {
		return nil, err
	}
	if err := syscalls.CheckSchema(b); err != nil {
		return nil, fmt.Errorf("output schema, checked as an input schema: %w", err)
	}
	return b, nil
}

// session returns a live session, reconnecting once if the last one died.
func (c *conn) session(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	sess, dead := c.sess, c.dead
	c.mu.Unlock()
	if sess != nil && dead == nil {
		return sess, nil
	}
	sess, err := c.connect(ctx)
	if err != nil {
		why := "not connected"
		if dead != nil {
			why = dead.Error()
		}
		return nil, fmt.Errorf("%s; reconnecting failed: %w", why, err)
	}
	return sess, nil
}

// markDead records that sess ended, if it is still the server's session.
func (c *conn) markDead(sess *mcp.ClientSession, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == sess && c.dead == nil {
		c.dead = errors.New("the session ended")
		if err != nil {
			c.dead = fmt.Errorf("the session ended: %v", err)
		}
	}
}

// close ends the conn: what is in flight on its session first (see
// life), then the session, and removes its tools from the table.
func (c *conn) close() error {
	c.end()
	c.mu.Lock()
	c.closed = true
	sess := c.sess
	c.sess = nil
	c.reg.ReplacePrefix(Prefix(c.name), nil)
	c.mu.Unlock()
	if sess == nil {
		return nil
	}
	return sess.Close()
}

// tool is one call of an upstream tool.
type tool struct {
	conn *conn
	name string // the upstream name
	def  syscalls.Definition
	decl *Tool
}

func (t *tool) Definition() syscalls.Definition { return t.def }

// Execute sends tools/call upstream. A call that was never written to a
// live connection (the session was broken or is being reconnected) is
// sent once more on a new session, within the call's time; if none can be
// had, it is upstream_unavailable and nothing was sent. Once the request
// has been written, a lost answer — the connection broke, the call's time
// ran out, the kernel closed the server — is outcome_unknown for a
// mutating tool: the server may have acted, so the kernel never sends it
// again.
func (t *tool) Execute(ctx context.Context, c *syscalls.Call) (syscalls.Output, error) {
	var res *mcp.CallToolResult
	var err error
	var sent *atomic.Bool
	var ans *answer
	for attempt := 0; ; attempt++ {
		var sess *mcp.ClientSession
		sess, err = t.conn.session(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return syscalls.Output{}, err // the kernel reports timeout or cancelled
			}
			return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUpstreamUnavailable,
				Message: fmt.Sprintf("mcp server %s: %v; nothing was sent", t.conn.name, err)}
		}
		cctx, stop := t.conn.within(ctx)
		cctx, sent = withSent(cctx)
		cctx, ans = withAnswer(cctx)
		res, err = sess.CallTool(cctx, &mcp.CallToolParams{Name: t.name, Arguments: c.Args})
		ans.done()
		stop()
		if errors.Is(err, mcp.ErrConnectionClosed) || err != nil && !sent.Load() && ctx.Err() == nil {
			// Marked now, not when the session's reader notices: the next
			// call must reconnect, not fail on the dead session too. A
			// write that failed for no reason of the call's own means the
			// session is broken, whatever its reader has seen so far.
			t.conn.markDead(sess, err)
		}
		if err == nil || sent.Load() || ctx.Err() != nil || attempt > 0 {
			break
		}
	}
	var werr *jsonrpc.Error
	switch {
	case errors.As(err, &werr) && werr.Code == codeTooLarge:
		var d struct {
			Bytes int
			Cut   bool
		}
		json.Unmarshal(werr.Data, &d)
		return syscalls.Output{}, t.tooLarge(d.Bytes, d.Cut)
	case errors.As(err, &werr):
		return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUpstreamError,
			Message: fmt.Sprintf("mcp server %s, tool %s: %s (code %d)", t.conn.name, t.name, cut(werr.Message, maxErrorText), werr.Code)}
	case err != nil && !sent.Load() && ctx.Err() != nil:
		return syscalls.Output{}, err // never sent: timeout or cancelled
	case err != nil && !sent.Load():
		return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUpstreamUnavailable,
			Message: fmt.Sprintf("mcp server %s, tool %s: %v; nothing was sent", t.conn.name, t.name, err)}
	case err != nil && t.def.SideEffect.Mutating():
		return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUnknown,
			Message: fmt.Sprintf("mcp server %s, tool %s: the call was sent but no answer came (%v); it may have acted", t.conn.name, t.name, err)}
	case err != nil && ctx.Err() != nil:
		return syscalls.Output{}, err // the kernel reports timeout or cancelled
	case err != nil:
		return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUpstreamUnavailable,
			Message: fmt.Sprintf("mcp server %s, tool %s: %v", t.conn.name, t.name, err)}
	}
	if res.IsError {
		return syscalls.Output{}, &syscalls.Failure{Class: syscalls.FailUpstreamError,
			Message: fmt.Sprintf("mcp server %s, tool %s reported an error: %s", t.conn.name, t.name, cut(text(res.Content), maxErrorText))}
	}
	raw := ans.raw()
	if raw == nil {
		// Answered, but not where and as a tools/call answer comes (on
		// the request's own stream, the members named exactly once): what
		// the SDK read cannot be checked against what was sent.
		return syscalls.Output{}, t.withheld("the answer came in a form the kernel does not check (not the response to its request on that request's stream, or with a member named twice): the result is withheld")
	}
	if err := exactNumbers(raw); err != nil {
		return syscalls.Output{}, t.withheld(err.Error())
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	b, err := json.Marshal(res)
	if err != nil {
		return syscalls.Output{}, fmt.Errorf("mcp server %s, tool %s: encoding the result: %w", t.conn.name, t.name, err)
	}
	if max := t.conn.cfg.maxResult(); len(b) > max {
		return syscalls.Output{}, t.tooLarge(len(b), false)
	}
	return syscalls.Output{Result: b}, nil
}

// tooLarge is the failure of a call whose result is over the server's
// cap: size bytes, or more when the transport cut it there.
func (t *tool) tooLarge(size int, cut bool) error {
	what, read := fmt.Sprint(size), ""
	if cut {
		what, read = fmt.Sprint("over ", size-1), " (read no further than that)"
	}
	return t.withheld(fmt.Sprintf("the result is %s bytes; the limit is %d bytes (max_result_bytes): the result is withheld%s; both connections stay open",
		what, t.conn.cfg.maxResult(), read))
}

// withheld is the failure of a call whose answer came but whose result
// the kernel does not pass on, for the reason why. The upstream answered,
// so a mutating tool has acted (or failed): its outcome is unknown to the
// caller, and the call is never sent again.
func (t *tool) withheld(why string) error {
	msg := fmt.Sprintf("mcp server %s, tool %s: %s", t.conn.name, t.name, why)
	if t.def.SideEffect.Mutating() {
		return &syscalls.Failure{Class: syscalls.FailUnknown, Message: msg + "; the tool answered, so it may have acted"}
	}
	return &syscalls.Failure{Class: syscalls.FailUpstreamError, Message: msg}
}

// exactNumbers refuses a result, as it came, that holds a number the
// result passed on could not: one that reads as an IEEE-754 double of
// another decimal value (9007199254740993 reads as 9007199254740992). The
// SDK decodes numbers into float64s, and the kernel audits results in
// RFC 8785's form, whose numbers are doubles: such a number would reach
// the agent, and the record, as another number than the upstream sent.
// Each number is checked on its own, token by token, so that nothing
// else in the result (a lone surrogate escape, invalid UTF-8, which the
// SDK lets through) keeps the check from seeing it.
func exactNumbers(raw json.RawMessage) error {
	dec := jsontext.NewDecoder(bytes.NewReader(raw), jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true))
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil // the end, or what the SDK read otherwise: not a number's matter
		}
		if tok.Kind() != '0' {
			continue
		}
		if _, err := jcs.CanonicalizeExact([]byte(tok.String())); err != nil {
			what := "no finite double"
			if canon, err := jcs.Canonicalize([]byte(tok.String())); err == nil {
				what = fmt.Sprintf("not the decimal its canonical form %s is (it has more digits than a double keeps)", canon)
			}
			return fmt.Errorf("the result is withheld: number %s, ending at offset %d of the result, is %s: send it as a string", cut(tok.String(), 64), dec.InputOffset(), what)
		}
	}
}

// maxErrorText bounds the text of an isError answer kept in the call's
// error message, which goes into the audit record and to the caller.
const maxErrorText = 8 << 10

// cut returns s whole if it has at most n bytes, else its first n bytes
// or fewer (ending on a UTF-8 character boundary) and a note of the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s… (cut: the text is %d bytes; the first %d are kept)", s[:i], len(s), i)
}

// text joins the text parts of content.
func text(content []mcp.Content) string {
	var parts []string
	for _, c := range content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	if len(parts) == 0 {
		return "(no text)"
	}
	return strings.Join(parts, "\n")
}
