package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// TestMain runs the test binary as the upstream MCP test server over
// stdio when CAPK_MCP_STDIO is set. With CAPK_MCP_ONCE naming a file, the
// server starts only if the file does not exist yet, and creates it: a
// restarted server then fails, as a broken upstream would.
func TestMain(m *testing.M) {
	if os.Getenv("CAPK_MCP_STDIO") == "" {
		os.Exit(m.Run())
	}
	if once := os.Getenv("CAPK_MCP_ONCE"); once != "" {
		f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "upstream test server: already started once:", err)
			os.Exit(2)
		}
		f.Close()
	}
	if err := upstreamtest.New().MCP.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "upstream test server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// stdioServer configures the test binary as an upstream over stdio.
func stdioServer(env map[string]string) upstream.Server {
	e := map[string]string{"CAPK_MCP_STDIO": "1"}
	for k, v := range env {
		e[k] = v
	}
	return upstream.Server{Command: []string{os.Args[0]}, Env: e}
}

// httpServer serves a new test server over streamable HTTP on loopback.
func httpServer(t *testing.T) (*upstreamtest.Server, string) {
	t.Helper()
	s := upstreamtest.New()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.MCP }, nil))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// withServers configures servers; one without declarations gets one that
// declares every tool to touch nothing the kernel governs (the test
// server's tools only compute), so the policy decides them by class.
func withServers(servers map[string]upstream.Server) func(*Config) {
	for n, s := range servers {
		if s.Resources == nil && s.Declare == "" {
			s.Resources = []upstream.Declaration{{Tools: "*"}}
			servers[n] = s
		}
	}
	return func(c *Config) { c.MCPServers = servers }
}

// waitFor polls cond until it holds; a condition that never comes fails
// the test after a generous bound (no timing is asserted).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMCPUpstreamTools(t *testing.T) {
	_, url := httpServer(t)
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"std": stdioServer(nil),
		"web": {URL: url, Tools: map[string]syscalls.SideEffect{"add": "NONE"}},
	}))
	for _, srv := range []string{"std", "web"} {
		t.Run(srv, func(t *testing.T) {
			want := map[string]string{"add": "EXECUTE", "fail": "EXECUTE", "slow": "EXECUTE", "list_items": "EXECUTE", "exit": "EXECUTE", "big": "EXECUTE", "number": "EXECUTE"}
			if srv == "web" {
				want["add"] = "NONE"
			}
			got := map[string]string{}
			for _, d := range h.k.Registry().List() {
				if name, ok := strings.CutPrefix(d.ID, "mcp."+srv+"."); ok {
					got[name] = string(d.SideEffect)
				}
			}
			// wide's schema (anyOf) is outside the subset: left out.
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("tools %v, want %v", got, want)
			}
			before := h.headSize()
			r := h.invoke("mcp."+srv+".add", map[string]int{"a": 2, "b": 40}, key("add-"+srv))
			mustOK(t, r)
			var out struct {
				Content    []struct{ Type, Text string }
				Structured struct{ Sum int } `json:"structuredContent"`
			}
			if err := json.Unmarshal(r.Result, &out); err != nil || len(out.Content) != 1 || out.Content[0].Text != "42" || out.Structured.Sum != 42 {
				t.Fatalf("result %s (%v)", r.Result, err)
			}
			a := h.audits(before)
			if len(a) != 1 || a[0].ToolID != "mcp."+srv+".add" || a[0].ResultHash != r.ResultHash || a[0].Status != StatusOK {
				t.Fatalf("audit %+v", a)
			}
			if rc := verifyReceipt(t, h.k, r); rc.ToolID != "mcp."+srv+".add" || rc.ResultHash != r.ResultHash {
				t.Fatalf("receipt %+v", rc)
			}
			if r := h.invoke("mcp."+srv+".list_items", map[string]any{}, key("list-"+srv)); r.Status != StatusOK || !strings.Contains(string(r.Result), `a\nb`) {
				t.Fatalf("list_items %+v", r)
			}
		})
	}
	// EXECUTE runs as a transaction: an idempotency key is required.
	if r := h.invoke("mcp.std.fail", map[string]any{}); errClass(r) != ErrIdempotencyKeyRequired {
		t.Fatalf("no key: %+v", r.Error)
	}
	mustVerify(t, h.k.Inspector())
}

func TestMCPUpstreamGoverned(t *testing.T) {
	up, url := httpServer(t)
	servers := withServers(map[string]upstream.Server{"web": {URL: url}, "std": stdioServer(nil)})
	h := newHarness(t, execPolicy(t), servers)
	tests := []struct {
		name  string
		tools []string
		tool  string
		class string
	}{
		{"server glob allows", []string{"mcp.web.*"}, "mcp.web.add", ""},
		{"exact id allows", []string{"mcp.web.add"}, "mcp.web.add", ""},
		{"server glob denies another server", []string{"mcp.web.*"}, "mcp.std.add", ErrPermissionDenied},
		{"exact id denies a sibling", []string{"mcp.web.fail"}, "mcp.web.add", ErrPermissionDenied},
		{"mcp glob allows every server", []string{"mcp.*"}, "mcp.std.add", ""},
		{"built-in glob denies", []string{"fs.*"}, "mcp.web.add", ErrPermissionDenied},
		{"unknown tool", []string{"*"}, "mcp.web.nope", ErrToolNotFound},
		{"schema refuses", []string{"*"}, "mcp.web.add", ErrInvalidArgs},
		{"upstream isError", []string{"*"}, "mcp.web.fail", ErrUpstreamError},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: tc.tools})
			args := any(map[string]int{"a": 1, "b": 2})
			if tc.class == ErrInvalidArgs {
				args = map[string]any{"a": "one", "b": 2}
			}
			if tc.tool == "mcp.web.fail" {
				args = map[string]any{}
			}
			sent := up.Calls("add") + up.Calls("fail")
			before := h.headSize()
			r := h.invoke(tc.tool, args, key(fmt.Sprint("gov-", i)))
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			a := h.audits(before)
			if len(a) != 1 || a[0].ToolID != tc.tool || a[0].ErrorClass != tc.class || r.Receipt == nil {
				t.Fatalf("audit %+v", a)
			}
			reached := up.Calls("add") + up.Calls("fail") - sent
			wantReached := 0
			if tc.class == "" && strings.HasPrefix(tc.tool, "mcp.web.") || tc.class == ErrUpstreamError {
				wantReached = 1
			}
			if reached != wantReached {
				t.Fatalf("the web upstream got %d calls, want %d", reached, wantReached)
			}
			if tc.class == ErrUpstreamError && (!strings.Contains(r.Error.Message, "boom") || r.TxOutcome != RolledBack) {
				t.Fatalf("isError mapping: %+v %s", r.Error, r.TxOutcome)
			}
		})
	}

	// Under the default policy an EXECUTE upstream tool waits for an
	// approver (soft_gate); none comes, and nothing is sent upstream.
	h.k.Close()
	h.open(servers, func(c *Config) { c.ApprovalTimeout = time.Millisecond })
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"mcp.web.*"}})
	sent := up.Calls("add")
	r := h.invoke("mcp.web.add", map[string]int{"a": 1, "b": 2}, key("gated"))
	if errClass(r) != ErrApprovalTimeout || r.AutonomyMode != "soft_gate" || up.Calls("add") != sent {
		t.Fatalf("default policy: %+v mode %s, upstream calls %d→%d", r.Error, r.AutonomyMode, sent, up.Calls("add"))
	}
}

func TestMCPUpstreamListChanged(t *testing.T) {
	up, url := httpServer(t)
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{"web": {URL: url}}))
	old, ok := h.k.Registry().Get("mcp.web.slow")
	if !ok {
		t.Fatal("mcp.web.slow is not registered")
	}
	done := make(chan *Result, 1)
	go func() { done <- h.invoke("mcp.web.slow", map[string]string{"id": "a"}, key("slow-a")) }()
	if id := <-up.Started(); id != "a" {
		t.Fatalf("started %q", id)
	}
	// While the call runs upstream, the server drops slow and adds slower:
	// tools/list_changed swaps the table.
	up.MCP.RemoveTools("slow")
	up.AddSlow("slower")
	waitFor(t, "mcp.web.slower registered", func() bool { _, ok := h.k.Registry().Get("mcp.web.slower"); return ok })
	if _, ok := h.k.Registry().Get("mcp.web.slow"); ok {
		t.Fatal("mcp.web.slow is still registered after the swap")
	}
	if _, ok := h.k.Registry().Get("mcp.web.add"); !ok {
		t.Fatal("mcp.web.add went missing in the swap")
	}
	// A new call sees the new table.
	if r := h.invoke("mcp.web.slow", map[string]string{"id": "b"}, key("slow-b")); errClass(r) != ErrToolNotFound {
		t.Fatalf("new call to a removed tool: %+v", r.Error)
	}
	// The call in flight finishes against the entry it resolved.
	up.Release("a")
	r := <-done
	mustOK(t, r)
	if !strings.Contains(string(r.Result), "slow a done") {
		t.Fatalf("in-flight result %s", r.Result)
	}
	if old.Def.ID != "mcp.web.slow" {
		t.Fatalf("the old entry changed: %+v", old.Def)
	}
	go func() { done <- h.invoke("mcp.web.slower", map[string]string{"id": "c"}, key("slower-c")) }()
	<-up.Started()
	up.Release("c")
	if r := <-done; r.Status != StatusOK || !strings.Contains(string(r.Result), "slower c done") {
		t.Fatalf("the new tool: %+v %s", r.Error, r.Result)
	}
}

func TestMCPUpstreamDies(t *testing.T) {
	once := filepath.Join(t.TempDir(), "started")
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{"std": stdioServer(map[string]string{"CAPK_MCP_ONCE": once})}))
	mustOK(t, h.invoke("mcp.std.add", map[string]int{"a": 1, "b": 1}, key("before")))
	// The process exits while answering: the call was sent, its outcome
	// is unknown, and a repeat is never re-sent.
	r := h.invoke("mcp.std.exit", map[string]any{}, key("exit"))
	if errClass(r) != ErrOutcomeUnknown {
		t.Fatalf("call during the upstream's death: %+v", r.Error)
	}
	if again := h.invoke("mcp.std.exit", map[string]any{}, key("exit")); errClass(again) != ErrOutcomeUnknown || !again.Replayed {
		t.Fatalf("repeat: %+v replayed %v", again.Error, again.Replayed)
	}
	// The server cannot be restarted (it starts once): a clear class,
	// audited, and nothing was sent.
	before := h.headSize()
	r = h.invoke("mcp.std.add", map[string]int{"a": 1, "b": 1}, key("after"))
	if errClass(r) != ErrUpstreamUnavailable || !strings.Contains(r.Error.Message, "mcp server std") {
		t.Fatalf("call to a dead upstream: %+v", r.Error)
	}
	if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != ErrUpstreamUnavailable {
		t.Fatalf("audit %+v", a)
	}
	// Once it can start again, the next call reconnects; the refused
	// call's key was not consumed (nothing was sent), so it runs now.
	if err := os.Remove(once); err != nil {
		t.Fatal(err)
	}
	if r := h.invoke("mcp.std.add", map[string]int{"a": 1, "b": 1}, key("after")); r.Status != StatusOK || r.Replayed {
		t.Fatalf("the refused call again: %+v replayed %v", r.Error, r.Replayed)
	}
	mustVerify(t, h.k.Inspector())
}

func TestMCPUpstreamCrash(t *testing.T) {
	h := newExecHarness(t)
	up, url := httpServer(t)
	// The server comes from kernel.json, as a user configures it.
	path := filepath.Join(h.data, ConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	s["mcp_servers"] = map[string]any{"web": map[string]any{"url": url, "resources": []any{map[string]any{"tools": "*"}}}} // EXECUTE, the default
	if b, err = json.Marshal(s); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"mcp.web.*"}})
	args := json.RawMessage(`{"id":"pay"}`)
	env := Envelope{ToolID: "mcp.web.slow", AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
		IdempotencyKey: "pay-1", OperationID: newID(), Args: args}
	runCrashChild(t, h, env, "", "", func(p *os.Process) {
		select {
		case <-up.Started():
		case <-time.After(60 * time.Second):
			t.Error("the upstream call never arrived")
		}
		p.Kill()
	})
	h.open(execPolicy(t))
	if len(h.k.Recovered.Unknown) != 1 || h.k.Recovered.Unknown[0].OperationID != env.OperationID {
		t.Fatalf("recovery %+v", h.k.Recovered)
	}
	a := h.audits(0)
	if last := a[len(a)-1]; last.OperationID != env.OperationID || last.ErrorClass != ErrOutcomeUnknown {
		t.Fatalf("recovery audit %+v", last)
	}
	for range 2 {
		r := h.invoke("mcp.web.slow", nil, key("pay-1"), func(e *Envelope) { e.Args = args })
		if errClass(r) != ErrOutcomeUnknown || !r.Replayed || r.OperationID != env.OperationID {
			t.Fatalf("replay %+v", r)
		}
	}
	if n := up.Calls("slow"); n != 1 {
		t.Fatalf("the upstream got the call %d times", n)
	}
	if n := len(h.entries(ledger.KindAudit, 0)); n == 0 {
		t.Fatal("no audit records")
	}
}

func TestMCPUpstreamConfig(t *testing.T) {
	tests := []struct {
		name    string
		servers map[string]upstream.Server
		want    string
	}{
		{"bad name", map[string]upstream.Server{"Web": {URL: "http://127.0.0.1:1/"}}, "the name must be"},
		{"neither command nor url", map[string]upstream.Server{"web": {}}, "exactly one of command and url"},
		{"both", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Command: []string{"x"}}}, "exactly one of command and url"},
		{"bad class", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", SideEffect: "LOUD"}}, `side_effect "LOUD"`},
		{"unreachable", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/"}}, "mcp server web: connect"},
		{"declaration: a pointer that is no pointer", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Resources: []upstream.Declaration{
			{Tools: "read_*", Args: []upstream.Arg{{Pointer: "path", Kind: "fs"}}}}}}, `mcp server web: resources[0] (tools "read_*"), args[0]: pointer "path" is not a JSON pointer`},
		{"declaration: an unknown kind", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Resources: []upstream.Declaration{
			{Tools: "*"}, {Tools: "x", Args: []upstream.Arg{{Pointer: "/p", Kind: "disk"}}}}}}, `mcp server web: resources[1] (tools "x"), args[0]: kind "disk"`},
		{"declaration: a bad mode", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Resources: []upstream.Declaration{
			{Tools: "x", Args: []upstream.Arg{{Pointer: "/p", Kind: "fs", Mode: "w"}}}}}}, `args[0]: mode "w" is not r or rw`},
		{"declaration: a bad glob", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Resources: []upstream.Declaration{{Tools: "[x"}}}}, `resources[0]: tools "[x"`},
		{"declare: unknown", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Declare: "github"}}, `declare "github" is not one of the shipped declarations (everything, fetch, filesystem, git, memory)`},
		{"paths: relative", map[string]upstream.Server{"web": {URL: "http://127.0.0.1:1/", Paths: []upstream.PathMap{{Root: "ws", Upstream: "/data"}}}}, `paths[0]: root "ws"`},
		{"command missing", map[string]upstream.Server{"std": {Command: []string{filepath.Join(t.TempDir(), "none")}}}, "mcp server std: connect"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if _, err := Init(dir); err != nil {
				t.Fatal(err)
			}
			k, err := Open(context.Background(), Config{DataDir: dir, MCPServers: tc.servers})
			if err == nil {
				k.Close()
				t.Fatal("Open accepted the configuration")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
			// The data dir is not left locked.
			k, err = Open(context.Background(), Config{DataDir: dir, MCPServers: map[string]upstream.Server{}})
			if err != nil {
				t.Fatal(err)
			}
			k.Close()
		})
	}
}

// TestMCPUpstreamTimeout: a mutating upstream call that runs past its
// bound was sent, so its outcome is unknown; a READ one is a timeout.
func TestMCPUpstreamTimeout(t *testing.T) {
	up, url := httpServer(t)
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"web":  {URL: url, Timeout: upstream.Duration(300 * time.Millisecond)},
		"webr": {URL: url, SideEffect: syscalls.Read, Timeout: upstream.Duration(300 * time.Millisecond)},
	}))
	tests := []struct {
		tool, class, tx string
	}{
		{"mcp.web.slow", ErrOutcomeUnknown, RolledBack},
		{"mcp.webr.slow", ErrTimeout, ""},
	}
	for _, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			sent := up.Calls("slow")
			r := h.invoke(tc.tool, map[string]string{"id": "never-" + tc.tool}, key("t-"+tc.tool))
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if up.Calls("slow") != sent+1 {
				t.Fatal("the call did not reach the upstream")
			}
			if tc.class == ErrOutcomeUnknown {
				again := h.invoke(tc.tool, map[string]string{"id": "never-" + tc.tool}, key("t-"+tc.tool))
				if errClass(again) != ErrOutcomeUnknown || !again.Replayed || up.Calls("slow") != sent+1 {
					t.Fatalf("repeat %+v replayed %v, upstream calls %d", again.Error, again.Replayed, up.Calls("slow")-sent)
				}
			}
		})
	}
}

// TestMCPUpstreamResultCap: a result over max_result_bytes, over stdio
// (under the framer's limit: checked once decoded; over it: replaced by
// the framer) and over HTTP, is an audited error naming its size and the
// cap — upstream_error for a READ tool, outcome_unknown for a mutating
// one, which answered and so may have acted — and the next call on the
// same server works.
// TestMCPUpstreamExactNumbers: a result holding a number that a double
// cannot hold (the SDK would hand on 9007199254740993 as
// 9007199254740992) is withheld, over stdio and HTTP, for a reading tool
// (upstream_error) and a mutating one (outcome_unknown: it answered, so
// it may have acted); a number a double holds passes through as the
// decimal it is.
func TestMCPUpstreamExactNumbers(t *testing.T) {
	_, url := httpServer(t)
	read := map[string]syscalls.SideEffect{"number": syscalls.Read}
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"stdr": func() upstream.Server { s := stdioServer(nil); s.Tools = read; return s }(),
		"stdw": stdioServer(nil),
		"webr": {URL: url, Tools: read},
		"webw": {URL: url},
	}))
	for _, srv := range []string{"stdr", "stdw", "webr", "webw"} {
		t.Run(srv, func(t *testing.T) {
			class := ErrUpstreamError
			if strings.HasSuffix(srv, "w") {
				class = ErrOutcomeUnknown
			}
			for i, text := range []string{"9007199254740993", "[1, 12345678901234567890]", "0.10000000000000000001"} {
				before := h.headSize()
				r := h.invoke("mcp."+srv+".number", map[string]string{"text": text}, key(fmt.Sprint(srv, "-inexact-", i)))
				if errClass(r) != class || !strings.Contains(r.Error.Message, "is not the decimal its canonical form") || r.Result != nil {
					t.Fatalf("%s: class %q, want %q: %+v %s", text, errClass(r), class, r.Error, r.Result)
				}
				if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != class {
					t.Fatalf("audit %+v", a)
				}
			}
			for i, text := range []string{"9007199254740992", "1.50", "-0", "1e300", "[2, 0.1]"} {
				r := h.invoke("mcp."+srv+".number", map[string]string{"text": text}, key(fmt.Sprint(srv, "-exact-", i)))
				mustOK(t, r)
				var out struct {
					N json.RawMessage `json:"n"`
				}
				if err := json.Unmarshal(mustMember(t, r.Result, "structuredContent"), &out); err != nil {
					t.Fatal(err)
				}
				got, _ := jcs.CanonicalizeExact(out.N)
				if want, _ := jcs.CanonicalizeExact([]byte(text)); string(got) != string(want) {
					t.Errorf("%s came as %s", text, out.N)
				}
			}
		})
	}
}

// mustMember returns member name of the JSON object b.
func mustMember(t *testing.T, b []byte, name string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m[name] == nil {
		t.Fatalf("no %s in %s (%v)", name, b, err)
	}
	return m[name]
}

func TestMCPUpstreamResultCap(t *testing.T) {
	const max = 64 << 10
	_, url := httpServer(t)
	read := map[string]syscalls.SideEffect{"big": syscalls.Read}
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"stdr": func() upstream.Server { s := stdioServer(nil); s.MaxResultBytes, s.Tools = max, read; return s }(),
		"stdw": func() upstream.Server { s := stdioServer(nil); s.MaxResultBytes = max; return s }(),
		"webr": {URL: url, MaxResultBytes: max, Tools: read},
		"webw": {URL: url, MaxResultBytes: max},
	}))
	for _, srv := range []string{"stdr", "stdw", "webr", "webw"} {
		for _, n := range []int{max + 10<<10, 4 * max} {
			t.Run(fmt.Sprint(srv, "/", n), func(t *testing.T) {
				class := ErrUpstreamError
				if strings.HasSuffix(srv, "w") {
					class = ErrOutcomeUnknown
				}
				before := h.headSize()
				r := h.invoke("mcp."+srv+".big", map[string]int{"n": n}, key(fmt.Sprint(srv, n)))
				if errClass(r) != class || !strings.Contains(r.Error.Message, fmt.Sprintf("bytes; the limit is %d bytes (max_result_bytes)", max)) {
					t.Fatalf("class %q, want %q: %+v", errClass(r), class, r.Error)
				}
				if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != class {
					t.Fatalf("audit %+v", a)
				}
				mustOK(t, h.invoke("mcp."+srv+".big", map[string]int{"n": max - 1<<10}, key(fmt.Sprint(srv, n, "-fits"))))
			})
		}
	}
}
