package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// waitSpareChain waits until s has a spare chain and returns it.
func waitSpareChain(t *testing.T, s *Sandbox) *chain {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s.mu.Lock()
		c := s.spareChain
		s.mu.Unlock()
		if c != nil {
			return c
		}
	}
	t.Fatal("no spare chain was started after a run")
	return nil
}

// spareAfterRun runs `true` in p, which leaves a spare chain behind, and
// returns that chain once it is made.
func spareAfterRun(t *testing.T, s *Sandbox, p Profile) *chain {
	t.Helper()
	res, err := s.Run(context.Background(), p, Command{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	return waitSpareChain(t, s)
}

// A plain run leaves a spare chain behind — bwrap, started, waiting for
// its options — and the next plain run takes it: the command runs in it
// (its bwrap is the process the run waited for), the spare is replaced,
// and Close kills the one left.
func TestSpareChain(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	p := Profile{Roots: []Root{{Path: t.TempDir()}}}
	run := func(argv ...string) *Result {
		t.Helper()
		res, err := s.Run(context.Background(), p, Command{Argv: argv, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		res.Close()
		return res
	}
	run("true")
	spare := waitSpareChain(t, s)
	pid := spare.cmd.Process.Pid
	// A root kernel's chain is unshare until it has made its user
	// namespace and exec'd bwrap.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err == nil && strings.TrimSpace(string(b)) == "bwrap" {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("the spare chain's process %d is %q (%v), want bwrap", pid, b, err)
		}
	}
	// A root kernel's spare has the /etc directories bound into the
	// snapshot already: there, read-only, as the run's own binds were;
	// its /dev made, and its loopback up (TestSpareChainMadeAhead).
	if os.Geteuid() == 0 && (!spare.ahead.mounted || !spare.ahead.loopback) {
		t.Errorf("the spare chain has not made ahead what it should: %+v", spare.ahead)
	}
	script := `echo from the spare; test -s /etc/ssl/certs/ca-certificates.crt && echo certs; touch /etc/ssl/certs/x 2>/dev/null || echo read-only`
	if res := run("sh", "-c", script); string(res.Stdout) != "from the spare\ncerts\nread-only\n" || res.ExitCode != 0 {
		t.Fatalf("run in the spare: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if spare.cmd.ProcessState == nil || !spare.cmd.ProcessState.Exited() {
		t.Fatal("the run did not take the spare chain")
	}
	next := waitSpareChain(t, s)
	if next == spare {
		t.Fatal("the spare chain was not replaced")
	}
	s.Close()
	select {
	case <-next.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close left the spare chain running")
	}
}

// What a root kernel's spare chain makes ahead — the sandbox's /dev, its
// network namespace with the loopback up — is what a chain started for
// the run has: the same command sees the same /dev, the same device nodes
// work, /dev is read-only but for /dev/shm and a pty, the host's nodes
// cannot be changed (chmod of a node the sandbox user, the host's uid 0,
// owns: a no-op mode, so a failure of this test changes nothing), the
// loopback answers and nothing else is reachable; and a run with the
// host's network never takes such a spare.
func TestSpareChainMadeAhead(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s is not installed", c)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "reached") }))
	defer srv.Close()
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	p := Profile{Roots: []Root{{Path: t.TempDir()}}}
	script := `ls -A /dev | tr '\n' ' '; echo
echo x > /dev/null && echo null
test "$(head -c 4 /dev/urandom | wc -c)" = 4 && echo urandom
test "$(head -c 3 /dev/zero | od -An -tx1 | tr -d ' ')" = 000000 && echo zero
echo x > /dev/full 2>/dev/null || echo full
chmod 0666 /dev/full 2>/dev/null || echo host-node-unchanged
touch /dev/x 2>/dev/null || echo dev-read-only
echo y > /dev/shm/y && echo shm
test -c /dev/pts/ptmx && test -L /dev/ptmx && test -L /dev/fd && echo pts
bash -c 'exec 3<>/dev/tcp/127.0.0.1/9' 2>&1 | grep -q 'Connection refused' && echo loopback-up
curl -sS --max-time 5 ` + srv.URL + ` 2>/dev/null || echo host-unreachable
`
	run := func(net NetMode) string {
		t.Helper()
		p.Net = net
		res, err := s.Run(context.Background(), p, Command{Argv: []string{"sh", "-c", script}, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		res.Close()
		return string(res.Stdout) + string(res.Stderr)
	}
	fresh := run(NetOff) // the Sandbox's first run: a chain of its own
	spare := waitSpareChain(t, s)
	if os.Geteuid() == 0 && (!spare.ahead.mounted || !spare.ahead.loopback || !spare.netNS) {
		t.Fatalf("the spare chain has not made ahead what it should: %+v", spare.ahead)
	}
	ahead := run(NetOff)
	if spare.cmd.ProcessState == nil {
		t.Fatal("the run did not take the spare chain")
	}
	want := "null\nurandom\nzero\nfull\nhost-node-unchanged\ndev-read-only\nshm\npts\nloopback-up\nhost-unreachable\n"
	if !strings.HasSuffix(fresh, want) || !strings.HasPrefix(fresh, "core fd full null ptmx pts random shm stderr stdin stdout tty urandom zero \n") {
		t.Errorf("on a chain of its own:\n%s", fresh)
	}
	if ahead != fresh {
		t.Errorf("on the spare chain:\n%s\non a chain of its own:\n%s", ahead, fresh)
	}
	next := waitSpareChain(t, s)
	if full := run(NetFull); !strings.HasSuffix(full, "reached") {
		t.Errorf("the full posture did not reach the host's server: %s", full)
	}
	s.mu.Lock()
	kept := s.spareChain == next
	s.mu.Unlock()
	if os.Geteuid() == 0 && !kept {
		t.Error("a run with the host's network took the spare chain (its network namespace is the spare's own)")
	}
}

// A spare chain is not taken when the /etc snapshot has been replaced
// since it started (it names the old one) nor when it has died: the run
// starts a chain of its own and succeeds.
func TestSpareChainStale(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	p := Profile{Roots: []Root{{Path: t.TempDir()}}}
	for _, tc := range []struct {
		name  string
		spoil func(c *chain)
	}{
		{"etc replaced", func(c *chain) { c.etc = &etcSnap{} }},
		{"died", func(c *chain) {
			c.cmd.Process.Signal(syscall.SIGKILL)
			for !c.exited() {
				time.Sleep(time.Millisecond)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spare := spareAfterRun(t, s, p)
			tc.spoil(spare)
			res, err := s.Run(context.Background(), p, Command{Argv: []string{"echo", "ok"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Close()
			if string(res.Stdout) != "ok\n" {
				t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
			select {
			case <-spare.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the unusable spare was left running")
			}
			if spare.cmd.ProcessState.Exited() {
				t.Fatal("the unusable spare ran a sandbox instead of being killed")
			}
		})
	}
}

// A run that comes while the spare chain is still being made (a call
// right after the previous one) waits for it rather than start a second
// chain beside it; a cancelled run stops waiting.
func TestSpareChainBeingMade(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	tl, err := s.tools(false, os.Geteuid() == 0, false)
	if err != nil {
		t.Fatal(err)
	}
	etc, release, err := s.acquireEtc()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for _, cancelled := range []bool{false, true} {
		s.kickSpareChain(tl)
		s.mu.Lock()
		made := s.makingChain
		s.mu.Unlock()
		if made == nil {
			t.Fatal("kickSpareChain is not making a spare chain")
		}
		ctx, cancel := context.WithCancel(context.Background())
		if cancelled {
			cancel()
		}
		c := s.takeSpareChain(ctx, etc, false, false)
		cancel()
		if cancelled {
			if c != nil {
				t.Fatal("a cancelled run waited for the spare chain")
			}
			<-made
			c = s.takeSpareChain(context.Background(), etc, false, false)
		}
		if c == nil || c.exited() {
			t.Fatalf("cancelled %v: took %v, want the spare chain that was being made", cancelled, c)
		}
		c.end()
	}
}

// A spare chain being made that stalls (its unshare stopped before it
// runs bwrap) holds a run up for spareWait at most, not for the stalled
// chain's 10 s: the run starts a chain of its own and its command runs
// within its timeout.
func TestStalledSpareChain(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	tl, err := s.tools(false, os.Geteuid() == 0, false)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pidFile, stalled := filepath.Join(dir, "pid"), *tl
	stalled.unshare = filepath.Join(dir, "unshare")
	script := "#!/bin/sh\necho $$ > " + pidFile + "\nkill -STOP $$\nexec " + tl.unshare + ` "$@"` + "\n"
	if err := os.WriteFile(stalled.unshare, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Let the stalled chain end, so that Close need not wait for it.
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	s.kickSpareChain(&stalled)
	start := time.Now()
	res, err := s.Run(context.Background(), Profile{Roots: []Root{{Path: t.TempDir()}}}, Command{Argv: []string{"echo", "hi"}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	if took := time.Since(start); res.TimedOut || strings.TrimSpace(string(res.Stdout)) != "hi" || took > 4*time.Second {
		t.Fatalf("a run behind a stalled spare chain: timed out %v, stdout %q, after %v", res.TimedOut, res.Stdout, took)
	}
}

// A run that fails before its command starts (here: the run's end of its
// spare chain's options pipe is a closed file, so it cannot hand bwrap
// its options) removes its pids cgroup as a finished run does; none is
// left behind. The pipe itself stays open, so bwrap waits for its options
// until the run kills it: closing it would let bwrap run (and exit) with
// none, and fork a child before that, which the kill of bwrap would leave
// behind in the cgroup, and the run might find the spare exited and take
// a fresh chain.
func TestFailedRunRemovesCgroup(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	parent, v1, err := ownPidsCgroup()
	if err != nil || !v1 {
		t.Skip("no cgroup v1 pids hierarchy of this process")
	}
	ours := filepath.Join(parent, fmt.Sprintf("capkernel-sandbox-%d-*", os.Getpid()))
	before, _ := filepath.Glob(ours)
	s := New(Options{StagingDir: t.TempDir()})
	p := Profile{Roots: []Root{{Path: t.TempDir()}}, Limits: Limits{Processes: 10}}
	spareAfterRun(t, s, p)
	for i := range 5 {
		c := waitSpareChain(t, s)
		if c.f == nil {
			s.Close()
			t.Skip("spare chains are made without a forker here")
		}
		closed, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		c.argsW = closed // the pipe's end stays in c.ends until the chain is closed
		if res, err := s.Run(context.Background(), p, Command{Argv: []string{"true"}}); err == nil {
			res.Close()
			t.Fatalf("run %d on a spare chain without its options pipe succeeded", i)
		}
	}
	s.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after, _ := filepath.Glob(ours)
		if len(after) <= len(before) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids cgroups left by the failed runs: %v (before: %v)", after, before)
		}
	}
}

// With Command.Spare, Run hands the start of the next spare chain to the
// caller instead of starting it as it ends; the caller's start makes it.
func TestSpareChainStartedByCaller(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	var start func()
	res, err := s.Run(context.Background(), Profile{Roots: []Root{{Path: t.TempDir()}}},
		Command{Argv: []string{"true"}, Spare: func(f func()) { start = f }})
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	if start == nil {
		t.Fatal("Run did not hand the start of the next spare chain to Command.Spare")
	}
	s.mu.Lock()
	making, spare := s.makingChain, s.spareChain
	s.mu.Unlock()
	if making != nil || spare != nil {
		t.Fatal("Run started the next spare chain itself")
	}
	start()
	waitSpareChain(t, s)
}

// Overlays are mounted in the chain's own mount namespace by nsenter and
// mount, no shell: the mount is there and not on the host; a mount the
// kernel refuses (here: a missing mount point) is errOverlayRefused with
// mount's message, which StagingAuto falls back from.
func TestMountOverlays(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	tl, err := s.tools(true, true, false)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.WriteFile(root+"/a.txt", []byte("lower\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		spoil   func(r *rootPlan)
		refused bool
	}{
		{"mounted", func(*rootPlan) {}, false},
		{"refused", func(r *rootPlan) { r.merged += "-missing" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := newStageDir(s.opts.StagingDir, "run-")
			if err != nil {
				t.Fatal(err)
			}
			defer st.remove()
			r := &rootPlan{Root: Root{Path: root, Writable: true}, real: root}
			if err := setupOverlay(st, r); err != nil {
				t.Fatal(err)
			}
			tc.spoil(r)
			etc, release, err := s.acquireEtc()
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.startChain(tl, overlayChainSpec(tl), etc, release, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = mountOverlays(tl, c, st, []*rootPlan{r})
			var inChain, onHost string
			if err == nil {
				mi, _ := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/mountinfo")
				inChain = string(mi)
				host, _ := os.ReadFile("/proc/self/mountinfo")
				onHost = string(host)
			}
			c.discard()
			<-c.done
			if tc.refused {
				if !errors.Is(err, errOverlayRefused) || !strings.Contains(err.Error(), "-missing") {
					t.Fatalf("mountOverlays = %v, want errOverlayRefused naming the mount point", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(inChain, " "+r.merged+" ") {
				t.Errorf("the overlay is not mounted in the chain:\n%s", inChain)
			}
			if strings.Contains(onHost, r.merged) {
				t.Errorf("the overlay is visible on the host:\n%s", onHost)
			}
		})
	}
}

// A spare chain killed from outside (SIGKILL to its processes) just
// before a run, so that the run takes it before it has been reaped, does
// not fail the run: the run finds it dead before its command could start
// and runs on a fresh chain, once. Each case kills five spares in a row,
// each just before the run that takes it.
func TestDeadSpareChainRetried(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		staging StagingMode
		rw      bool
	}{
		{"r-root", StagingAuto, false},
		{"rw-copy", StagingCopy, true},
		{"rw-overlay", StagingOverlay, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.staging == StagingOverlay && !sparesMountNS() {
				t.Skip("an ordinary user's overlay run does not take the spare chain")
			}
			s := New(Options{StagingDir: t.TempDir(), Staging: c.staging})
			defer s.Close()
			ws := t.TempDir()
			p := Profile{Roots: []Root{{Path: ws, Writable: c.rw}}}
			cmd := Command{Argv: []string{"sh", "-c", "echo ran; echo x > " + ws + "/out"}}
			if !c.rw {
				cmd.Argv = []string{"echo", "ran"}
			}
			res, err := s.Run(context.Background(), p, cmd)
			if err != nil {
				t.Fatal(err)
			}
			res.Close()
			for i := range 5 {
				spare := waitSpareChain(t, s)
				// The chain's process group: unshare (exec'd into bwrap)
				// or bwrap.
				if err := syscall.Kill(-spare.cmd.Process.Pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				res, err := s.Run(context.Background(), p, cmd)
				if err != nil {
					t.Fatalf("run %d on a killed spare chain: %v", i, err)
				}
				if res.ExitCode != 0 || string(res.Stdout) != "ran\n" {
					t.Errorf("run %d: exit %d, stdout %q, stderr %q", i, res.ExitCode, res.Stdout, res.Stderr)
				}
				if c.rw && len(res.Delta.Changes) != 1 {
					t.Errorf("run %d: delta %+v, want the one file written", i, res.Delta.Changes)
				}
				res.Close()
			}
		})
	}
}

// A chain killed from outside once its command has started is not run
// again: the run ends with the kill in its Result, and the command ran
// once.
func TestStartedChainKilledNotRetried(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	p := Profile{Roots: []Root{{Path: t.TempDir()}}}
	for _, fromSpare := range []bool{false, true} {
		if fromSpare {
			waitSpareChain(t, s)
		}
		out := &signalWriter{seen: make(chan struct{})}
		var res *Result
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, err = s.Run(context.Background(), p, Command{Argv: []string{"sh", "-c", "echo ran; exec sleep 30.5"}, Stdout: out})
		}()
		select {
		case <-out.seen:
		case <-done:
			t.Fatalf("spare %v: the run ended before its command wrote: %v", fromSpare, err)
		}
		syscall.Kill(-chainOfSleep(t, "30.5"), syscall.SIGKILL)
		<-done
		if err != nil {
			t.Fatalf("spare %v: %v", fromSpare, err)
		}
		if res.Signal != "killed" || out.count() != 1 {
			t.Errorf("spare %v: signal %q, command ran %d times; want killed, once", fromSpare, res.Signal, out.count())
		}
		res.Close()
	}
}

// A spare chain killed after its init said "ready" — here while the
// run's Gate runs, which the kernel uses to make its intent durable — is
// not run again: the Gate runs once and the run fails. (Before "ready" the
// init has had no "go", so a retry is safe; after it, the command may be
// under way.)
func TestChainKilledInGateNotRetried(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	p := Profile{Roots: []Root{{Path: t.TempDir()}}}
	spare := spareAfterRun(t, s, p)
	var calls atomic.Int32
	gate := func() error {
		if calls.Add(1) == 1 {
			syscall.Kill(-spare.cmd.Process.Pid, syscall.SIGKILL)
			<-spare.done
		}
		return nil
	}
	res, err := s.Run(context.Background(), p, Command{Argv: []string{"echo", "ran"}, Gate: gate})
	if n := calls.Load(); n != 1 {
		t.Fatalf("the Gate ran %d times (res %+v, err %v): a chain killed after \"ready\" was run again", n, res, err)
	}
	if err == nil {
		res.Close()
		t.Fatalf("the run on a chain killed in its Gate succeeded: %+v", res)
	}
}

// signalWriter counts the lines "ran" written to it and closes seen at
// the first.
type signalWriter struct {
	mu   sync.Mutex
	buf  []byte
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := w.countLocked() == 0
	w.buf = append(w.buf, p...)
	if first && w.countLocked() > 0 {
		close(w.seen)
	}
	return len(p), nil
}

func (w *signalWriter) countLocked() int { return strings.Count(string(w.buf), "ran\n") }

func (w *signalWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.countLocked()
}

// chainOfSleep returns the pid of the chain (bwrap, a child of this
// process) whose sandbox runs `sleep arg`: the sleep's parent is the
// sandbox's init, and the init's parent bwrap.
func chainOfSleep(t *testing.T, arg string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if string(cmdline) != "sleep\x00"+arg+"\x00" {
				continue
			}
			if bwrap := parentOf(parentOf(pid)); bwrap > 0 && parentOf(bwrap) == os.Getpid() {
				return bwrap
			}
		}
	}
	t.Fatalf("no sleep %s in a chain of this process", arg)
	return 0
}
