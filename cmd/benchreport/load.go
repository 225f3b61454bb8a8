package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// A point is one closed-loop load measurement: c workers, each sending its
// next request as soon as the previous answer is read, for a fixed time.
type point struct {
	Target      string
	Concurrency int
	Calls       int
	Seconds     float64
	P50, P99    time.Duration
	// ServerCPU is the server process's user+system CPU time per call;
	// ClientCPU the load generator's.
	ServerCPU, ClientCPU time.Duration
}

// Rate is the throughput in calls per second.
func (p point) Rate() float64 { return float64(p.Calls) / p.Seconds }

// A target is one server asked one question: body(w, i) is worker w's i-th
// request body, so workers (a session each) and calls can differ, and
// every answer must have status 200 and contain want.
type target struct {
	name string
	url  string
	pid  int
	body func(w, i int) []byte
	want []byte
	// fixed says body(w, i) is the same for every i: each worker makes
	// its body once, before it starts, as a client resending one request
	// would. The load generator shares the machine with the server, so
	// CPU it spends re-encoding a body it already sent is CPU the server
	// does not get; OPA's question is made once too.
	fixed bool
	// header, unless nil, is worker w's request headers beside
	// Content-Type (an MCP session's, say).
	header func(w int) http.Header
}

// measure runs c workers against t for warm then d, and reports the
// measured part. An unexpected status or body fails the measurement: a
// benchmark of errors measures nothing.
func measure(client *http.Client, t target, c int, warm, d time.Duration) (point, error) {
	var (
		mu      sync.Mutex
		lats    []time.Duration
		failure error
	)
	stop := make(chan struct{})
	measuring := make(chan struct{})
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h http.Header // the same on every call of this worker
			if t.header != nil {
				h = t.header(w)
			}
			var body []byte
			if t.fixed {
				body = t.body(w, 0)
			}
			var mine []time.Duration
			on := false
			for i := 0; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					lats = append(lats, mine...)
					mu.Unlock()
					return
				case <-measuring:
					on = true
				default:
				}
				b := body
				if !t.fixed {
					b = t.body(w, i)
				}
				t0 := time.Now()
				err := post(client, t.url, h, b, t.want)
				if err != nil {
					mu.Lock()
					failure = fmt.Errorf("%s c=%d: %w", t.name, c, err)
					mu.Unlock()
					<-stop
					return
				}
				if on {
					mine = append(mine, time.Since(t0))
				}
			}
		}()
	}
	time.Sleep(warm)
	srv0, err := procCPU(t.pid)
	if err != nil {
		return point{}, err
	}
	cli0 := selfCPU()
	start := time.Now()
	close(measuring)
	time.Sleep(d)
	srv1, err := procCPU(t.pid)
	if err != nil {
		return point{}, err
	}
	cli1 := selfCPU()
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()
	if failure != nil {
		return point{}, failure
	}
	if len(lats) == 0 {
		return point{}, fmt.Errorf("%s c=%d: no call completed in %v", t.name, c, d)
	}
	slices.Sort(lats)
	// Calls finishing after the window closed still count in lats; the
	// rate uses them over the time until the last one was stopped, which
	// at most adds one call per worker.
	n := len(lats)
	return point{
		Target: t.name, Concurrency: c, Calls: n, Seconds: elapsed.Seconds(),
		P50: lats[n/2], P99: lats[n*99/100],
		ServerCPU: (srv1 - srv0) / time.Duration(n), ClientCPU: (cli1 - cli0) / time.Duration(n),
	}, nil
}

func post(client *http.Client, url string, header http.Header, body, want []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, want) {
		return fmt.Errorf("status %d, answer %.300s (want it to contain %s)", resp.StatusCode, b, want)
	}
	return nil
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPU reads a process's user+system CPU time from /proc/PID/stat
// (fields 14 and 15, counted after the parenthesised command name).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad CPU times %q %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchToken mints a token of agent "bench" with req's grants on the
// served kernel ks (data dir data, whose admin credential it reads) and
// returns it with the kernel's policy hash.
func benchToken(ks *proc, data string, req kernel.TokenRequest) (*kernel.MintedToken, string, error) {
	admin, err := os.ReadFile(filepath.Join(data, kernel.AdminFile))
	if err != nil {
		return nil, "", err
	}
	ctx := context.Background()
	c := &httpapi.Client{BaseURL: ks.url, Credential: strings.TrimSpace(string(admin))}
	req.AgentID = "bench"
	tok, err := c.Mint(ctx, req)
	if err != nil {
		return nil, "", fmt.Errorf("mint: %w", err)
	}
	ph, err := c.PolicyHash(ctx)
	return tok, ph, err
}

// sessionCall returns the bodies of the audited calls of tool under tok
// (policy hash ph) to POST /v1/syscalls: args(i) are the arguments of a
// worker's i-th call, and each worker is its own agent session, as
// concurrent agents are.
func sessionCall(tok *kernel.MintedToken, ph, tool string, args func(i int) string) func(w, i int) []byte {
	return func(w, i int) []byte {
		b, _ := json.Marshal(map[string]any{
			"tool_id": tool, "args": json.RawMessage(args(i)), "agent_id": tok.AgentID,
			"capability_token": tok.Token, "capability_token_id": tok.ID, "policy_hash": ph,
			"provenance": map[string]any{"session_id": fmt.Sprintf("bench-%d", w)},
		})
		return b
	}
}

// same is the arguments of every call: args.
func same(args string) func(int) string { return func(int) string { return args } }

// fresh is arguments never sent before in the run: format filled in with
// a count of its own, which runs on across workers, rounds and
// concurrencies (measure's call number starts again at 0 each time).
func fresh(format string) func(int) string {
	var n atomic.Int64
	return func(int) string { return fmt.Sprintf(format, n.Add(1)) }
}

// evalArgs are the arguments of the kernelEchoEval target: new on every
// call of the run, so every policy input is new, the kernel's decision
// cache never answers, and OPA evaluates each call.
func evalArgs() func(int) string { return fresh(`{"text":"hello %d"}`) }

// alternate measures targets ts at each concurrency of cs in rounds
// rounds, the targets in turn, each round starting one target later (with
// two targets: a then b in even rounds, b then a in odd ones), so that all
// see the same machine (a shared machine's load drifts over seconds) and
// none always follows the same one. Each measurement has warm of warm-up
// and d measured. It returns the points in the order taken (combine takes
// each target's rounds together). around, if not nil, runs before each
// measurement and returns what to run after it (a profile taken
// meanwhile, say).
func alternate(client *http.Client, ts []target, cs []int, rounds int, warm, d time.Duration, around func(t target, c, round int) func() error) ([]point, error) {
	var out []point
	for _, c := range cs {
		for round := range rounds {
			for i := range ts {
				t := ts[(i+round)%len(ts)]
				step("HTTP %s at c=%d, round %d", t.name, c, round+1)
				after := func() error { return nil }
				if around != nil {
					after = around(t, c, round)
				}
				p, err := measure(client, t, c, warm, d)
				if err != nil {
					return nil, err
				}
				if err := after(); err != nil {
					return nil, err
				}
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// combine takes the rounds of each target at each concurrency in ps
// together, in the order each first appears: the calls and seconds of all
// of them (so the rate is over all rounds), CPU per call over all of them,
// and the median of the rounds' p50s and, apart, of their p99s (the
// upper median of an even count).
func combine(ps []point) []point {
	type key struct {
		target string
		c      int
	}
	var out []point
	at := map[key]int{}
	var p50s, p99s [][]time.Duration
	for _, p := range ps {
		k := key{p.Target, p.Concurrency}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, point{Target: p.Target, Concurrency: p.Concurrency})
			p50s, p99s = append(p50s, nil), append(p99s, nil)
		}
		o := &out[i]
		o.ServerCPU += p.ServerCPU * time.Duration(p.Calls)
		o.ClientCPU += p.ClientCPU * time.Duration(p.Calls)
		o.Calls += p.Calls
		o.Seconds += p.Seconds
		p50s[i], p99s[i] = append(p50s[i], p.P50), append(p99s[i], p.P99)
	}
	for i := range out {
		o := &out[i]
		if o.Calls > 0 {
			o.ServerCPU /= time.Duration(o.Calls)
			o.ClientCPU /= time.Duration(o.Calls)
		}
		slices.Sort(p50s[i])
		slices.Sort(p99s[i])
		o.P50, o.P99 = p50s[i][len(p50s[i])/2], p99s[i][len(p99s[i])/2]
	}
	return out
}
