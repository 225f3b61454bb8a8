package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

var long = flag.Bool("chaos.long", false, "run the long fault campaign (make chaos)")

// fault is one injection: strace's -e inject=<syscalls>:error=<errno>:when=<when>.
type fault struct {
	syscalls, errno, when string
	// durable marks faults of a durability syscall (fdatasync, pwrite64
	// of the store, syncfs): the kernel must fail stop and exit non-zero.
	// Other faults (a write or a rename) may be absorbed: a failed staging
	// write rolls its call back, a failed rename is retried.
	durable bool
}

func (f fault) String() string { return f.syscalls + ":" + f.errno + ":" + f.when }

// shortFaults run in make test; longFaults under make chaos. A when of
// N+ fails every call from the N-th on (a persistent failure, like a full
// disk), a plain N only the N-th. strace counts per thread, and the Go
// runtime moves goroutines between threads, so a given N lands at
// varying points of the workload.
var shortFaults = []fault{
	{"fdatasync", "EIO", "12+", true},
	{"fdatasync", "EIO", "20", true},
	{"pwrite64", "ENOSPC", "30+", true},
	{"syncfs", "EIO", "6", true},
	{"renameat", "EIO", "4+", false},
	{"write", "ENOSPC", "12+", false},
	{"renameat", "EIO", "3", false},
}

func longFaults() []fault {
	var out []fault
	for _, n := range []int{3, 8, 15, 25, 40, 70} {
		for _, f := range []fault{
			{"fdatasync", "EIO", "%d", true}, {"fdatasync", "EIO", "%d+", true}, {"fdatasync", "ENOSPC", "%d+", true},
			{"pwrite64", "EIO", "%d", true}, {"pwrite64", "ENOSPC", "%d+", true},
			{"syncfs", "EIO", "%d", true}, {"syncfs", "EIO", "%d+", true},
			{"renameat", "EIO", "%d", false}, {"renameat", "ENOSPC", "%d+", false},
			{"write", "EIO", "%d", false}, {"write", "ENOSPC", "%d+", false},
		} {
			f.when = fmt.Sprintf(f.when, n)
			out = append(out, f)
		}
	}
	return out
}

// tally is what the campaign counts; every "bad" field must stay 0.
type tally struct {
	mu                                   sync.Mutex
	cases, calls, acked, failStops       int
	lost, duplicated, contradicted       int
	stuck, staging, verifyFailed, doubly int
	noExit, crashes, injected            int
	toExit, restart                      []time.Duration
}

func TestChaos(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace is not installed (make strace installs it)")
	}
	if out, err := exec.Command("strace", "-f", "-o", "/dev/null", "-e", "inject=getpid:error=EIO", "true").CombinedOutput(); err != nil {
		t.Skipf("strace cannot trace here (ptrace refused?): %v %s", err, out)
	}
	bin := buildKernelctl(t)
	faults, workers, perWorker := shortFaults, 3, 40
	if *long {
		faults, workers, perWorker = longFaults(), 6, 120
	}
	var tl tally
	start := time.Now()
	for _, f := range faults {
		t.Run(f.String(), func(t *testing.T) { runCase(t, bin, f, workers, perWorker, &tl) })
	}
	// A campaign whose faults never fired proved nothing.
	if tl.injected == 0 || tl.failStops == 0 {
		t.Errorf("%d of %d cases had a fault injected and %d failed stop: the campaign did not test durability faults", tl.injected, tl.cases, tl.failStops)
	}
	t.Logf("fault cases %d (faults injected in %d), calls %d, acknowledged ok %d, fail stops (exit 1) %d, runtime crashes from write injection %d; lost %d, duplicated %d, contradicted %d, stuck keys %d, staging left %d, verifier failures %d, operations with two stories %d, no exit after a durability fault %d",
		tl.cases, tl.injected, tl.calls, tl.acked, tl.failStops, tl.crashes, tl.lost, tl.duplicated, tl.contradicted, tl.stuck, tl.staging, tl.verifyFailed, tl.doubly, tl.noExit)
	t.Logf("durability error to exit: %s; restart (recovery included) to serving: %s; campaign %s",
		spread(tl.toExit), spread(tl.restart), time.Since(start).Round(time.Millisecond))
}

// buildKernelctl builds kernelctl into a temporary dir.
func buildKernelctl(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "kernelctl")
	// Not race-built even when the suite is: a race-built kernel under
	// strace is ten times slower, too slow for make test's budget.
	build := exec.Command("go", "build", "-o", bin, "github.com/capkernel/capkernel/cmd/kernelctl")
	build.Env = append(os.Environ(), "GOEXPERIMENT=jsonv2") // the module needs it (see the Makefile)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build kernelctl: %v\n%s", err, out)
	}
	return bin
}

// TestWorkspaceVerifyCatchesLoss: the loss the old kernel produced (an
// acknowledged write gone, an older version back, a staging file left)
// passes ledger verify and replay verify, and kernelctl workspace verify
// names each path and exits 1.
func TestWorkspaceVerifyCatchesLoss(t *testing.T) {
	bin := buildKernelctl(t)
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	tok, jti, policyHash := mint(t, data, ws)
	srv := startServe(t, bin, data, nil)
	if srv.url == "" {
		t.Fatalf("serve: %s", srv.stderr.String())
	}
	calls := workload(srv.url, tok, jti, policyHash, 1, 6)
	srv.stop(t, 0)
	for _, c := range calls {
		if c.first == nil || c.first.Status != kernel.StatusOK {
			t.Fatalf("call %s: %+v", c.key, c.first)
		}
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append(args, "--data", data)...)
		cmd.Env = append(os.Environ(), "CAPKERNEL_SERVER=", "CAPKERNEL_DATA=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("workspace", "verify"); err != nil {
		t.Fatalf("workspace verify on an intact workspace: %v\n%s", err, out)
	}
	// w0-0.txt and w0-3.txt are new files, w0-latest.txt was written
	// twice (calls 1 and 4).
	os.Remove(filepath.Join(ws, "w0-3.txt"))
	os.WriteFile(filepath.Join(ws, "w0-latest.txt"), []byte("worker 0 call 1\n"), 0o644)
	os.WriteFile(filepath.Join(ws, ".capk-stage-lost-0"), []byte("x"), 0o644)
	for _, v := range [][]string{{"ledger", "verify"}, {"replay", "verify"}} {
		if out, err := run(v...); err != nil {
			t.Fatalf("%s fails on a workspace loss (it cannot see it, it need not fail): %v\n%s", v, err, out)
		}
	}
	out, err := run("workspace", "verify")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("workspace verify on a planted loss: %v, want exit 1\n%s", err, out)
	}
	for _, p := range []string{"w0-3.txt", "w0-latest.txt", ".capk-stage-lost-0"} {
		if !strings.Contains(out, p) {
			t.Errorf("workspace verify does not name %s:\n%s", p, out)
		}
	}
	if strings.Contains(out, "w0-0.txt") {
		t.Errorf("workspace verify names the intact w0-0.txt:\n%s", out)
	}
}

// spread formats min / median / max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none measured"
	}
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %s, median %s, max %s (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

// sent is one call of the workload and its first answer.
type sent struct {
	envelope []byte
	key      string
	file     string // a new file the call writes (exact content checked), or ""
	content  string
	first    *kernel.Result // nil when the transport failed
}

func runCase(t *testing.T, bin string, f fault, workers, perWorker int, tl *tally) {
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	tok, jti, policyHash := mint(t, data, ws)

	// 1. Serve under injection while the workload runs.
	traceLog := filepath.Join(dir, "strace.log")
	srv := startServe(t, bin, data, []string{"strace", "-f", "-qq", "--seccomp-bpf", "-ttt", "-s", "256", "-o", traceLog,
		"-e", "trace=" + f.syscalls, "-e", "inject=" + f.syscalls + ":error=" + f.errno + ":when=" + f.when})
	var calls []*sent
	if srv.url != "" {
		calls = workload(srv.url, tok, jti, policyHash, workers, perWorker)
	}
	grace := 200 * time.Millisecond
	if f.durable {
		grace = 3 * time.Second // time to fail stop on its own
	}
	exitedAt, code := srv.stop(t, grace)
	injected := firstInjection(t, traceLog)
	acked, unknown := 0, 0
	for _, c := range calls {
		if c.first != nil && c.first.Status == kernel.StatusOK {
			acked++
		}
		if c.first == nil || c.first.TxOutcome == kernel.TxUnknown {
			unknown++
		}
	}
	t.Logf("%d calls, %d acknowledged ok, %d with outcome unknown; injected: %v; exited on its own: %v (status %d); %s",
		len(calls), acked, unknown, !injected.IsZero(), srv.selfExit, code, lastLine(srv.stderr.String()))
	tl.mu.Lock()
	tl.cases++
	if !injected.IsZero() {
		tl.injected++
	}
	tl.calls += len(calls)
	tl.acked += acked
	if srv.selfExit && code == 1 {
		tl.failStops++
		if !injected.IsZero() {
			tl.toExit = append(tl.toExit, exitedAt.Sub(injected))
		}
	}
	if f.durable && !injected.IsZero() && !srv.selfExit && injected.Before(srv.termAt) {
		tl.noExit++
		t.Errorf("a %s fault was injected at %s and the kernel kept serving (it must fail stop and exit non-zero)", f, injected.Format(time.StampMicro))
	}
	if srv.selfExit && code == 0 {
		t.Errorf("the kernel exited 0 on its own after a fault")
	}
	switch {
	case code == 0 || code == 1: // a clean stop; a fail stop or a failed start
	case code == 2 && strings.Contains(grepLines(traceLog, "netpollBreak"), "write failed"):
		// strace cannot restrict an injection to some descriptors: a
		// write(2) failed on the Go runtime's own eventfd, which no disk
		// fault does, and the runtime aborted. That is a crash like a
		// kill -9, and every check below holds for it all the same.
		t.Logf("the injection hit the Go runtime's eventfd write: a crash, checked like a kill -9")
		tl.crashes++ // under tl.mu
	default:
		t.Errorf("kernelctl exited with status %d: %s\n%s", code, lastLine(srv.stderr.String()), grepLines(traceLog, "write(2,"))
	}
	tl.mu.Unlock()
	for _, c := range calls {
		if c.first != nil && c.first.Status == kernel.StatusError && c.first.TxOutcome == kernel.Committed {
			t.Errorf("key %s: an error answer claims committed: %+v", c.key, c.first.Error)
			tl.mu.Lock()
			tl.contradicted++
			tl.mu.Unlock()
		}
	}

	// 2. Restart without injection: recovery, then the workspace as the
	// kernel left it, before any retry.
	t0 := time.Now()
	srv = startServe(t, bin, data, nil)
	if srv.url == "" {
		t.Fatalf("restart without injection failed: %s", srv.stderr.String())
	}
	tl.mu.Lock()
	tl.restart = append(tl.restart, srv.servingAt.Sub(t0))
	tl.mu.Unlock()
	srv.stop(t, 0)
	verify(t, bin, data, tl, "after recovery")
	for _, c := range calls {
		if c.file == "" || c.first == nil || c.first.Status != kernel.StatusOK {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(ws, c.file)); err != nil || string(b) != c.content {
			t.Errorf("acknowledged write of %s (key %s) is not there after recovery: %q, %v", c.file, c.key, b, err)
			tl.mu.Lock()
			tl.lost++
			tl.mu.Unlock()
		}
	}

	// 3. Every client retries every call with its key: each gets a
	// definitive answer that agrees with the first one.
	srv = startServe(t, bin, data, nil)
	if srv.url == "" {
		t.Fatalf("second restart failed: %s", srv.stderr.String())
	}
	cl := &httpapi.Client{BaseURL: srv.url}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, _, err := cl.Call(ctx, c.envelope)
		cancel()
		if err != nil {
			t.Errorf("retry of key %s: %v", c.key, err)
			continue
		}
		bad := ""
		switch {
		case r.Error != nil && r.Error.Class == kernel.ErrIdempotencyInFlight:
			bad = "stuck"
		case r.Status != kernel.StatusOK:
			bad = "stuck" // no definitive outcome once the disk is fine
		case c.first == nil || c.first.TxOutcome == kernel.TxUnknown:
		case c.first.Status == kernel.StatusOK && (!r.Replayed || r.OperationID != c.first.OperationID):
			bad = "lost"
		case c.first.Status == kernel.StatusError && r.Replayed:
			bad = "contradicted"
		}
		if bad != "" {
			t.Errorf("retry of key %s: %s (first %+v; retry %+v %+v)", c.key, bad, c.first, r, r.Error)
			tl.mu.Lock()
			switch bad {
			case "stuck":
				tl.stuck++
			case "lost":
				tl.lost++
			default:
				tl.contradicted++
			}
			tl.mu.Unlock()
		}
	}
	srv.stop(t, 0)
	for _, c := range calls {
		if c.file == "" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(ws, c.file)); err != nil || string(b) != c.content {
			t.Errorf("%s after every retry: %q, %v; want %q", c.file, b, err, c.content)
			tl.mu.Lock()
			tl.lost++
			tl.mu.Unlock()
		}
	}
	verify(t, bin, data, tl, "after retries")
	countStories(t, data, tl)
}

// mint makes a kernel in data and the workspace ws, and the workload's
// token: fs.write and kv.put in ws.
func mint(t *testing.T, data, ws string) (tok, jti, policyHash string) {
	if _, err := kernel.Init(data); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent", Expiry: time.Now().Add(2 * time.Hour),
		Cap: captoken.Capability{Tools: []string{"fs.write", "kv.put"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}, KV: []captoken.KVScope{{Keys: "*", Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return tok, cl.ID, k.PolicyHash()
}

// workload runs workers clients, each sending perWorker mutating calls
// one after another (a new file, an overwrite of its latest.txt, a kv put)
// until the kernel goes away.
func workload(url, tok, jti, policyHash string, workers, perWorker int) []*sent {
	var mu sync.Mutex
	var all []*sent
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &httpapi.Client{BaseURL: url}
			refused := 0
			for i := range perWorker {
				c := &sent{key: fmt.Sprintf("w%d-%d", w, i)}
				var tool string
				var args map[string]any
				switch i % 3 {
				case 0, 1:
					c.file, c.content = fmt.Sprintf("w%d-%d.txt", w, i), fmt.Sprintf("worker %d call %d\n", w, i)
					tool, args = "fs.write", map[string]any{"path": c.file, "content": c.content}
					if i%3 == 1 {
						tool, args = "fs.write", map[string]any{"path": fmt.Sprintf("w%d-latest.txt", w), "content": c.content}
						c.file = ""
					}
				case 2:
					tool, args = "kv.put", map[string]any{"key": fmt.Sprintf("w%d", w), "value": i}
				}
				a, _ := json.Marshal(args)
				c.envelope, _ = json.Marshal(map[string]any{
					"tool_id": tool, "args": json.RawMessage(a), "agent_id": "agent", "capability_token": tok,
					"capability_token_id": jti, "policy_hash": policyHash, "idempotency_key": c.key, "task_class": "chaos",
				})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, _, err := cl.Call(ctx, c.envelope)
				cancel()
				if err == nil {
					c.first = r
				}
				mu.Lock()
				all = append(all, c)
				mu.Unlock()
				// Caught in a fail stop (unknown), or refused after one.
				if err != nil || (r.Error != nil && r.Error.Class == kernel.ErrInternal) {
					if refused++; refused >= 3 {
						return // the kernel is gone or failed stop
					}
				}
			}
		}()
	}
	wg.Wait()
	return all
}

// server is a running kernelctl serve.
type server struct {
	cmd       *exec.Cmd
	url       string
	servingAt time.Time
	stderr    *syncBuffer
	exited    chan struct{}
	exitedAt  time.Time
	code      int
	selfExit  bool      // it exited before stop asked it to
	termAt    time.Time // when stop sent SIGTERM
}

// startServe starts kernelctl serve on data, under wrap (strace …) when
// given, and waits until it serves or exits.
func startServe(t *testing.T, bin, data string, wrap []string) *server {
	// A port of its own, so that readiness does not depend on a line
	// written to stdout, which an injected write fault may swallow.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	argv := append(append([]string{}, wrap...), bin, "serve", "--data", data, "--listen", addr, "--drain", "5s")
	cmd := exec.Command(argv[0], argv[1:]...)
	s := &server{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr, cmd.Stdout = s.stderr, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	go func() {
		for {
			select {
			case <-s.exited:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				served <- "http://" + addr
				return
			}
		}
	}()
	go func() {
		cmd.Wait()
		s.exitedAt = time.Now()
		s.code = cmd.ProcessState.ExitCode()
		close(s.exited)
	}()
	select {
	case s.url = <-served:
		s.servingAt = time.Now()
	case <-s.exited:
		s.selfExit = true
	case <-time.After(60 * time.Second):
		t.Fatalf("kernelctl serve did not start: %s", s.stderr.String())
	}
	return s
}

// stop waits up to grace for the server to exit on its own, then sends
// SIGTERM; it returns when and how it exited.
func (s *server) stop(t *testing.T, grace time.Duration) (time.Time, int) {
	select {
	case <-s.exited:
		s.selfExit = true
	case <-time.After(grace):
		// The signal goes to kernelctl itself: strace, on SIGTERM,
		// would detach and leave it running.
		s.termAt = time.Now()
		syscall.Kill(s.kernelPid(), syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(s.kernelPid(), syscall.SIGKILL)
			s.cmd.Process.Kill()
			<-s.exited
			t.Errorf("kernelctl serve did not stop on SIGTERM: %s", s.stderr.String())
		}
	}
	return s.exitedAt, s.code
}

// kernelPid is the pid of kernelctl: the process started, or strace's child.
func (s *server) kernelPid() int {
	pid := s.cmd.Process.Pid
	if filepath.Base(s.cmd.Path) != "strace" {
		return pid
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if f := strings.Fields(string(b)); len(f) > 0 {
		if c, err := strconv.Atoi(f[0]); err == nil {
			return c
		}
	}
	return pid
}

// firstInjection returns the time of the first injected fault in strace's
// log (-ttt), or zero when none was injected.
func firstInjection(t *testing.T, log string) time.Time {
	b, err := os.ReadFile(log)
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "(INJECTED)") {
			continue
		}
		fields := strings.Fields(line)
		for _, f := range fields {
			if strings.Contains(f, ".") {
				if sec, err := strconv.ParseFloat(f, 64); err == nil && sec > 1e9 {
					return time.Unix(0, int64(sec*1e9))
				}
			}
		}
	}
	return time.Time{}
}

// verify runs the three verifiers on the stopped kernel's data dir.
func verify(t *testing.T, bin, data string, tl *tally, when string) {
	for _, v := range [][]string{{"ledger", "verify"}, {"replay", "verify"}, {"workspace", "verify"}} {
		cmd := exec.Command(bin, append(v, "--data", data)...)
		cmd.Env = append(os.Environ(), "CAPKERNEL_SERVER=", "CAPKERNEL_DATA=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: kernelctl %s: %v\n%s", when, strings.Join(v, " "), err, out)
			tl.mu.Lock()
			tl.verifyFailed++
			if strings.Contains(string(out), "staging") {
				tl.staging++
			}
			tl.mu.Unlock()
		}
	}
}

// countStories reads the ledger: no idempotency key may have two
// committed records, and no operation two audit records.
func countStories(t *testing.T, data string, tl *tally) {
	in, err := kernel.OpenInspector(data)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	committed, records := map[string]int{}, map[string]int{}
	err = in.Scan(0, func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit {
			return nil
		}
		var a struct {
			OperationID    string `json:"operation_id"`
			IdempotencyKey string `json:"idempotency_key"`
			TxOutcome      string `json:"tx_outcome"`
		}
		if err := json.Unmarshal(e.Body, &a); err != nil {
			return err
		}
		records[a.OperationID]++
		if a.TxOutcome == kernel.Committed {
			committed[a.IdempotencyKey]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for k, n := range committed {
		if n > 1 {
			tl.duplicated++
			t.Errorf("key %s committed %d times", k, n)
		}
	}
	for op, n := range records {
		if n > 1 {
			tl.doubly++
			t.Errorf("operation %s has %d audit records", op, n)
		}
	}
}

// syncBuffer is a bytes buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// grepLines returns the lines of file that contain any of words.
func grepLines(file string, words ...string) string {
	b, _ := os.ReadFile(file)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
