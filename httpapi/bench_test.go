package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// BenchmarkCallHTTP: audited calls (echo, and fs.read of a 1 KiB file) over
// real HTTP on loopback from p concurrent clients, each its own session,
// as cmd/benchreport drives kernelctl serve. The server is this test binary
// in a process of its own (benchServer: a real kernel behind a real
// http.Server with serve's timeouts and GC target), so the figures are the
// server's alone: server-cpu-µs/call (its rusage), server-allocs/call and
// server-B/call (its heap), and calls/commit, the calls of a group commit
// (some of a call's cost is a commit's, shared by the calls it holds: a
// change that answers sooner can make smaller batches and so cost more a
// call). calls/s is the wall-clock rate, noisy on a shared machine; judge
// by CPU and allocations. With
// CAPKERNEL_BENCH_SERVER_PROFILE=FILE the server writes a CPU profile of
// each run to FILE, with CAPKERNEL_BENCH_SERVER_MEMPROFILE=FILE a profile of
// every allocation (slower); the last run's remains.
//
//	go test -run '^$' -bench CallHTTP ./httpapi/
func BenchmarkCallHTTP(b *testing.B) {
	cases := []struct{ name, tool, args string }{
		{"echo", "echo", `{"text":"hello"}`},
		{"fs.read-1KiB", "fs.read", `{"path":"one-kib.txt"}`},
	}
	for _, c := range cases {
		for _, p := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/p=%d", c.name, p), func(b *testing.B) {
				srv := startBenchServer(b)
				bodies := make([][]byte, p)
				for w := range bodies {
					bodies[w] = srv.call(b, c.tool, c.args, fmt.Sprintf("bench-%d", w))
				}
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: p}}
				defer client.CloseIdleConnections()
				// One call per connection first, so that the timed part
				// makes none.
				var wg sync.WaitGroup
				for w := range p {
					wg.Go(func() { post(b, client, srv.URL, bodies[w]) })
				}
				wg.Wait()
				var next atomic.Int64
				before := srv.stats(b)
				b.ResetTimer()
				start := time.Now()
				for w := range p {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) && post(b, client, srv.URL, bodies[w]) {
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				d := srv.stats(b).since(before)
				n := float64(b.N)
				b.ReportMetric(n/elapsed.Seconds(), "calls/s")
				b.ReportMetric(float64(d.cpu.Nanoseconds())/1e3/n, "server-cpu-µs/call")
				b.ReportMetric(float64(d.mallocs)/n, "server-allocs/call")
				b.ReportMetric(float64(d.bytes)/n, "server-B/call")
				b.ReportMetric(n/float64(max(d.commits, 1)), "calls/commit")
			})
		}
	}
}

// post makes one call and checks it succeeded; false after a failure.
func post(b *testing.B, client *http.Client, url string, body []byte) bool {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/syscalls", bytes.NewReader(body))
	if err != nil {
		b.Error(err)
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return false
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"status":"ok"`)) {
		b.Errorf("status %d, %v: %s", resp.StatusCode, err, out)
		return false
	}
	return true
}

// envBenchServer, set to a directory, makes the test binary a benchmark
// server (TestMain): benchServer.
const (
	envBenchServer  = "CAPKERNEL_BENCH_SERVER"
	envBenchProfile = "CAPKERNEL_BENCH_SERVER_PROFILE"
	envBenchMemProf = "CAPKERNEL_BENCH_SERVER_MEMPROFILE"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envBenchServer); dir != "" {
		if err := benchServer(dir, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// benchHello is what a benchmark server says first, on one line.
type benchHello struct {
	URL, Token, JTI, AgentID, PolicyHash string
}

// benchServer serves a new kernel in dir as kernelctl serve does (its
// http.Server timeouts and GC target) with a token for echo and fs.read
// of dir/ws, where one-kib.txt is. It writes a benchHello line to out;
// then for each line read from in it writes its CPU time (ns), heap
// allocations, bytes allocated and group commits (the number of its
// latest checkpoint, one a commit) so far; it stops at the end of in.
func benchServer(dir string, in io.Reader, out io.Writer) error {
	debug.SetGCPercent(400)
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if _, err := kernel.Init(data); err != nil {
		return err
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(ws, "one-kib.txt"), bytes.Repeat([]byte("x"), 1024), 0o644); err != nil {
		return err
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data})
	if err != nil {
		return err
	}
	defer k.Close()
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "bench", Tools: []string{"echo", "fs.read"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           httpapi.New(k),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      15 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go srv.Serve(ln)
	defer srv.Close()
	if p := os.Getenv(envBenchProfile); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if p := os.Getenv(envBenchMemProf); p != "" {
		runtime.MemProfileRate = 1
		defer func() {
			if f, err := os.Create(p); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	hello, _ := json.Marshal(benchHello{URL: "http://" + ln.Addr().String(), Token: tok.Token, JTI: tok.ID, AgentID: tok.AgentID, PolicyHash: k.PolicyHash()})
	fmt.Fprintf(out, "%s\n", hello)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		c, err := k.Inspector().Checkpoint(false)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%d %d %d %d\n", ru.Utime.Nano()+ru.Stime.Nano(), ms.Mallocs, ms.TotalAlloc, c.Number)
	}
	return sc.Err()
}

// benchProc is a benchmark server process.
type benchProc struct {
	benchHello
	in  io.WriteCloser
	out *bufio.Reader
}

// startBenchServer starts the test binary as a benchmark server, stopped
// when b ends.
func startBenchServer(b *testing.B) *benchProc {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envBenchServer+"="+b.TempDir())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("bench server: %v", err)
		}
	})
	p := &benchProc{in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadBytes('\n')
	if err != nil {
		b.Fatalf("bench server: %v", err)
	}
	if err := json.Unmarshal(line, &p.benchHello); err != nil {
		b.Fatalf("bench server said %q: %v", line, err)
	}
	return p
}

// call is the body of a call of tool with args in session.
func (p *benchProc) call(b *testing.B, tool, args, session string) []byte {
	body, err := json.Marshal(map[string]any{
		"tool_id": tool, "args": json.RawMessage(args), "agent_id": p.AgentID,
		"capability_token": p.Token, "capability_token_id": p.JTI, "policy_hash": p.PolicyHash,
		"provenance": map[string]any{"session_id": session},
	})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// serverStats is what the server process has spent so far.
type serverStats struct {
	cpu                     time.Duration
	mallocs, bytes, commits uint64
}

func (p *benchProc) stats(b *testing.B) serverStats {
	b.Helper()
	if _, err := io.WriteString(p.in, "stats\n"); err != nil {
		b.Fatal(err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	var s serverStats
	var ns int64
	if _, err := fmt.Sscan(strings.TrimSpace(line), &ns, &s.mallocs, &s.bytes, &s.commits); err != nil {
		b.Fatalf("bench server stats %q: %v", line, err)
	}
	s.cpu = time.Duration(ns)
	return s
}

func (s serverStats) since(o serverStats) serverStats {
	return serverStats{s.cpu - o.cpu, s.mallocs - o.mallocs, s.bytes - o.bytes, s.commits - o.commits}
}
