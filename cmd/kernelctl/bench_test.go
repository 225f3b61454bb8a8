package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

var concurrencies = []int{1, 8, 32, 64}

// load sends b.N requests made by req from c goroutines and reports
// calls/s, p50 and p99 latency.
func load(b *testing.B, c int, client *http.Client, req func() *http.Request, wantStatus int) {
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				resp, err := client.Do(req())
				if err != nil {
					failed.Store(err.Error())
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[i] = time.Since(t0)
				if resp.StatusCode != wantStatus {
					failed.Store(fmt.Sprintf("status %d", resp.StatusCode))
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func loopbackClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}
}

// BenchmarkHTTPFsRead drives a real `kernelctl serve` process (this test
// process is the load generator) with fs.read of a 1 KiB file — token
// verification, policy, audit record and signed receipt on every call.
// The baseline, in the same run, is a bare net/http handler on loopback
// answering 1 KiB: the cost of HTTP itself.
//
//	go test -run='^$' -bench=HTTP -benchtime=2000x ./cmd/kernelctl/
func BenchmarkHTTPFsRead(b *testing.B) {
	dir := b.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "a.txt"), bytes.Repeat([]byte("a"), 1024), 0o644)
	if _, err := kernel.Init(data); err != nil {
		b.Fatal(err)
	}
	s := startServer(b, data)
	admin, _ := readSecret(filepath.Join(data, kernel.AdminFile))
	ctx := context.Background()
	c := &httpapi.Client{BaseURL: s.url, Credential: admin}
	tok, err := c.Mint(ctx, kernel.TokenRequest{AgentID: "bench", Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		b.Fatal(err)
	}
	ph, _ := c.PolicyHash(ctx)
	body := envelope(agentToken{MintedToken: *tok}, ph, "fs.read", map[string]any{"path": "a.txt"}, "")
	client := loopbackClient()
	for _, n := range concurrencies {
		b.Run(fmt.Sprintf("kernel/c=%d", n), func(b *testing.B) {
			load(b, n, client, func() *http.Request {
				r, _ := http.NewRequest(http.MethodPost, s.url+"/v1/syscalls", bytes.NewReader(body))
				return r
			}, http.StatusOK)
		})
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(strings.Repeat("a", 1024))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(payload)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	for _, n := range concurrencies {
		b.Run(fmt.Sprintf("bare-http/c=%d", n), func(b *testing.B) {
			load(b, n, client, func() *http.Request {
				r, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/", bytes.NewReader(body))
				return r
			}, http.StatusOK)
		})
	}
}
