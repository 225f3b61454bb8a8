package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// TestAlternate: alternate measures every target at every concurrency in
// every round, each round starting one target later, so no target always
// follows the same one; combine then gives one point per target and
// concurrency holding all its rounds.
func TestAlternate(t *testing.T) {
	var ts []target
	for _, name := range []string{"a", "b", "c"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"ok":"` + name + `"}`)) }))
		defer srv.Close()
		ts = append(ts, target{name: name, url: srv.URL, pid: os.Getpid(), body: func(int, int) []byte { return []byte("{}") }, want: []byte(name)})
	}
	ps, err := alternate(http.DefaultClient, ts, []int{1, 2}, 3, 0, 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.Target)
	}
	round := []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}
	if want := append(slices.Clone(round), round...); !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	all := combine(ps)
	if len(all) != 6 {
		t.Fatalf("combine gave %d points, want 6: %+v", len(all), all)
	}
	for _, p := range all {
		calls := 0
		for _, q := range ps {
			if q.Target == p.Target && q.Concurrency == p.Concurrency {
				calls += q.Calls
			}
		}
		if p.Calls != calls || calls == 0 {
			t.Errorf("%s c=%d: %d calls, want the rounds' %d", p.Target, p.Concurrency, p.Calls, calls)
		}
	}
}

// TestCombine: a target's rounds taken together: calls and seconds summed,
// CPU weighted by calls, latencies the rounds' medians.
func TestCombine(t *testing.T) {
	ms := time.Millisecond
	ps := []point{
		{Target: "k", Concurrency: 8, Calls: 100, Seconds: 1, P50: 3 * ms, P99: 9 * ms, ServerCPU: 100 * time.Microsecond, ClientCPU: 10 * time.Microsecond},
		{Target: "o", Concurrency: 8, Calls: 50, Seconds: 1, P50: ms, P99: 2 * ms, ServerCPU: 300 * time.Microsecond},
		{Target: "k", Concurrency: 8, Calls: 300, Seconds: 1, P50: ms, P99: 30 * ms, ServerCPU: 200 * time.Microsecond, ClientCPU: 30 * time.Microsecond},
		{Target: "k", Concurrency: 8, Calls: 200, Seconds: 2, P50: 2 * ms, P99: 10 * ms, ServerCPU: 50 * time.Microsecond, ClientCPU: 20 * time.Microsecond},
	}
	want := []point{
		{Target: "k", Concurrency: 8, Calls: 600, Seconds: 4, P50: 2 * ms, P99: 10 * ms,
			ServerCPU: (100*100 + 300*200 + 200*50) * time.Microsecond / 600, ClientCPU: (100*10 + 300*30 + 200*20) * time.Microsecond / 600},
		{Target: "o", Concurrency: 8, Calls: 50, Seconds: 1, P50: ms, P99: 2 * ms, ServerCPU: 300 * time.Microsecond},
	}
	if got := combine(ps); !slices.Equal(got, want) {
		t.Errorf("combine =\n%+v\nwant\n%+v", got, want)
	}
}

// TestEvalArgsNeverRepeat: the echo-with-new-args target promises a policy
// input the kernel's decision cache has not seen on every call; measure
// numbers each measurement's calls from 0, so the arguments must count on
// across rounds and concurrencies by themselves.
func TestEvalArgsNeverRepeat(t *testing.T) {
	var mu sync.Mutex
	seen, total := map[string]bool{}, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[string(b)], total = true, total+1
		mu.Unlock()
		w.Write([]byte(`{"status":"ok"}`))
	}))
	defer srv.Close()
	tok := &kernel.MintedToken{AgentID: "bench", Token: "t", ID: "j"}
	eval := target{name: kernelEchoEval, url: srv.URL, pid: os.Getpid(), body: sessionCall(tok, "ph", "echo", evalArgs()), want: []byte(`"status":"ok"`)}
	if _, err := alternate(http.DefaultClient, []target{eval}, []int{1, 2}, httpRounds, 0, 30*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if len(seen) != total || total == 0 {
		t.Errorf("%d calls sent %d distinct bodies", total, len(seen))
	}
}

// TestFixedBodyMadeOncePerWorker: a fixed target's body is made once for
// each worker, whatever the number of calls, and sent on every call; any
// other target's is made for each call.
func TestFixedBodyMadeOncePerWorker(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[string(b)]++
		mu.Unlock()
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	for _, fixed := range []bool{true, false} {
		clear(got)
		var made [3]int
		tg := target{name: "t", url: srv.URL, pid: os.Getpid(), fixed: fixed, want: []byte("ok"),
			body: func(w, i int) []byte {
				mu.Lock()
				made[w]++
				mu.Unlock()
				return []byte(strconv.Itoa(w))
			}}
		p, err := measure(http.DefaultClient, tg, 3, 0, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		calls := got["0"] + got["1"] + got["2"]
		for w, n := range made {
			if fixed && n != 1 || !fixed && n != got[strconv.Itoa(w)] {
				t.Errorf("fixed %v: worker %d made its body %d times in %d calls", fixed, w, n, got[strconv.Itoa(w)])
			}
		}
		mu.Unlock()
		if calls < p.Calls || p.Calls < 3 {
			t.Errorf("fixed %v: server saw %d calls, measure counted %d", fixed, calls, p.Calls)
		}
	}
}
