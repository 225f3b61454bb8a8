package main

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// Targets of the telemetry comparison: the same audited echo call on a
// kernel with metrics and traces off, and on one with both on.
const (
	telemetryOff = "kernel echo, telemetry off"
	telemetryOn  = "kernel echo, metrics + traces"
)

// telemetryRounds alternate the two kernels so that both see the same
// machine: a shared machine's load drifts over seconds.
const telemetryRounds = 10

// telemetryConcurrencies are the concurrencies compared.
var telemetryConcurrencies = []int{8, 32}

// measureTelemetry serves two kernels side by side, one with
// `--metrics off` and no traces, one with `--metrics public` and
// `--otlp-endpoint` pointing at an OTLP/HTTP receiver in this process,
// and measures the audited echo call on each, in alternating rounds.
// The receiver reads and drops what it is sent; it must have been sent
// something, or the traces were not on.
func (r *report) measureTelemetry(bin, tmp string, d time.Duration) error {
	var received atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	rcv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		received.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go rcv.Serve(ln)
	defer rcv.Close()

	targets := map[string]target{}
	pprofAddrs := map[string]string{}
	for _, v := range []struct {
		name  string
		flags []string
	}{
		{telemetryOff, []string{"--metrics", "off"}},
		{telemetryOn, []string{"--metrics", "public", "--otlp-endpoint", "http://" + ln.Addr().String()}},
	} {
		data := filepath.Join(tmp, "telemetry-"+strings.Fields(v.name)[2])
		if err := sh(nil, filepath.Join(bin, "kernelctl"), "init", "--data", data); err != nil {
			return err
		}
		if r.TelemetryProfile != "" {
			if pprofAddrs[v.name], err = freePort(); err != nil {
				return err
			}
		}
		ks, err := startKernel(filepath.Join(bin, "kernelctl"), data, pprofAddrs[v.name], v.flags...)
		if err != nil {
			return err
		}
		defer ks.stop()
		t, err := echoTarget(v.name, ks, data)
		if err != nil {
			return err
		}
		targets[v.name] = t
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}
	// With TelemetryProfile set, each kernel's first round at the highest
	// concurrency is profiled into TelemetryProfile-off.pprof / -on.pprof.
	profile := func(t target, c, round int) func() error {
		if r.TelemetryProfile == "" || c != telemetryConcurrencies[len(telemetryConcurrencies)-1] || round != 0 {
			return func() error { return nil }
		}
		file := r.TelemetryProfile + map[string]string{telemetryOff: "-off.pprof", telemetryOn: "-on.pprof"}[t.name]
		profiled := make(chan error, 1)
		go func() { profiled <- fetchProfile(pprofAddrs[t.name], file, d) }()
		return func() error { return <-profiled }
	}
	points, err := alternate(client, []target{targets[telemetryOff], targets[telemetryOn]}, telemetryConcurrencies, telemetryRounds, time.Second, d, profile)
	if err != nil {
		return err
	}
	r.Telemetry = append(r.Telemetry, points...)
	if received.Load() == 0 {
		return fmt.Errorf("the OTLP receiver got no spans from the kernel with traces on")
	}
	return nil
}

// echoTarget mints a token on the served kernel ks (data dir data) and
// returns the audited echo call as a load target, a session per worker.
func echoTarget(name string, ks *proc, data string) (target, error) {
	tok, ph, err := benchToken(ks, data, kernel.TokenRequest{Tools: []string{"echo"}})
	if err != nil {
		return target{}, err
	}
	return target{name: name, url: ks.url + "/v1/syscalls", pid: ks.pid, want: []byte(`"status":"ok"`),
		body: sessionCall(tok, ph, "echo", same(`{"text":"hello"}`)), fixed: true}, nil
}

// sumRounds takes the rounds in ps of one target at one concurrency
// together (combine): the throughput over all of them, CPU per call over
// all of them, and the medians of the rounds' p50s and p99s.
func sumRounds(ps []point, name string, c int) (rate float64, p50, p99, cpu time.Duration, ok bool) {
	for _, p := range combine(ps) {
		if p.Target == name && p.Concurrency == c && p.Calls > 0 {
			return p.Rate(), p.P50, p.P99, p.ServerCPU, true
		}
	}
	return 0, 0, 0, 0, false
}

// telemetryMarkdown is the report's section on what metrics and traces
// cost.
func (r *report) telemetryMarkdown(w func(string, ...any)) {
	w("## Telemetry: metrics and traces on against off")
	w("")
	w("The audited echo call over HTTP, as in section 1–2, on two kernels served side by side: one with `--metrics off` and no traces, one with `--metrics public` and `--otlp-endpoint` exporting every call's spans (the call and its stages) to an OTLP/HTTP receiver in the load generator. %d alternating rounds per concurrency, taken together (throughput and CPU over all rounds, latency the median of the rounds' p50s and, apart, of their p99s); the range is that of the rounds' own on / off ratios, the spread the noise of one round puts in them. Goal: within 5%%.", telemetryRounds)
	w("")
	w("| c | calls/s off | calls/s on | on / off | rounds' on / off | p50 µs off / on | p99 µs off / on | server CPU µs/call off / on | within 5%% |")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, c := range telemetryConcurrencies {
		ro, p50o, p99o, cpuo, ok1 := sumRounds(r.Telemetry, telemetryOff, c)
		rn, p50n, p99n, cpun, ok2 := sumRounds(r.Telemetry, telemetryOn, c)
		if !ok1 || !ok2 {
			continue
		}
		q := rn / ro
		lo, hi := roundRatios(r.Telemetry, telemetryOff, telemetryOn, c)
		w("| %d | %s | %s | %.3f | %.3f–%.3f | %s / %s | %s / %s | %s / %s | %s |", c, num(ro), num(rn), q, lo, hi, µs(p50o), µs(p50n), µs(p99o), µs(p99n), µs(cpuo), µs(cpun), yes(q >= 0.95))
	}
	w("")
}

// roundRatios is the lowest and highest ratio of b's throughput to a's
// in one round at concurrency c (alternate measures a and b once per
// round, so their i-th points at c are one round's).
func roundRatios(ps []point, a, b string, c int) (lo, hi float64) {
	var as, bs []float64
	for _, p := range ps {
		switch {
		case p.Concurrency != c:
		case p.Target == a:
			as = append(as, p.Rate())
		case p.Target == b:
			bs = append(bs, p.Rate())
		}
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for i := range min(len(as), len(bs)) {
		q := bs[i] / as[i]
		lo, hi = min(lo, q), max(hi, q)
	}
	return lo, hi
}
