package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCallHTTP: audited echo calls over real HTTP on loopback from 32
// concurrent clients, reporting the process's CPU per call (server and
// clients: both run here).
//
//	go test -run '^$' -bench CallHTTP ./httpapi/
func BenchmarkCallHTTP(b *testing.B) {
	f := newFixture(b)
	env := f.envelope(b)
	const p = 32
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: p}}
	defer client.CloseIdleConnections()
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpu()
	for range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				resp, err := client.Post(f.srv.URL+"/v1/syscalls", "application/json", bytes.NewReader(env))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	b.ReportMetric(float64((cpu()-cpu0).Microseconds())/float64(b.N), "cpu-µs/call")
}
