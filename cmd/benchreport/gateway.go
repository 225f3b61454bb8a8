package main

// The MCP gateway against the kernel's own HTTP API (issue 16's bench):
// one kernel, served in a process of its own with both front ends, as
// `kernelctl serve` serves the HTTP API and `kernelctl mcp --http --data`
// the streamable-HTTP MCP endpoint, asked the same audited echo call
// through each at c=1 and c=8.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/syscalls"
)

// Targets of the gateway comparison.
const (
	gatewayKernel = "kernel HTTP API echo"
	gatewayMCP    = "MCP gateway tools/call echo"
)

// gatewayConcurrencies are the concurrencies compared, gatewayRounds the
// alternating rounds at each (the ledger grows and a shared machine's
// load drifts; alternating gives both targets the same share of either).
var gatewayConcurrencies = []int{1, 8}

const gatewayRounds = 2

// gatewayGoal is issue 16's bound on the gateway's throughput at c=8 as a
// fraction of the kernel's HTTP API: kernel calls/s ÷ gateway calls/s.
const gatewayGoal = 1.3

// gatewayServer is the ready line the server process prints (JSON): its
// two front ends and the token the calls are made under.
type gatewayServer struct {
	API        string `json:"api"` // base URL of the HTTP API
	MCP        string `json:"mcp"` // URL of the streamable-HTTP MCP endpoint
	Token      string `json:"token"`
	TokenID    string `json:"token_id"`
	AgentID    string `json:"agent_id"`
	PolicyHash string `json:"policy_hash"`
}

// kernelInvoker runs envelopes in the server process's kernel, as
// `kernelctl mcp --data` does.
type kernelInvoker struct{ k *kernel.Kernel }

func (i kernelInvoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return i.k.InvokeJSON(ctx, env), nil
}

// serveGateway is the server process (benchreport -serve-gateway DIR):
// it makes a kernel in data, mints an echo token, serves the HTTP API
// and the MCP gateway for that token on loopback (and a profiler on
// pprofAddr unless ""), prints the ready line and serves until stdin
// closes.
func serveGateway(data, pprofAddr string) error {
	// As kernelctl serve does (serverGCPercent): both front ends share it.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if _, err := kernel.Init(data); err != nil {
		return err
	}
	ctx := context.Background()
	k, err := kernel.Open(ctx, kernel.Config{DataDir: data})
	if err != nil {
		return err
	}
	defer k.Close()
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "bench", Tools: []string{"echo"}})
	if err != nil {
		return err
	}
	defs, err := k.Tools(tok.Token, syscalls.FormatMCP)
	if err != nil {
		return err
	}
	// The gateway as kernelctl mcp makes it for a kernel in its process.
	cfg := mcpgateway.Config{Invoker: kernelInvoker{k}, Token: tok.Token, TokenID: tok.ID, AgentID: tok.AgentID,
		PolicyHash: k.PolicyHash(), StdioSession: "unused", Version: "bench", Confirmer: mcpgateway.ConfirmerOf(k)}
	if err := json.Unmarshal(defs, &cfg.Tools); err != nil {
		return err
	}
	g := mcpgateway.New(cfg)
	ready := gatewayServer{Token: tok.Token, TokenID: tok.ID, AgentID: tok.AgentID, PolicyHash: k.PolicyHash()}
	for _, s := range []struct {
		url *string
		h   http.Handler
	}{{&ready.API, httpapi.New(k)}, {&ready.MCP, g.HTTPHandler(mcpgateway.HTTPOptions{})}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		*s.url = "http://" + ln.Addr().String()
		srv := &http.Server{Handler: s.h, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
	}
	if pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go http.ListenAndServe(pprofAddr, mux)
	}
	line, err := json.Marshal(ready)
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", line)
	// Serve until the load generator closes stdin (or kills this process).
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// measureGateway starts the server process and measures the same echo
// call on the HTTP API (POST /v1/syscalls) and through the MCP gateway
// (tools/call), in alternating rounds, each worker its own session; with
// profile set, it saves a CPU profile of the server during the gateway's
// first round at c=8.
func (r *report) measureGateway(tmp, profile string, d time.Duration) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"-serve-gateway", filepath.Join(tmp, "gateway-data")}
	var pprofAddr string
	if profile != "" {
		if pprofAddr, err = freePort(); err != nil {
			return err
		}
		args = append(args, "-gateway-pprof", pprofAddr)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid}
	defer p.stop()
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	var srv gatewayServer
	if err != nil || json.Unmarshal(line, &srv) != nil || srv.MCP == "" {
		return fmt.Errorf("benchreport -serve-gateway: no ready line (%q, %v)", line, err)
	}

	// The MCP sessions are opened by the Go SDK's client (initialize,
	// notifications/initialized, its standing GET stream); the calls are
	// the POSTs that client sends for CallTool (mcpCall, the same bytes
	// on the wire: TestMCPCallOnTheWire), so that the load generator's
	// own cost is alike on both sides.
	ctx := context.Background()
	n := slices.Max(gatewayConcurrencies)
	sessions := make([]*mcp.ClientSession, n)
	for w := range sessions {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "benchreport", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: srv.MCP, MaxRetries: -1}, nil)
		if err != nil {
			return fmt.Errorf("MCP session %d: %w", w, err)
		}
		defer cs.Close()
		sessions[w] = cs
	}
	// Every call has its own idempotency key on both sides (the gateway
	// derives one from the session and JSON-RPC id), so none is a replay:
	// the per-worker counters run on over the rounds.
	seq := make([]atomic.Int64, n)
	mcpTarget := target{name: gatewayMCP, url: srv.MCP, pid: p.pid, want: []byte(`"text":"{\"text\":\"hello\"}"`),
		header: func(w int) http.Header {
			h, _ := mcpCall(sessions[w], 0)
			return h
		},
		body: func(w, _ int) []byte {
			_, b := mcpCall(sessions[w], 1000+seq[w].Add(1))
			return b
		}}
	kernelTarget := target{name: gatewayKernel, url: srv.API + "/v1/syscalls", pid: p.pid, want: []byte(`"status":"ok"`),
		body: func(w, _ int) []byte {
			b, _ := json.Marshal(map[string]any{
				"tool_id": "echo", "args": map[string]string{"text": "hello"}, "agent_id": srv.AgentID,
				"capability_token": srv.Token, "capability_token_id": srv.TokenID, "policy_hash": srv.PolicyHash,
				"idempotency_key": fmt.Sprintf("bench:%d:%d", w, seq[w].Add(1)),
				"provenance":      map[string]any{"session_id": fmt.Sprintf("bench-%d", w), "source": "http"},
			})
			return b
		}}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}
	points, err := alternate(client, []target{kernelTarget, mcpTarget}, gatewayConcurrencies, gatewayRounds, time.Second, d, func(t target, c, round int) func() error {
		if profile == "" || t.name != gatewayMCP || c != 8 || round != 0 {
			return func() error { return nil }
		}
		profiled := make(chan error, 1)
		go func() { profiled <- fetchProfile(pprofAddr, profile, d) }()
		return func() error { return <-profiled }
	})
	if err != nil {
		return err
	}
	r.Gateway = append(r.Gateway, points...)
	return nil
}

// mcpCall is the HTTP request the Go SDK's client sends for
// CallTool(echo {"text":"hello"}) in session cs, with JSON-RPC id id: its
// headers (beside Content-Type) and body.
func mcpCall(cs *mcp.ClientSession, id int64) (http.Header, []byte) {
	h := http.Header{}
	h.Set("Accept", "application/json, text/event-stream")
	h.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	h.Set("Mcp-Session-Id", cs.ID())
	return h, []byte(`{"jsonrpc":"2.0","id":` + strconv.FormatInt(id, 10) + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`)
}

// gatewayRatio is the kernel's throughput over the gateway's at c, with
// both targets' rounds taken together.
func (r *report) gatewayRatio(c int) (float64, bool) {
	k, _, _, _, ok1 := sumRounds(r.Gateway, gatewayKernel, c)
	m, _, _, _, ok2 := sumRounds(r.Gateway, gatewayMCP, c)
	if !ok1 || !ok2 || m == 0 {
		return 0, false
	}
	return k / m, true
}

// gatewayGoalLine is the goals table's line for issue 16's figure.
func (r *report) gatewayGoalLine() goal {
	text := fmt.Sprintf("MCP gateway `tools/call` echo over streamable HTTP ≤ %.1f× the kernel's HTTP API (calls/s, c=8)", gatewayGoal)
	q, ok := r.gatewayRatio(8)
	if !ok {
		return goal{text, "not measured", "n/a"}
	}
	return goal{text, fmt.Sprintf("%.2f×", q), yes(q <= gatewayGoal)}
}

// gatewayMarkdown is the report's section on the MCP gateway.
func (r *report) gatewayMarkdown(w func(string, ...any)) {
	if len(r.Gateway) == 0 {
		return
	}
	w("")
	w("## 8. MCP gateway against the kernel's HTTP API")
	w("")
	w("One kernel in a server process of its own serves both front ends on loopback: the HTTP API (`httpapi`, as `kernelctl serve`) and the streamable-HTTP MCP endpoint (`mcpgateway`, as `kernelctl mcp --http --data`), for one token, with `kernelctl serve`'s GC target. Each is asked the same audited `echo {\"text\":\"hello\"}` with a fresh idempotency key, closed loop, each worker its own session: `POST /v1/syscalls` with the call envelope, and `tools/call` in an MCP session the Go SDK's client opened, sent as the very request that client sends (headers and body; `TestMCPCallOnTheWire`), answered as an SSE stream. %d alternating rounds per concurrency, taken together (throughput and CPU over all rounds, latency the median of the rounds' p50s and, apart, of their p99s). Ratio = gateway ÷ HTTP API (calls/s: HTTP API ÷ gateway). Goal: ≤ %.1f× at c=8.", gatewayRounds, gatewayGoal)
	w("")
	w("| c | calls/s API / MCP | p50 µs API / MCP | p99 µs API / MCP | server CPU µs/call API / MCP | ratio calls/s | ratio p50 | ratio CPU | ≤ %.1f× |", gatewayGoal)
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, c := range gatewayConcurrencies {
		rk, p50k, p99k, cpuk, ok1 := sumRounds(r.Gateway, gatewayKernel, c)
		rm, p50m, p99m, cpum, ok2 := sumRounds(r.Gateway, gatewayMCP, c)
		if !ok1 || !ok2 || rm == 0 || p50k == 0 || cpuk == 0 {
			continue
		}
		q := rk / rm
		w("| %d | %s / %s | %s / %s | %s / %s | %s / %s | %.2f× | %.2f× | %.2f× | %s |", c, num(rk), num(rm), µs(p50k), µs(p50m), µs(p99k), µs(p99m), µs(cpuk), µs(cpum),
			q, float64(p50m)/float64(p50k), float64(cpum)/float64(cpuk), yes(q <= gatewayGoal))
	}
}
