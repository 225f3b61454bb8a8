package main

import (
	"bytes"
	"fmt"
	"time"
)

// A report holds every figure of one run and what it ran on.
type report struct {
	Began                 time.Time
	Took, Duration        time.Duration
	Benchtime, Command    string
	GoVersion, OPAVersion string
	CPU, Kernel, Commit   string
	CPUs                  int
	OPAInput              string
	FloorAnswer           int // bytes the floor server answers: the kernel's first fs.read answer
	LastAnswer            int // bytes of the kernel's fs.read answer after section 1–2
	HTTP                  []point
	Telemetry             []point // measureTelemetry's rounds
	TelemetryProfile      string  // file prefix of CPU profiles of the telemetry kernels, or ""
	Gateway               []point // measureGateway's rounds
	Memory                []memoryPoint
	Go                    []result
	Writes                []writesFS // section 4: the machine's disk, then the journaled ext4
}

func (r *report) point(target string, c int) (point, bool) {
	for _, p := range r.HTTP {
		if p.Target == target && p.Concurrency == c {
			return p, true
		}
	}
	return point{}, false
}

func (r *report) metric(name, unit string) string {
	v, err := find(r.Go, name, unit)
	if err != nil {
		return "n/a"
	}
	return num(v)
}

func (r *report) ratio(name, unit, baseName, baseUnit string) string {
	v, err1 := find(r.Go, name, unit)
	b, err2 := find(r.Go, baseName, baseUnit)
	if err1 != nil || err2 != nil || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", v/b)
}

// num prints a figure with three significant digits, grouping thousands.
func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		s := fmt.Sprintf("%.0f", v)
		var out []byte
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				out = append(out, ',')
			}
			out = append(out, byte(c))
		}
		return string(out)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func µs(d time.Duration) string { return num(float64(d.Nanoseconds()) / 1000) }

const (
	kernelEcho = "kernel echo"
	kernelRead = "kernel fs.read 1 KiB"
	// kernelEchoEval is echo with new args every call: a policy input the
	// decision cache has not seen, so the policy is evaluated.
	kernelEchoEval = "kernel echo, new args each call"
	opaServer      = "OPA server decision"
)

func (r *report) markdown() []byte {
	var b bytes.Buffer
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("# Benchmarks: what governance costs")
	w("")
	w("Written by `%s` (cmd/benchreport) on %s in %v; every figure below comes from that one run on one machine, so the ratios hold even where the absolute numbers do not. Rerun it to measure yours.", r.Command, r.Began.UTC().Format("2006-01-02 15:04 UTC"), r.Took.Round(time.Second))
	w("")
	w("| | |")
	w("|---|---|")
	w("| machine | %s, %d CPUs, %s |", r.CPU, r.CPUs, r.Kernel)
	w("| Go | %s |", r.GoVersion)
	w("| OPA | %s (the version go.mod pins, built with `go install`) |", r.OPAVersion)
	w("| commit | %s |", r.Commit)
	w("| command | `%s` (section 1–2: each HTTP point %v measured over %d rounds, each after %v of warm-up; the other HTTP sections: %v per measurement (each round, or the one), after 1 s of warm-up; in-process: `go test -bench -benchtime=%s`) |", r.Command, r.Duration, httpRounds, httpWarm, r.Duration, r.Benchtime)
	w("")
	w("![throughput and p99 latency against concurrency](benchmarks.svg)")
	w("")
	w("## Goals")
	w("")
	w("| goal | measured | met |")
	w("|---|---|---|")
	for _, g := range r.goals() {
		w("| %s | %s | %s |", g.goal, g.measured, g.met)
	}
	w("")
	r.httpMarkdown(w)
	r.telemetryMarkdown(w)
	w("## 3. In-process Invoke")
	w("")
	w("`kernel.Invoke` called by p goroutines in the benchmark process: the same pipeline without HTTP (`BenchmarkInvoke`); fs.read reads, and fs.write writes, 1 KiB of text (the first KiB of docs/kernel.md, whose audit payload is coded as text's is). CPU is the process's user+system time per call (every goroutine, GC included); serial is the time per call the store's sequencer goroutine spent in the kernel's functions and in bbolt's commit work (spill, rebalance), which bounds throughput at 1/serial however many cores there are; pages are bbolt page writes and fsyncs the fdatasyncs (two per group commit) per call.")
	w("")
	w("| call | p | calls/s | ns/op | CPU µs/call | serial µs/call | pages/call | fsyncs/call | B/op | allocs/op |")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, name := range []string{"echo", "fs.read-1KiB", "fs.write-1KiB"} {
		for _, p := range invokeConcurrencies {
			n := fmt.Sprintf("BenchmarkInvoke/%s/p=%d", name, p)
			if _, err := find(r.Go, n, "ns/op"); err != nil {
				continue
			}
			w("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |", name, p, r.metric(n, "calls/s"), r.metric(n, "ns/op"), r.metric(n, "cpu-µs/call"),
				r.metric(n, "serial-µs/call"), r.metric(n, "pages/call"), r.metric(n, "fsyncs/call"), r.metric(n, "B/op"), r.metric(n, "allocs/op"))
		}
	}
	w("")
	r.writesMarkdown(w)
	w("## 5. Ledger at one million entries")
	w("")
	w("`BenchmarkLedger1M`: one million 300-byte audit entries with a signed checkpoint every 1,000.")
	w("")
	w("| measure | figure |")
	w("|---|---:|")
	w("| full verification in the store (`VerifyWith`: chain, tree, checkpoint signatures) | %s entries/s |", r.metric("BenchmarkLedger1M/VerifyWith", "entries/s"))
	w("| verification of an export (`VerifyExport`, what `kernelctl ledger verify --export` does) | %s entries/s |", r.metric("BenchmarkLedger1M/VerifyExport", "entries/s"))
	w("| inclusion proof, made | %s ns |", r.metric("BenchmarkLedger1M/InclusionProof", "ns/op"))
	w("| inclusion proof, largest | %s bytes |", r.metric("BenchmarkLedger1M/InclusionProof", "max-proof-bytes"))
	w("| inclusion proof, verified | %s ns |", r.metric("BenchmarkLedger1M/VerifyInclusion", "ns/op"))
	w("")
	w("## 6. proc.exec `true` against bare bwrap")
	w("")
	w("`BenchmarkExecVsBareBwrap`: `true` through Invoke (token, policy, prepare, sandbox, commit, audit) interleaved in one loop with bare `bwrap … true` with comparable namespaces and binds, in a read-only root and in a staged rw root. The loop pauses 15 ms after each side, so each is timed alone: work that follows an answer in the background (the sandbox making its next spare chain, namespaces torn down) is not counted against the other side, and proc.exec finds its spare chain made, as a call after an agent's think time does; calls back to back would wait for it.")
	w("")
	w("| root | bare bwrap ms | proc.exec ms | ratio |")
	w("|---|---:|---:|---:|")
	for _, root := range []string{"r-root", "rw-empty"} {
		n := "BenchmarkExecVsBareBwrap/" + root
		w("| %s | %s | %s | %s× |", root, r.metric(n, "bare-ms/op"), r.metric(n, "invoke-ms/op"), r.metric(n, "ratio"))
	}
	r.upstreamSection(w)
	r.gatewayMarkdown(w)
	w("")
	r.memoryMarkdown(w)
	r.storageMarkdown(w)
	return b.Bytes()
}

// httpMarkdown writes section 1–2 with w.
func (r *report) httpMarkdown(w func(format string, a ...any)) {
	w("## 1–2. HTTP: kernel against OPA's own server")
	w("")
	w("A separate load-generating process (this program) on loopback, closed loop: each of c workers sends its next request when the previous answer is in. The kernel answers `POST /v1/syscalls` with a full audited call: token verification, scope checks, the policy decision, an audit record in the hash-chained ledger (group-committed, fsync'd) and its receipt (the record proven under the checkpoint signed once per group commit). Each worker is its own agent session and makes its request body once, as it does for OPA (but for \"new args each call\", whose body is new each time). OPA's server (`opa run --server`, decision logs off) is asked `POST /v1/data/capkernel/decision` with the very input the kernel decided fs.read with (read back from that call's audit record): the cost of a bare policy check with no token, no audit and no receipt. The floor is what any server that answers a call only once a record of it is durable must spend, with nothing of governance: a server process of this program that reads the fs.read request, puts its bytes in a bbolt file under the next sequence number (group committed as the kernel's store commits: every request queued while a transaction committed goes into the next, one fdatasync'd transaction, the kernel's bbolt options) and then answers the kernel's own answer to that fs.read (%s bytes, the run's first; the kernel's last was %s, its inclusion proof having grown with the ledger). CPU per call is the server process's user+system time (from /proc) over the calls it answered. The five targets are measured in turn, %d rounds per concurrency, each round starting with the next target, so that OPA and the kernel share the machine's drifting load; a row takes its target's rounds together (throughput and CPU over all rounds, latency the median of the rounds' p50s and, apart, of their p99s).", num(float64(r.FloorAnswer)), num(float64(r.LastAnswer)), httpRounds)
	w("")
	w("| target | c | calls/s | p50 µs | p99 µs | server CPU µs/call | load-generator CPU µs/call |")
	w("|---|---:|---:|---:|---:|---:|---:|")
	for _, p := range r.HTTP {
		w("| %s | %d | %s | %s | %s | %s | %s |", p.Target, p.Concurrency, num(p.Rate()), µs(p.P50), µs(p.P99), µs(p.ServerCPU), µs(p.ClientCPU))
	}
	w("")
	w("Kernel throughput as a multiple of the OPA server's at the same concurrency, and the floor's: how much of the distance to OPA durability alone takes on this machine, and how much of the floor the audited call keeps:")
	w("")
	w("| c | echo / OPA | fs.read / OPA | echo, new args / OPA | fs.read CPU per call / OPA's | floor / OPA | fs.read / floor |")
	w("|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range concurrencies {
		e, _ := r.point(kernelEcho, c)
		k, _ := r.point(kernelRead, c)
		n, _ := r.point(kernelEchoEval, c)
		f, _ := r.point(floorTarget, c)
		o, ok := r.point(opaServer, c)
		if !ok || o.Calls == 0 || o.ServerCPU == 0 || f.Calls == 0 {
			continue
		}
		w("| %d | %.2f× | %.2f× | %.2f× | %.2f× | %.2f× | %.2f× |", c, e.Rate()/o.Rate(), k.Rate()/o.Rate(), n.Rate()/o.Rate(), float64(k.ServerCPU)/float64(o.ServerCPU), f.Rate()/o.Rate(), k.Rate()/f.Rate())
	}
	w("")
	w("The input OPA was asked:")
	w("")
	w("```json")
	w("%s", r.OPAInput)
	w("```")
	w("")
}

// goal is one line of the report's goals table (issue 17's figures).
type goal struct{ goal, measured, met string }

// goals checks the figures of the run against the goals.
func (r *report) goals() []goal {
	var out []goal
	add := func(text string, v float64, ok bool, unit string, met bool) {
		if !ok {
			out = append(out, goal{text, "not measured", "n/a"})
			return
		}
		out = append(out, goal{text, num(v) + unit, yes(met)})
	}
	// best is the highest rate of call at any concurrency, and where.
	best := func(call string) (v float64, at string, ok bool) {
		for _, p := range invokeConcurrencies {
			if x, err := find(r.Go, fmt.Sprintf("BenchmarkInvoke/%s/p=%d", call, p), "calls/s"); err == nil && x > v {
				v, at, ok = x, fmt.Sprintf(" (p=%d)", p), true
			}
		}
		return v, at, ok
	}
	get := func(name, unit string) (float64, bool) {
		v, err := find(r.Go, name, unit)
		return v, err == nil
	}
	v, at, ok := best("fs.read-1KiB")
	add("in-process audited fs.read 1 KiB ≥ 20,000/s (best concurrency)", v, ok, " calls/s"+at, v >= 20000)
	v, at, ok = best("echo")
	add("in-process audited echo ≥ 25,000/s (best concurrency)", v, ok, " calls/s"+at, v >= 25000)
	for _, c := range []struct {
		conc int
		min  float64
	}{{32, 1.5}, {1, 0.5}} {
		k, ok1 := r.point(kernelRead, c.conc)
		o, ok2 := r.point(opaServer, c.conc)
		q, ok := 0.0, ok1 && ok2 && o.Rate() > 0
		if ok {
			q = k.Rate() / o.Rate()
		}
		add(fmt.Sprintf("HTTP fs.read at c=%d ≥ %.1f× OPA's server deciding the same input", c.conc, c.min), q, ok, "×", q >= c.min)
	}
	v, ok = get("BenchmarkInvoke/fs.read-1KiB/p=32", "cpu-µs/call")
	add("CPU per audited fs.read ≤ 80 µs (in-process, p=32, GC included)", v, ok, " µs", v <= 80)
	if k, ok := r.point(kernelRead, 32); ok {
		add("CPU per audited fs.read over HTTP ≤ 80 µs (server process, c=32)", float64(k.ServerCPU.Nanoseconds())/1e3, true, " µs", k.ServerCPU <= 80*time.Microsecond)
	}
	v, ok = get("BenchmarkInvoke/fs.read-1KiB/p=32", "serial-µs/call")
	add("serial work on the sequencer per call ≤ 15 µs (fs.read, p=32)", v, ok, " µs", v <= 15)
	v, ok = get("BenchmarkInvoke/fs.read-1KiB/p=32", "allocs/op")
	add("allocations per fs.read ≤ 150 (p=32)", v, ok, "", v <= 150)
	out = append(out, r.writesGoals()...)
	v, ok = get("BenchmarkLedger1M/VerifyWith", "entries/s")
	add("ledger verification (chain, tree, every signature) ≥ 1 M entries/s", v, ok, " entries/s", v >= 1e6)
	v, ok = get("BenchmarkExecVsBareBwrap/r-root", "ratio")
	add("proc.exec `true` ≤ 1.3× bare bwrap", v, ok, "×", v <= 1.3)
	v, ok = get("BenchmarkExecVsBareBwrap/rw-empty", "ratio")
	add("proc.exec in a staged rw root ≤ 1.6× bare bwrap", v, ok, "×", v <= 1.6)
	v, ok = get("BenchmarkAuditStorage/fs.read/full", "db-bytes/call")
	add("kernel.db per audited fs.read 1 KiB, payloads kept ≤ 2 KB (issue 19)", v, ok, " B", v <= 2000)
	return append(out, r.gatewayGoalLine())
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// upstreamSection reports BenchmarkUpstreamEcho: an upstream MCP tool
// called through the kernel against the same call made directly, with
// the kernel's own audited-call latency (built-in echo) beside them.
func (r *report) upstreamSection(w func(string, ...any)) {
	w("")
	w("## 7. Upstream MCP call: through the kernel against direct")
	w("")
	w("`BenchmarkUpstreamEcho`: `echo` of `@modelcontextprotocol/server-everything` (stdio) called through `kernel.Invoke` (declared resources, policy, audit record, receipt) and, on another process of the same server, directly with the Go SDK's client; the kernel's built-in `echo` is its audited-call latency. Overhead = kernel − direct − built-in: what the upstream path adds beyond an audited call (goal ≤ 1 ms at p50, c=1).")
	w("")
	w("| c | direct p50 ms | kernel p50 ms | built-in echo p50 ms | overhead p50 ms | direct calls/s | kernel calls/s |")
	w("|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range []int{1, 8} {
		n := func(what string) string { return fmt.Sprintf("BenchmarkUpstreamEcho/%s/c=%d", what, c) }
		over := "n/a"
		d, e1 := find(r.Go, n("direct"), "p50-ms")
		k, e2 := find(r.Go, n("kernel"), "p50-ms")
		b, e3 := find(r.Go, n("builtin"), "p50-ms")
		if e1 == nil && e2 == nil && e3 == nil {
			over = num(k - d - b)
		}
		w("| %d | %s | %s | %s | %s | %s | %s |", c, r.metric(n("direct"), "p50-ms"), r.metric(n("kernel"), "p50-ms"), r.metric(n("builtin"), "p50-ms"), over,
			r.metric(n("direct"), "calls/s"), r.metric(n("kernel"), "calls/s"))
	}
}

// storageMarkdown reports BenchmarkAuditStorage: what kernel.db keeps per
// audited call.
func (r *report) storageMarkdown(w func(string, ...any)) {
	w("## 10. Storage per call")
	w("")
	w("`BenchmarkAuditStorage`: bytes kernel.db grows by per audited call at steady state (after 1,000 calls; 8 calls at a time, so commits are grouped), reading or writing real text (this repository's docs), with payloads kept (depth `full`) and with commitments only; live bytes leave out the free pages the file holds. Records, payloads, result envelopes and checkpoints are stored packed, payloads of 512 packed bytes or more also compressed (docs/formats.md, \"Storage encoding\").")
	w("")
	w("| call | depth | kernel.db bytes/call | live bytes/call |")
	w("|---|---|---:|---:|")
	for _, call := range []string{"fs.read", "fs.write", "fs.write-16KiB"} {
		for _, depth := range []string{"full", "commitments_only"} {
			n := "BenchmarkAuditStorage/" + call + "/" + depth
			if _, err := find(r.Go, n, "db-bytes/call"); err != nil {
				continue
			}
			w("| %s | %s | %s | %s |", call, depth, r.metric(n, "db-bytes/call"), r.metric(n, "live-bytes/call"))
		}
	}
	w("")
}
