package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// rpc is the part of a JSON-RPC request the hostile servers look at.
type rpc struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Name string `json:"name"`
	} `json:"params"`
}

// hostile serves s over streamable HTTP, letting answer take any POST
// first: it reports whether it answered the request m itself.
func hostile(t *testing.T, s *mcp.Server, opts *mcp.StreamableHTTPOptions, answer func(w http.ResponseWriter, m rpc) bool) string {
	t.Helper()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, opts)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m rpc
			json.Unmarshal(body, &m)
			if answer(w, m) {
				return
			}
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// objectTools adds tools named names to s, each with an empty object
// schema and an answer of the text "ok".
func objectTools(s *mcp.Server, names ...string) {
	for _, n := range names {
		s.AddTool(&mcp.Tool{Name: n, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
			})
	}
}

// start connects to the servers of cfg, and closes them at the end of t.
func start(t *testing.T, cfg map[string]Server) (*syscalls.Registry, *Set) {
	t.Helper()
	reg := syscalls.NewRegistry()
	set, err := Start(context.Background(), reg, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return reg, set
}

// call runs tool id of reg with empty arguments.
func call(t *testing.T, reg *syscalls.Registry, id string) (syscalls.Output, error) {
	t.Helper()
	e, ok := reg.Get(id)
	if !ok {
		t.Fatalf("%s is not in the table", id)
	}
	return e.New().Execute(context.Background(), &syscalls.Call{Args: json.RawMessage(`{}`)})
}

// failure is err's class and message, or "" and err's text.
func failure(err error) (string, string) {
	var f *syscalls.Failure
	if errors.As(err, &f) {
		return f.Class, f.Message
	}
	if err == nil {
		return "", ""
	}
	return "", err.Error()
}

// sseMode makes TestHTTPResultCap's upstream answer with an SSE stream.
var sseMode atomic.Bool

// TestHTTPResultCap: an HTTP upstream's answer over max_result_bytes is
// cut where it passes the cap (plus room for the envelope), whether it
// comes as a JSON body or as an SSE event, and the call fails as too
// large — outcome_unknown for a mutating tool — with the session still
// usable; an isError answer's text is cut before it becomes the error
// message.
func TestHTTPResultCap(t *testing.T) {
	const total = 64 << 20 // what the upstream would send
	var wrote atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	objectTools(s, "huge", "fine", "loud")
	url := hostile(t, s, &mcp.StreamableHTTPOptions{JSONResponse: true}, func(w http.ResponseWriter, m rpc) bool {
		if m.Method != "tools/call" {
			return false
		}
		switch m.Params.Name {
		case "loud":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"isError":true,"content":[{"type":"text","text":"%s"}]}}`, m.ID, strings.Repeat("é", 1<<19))
			return true
		case "huge":
		default:
			return false
		}
		sse := sseMode.Load()
		head := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"`, m.ID)
		if sse {
			w.Header().Set("Content-Type", "text/event-stream")
			head = "event: message\ndata: " + head
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		wrote.Store(0)
		n, _ := io.WriteString(w, head)
		wrote.Add(int64(n))
		chunk := bytes.Repeat([]byte("A"), 1<<20)
		for wrote.Load() < total {
			n, err := w.Write(chunk)
			wrote.Add(int64(n))
			if err != nil {
				return true
			}
		}
		io.WriteString(w, `"}]}}`)
		if sse {
			io.WriteString(w, "\n\n")
		}
		return true
	})
	reg, _ := start(t, map[string]Server{
		"n": {URL: url, SideEffect: syscalls.None, MaxResultBytes: 2 << 20},
		"w": {URL: url, SideEffect: syscalls.Write, MaxResultBytes: 2 << 20},
	})
	for _, tc := range []struct {
		name, server string
		sse          bool
		class        string
	}{
		{"json NONE", "n", false, syscalls.FailUpstreamError},
		{"json WRITE", "w", false, syscalls.FailUnknown},
		{"sse NONE", "n", true, syscalls.FailUpstreamError},
		{"sse WRITE", "w", true, syscalls.FailUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sseMode.Store(tc.sse)
			_, err := call(t, reg, "mcp."+tc.server+".huge")
			class, msg := failure(err)
			if class != tc.class || !strings.Contains(msg, "max_result_bytes") || !strings.Contains(msg, "over") {
				t.Errorf("a %d MiB result over a 2 MiB cap: %v", total>>20, err)
			}
			if wrote.Load() >= total {
				t.Errorf("the kernel read the whole %d MiB answer", total>>20)
			}
			t.Logf("the upstream wrote %d KiB of %d MiB", wrote.Load()>>10, total>>20)
			if out, err := call(t, reg, "mcp."+tc.server+".fine"); err != nil {
				t.Errorf("the next call on the session: %s, %v", out.Result, err)
			}
		})
	}
	t.Run("isError text", func(t *testing.T) {
		_, err := call(t, reg, "mcp.n.loud")
		class, msg := failure(err)
		if class != syscalls.FailUpstreamError || len(msg) > 2*maxErrorText || !strings.Contains(msg, "cut: the text is 1048576 bytes") || !strings.HasPrefix(msg, "mcp server n, tool loud reported an error: éé") {
			t.Errorf("an isError answer of 1 MiB text: %s %.200s… (%d bytes)", class, msg, len(msg))
		}
	})
}

// closed runs set.Close and fails t if it has not returned within 30 s.
func closed(t *testing.T, set *Set) {
	t.Helper()
	done := make(chan struct{})
	go func() { set.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close has not returned after 30 s")
	}
}

// TestCloseInFlight: closing ends what is in flight on a session first,
// so Close never waits for an upstream: a refresh's tools/list the
// upstream never answers, a call it never answers (outcome_unknown for a
// mutating tool).
func TestCloseInFlight(t *testing.T) {
	t.Run("refresh never answered", func(t *testing.T) {
		s := mcp.NewServer(&mcp.Implementation{Name: "stall", Version: "1"}, nil)
		objectTools(s, "t")
		var lists atomic.Int64
		block := make(chan struct{})
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "tools/list" && lists.Add(1) > 1 {
					<-block
				}
				return next(ctx, method, req)
			}
		})
		url := hostile(t, s, nil, func(http.ResponseWriter, rpc) bool { return false })
		t.Cleanup(func() { close(block) }) // before the server's Close, which waits for it
		_, set := start(t, map[string]Server{"web": {URL: url}})
		objectTools(s, "u") // tools/list_changed: the kernel lists again
		for deadline := time.Now().Add(30 * time.Second); lists.Load() < 2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no refresh after tools/list_changed")
			}
		}
		closed(t, set)
	})
	t.Run("call in flight", func(t *testing.T) {
		up := upstreamtest.New()
		srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up.MCP }, nil))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { up.Release("z") }) // the cancellation may not reach it
		reg, set := start(t, map[string]Server{"web": {URL: srv.URL}})
		slow, _ := reg.Get("mcp.web.slow")
		done := make(chan error, 1)
		go func() {
			_, err := slow.New().Execute(context.Background(), &syscalls.Call{Args: json.RawMessage(`{"id":"z"}`)})
			done <- err
		}()
		<-up.Started()
		closed(t, set)
		if class, msg := failure(<-done); class != syscalls.FailUnknown {
			t.Fatalf("a mutating call cut by Close: %s %s", class, msg)
		}
	})
}

// lister is an upstream whose every tools/list page is page(n, cursor),
// n counting the pages served.
func lister(t *testing.T, page func(n int64, cursor string) *mcp.ListToolsResult) string {
	s := mcp.NewServer(&mcp.Implementation{Name: "lister", Version: "1"}, nil)
	objectTools(s, "t")
	var n atomic.Int64
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "tools/list" {
				return next(ctx, method, req)
			}
			return page(n.Add(1), req.(*mcp.ListToolsRequest).Params.Cursor), nil
		}
	})
	return hostile(t, s, nil, func(http.ResponseWriter, rpc) bool { return false })
}

// someTools is k tools named p0, p1, … with an empty object schema.
func someTools(p string, k int) []*mcp.Tool {
	ts := make([]*mcp.Tool, k)
	for i := range ts {
		ts[i] = &mcp.Tool{Name: fmt.Sprint(p, i), InputSchema: json.RawMessage(`{"type":"object"}`)}
	}
	return ts
}

// TestConnectBounds: an upstream can hold a connection (and so
// kernel.Open) only within bounds: a handshake or a listing that does not
// end in its time, a listing of more than maxListPages pages or maxTools
// tools, or one that gives a cursor twice, fails the connection.
func TestConnectBounds(t *testing.T) {
	defer func(h, l time.Duration) { handshakeTimeout, listTimeout = h, l }(handshakeTimeout, listTimeout)
	silent := func(t *testing.T) string {
		stop := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(stop) })
		return srv.URL
	}
	tests := []struct {
		name  string
		url   func(t *testing.T) string
		short bool // the handshake and the listing have 300 ms, not 30 s
		want  string
	}{
		{"handshake never answered", silent, true, "the MCP handshake did not end within 300ms"},
		{"tools/list never answered", func(t *testing.T) string {
			s := mcp.NewServer(&mcp.Implementation{Name: "slowlist", Version: "1"}, nil)
			objectTools(s, "t")
			stop := make(chan struct{})
			s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if method == "tools/list" {
						select {
						case <-stop:
						case <-ctx.Done():
						}
					}
					return next(ctx, method, req)
				}
			})
			url := hostile(t, s, nil, func(http.ResponseWriter, rpc) bool { return false })
			t.Cleanup(func() { close(stop) })
			return url
		}, true, "the listing did not end within 300ms (page 1)"},
		{"a cursor repeated", func(t *testing.T) string {
			return lister(t, func(n int64, _ string) *mcp.ListToolsResult {
				return &mcp.ListToolsResult{Tools: someTools(fmt.Sprint("p", n, "_"), 5), NextCursor: "again"}
			})
		}, false, "page 2 gives a cursor given before"},
		{"pages without end", func(t *testing.T) string {
			return lister(t, func(n int64, _ string) *mcp.ListToolsResult {
				return &mcp.ListToolsResult{Tools: someTools(fmt.Sprint("p", n, "_"), 5), NextCursor: fmt.Sprint(n)}
			})
		}, false, "more than 100 pages"},
		{"too many tools", func(t *testing.T) string {
			return lister(t, func(n int64, _ string) *mcp.ListToolsResult {
				r := &mcp.ListToolsResult{Tools: someTools(fmt.Sprint("p", n, "_"), 2000)}
				if n < 6 {
					r.NextCursor = fmt.Sprint(n)
				}
				return r
			})
		}, false, "more than 10000 tools"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			handshakeTimeout, listTimeout = 30*time.Second, 30*time.Second
			if tc.short {
				handshakeTimeout, listTimeout = 300*time.Millisecond, 300*time.Millisecond
			}
			url := tc.url(t)
			done := make(chan error, 1)
			go func() {
				set, err := Start(context.Background(), syscalls.NewRegistry(), map[string]Server{"web": {URL: url}}, nil)
				if err == nil {
					set.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Start: %v; want an error saying %q", err, tc.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Start has not returned after 30 s")
			}
		})
	}
	// Within the bounds: 100 pages, 10000 tools.
	url := lister(t, func(n int64, _ string) *mcp.ListToolsResult {
		r := &mcp.ListToolsResult{Tools: someTools(fmt.Sprint("p", n, "_"), 100)}
		if n < 100 {
			r.NextCursor = fmt.Sprint(n)
		}
		return r
	})
	reg, _ := start(t, map[string]Server{"web": {URL: url}})
	if n := len(reg.List()); n != 10000 {
		t.Fatalf("%d tools in the table, want 10000", n)
	}
}

// TestRefreshCoalesced: tools/list_changed notifications that come while
// a refresh waits for the upstream add one refresh after it, not one
// each.
func TestRefreshCoalesced(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "chatty", Version: "1"}, nil)
	objectTools(s, "t")
	var lists atomic.Int64
	block := make(chan struct{})
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/list" && lists.Add(1) == 2 {
				<-block // the first refresh waits
			}
			return next(ctx, method, req)
		}
	})
	url := hostile(t, s, nil, func(http.ResponseWriter, rpc) bool { return false })
	reg, set := start(t, map[string]Server{"web": {URL: url}})
	c := set.conns[0]
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	c.refreshTools(sess)
	for deadline := time.Now().Add(30 * time.Second); lists.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refresh never listed")
		}
	}
	objectTools(s, "u")
	for range 50 {
		c.refreshTools(sess)
	}
	close(block)
	for deadline := time.Now().Add(30 * time.Second); !refreshIdle(c); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refreshes never ended")
		}
	}
	// Adding tool u makes the server send its own tools/list_changed
	// (debounced), which may reach the client only after the pending
	// refresh ran: one more refresh, at most.
	if _, ok := reg.Get("mcp.web.u"); !ok || lists.Load() > 4 {
		t.Fatalf("after 51 refreshes asked while one waited: %d tools/list requests (want at most 4: Open's, the waiting one, one after it, and one for the server's own notification); mcp.web.u listed: %v", lists.Load(), ok)
	}
}

// refreshIdle reports whether no refresh of c runs.
func refreshIdle(c *conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.refreshing
}

// TestHTTPSessionGone: an HTTP upstream that restarted has forgotten the
// kernel's session and answers a call on it 404 without running it; the
// call (of a mutating tool) is sent once on a new session, not
// outcome_unknown.
func TestHTTPSessionGone(t *testing.T) {
	var handler atomic.Pointer[http.Handler]
	var adds atomic.Int64
	boot := func() {
		s := mcp.NewServer(&mcp.Implementation{Name: "restarts", Version: "1"}, nil)
		s.AddTool(&mcp.Tool{Name: "add", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				adds.Add(1)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
			})
		var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
		handler.Store(&h)
	}
	boot()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	reg, _ := start(t, map[string]Server{"w": {URL: srv.URL, SideEffect: syscalls.Write}})
	if _, err := call(t, reg, "mcp.w.add"); err != nil {
		t.Fatal(err)
	}
	boot() // the upstream restarts: its sessions are gone
	if out, err := call(t, reg, "mcp.w.add"); err != nil || adds.Load() != 2 {
		t.Fatalf("the call after the restart: %s, %v; the upstream ran add %d times, want 2", out.Result, err, adds.Load())
	}
}

// TestOutputSchemas: an upstream tool's output schema is listed only if it
// is a JSON object schema with "type": "object" within the kernel's
// subset ($schema dropped); any other is left out with the tool kept.
func TestOutputSchemas(t *testing.T) {
	tests := []struct{ tool, schema, want string }{
		{"plain", `{"type":"object","properties":{"sum":{"type":"integer"}},"required":["sum"]}`, `{"properties":{"sum":{"type":"integer"}},"required":["sum"],"type":"object"}`},
		{"dialect", `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`, `{"type":"object"}`},
		{"string", `{"type":"string"}`, ""},
		{"array", `{"type":"array","items":{"type":"string"}}`, ""},
		{"untyped", `{"properties":{"a":{"type":"string"}}}`, ""},
		{"wide", `{"type":"object","properties":{"v":{"anyOf":[{"type":"string"},{"type":"integer"}]}}}`, ""},
		{"bad_properties", `{"type":"object","properties":[]}`, ""},
		{"none", "", ""},
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "outs", Version: "1"}, nil)
	for _, tc := range tests {
		tool := &mcp.Tool{Name: tc.tool, InputSchema: json.RawMessage(`{"type":"object"}`)}
		if tc.schema != "" {
			tool.OutputSchema = json.RawMessage(tc.schema)
		}
		s.AddTool(tool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	}
	url := hostile(t, s, nil, func(http.ResponseWriter, rpc) bool { return false })
	reg, _ := start(t, map[string]Server{"w": {URL: url}})
	for _, tc := range tests {
		e, ok := reg.Get("mcp.w." + tc.tool)
		if !ok {
			t.Errorf("%s: left out of the table", tc.tool)
			continue
		}
		if got := string(e.Def.OutputSchema); got != tc.want {
			t.Errorf("%s: output schema %s listed as %q, want %q", tc.tool, tc.schema, got, tc.want)
		}
	}
}

// TestRefreshBounded: a refresh after tools/list_changed is bounded as a
// connection's listing is; one past a bound fails and leaves the table
// as it was.
func TestRefreshBounded(t *testing.T) {
	url := lister(t, func(n int64, cursor string) *mcp.ListToolsResult {
		if n == 1 {
			return &mcp.ListToolsResult{Tools: someTools("first", 2)}
		}
		return &mcp.ListToolsResult{Tools: someTools(fmt.Sprint("p", n, "_"), 5), NextCursor: "again"}
	})
	reg, set := start(t, map[string]Server{"web": {URL: url}})
	c := set.conns[0]
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	c.refreshTools(sess)
	for deadline := time.Now().Add(30 * time.Second); !refreshIdle(c); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refresh has not ended after 30 s")
		}
	}
	var ids []string
	for _, d := range reg.List() {
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, " ") != "mcp.web.first0 mcp.web.first1" {
		t.Fatalf("table after a refresh past its bounds: %v", ids)
	}
}

// TestSentAfter404: a 404 to a request naming its session takes back only
// the call's own tools/call (the server did not process it); a 404 to a
// later message of the call — its notifications/cancelled after a
// timeout, the session lost after the server ran the call — leaves the
// call sent, so a mutating call is outcome_unknown, never sent again.
func TestSentAfter404(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "session not found", http.StatusNotFound)
	}))
	defer srv.Close()
	tr := sentTransport{base: http.DefaultTransport, limit: 1 << 20}
	post := func(ctx context.Context, body string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Mcp-Session-Id", "S1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ctx, sent := withSent(context.Background())
	post(ctx, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"act"}}`)
	if sent.Load() {
		t.Fatal("a tools/call the server answered 404 (session not found) counts as sent")
	}
	sent.Store(true) // the call went out on a new session, and the server ran it
	post(ctx, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`)
	if !sent.Load() {
		t.Fatal("a 404 to the call's notifications/cancelled took back a call that was sent")
	}
}

// TestRPCErrorMessageCapped: a JSON-RPC error's message is cut as an
// isError answer's text is, before it becomes the failure message (the
// audit record's, the caller's).
func TestRPCErrorMessageCapped(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	objectTools(s, "rpcerr")
	url := hostile(t, s, &mcp.StreamableHTTPOptions{JSONResponse: true}, func(w http.ResponseWriter, m rpc) bool {
		if m.Method != "tools/call" {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"%s"}}`, m.ID, strings.Repeat("x", 1<<20))
		return true
	})
	reg, _ := start(t, map[string]Server{"n": {URL: url, SideEffect: syscalls.None}})
	_, err := call(t, reg, "mcp.n.rpcerr")
	if class, msg := failure(err); class != syscalls.FailUpstreamError || len(msg) > 2*maxErrorText {
		t.Fatalf("class %q, a %d-byte message from a 1 MiB JSON-RPC error", class, len(msg))
	}
}

// TestHTTPAnswerReadAsTheSDK: over HTTP a tools/call answer is checked as
// the SDK reads it, and one the check cannot read is withheld rather
// than passed unchecked: an id written as 1.0 (the SDK takes it for 1),
// a result holding a number a double cannot hold, and a second member
// "Result" beside "result" (the SDK matches names exactly) all end as
// upstream_error, never as the rounded number; an honest answer with a
// lone surrogate escape (a string cut inside an emoji) passes, as the SDK
// reads it.
func TestHTTPAnswerReadAsTheSDK(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	objectTools(s, "float-id", "twice", "plain", "surrogate", "surrogate-big")
	url := hostile(t, s, &mcp.StreamableHTTPOptions{JSONResponse: true}, func(w http.ResponseWriter, m rpc) bool {
		if m.Method != "tools/call" {
			return false
		}
		bad := `{"content":[{"type":"text","text":"n"}],"structuredContent":{"n":9007199254740993}}`
		good := `{"content":[{"type":"text","text":"n"}],"structuredContent":{"n":1}}`
		w.Header().Set("Content-Type", "application/json")
		switch m.Params.Name {
		case "float-id":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s.0,"result":%s}`, m.ID, bad)
		case "twice":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s,"Result":%s}`, m.ID, bad, good)
		case "surrogate-big":
			// A lone surrogate beside a number a double cannot hold: the
			// number is checked all the same.
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"cut \ud83d"}],"structuredContent":{"n":9007199254740993}}}`, m.ID)
		case "surrogate":
			// A string cut inside an emoji, as the TypeScript SDK writes it.
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"cut \ud83d"}],"structuredContent":{"n":1}}}`, m.ID)
		default:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, good)
		}
		return true
	})
	reg, _ := start(t, map[string]Server{"h": {URL: url, SideEffect: syscalls.Read}})
	for _, tool := range []string{"float-id", "twice", "surrogate-big"} {
		out, err := call(t, reg, "mcp.h."+strings.ReplaceAll(tool, "-", "_"))
		if class, _ := failure(err); class != syscalls.FailUpstreamError || strings.Contains(string(out.Result), "9007199254740992") {
			t.Errorf("%s: %s %v", tool, out.Result, err)
		}
	}
	for _, tool := range []string{"plain", "surrogate"} {
		if out, err := call(t, reg, "mcp.h."+tool); err != nil || !strings.Contains(string(out.Result), `"n":1`) {
			t.Errorf("an honest answer (%s): %s %v", tool, out.Result, err)
		}
	}
}
