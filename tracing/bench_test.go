package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/telemetry"
	"github.com/capkernel/capkernel/tracing"
)

// cpuTime is the CPU time, user and system, this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAuditedCallHTTP is the cost of telemetry on an audited call
// over HTTP on loopback (echo: token, policy, ledger record with fsync,
// signed receipt), without any observer and with Prometheus metrics and
// OpenTelemetry traces both on, the spans exported over OTLP/HTTP to a
// receiver on loopback. Calls come from 8 goroutines, each its own
// session, as concurrent agents. cmd/benchreport measures the same over a
// served kernelctl (make bench-report).
func BenchmarkAuditedCallHTTP(b *testing.B) {
	var spans atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		spans.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer rc.Close()
	for _, on := range []bool{false, true} {
		name := "plain"
		if on {
			name = "metrics+traces"
		}
		b.Run(name, func(b *testing.B) {
			var obs kernel.Observer
			var tp interface{ Shutdown(context.Context) error }
			if on {
				reg := prometheus.NewRegistry()
				m := telemetry.NewMetrics(reg)
				p, err := tracing.NewProvider(context.Background(), rc.URL)
				if err != nil {
					b.Fatal(err)
				}
				tp = p
				obs = telemetry.Observers{m, p.Observer()}
			}
			data := filepath.Join(b.TempDir(), "data")
			if _, err := kernel.Init(data); err != nil {
				b.Fatal(err)
			}
			k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data, Observer: obs})
			if err != nil {
				b.Fatal(err)
			}
			defer k.Close()
			if m, ok := obs.(telemetry.Observers); ok {
				m[0].(*telemetry.Metrics).Watch(k)
			}
			tok, err := k.Mint(kernel.TokenRequest{AgentID: "bench", Tools: []string{"echo"}})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(httpapi.New(k))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			var worker atomic.Int64
			b.SetParallelism(4)
			b.ResetTimer()
			cpu0 := cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				env, _ := json.Marshal(map[string]any{
					"tool_id": "echo", "args": map[string]string{"text": "hello"}, "agent_id": "bench",
					"capability_token": tok.Token, "capability_token_id": tok.ID, "policy_hash": k.PolicyHash(),
					"provenance": map[string]string{"session_id": fmt.Sprintf("bench-%d", worker.Add(1))},
				})
				for pb.Next() {
					resp, err := client.Post(srv.URL+"/v1/syscalls", "application/json", bytes.NewReader(env))
					if err != nil {
						b.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if !bytes.Contains(body, []byte(`"status":"ok"`)) {
						b.Errorf("echo: %s", body)
						return
					}
				}
			})
			b.StopTimer()
			// CPU per call (client, server and kernel, one process) is
			// what telemetry adds to; wall time on a shared machine is
			// mostly fsync and neighbours.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			if tp != nil {
				if err := tp.Shutdown(context.Background()); err != nil {
					b.Fatal(err)
				}
				if spans.Load() == 0 {
					b.Fatal("the receiver got no spans")
				}
			}
		})
	}
}
