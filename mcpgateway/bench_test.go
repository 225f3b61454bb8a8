package mcpgateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// BenchmarkEcho compares an echo call through the gateway's streamable
// HTTP (the Go SDK client, one MCP session per client, the kernel in the
// gateway's process as under kernelctl mcp --data) with the same call on
// the kernel's own HTTP API (POST /v1/syscalls), both on loopback, with 1
// and 8 clients calling at once (c1, c8). ns/op is wall time over calls
// (throughput); p50-ms the median latency of one call.
func BenchmarkEcho(b *testing.B) {
	for _, c := range []int{1, 8} {
		b.Run(fmt.Sprintf("c%d", c), func(b *testing.B) { benchEcho(b, c) })
	}
}

// Each run has a kernel of its own in a fresh data dir: a call's cost
// grows with the ledger, so sharing one would charge the later side for
// the earlier side's calls.
func benchEcho(b *testing.B, concurrency int) {
	ctx := context.Background()
	b.Run("kernel-http", func(b *testing.B) {
		k, _ := newTestGateway(b, captoken.Capability{Tools: []string{"echo"}}, Config{})
		tok, err := k.Mint(kernel.TokenRequest{AgentID: "agent-1", Tools: []string{"echo"}})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(httpapi.New(k))
		defer srv.Close()
		c := &httpapi.Client{BaseURL: srv.URL}
		var seq atomic.Int64
		runConcurrent(b, concurrency, func(int) error {
			env, _ := json.Marshal(kernel.Envelope{ToolID: "echo", Args: json.RawMessage(`{"text":"hi"}`), AgentID: "agent-1",
				CapabilityToken: tok.Token, CapabilityTokenID: tok.ID, PolicyHash: k.PolicyHash(),
				IdempotencyKey: fmt.Sprintf("bench:%d", seq.Add(1))})
			res, _, err := c.Call(ctx, env)
			if err == nil && res.Status != kernel.StatusOK {
				err = fmt.Errorf("echo: %+v", res.Error)
			}
			return err
		})
	})

	b.Run("mcp-http", func(b *testing.B) {
		_, g := newTestGateway(b, captoken.Capability{Tools: []string{"echo"}}, Config{})
		srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
		defer srv.Close()
		sessions := make([]*mcp.ClientSession, concurrency)
		for i := range sessions {
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			sessions[i] = cs
		}
		runConcurrent(b, concurrency, func(w int) error {
			r, err := sessions[w].CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
			if err == nil && r.IsError {
				err = fmt.Errorf("echo: %v", r.Content[0])
			}
			return err
		})
	})
}

// runConcurrent makes b.N calls from concurrency workers and reports
// the median latency of one call.
func runConcurrent(b *testing.B, concurrency int, call func(worker int) error) {
	var next atomic.Int64
	lat := make([][]time.Duration, concurrency)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				if err := call(w); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	}
}
