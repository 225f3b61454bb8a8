// Command benchreport answers "what does governance cost?" with numbers
// measured side by side in one run on one machine, and writes them to
// docs/benchmarks.md with an SVG chart (docs/benchmarks.svg).
//
// It builds kernelctl and OPA (the version go.mod pins), serves each on
// loopback as its own process, and, itself the load generator, asks both
// the same question at several concurrencies: the kernel a full audited
// call (token, policy, ledger, receipt), OPA's server the bare
// policy decision the kernel makes for that call. Then it runs the
// in-process benchmarks (go test -bench) for Invoke, durable writes
// against bare bbolt, the ledger at one million entries and proc.exec
// against bare bwrap, the upstream MCP call and the bytes stored per
// call. Besides: two kernels, metrics and traces off and on, answer the
// same echo call in alternating rounds (telemetry.go); one kernel in a
// server process of its own (this program, -serve-gateway) serves its
// HTTP API and the MCP gateway side by side, and the same echo call is
// measured through each (gateway.go); and kernels of this tree and of
// an earlier commit serve 200 clients while their memory is sampled
// (memory.go).
//
// Run it from the module root (make bench-report does). -telemetry-only,
// -gateway-only, -memory-only and -writes-only run one of those sections
// alone and print it. The durable writes (section 4) are measured on the
// machine's disk and, run as root with mkfs.ext4 and loop devices, on a
// journaled ext4 the report makes on a loop device and removes (journal.go).
//
//	go run ./cmd/benchreport [-duration 3s] [-out docs/benchmarks.md]
//	go run ./cmd/benchreport -gateway-only [-gateway-profile FILE]
//	go run ./cmd/benchreport -writes-only [-benchtime 2s]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

var concurrencies = []int{1, 8, 32, 64}

// invokeConcurrencies are those of the in-process section, BenchmarkInvoke's
// (kernel/bench_test.go): beyond 64 too, for the goals at the best
// concurrency.
var invokeConcurrencies = []int{1, 8, 32, 64, 128, 256, 512}

func main() {
	duration := flag.Duration("duration", 3*time.Second, "measured time of each HTTP load point: in section 1–2 split over its rounds, each after its warm-up; in the others, of each round, after a 1 s warm-up")
	out := flag.String("out", "docs/benchmarks.md", "report to write")
	svg := flag.String("svg", "docs/benchmarks.svg", "chart to write")
	benchtime := flag.String("benchtime", "2s", "go test -benchtime of the in-process benchmarks")
	inProcess := flag.Bool("in-process", true, "run the in-process benchmarks too (false: HTTP only, for a quick look)")
	httpOnly := flag.Bool("http-only", false, "only measure section 1–2 (the kernel, OPA and the floor over HTTP; with -profile, a CPU profile); print it, write nothing")
	telemetryOnly := flag.Bool("telemetry-only", false, "only compare the audited HTTP call with metrics and traces on and off; print that section, write nothing")
	telemetryProfile := flag.String("telemetry-profile", "", "with -telemetry-only, write CPU profiles of both kernels at c=32 to PREFIX-off.pprof and PREFIX-on.pprof")
	memoryOnly := flag.Bool("memory-only", false, "only measure serve's memory under 200 clients; print that section, write nothing")
	profile := flag.String("profile", "", "write a CPU profile of kernelctl serve during fs.read at c=32 to this file (go tool pprof bin/kernelctl FILE)")
	gatewayOnly := flag.Bool("gateway-only", false, "only compare the MCP gateway with the kernel's HTTP API; print that section, write nothing")
	writesOnly := flag.Bool("writes-only", false, "only measure the durable writes against bare bbolt on the machine's disk and on a journaled ext4 on a loop device (section 4); print that section, write nothing")
	gatewayProfile := flag.String("gateway-profile", "", "write a CPU profile of the gateway's server process during tools/call at c=8 to this file")
	serveGatewayData := flag.String("serve-gateway", "", "internal: be the gateway comparison's server process on this data dir")
	serveFloorDir := flag.String("serve-floor", "", "internal: be section 1–2's floor server on this dir")
	floorAnswer := flag.String("floor-answer", "", "internal: with -serve-floor, the file whose bytes it answers")
	gatewayPprof := flag.String("gateway-pprof", "", "internal: with -serve-gateway, serve the profiler on this address")
	flag.Parse()
	if *serveGatewayData != "" {
		if err := serveGateway(*serveGatewayData, *gatewayPprof); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		return
	}
	if *serveFloorDir != "" {
		if err := serveFloor(*serveFloorDir, *floorAnswer); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		return
	}
	var section func(r *report, bin, tmp string, d time.Duration) error
	switch {
	case *httpOnly:
		section = func(r *report, bin, tmp string, d time.Duration) error {
			if err := sh([]string{"GOBIN=" + bin}, "go", "install", "github.com/open-policy-agent/opa"); err != nil {
				return err
			}
			if err := r.measureHTTP(bin, tmp, *profile, d); err != nil {
				return err
			}
			r.httpMarkdown(printLine)
			for _, g := range r.goals() {
				if strings.Contains(g.goal, "HTTP") && !strings.Contains(g.goal, "MCP") {
					printLine("%s: %s (met: %s)", g.goal, g.measured, g.met)
				}
			}
			return nil
		}
	case *telemetryOnly:
		section = func(r *report, bin, tmp string, d time.Duration) error {
			r.TelemetryProfile = *telemetryProfile
			if err := r.measureTelemetry(bin, tmp, d); err != nil {
				return err
			}
			r.telemetryMarkdown(printLine)
			return nil
		}
	case *memoryOnly:
		section = func(r *report, bin, tmp string, d time.Duration) error {
			if err := r.measureMemory(bin, tmp, d); err != nil {
				return err
			}
			r.memoryMarkdown(printLine)
			return nil
		}
	case *writesOnly:
		section = func(r *report, _, _ string, _ time.Duration) error {
			if err := r.measureWrites(*benchtime); err != nil {
				return err
			}
			if err := r.measureDiskCreates(); err != nil {
				return err
			}
			r.writesMarkdown(printLine)
			for _, g := range r.writesGoals() {
				printLine("%s: %s (met: %s)", g.goal, g.measured, g.met)
			}
			return nil
		}
	case *gatewayOnly:
		section = func(r *report, _, tmp string, d time.Duration) error {
			if err := r.measureGateway(tmp, *gatewayProfile, d); err != nil {
				return err
			}
			r.gatewayMarkdown(printLine)
			g := r.gatewayGoalLine()
			printLine("\n%s: %s (met: %s)", g.goal, g.measured, g.met)
			return nil
		}
	}
	if section != nil {
		if err := runAlone(*duration, section); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*duration, *benchtime, *inProcess, *profile, *gatewayProfile, *out, *svg); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(d time.Duration, benchtime string, inProcess bool, profile, gatewayProfile, out, svg string) error {
	began := time.Now()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("run from the module root: %w", err)
	}
	rep := &report{Began: began, Duration: d, Benchtime: benchtime, Command: "make bench-report"}
	if err := rep.readMachine(); err != nil {
		return err
	}
	bin := filepath.Join(root, "bin")
	step("building kernelctl and opa (%s)", rep.OPAVersion)
	if err := sh(nil, "go", "build", "-o", filepath.Join(bin, "kernelctl"), "./cmd/kernelctl"); err != nil {
		return err
	}
	if err := sh([]string{"GOBIN=" + bin}, "go", "install", "github.com/open-policy-agent/opa"); err != nil {
		return err
	}

	tmp, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := rep.measureHTTP(bin, tmp, profile, d); err != nil {
		return err
	}
	if err := rep.measureTelemetry(bin, tmp, d); err != nil {
		return err
	}
	if err := rep.measureGateway(tmp, gatewayProfile, d); err != nil {
		return err
	}
	if err := rep.measureMemory(bin, tmp, d); err != nil {
		return err
	}
	if inProcess {
		if err := rep.measureInProcess(benchtime); err != nil {
			return err
		}
	}
	rep.Took = time.Since(began)
	if err := os.WriteFile(out, rep.markdown(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(svg, rep.chart(), 0o644); err != nil {
		return err
	}
	step("wrote %s and %s in %v", out, svg, rep.Took.Round(time.Second))
	return nil
}

// runAlone builds kernelctl and runs one section of the report alone,
// which prints itself.
func runAlone(d time.Duration, section func(r *report, bin, tmp string, d time.Duration) error) error {
	bin, err := filepath.Abs("bin")
	if err != nil {
		return err
	}
	if err := sh(nil, "go", "build", "-o", filepath.Join(bin, "kernelctl"), "./cmd/kernelctl"); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	return section(&report{Duration: d}, bin, tmp, d)
}

// printLine writes one line of a section to stdout.
func printLine(format string, a ...any) { fmt.Printf(format+"\n", a...) }

func step(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "== "+format+"\n", a...)
}

func sh(env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// httpRounds are the rounds in which measureHTTP measures its targets in
// turn at each concurrency, each after httpWarm of warm-up: OPA and the
// kernel alternate within seconds, rather than each having its own stretch
// of a shared machine whose load drifts (the c=32 ratio came out between
// 1.05× and 1.15× in four runs of one build when each target had one
// stretch).
const (
	httpRounds = 4
	httpWarm   = 500 * time.Millisecond
)

// measureHTTP serves the kernel and OPA and measures both, in rounds
// (alternate), and keeps each target's rounds taken together.
func (r *report) measureHTTP(bin, tmp, profile string, d time.Duration) error {
	data, ws := filepath.Join(tmp, "data"), filepath.Join(tmp, "ws")
	if err := initKernel(bin, data, ws); err != nil {
		return err
	}
	var pprofAddr string
	var err error
	if profile != "" {
		if pprofAddr, err = freePort(); err != nil {
			return err
		}
	}
	ks, err := startKernel(filepath.Join(bin, "kernelctl"), data, pprofAddr)
	if err != nil {
		return err
	}
	defer ks.stop()
	admin, err := os.ReadFile(filepath.Join(data, kernel.AdminFile))
	if err != nil {
		return err
	}
	ctx := context.Background()
	c := &httpapi.Client{BaseURL: ks.url, Credential: strings.TrimSpace(string(admin))}
	tok, err := c.Mint(ctx, kernel.TokenRequest{AgentID: "bench", Tools: []string{"echo", "fs.read"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		return fmt.Errorf("mint: %w", err)
	}
	ph, err := c.PolicyHash(ctx)
	if err != nil {
		return err
	}
	readEnv := sessionCall(tok, ph, "fs.read", same(`{"path":"a.txt"}`))
	input, err := policyInput(ctx, &httpapi.Client{BaseURL: ks.url}, c, readEnv(0, 0))
	if err != nil {
		return err
	}
	r.OPAInput = string(input)

	opa, err := startOPA(filepath.Join(bin, "opa"), tmp)
	if err != nil {
		return err
	}
	defer opa.stop()
	opaBody, _ := json.Marshal(map[string]json.RawMessage{"input": input})
	answer, err := rawCall(ks.url+"/v1/syscalls", readEnv(0, 0))
	if err != nil {
		return err
	}
	r.FloorAnswer = len(answer)
	floor, err := startFloor(filepath.Join(tmp, "floor"), answer)
	if err != nil {
		return err
	}
	defer floor.stop()

	targets := []target{
		{name: kernelEcho, url: ks.url + "/v1/syscalls", pid: ks.pid, body: sessionCall(tok, ph, "echo", same(`{"text":"hello"}`)), fixed: true, want: []byte(`"status":"ok"`)},
		{name: kernelRead, url: ks.url + "/v1/syscalls", pid: ks.pid, body: readEnv, fixed: true, want: []byte(`"status":"ok"`)},
		// New args on every call make every policy input new: the
		// decision cache never answers, OPA evaluates each call.
		{name: kernelEchoEval, url: ks.url + "/v1/syscalls", pid: ks.pid, body: sessionCall(tok, ph, "echo", evalArgs()), want: []byte(`"status":"ok"`)},
		{name: opaServer, url: opa.url + "/v1/data/capkernel/decision", pid: opa.pid,
			body: func(int, int) []byte { return opaBody }, fixed: true, want: []byte(`"autonomy_mode":"autopilot"`)},
		{name: floorTarget, url: floor.url, pid: floor.pid, body: readEnv, fixed: true, want: []byte(`"status":"ok"`)},
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}
	points, err := alternate(client, targets, concurrencies, httpRounds, httpWarm, d/httpRounds, func(t target, c, round int) func() error {
		if profile == "" || t.name != kernelRead || c != 32 || round != 0 {
			return func() error { return nil }
		}
		profiled := make(chan error, 1)
		go func() { profiled <- fetchProfile(pprofAddr, profile, d/httpRounds) }()
		return func() error { return <-profiled }
	})
	if err != nil {
		return err
	}
	r.HTTP = combine(points)
	last, err := rawCall(ks.url+"/v1/syscalls", readEnv(0, 0))
	r.LastAnswer = len(last)
	return err
}

// rawCall posts body to url and returns the answer's bytes, which must
// be a 200.
func rawCall(url string, body []byte) ([]byte, error) {
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("POST %s: status %d: %.300s", url, resp.StatusCode, b)
	}
	return b, err
}

// initKernel makes a kernel's data dir and workspace ws holding a.txt,
// the 1 KiB file the fs.read targets read.
func initKernel(bin, data, ws string) error {
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), bytes.Repeat([]byte("a"), 1024), 0o644); err != nil {
		return err
	}
	return sh(nil, filepath.Join(bin, "kernelctl"), "init", "--data", data)
}

// policyInput makes one call and reads the policy input the kernel
// decided it with back from its audit record's payload (read in full with
// the admin credential; the chained record holds only its commitment), so
// OPA is asked exactly the kernel's question.
func policyInput(ctx context.Context, caller, admin *httpapi.Client, envelope []byte) (json.RawMessage, error) {
	res, _, err := caller.Call(ctx, envelope)
	if err != nil {
		return nil, err
	}
	if res.Status != kernel.StatusOK {
		return nil, fmt.Errorf("first fs.read: %+v", res.Error)
	}
	es, err := admin.Entries(ctx, res.LedgerSeq, 1)
	if err != nil {
		return nil, err
	}
	if len(es.Entries) != 1 || es.Entries[0].Seq != res.LedgerSeq || es.Entries[0].Payload == nil || len(es.Entries[0].Payload.PolicyInput) == 0 {
		return nil, fmt.Errorf("receipt %s: audit record %d has no policy input in its payload", res.ReceiptID, res.LedgerSeq)
	}
	return es.Entries[0].Payload.PolicyInput, nil
}

type proc struct {
	cmd   *exec.Cmd
	pid   int
	url   string
	stdin io.Closer // if set, the server's stdin, held open until stop
}

func (p *proc) stop() {
	if p.stdin != nil {
		p.stdin.Close()
	}
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// startKernel runs kernelctl serve on a free loopback port (with its
// profiler on pprofAddr, unless "", and more serve flags) and reads the URL from its ready line
// ("serving <id> on http://127.0.0.1:PORT …").
func startKernel(kernelctl, data, pprofAddr string, flags ...string) (*proc, error) {
	return startKernelEnv(nil, kernelctl, data, pprofAddr, flags...)
}

// startKernelEnv is startKernel with env added to the server's
// environment.
func startKernelEnv(env []string, kernelctl, data, pprofAddr string, flags ...string) (*proc, error) {
	args := append([]string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, flags...)
	if pprofAddr != "" {
		args = append(args, "--pprof", pprofAddr)
	}
	cmd := exec.Command(kernelctl, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) < 4 || f[0] != "serving" {
		cmd.Process.Kill()
		return nil, fmt.Errorf("kernelctl serve: no ready line (%q, %v)", line, err)
	}
	return &proc{cmd: cmd, pid: cmd.Process.Pid, url: f[3]}, nil
}

// startOPA serves the default policy bundle's module and data with OPA's
// own server, quiet (no decision logs), and waits for its health check.
func startOPA(opa, tmp string) (*proc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(tmp, "opa")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, name := range []string{"capkernel.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("policy", "rego", name))
		if err != nil {
			return nil, err
		}
		files = append(files, filepath.Join(dir, name))
		if err := os.WriteFile(files[len(files)-1], b, 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(opa, append([]string{"run", "--server", "--addr", addr, "--log-level", "error", "--disable-telemetry", "--optimize-store-for-read-speed"}, files...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, url: "http://" + addr}
	for range 100 {
		if resp, err := http.Get(p.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("opa run --server on %s: not healthy after 10 s", addr)
}

// freePort returns a loopback address with a port free at the time of the
// call, for servers that take no port 0.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// fetchProfile saves a CPU profile of d from the profiler at addr to file.
func fetchProfile(addr, file string, d time.Duration) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds()+1)))
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile: %w", err)
	}
	return f.Close()
}

// measureInProcess runs the go test benchmarks the report quotes, the
// durable writes on two file systems (measureWrites) after Invoke, and
// last the create loop on the machine's disk, whose freed inodes would
// slow the benchmarks' creates after it there.
func (r *report) measureInProcess(benchtime string) error {
	runs := []struct {
		what, pkg, pattern, benchtime string
		env                           []string
	}{
		{"in-process Invoke", "./kernel/", "^BenchmarkInvoke$/^(echo|fs.read-1KiB)$", benchtime, nil},
		{"ledger at 1M entries", "./ledger/", "^BenchmarkLedger1M$/^(InclusionProof|VerifyInclusion|VerifyWith|Export|VerifyExport)$", "1s", nil},
		{"proc.exec vs bare bwrap", "./kernel/", "^BenchmarkExecVsBareBwrap$/^(r-root|rw-empty)$", "100x", nil},
		{"upstream MCP call vs direct", "./kernel/", "^BenchmarkUpstreamEcho$", benchtime, []string{"CAPKERNEL_NPM_TESTS=1"}},
		{"audit storage per call", "./kernel/", "^BenchmarkAuditStorage$", "3000x", nil},
	}
	for i, run := range runs {
		// The durable writes come second, where they came when
		// the report measured them on the disk only.
		if i == 1 {
			if err := r.measureWrites(benchtime); err != nil {
				return err
			}
		}
		step("%s (go test -bench)", run.what)
		rs, err := goBench(run.pkg, run.pattern, run.benchtime, run.env...)
		if err != nil {
			return err
		}
		r.Go = append(r.Go, rs...)
	}
	return r.measureDiskCreates()
}

// readMachine records what the numbers were measured on.
func (r *report) readMachine() error {
	r.GoVersion = runtime.Version()
	r.CPUs = runtime.NumCPU()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				r.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := exec.Command("uname", "-sr").Output(); err == nil {
		r.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		r.Commit = strings.TrimSpace(string(b))
	}
	b, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/open-policy-agent/opa").Output()
	if err != nil {
		return fmt.Errorf("go list -m github.com/open-policy-agent/opa: %w", err)
	}
	r.OPAVersion = strings.TrimSpace(string(b))
	return nil
}
