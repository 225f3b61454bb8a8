package kernel

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/upstream"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// BenchmarkUpstreamEcho: server-everything's echo called through the
// kernel (declared resources, policy, audit, receipt) against the same
// call made directly to another process of the same server with the Go
// SDK's client, and the kernel's own built-in echo (its audited-call
// latency), at 1 and 8 callers. Each reports calls/s and the p50 and p99
// latency of one call in ms.
//
//	go test -run '^$' -bench UpstreamEcho -benchtime 2s ./kernel/
func BenchmarkUpstreamEcho(b *testing.B) {
	cmd := upstreamtest.ReferenceServer(b, "server-everything", "stdio")
	h := newHarness(b, execPolicy(b), withServers(map[string]upstream.Server{
		"ev": {Command: cmd, Declare: "everything"},
	}))
	direct := exec.Command(cmd[0], cmd[1:]...)
	direct.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).
		Connect(context.Background(), &mcp.CommandTransport{Command: direct}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Close()
	ops := []struct {
		name string
		call func() error
	}{
		{"direct", func() error {
			res, err := sess.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "hi"}})
			if err == nil && res.IsError {
				err = fmt.Errorf("isError")
			}
			return err
		}},
		{"kernel", func() error {
			if r := h.invoke("mcp.ev.echo", map[string]any{"message": "hi"}); r.Status != StatusOK {
				return fmt.Errorf("%+v", r.Error)
			}
			return nil
		}},
		{"builtin", func() error {
			if r := h.invoke("echo", map[string]any{"text": "hi"}); r.Status != StatusOK {
				return fmt.Errorf("%+v", r.Error)
			}
			return nil
		}},
	}
	for _, p := range []int{1, 8} {
		for _, op := range ops {
			b.Run(fmt.Sprintf("%s/c=%d", op.name, p), func(b *testing.B) {
				var mu sync.Mutex
				lat := make([]time.Duration, 0, b.N)
				runParallel(b, p, func(int64) {
					t0 := time.Now()
					if err := op.call(); err != nil {
						b.Error(err)
					}
					d := time.Since(t0)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				})
				slices.Sort(lat)
				ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e6 }
				b.ReportMetric(ms(0.5), "p50-ms")
				b.ReportMetric(ms(0.99), "p99-ms")
			})
		}
	}
}
