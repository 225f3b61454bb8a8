package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errOverlayRefused: the kernel refused the overlay mount in the run's
// namespace (StagingAuto then retries by copy).
var errOverlayRefused = errors.New("sandbox: overlayfs refused")

// Run runs c under the profile p. It returns an error, and no Result,
// when the run cannot start or its sandbox cannot be set up (including
// ErrUnavailable); anything the command does — a non-zero exit, a
// timeout, a cancellation — is in the Result. Call Result.Close when done
// with the delta.
func (s *Sandbox) Run(ctx context.Context, p Profile, c Command) (*Result, error) {
	pl, err := makePlan(p, c)
	if err != nil {
		return nil, err
	}
	mode := s.opts.Staging
	if mode == StagingAuto && (s.overlayRefused.Load() || pl.small()) {
		mode = StagingCopy
	}
	if len(pl.writable()) == 0 {
		mode = StagingOverlay // nothing staged
	}
	overlay := mode != StagingCopy && len(pl.writable()) > 0
	// A root kernel's chains mount the sandbox's /dev in their own mount
	// namespace (mountAhead): nsenter and mount, as overlays do.
	root := os.Geteuid() == 0
	t, err := s.tools(overlay || root, overlay || root, pl.net == NetAllowlist)
	if err != nil {
		return nil, err
	}
	fresh := false
	for {
		res, err := s.run(ctx, pl, t, mode, fresh)
		if errors.Is(err, errSpareDead) && !fresh {
			// Nothing of the command ran: once more, on a chain of its own.
			fresh = true
			continue
		}
		if errors.Is(err, errOverlayRefused) && s.opts.Staging == StagingAuto {
			s.overlayRefused.Store(true)
			s.refusedWhy.Store(err.Error())
			mode = StagingCopy
			continue
		}
		return res, err
	}
}

var defaultSandbox = sync.OnceValue(func() *Sandbox { return New(Options{}) })

// Run runs c under p with a Sandbox of default Options, shared by the
// process and never closed.
func Run(ctx context.Context, p Profile, c Command) (*Result, error) {
	return defaultSandbox().Run(ctx, p, c)
}

// errSpareDead: the spare chain the run took was found dead before its
// init had said "ready" (so before its "go"): nothing of the command ran,
// and Run retries once on a fresh chain. A spare killed from outside
// passes takeSpareChain's check until it is reaped.
var errSpareDead = errors.New("sandbox: the spare chain died before the run started")

// run runs the plan once, on the spare chain if there is one, unless
// fresh: then on a chain started for it.
func (s *Sandbox) run(ctx context.Context, pl *plan, t *tools, mode StagingMode, fresh bool) (res *Result, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var st *stageDir
	manifests := map[*rootPlan]map[string]stamp{}
	if rw := pl.writable(); len(rw) > 0 {
		if st, err = newStageDir(s.opts.StagingDir, "run-"); err != nil {
			return nil, err
		}
		defer func() {
			if res == nil {
				st.remove()
			}
		}()
		if mode != StagingCopy && !overlayPathOK(st.path) {
			return nil, fmt.Errorf("%w: staging path %q cannot go into overlay options", errOverlayRefused, st.path)
		}
		for _, r := range rw {
			if mode == StagingCopy {
				m, err := setupCopy(st, r)
				if err != nil {
					return nil, err
				}
				manifests[r] = m
			} else if err := setupOverlay(st, r); err != nil {
				return nil, fmt.Errorf("sandbox: staging: %w", err)
			}
		}
	}

	etc, releaseEtc, err := s.acquireEtc()
	if err != nil {
		return nil, err
	}
	defer releaseEtc()

	// The clock starts before the timeout's: a run the timeout ends lasts
	// at least the timeout, however the goroutine is scheduled.
	start := time.Now()
	runCtx := ctx
	var cancelTimeout context.CancelFunc = func() {}
	if pl.timeout > 0 {
		runCtx, cancelTimeout = context.WithTimeout(ctx, pl.timeout)
	}
	defer cancelTimeout()
	overlay := st != nil && mode != StagingCopy
	var ch *chain
	if pl.cmd.Channel == nil && !fresh {
		ch = s.takeSpareChain(ctx, etc, overlay, pl.net == NetFull)
	}
	spare := ch != nil
	var f *forker
	if ch != nil {
		f = ch.f
		if f != nil && pl.limits.Processes > 0 && !limitForker(f, pl.limits.Processes) {
			ch.discard()
			ch, f = nil, nil
		}
	}
	if ch == nil {
		sp := s.plainChainSpec(t)
		if overlay && !sp.mountNS {
			sp = overlayChainSpec(t)
		}
		sp.channel = pl.cmd.Channel
		// With a forker (forker.go), the chain is forked from its thread,
		// already in the run's pids cgroup: everything of the run is born
		// there.
		if pl.limits.Processes > 0 {
			if f = s.takeForker(); f != nil && !limitForker(f, pl.limits.Processes) {
				f.discard()
				f = nil
			}
		}
		if ch, err = s.startChain(t, sp, etc, func() {}, f); err != nil {
			return nil, err
		}
		spare = false
	}
	defer ch.close()
	if pl.cmd.Channel == nil {
		defer func() {
			switch {
			case errors.Is(err, errSpareDead):
				// The retry's run starts the next spare.
			case pl.cmd.Spare != nil:
				pl.cmd.Spare(func() { s.kickSpareChain(t) })
			default:
				s.kickSpareChain(t)
			}
		}()
	}

	stdout := &capped{max: pl.limits.Stdout}
	stderr := &capped{max: pl.limits.Stderr}
	var wout, werr io.Writer = stdout, stderr
	if w := pl.cmd.Stdout; w != nil {
		wout = io.MultiWriter(stdout, w)
	}
	if w := pl.cmd.Stderr; w != nil {
		werr = io.MultiWriter(stderr, w)
	}
	ch.stdout.attach(wout)
	ch.stderr.attach(werr)
	k := &killer{proc: ch.cmd.Process, grace: s.opts.KillGrace}
	if f != nil {
		k.setCgroup(f.cg)
	}
	startR, relW, infoR := ch.startR, ch.relW, ch.infoR
	// abort ends a run that fails before its command starts.
	abort := func(err error) (*Result, error) {
		if spare && ch.killedBefore(err) {
			err = fmt.Errorf("%w: %w", errSpareDead, err)
		}
		k.kill()
		<-ch.done
		k.removeCgroup()
		return nil, err
	}
	// The memory cgroup: the spare chain's own, moved in ahead (its
	// processes are born there); otherwise the init joins one while bwrap
	// sets the sandbox up (below).
	if ch.memDone != nil {
		<-ch.memDone
		if m := ch.mem; m != nil {
			ch.mem = nil // the run's now: the killer removes it
			k.setMem(m)
			if pl.limits.Memory > 0 {
				if err := m.setLimit(pl.limits.Memory); err != nil {
					return abort(fmt.Errorf("sandbox: setting the memory limit: %w", err))
				}
			}
		}
	}
	joinMem := pl.limits.Memory > 0 && k.mem == nil && MemoryCgroup() == nil
	if ch.mountNS && !ch.ahead.mounted {
		// A chain started for the run, or a spare whose mounts failed:
		// bwrap's --dev would bind the host's nodes writable, to a
		// sandbox user that owns them (dev.go). Made now, or no run.
		if err := s.mountAhead(t, ch, etc); err != nil {
			return abort(fmt.Errorf("sandbox: making the sandbox's /dev: %w", err))
		}
		ch.ahead.mounted = true
	}
	if overlay {
		if err := mountOverlays(t, ch, st, pl.writable()); err != nil {
			return abort(err)
		}
	}
	if err := ch.setArgs(s.bwrapArgs(pl, t, etc, ch.ahead), pl.stdin); err != nil {
		return abort(err)
	}
	// bwrap reports the sandbox's init as soon as it has made it. Without
	// a forker, the init joins its pids cgroup then, while bwrap sets the
	// sandbox up, since moving a process into a cgroup waits for an RCU
	// grace period. The init forks nothing before it has been released.
	joined := make(chan struct{})
	var memErr error // joining the memory cgroup failed: the run fails closed
	go func() {
		defer close(joined)
		pid := readInfo(infoR)
		if pid == 0 || !k.setInit(pid) {
			return
		}
		if pl.limits.Processes > 0 && f == nil {
			// The init and Processes of the command's: the watchdog
			// reports "processes" above that, and the host refuses any
			// fork beyond it even when the watchdog is starved.
			if c, err := joinPidsCgroup(pid, pl.limits.Processes+1); err == nil {
				k.setCgroup(c)
			}
		}
		if joinMem {
			// Right after the pids move, whose grace period it shares.
			memErr = joinMemCgroup(k, pid, pl.limits.Memory)
		}
	}()
	// The init says "ready", waits until the kernel has applied the limits
	// to it (and so to everything it starts), then says "started" once the
	// command is about to run.
	started := make(chan bool, 1)
	var releaseErr, gateErr error
	var ready bool // the init said "ready"; read once started has a value
	go func() {
		word := make([]byte, len("ready"))
		if _, err := io.ReadFull(startR, word); err != nil || string(word) != "ready" {
			relW.Close()
			started <- false
			return
		}
		ready = true
		<-joined
		releaseErr = memErr
		if releaseErr == nil {
			releaseErr = s.release(k, pl.limits)
		}
		if releaseErr != nil {
			relW.Close() // the init exits 125 without running anything
			started <- false
			return
		}
		if pl.cmd.Gate != nil {
			if gateErr = pl.cmd.Gate(); gateErr != nil {
				relW.Close()
				started <- false
				return
			}
		}
		_, err := relW.Write([]byte("go\n"))
		relW.Close()
		b, _ := io.ReadAll(io.LimitReader(startR, 64))
		started <- err == nil && string(b) == "started"
	}()

	res = &Result{Staging: mode}
	if mode == StagingAuto {
		res.Staging = StagingOverlay // the mode used, as documented
	}
	watchStop := make(chan struct{})
	var limitCh <-chan string
	if pl.limits.Processes > 0 {
		limitCh = watchProcesses(k, pl.limits.Processes, watchStop)
	}
	// The staging watchdog (stagewatch.go) ends a run whose staging has
	// grown past what its delta could ever be.
	var stageCh <-chan string
	var stageDone <-chan struct{}
	if st != nil && (pl.limits.DeltaBytes > 0 || pl.limits.DeltaFiles > 0) {
		var base int64
		for _, r := range pl.writable() {
			base += r.copied
		}
		stageCh, stageDone = watchStaging(pl.writable(), base, pl.limits, watchStop)
	}
	var waitErr error
loop:
	for {
		select {
		case <-ch.done:
			waitErr = ch.waitErr
			break loop
		case what := <-limitCh:
			limitCh = nil
			res.LimitExceeded = what
			k.kill()
		case why := <-stageCh:
			stageCh = nil
			res.DeltaErr = fmt.Errorf("%w: %s (killed)", ErrDeltaTooLarge, why)
			k.kill()
		case <-runCtx.Done():
			if ctx.Err() != nil {
				res.Cancelled = true
			} else {
				res.TimedOut = true
			}
			k.terminate()
			runCtx = context.Background() // fire once
		}
	}
	close(watchStop)
	if stageDone != nil {
		<-stageDone // it reads the roots' plans, which a retry rewrites
	}
	k.stop()
	k.waitGone(5 * time.Second)
	// A command whose fork the pids cgroup refused may end on its own
	// (its shell cannot fork the next command) before the watchdog's
	// next sample: it still hit the process limit.
	if res.LimitExceeded == "" && k.forkRefused() {
		res.LimitExceeded = "processes"
	}
	<-joined
	if res.LimitExceeded == "" && k.memOOM() {
		res.LimitExceeded = "memory"
	}
	k.removeCgroup()
	res.Duration = time.Since(start)

	ps := ch.cmd.ProcessState
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
		res.UserTime = time.Duration(ru.Utime.Nano())
		res.SystemTime = time.Duration(ru.Stime.Nano())
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = ws.Signal().String()
	} else {
		res.ExitCode = ps.ExitCode()
	}
	res.Stdout, res.StdoutTruncated = stdout.bytes()
	res.Stderr, res.StderrTruncated = stderr.bytes()
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) {
			return nil, fmt.Errorf("sandbox: wait: %w", waitErr)
		}
	}
	ok := <-started
	if gateErr != nil {
		return nil, fmt.Errorf("sandbox: gate: %w", gateErr)
	}
	if releaseErr != nil {
		return nil, fmt.Errorf("sandbox: setup: %w", releaseErr)
	}
	if res.DeltaErr != nil {
		// The staging watchdog ended the run: its staging goes now, not
		// when the caller closes the Result, to give the disk back.
		st.remove()
		return res, nil
	}
	if !ok && !res.Killed() && spare && !ready && res.Signal != "" {
		// The init never said "ready", so it never had its "go": the
		// spare was dead (killed from outside) before anything ran.
		return nil, fmt.Errorf("%w: chain ended by %s", errSpareDead, res.Signal)
	}
	if !ok && !res.Killed() {
		return nil, fmt.Errorf("sandbox: setup failed (exit %d): %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}

	res.stage = st
	if res.Killed() || st == nil {
		return res, nil
	}
	b := &deltaBuilder{limits: pl.limits, symlinks: s.opts.Symlinks}
	for _, r := range pl.writable() {
		var err error
		if mode == StagingCopy {
			err = b.copyDelta(r, manifests[r])
		} else {
			err = b.overlayDelta(r, "", false, true)
		}
		if err != nil {
			res.DeltaErr = err
			return res, nil
		}
	}
	res.Delta = b.delta()
	return res, nil
}

// release applies the limits and the niceness to the sandbox's init,
// which waits for them before it starts anything of the command's: every
// process of the command inherits them (and its pids cgroup, joined
// already). The init is the pid bwrap reported (killer.setInit), never
// anything the sandbox can write. Run fails closed when this fails.
func (s *Sandbox) release(k *killer, l Limits) error {
	init, _ := k.sandboxInit()
	if init == 0 {
		return errors.New("the sandbox's init was not found")
	}
	type rlimit struct {
		name     string
		res      int
		cur, max uint64
	}
	// No core dumps: 1 byte is less than a core file's least (a page),
	// and the value the kernel takes for "no piped dump" — where the
	// host's core_pattern pipes to a helper, a crash would start it as the
	// host's root, and for a pipe any other limit, 0 included, is no
	// limit. The seccomp filter keeps the command from changing it.
	rs := []rlimit{{"RLIMIT_CORE", unix.RLIMIT_CORE, coreLimit, coreLimit}}
	if l.CPUTime > 0 {
		// Soft: SIGXCPU at the limit rounded up to whole seconds; hard:
		// SIGKILL one second later.
		sec := uint64((l.CPUTime + time.Second - 1) / time.Second)
		rs = append(rs, rlimit{"RLIMIT_CPU", unix.RLIMIT_CPU, sec, sec + 1})
	}
	if l.FileSize > 0 {
		rs = append(rs, rlimit{"RLIMIT_FSIZE", unix.RLIMIT_FSIZE, uint64(l.FileSize), uint64(l.FileSize)})
	}
	if l.Processes > 0 {
		rs = append(rs, rlimit{"RLIMIT_NPROC", unix.RLIMIT_NPROC, uint64(l.Processes), uint64(l.Processes)})
	}
	if l.OpenFiles > 0 {
		rs = append(rs, rlimit{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, uint64(l.OpenFiles), uint64(l.OpenFiles)})
	}
	if l.AddressSpace > 0 {
		rs = append(rs, rlimit{"RLIMIT_AS", unix.RLIMIT_AS, uint64(l.AddressSpace), uint64(l.AddressSpace)})
	}
	for _, r := range rs {
		if err := unix.Prlimit(init, r.res, &unix.Rlimit{Cur: r.cur, Max: r.max}, nil); err != nil {
			return fmt.Errorf("setting %s %d:%d on the sandbox's init (pid %d): %w", r.name, r.cur, r.max, init, err)
		}
	}
	if s.opts.Nice > 0 {
		if err := unix.Setpriority(unix.PRIO_PROCESS, init, s.opts.Nice); err != nil {
			return fmt.Errorf("setting niceness %d on the sandbox's init (pid %d): %w", s.opts.Nice, init, err)
		}
	}
	return nil
}

// capped keeps the first max bytes written and drops the rest.
type capped struct {
	mu        sync.Mutex
	buf       []byte
	max       int64
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max < 0 {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	if room := c.max - int64(len(c.buf)); room > 0 {
		if int64(len(p)) > room {
			c.buf = append(c.buf, p[:room]...)
			c.truncated = true
		} else {
			c.buf = append(c.buf, p...)
		}
	} else if len(p) > 0 {
		c.truncated = true
	}
	return len(p), nil
}

func (c *capped) bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf, c.truncated
}

// infoFD is the fd on which bwrap reports the sandbox's init (--info-fd).
const infoFD = 8

// readInfo reads bwrap's info document ({"child-pid": N}, written once
// bwrap has cloned the sandbox's init, then closed) and returns the pid,
// 0 if bwrap ended without one.
func readInfo(r io.Reader) int {
	b, _ := io.ReadAll(io.LimitReader(r, 4096))
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if json.Unmarshal(b, &info) != nil || info.ChildPid <= 0 {
		return 0
	}
	return info.ChildPid
}

// limitForker sets the pids limit of f's cgroup for a run of processes
// processes: the forker's threads, bwrap, the init and the command's. It
// reports false when it cannot, and f is then of no use to the run.
func limitForker(f *forker, processes int) bool {
	return f.cg.setMax(processes+forkerThreads+2) == nil
}

// joinMemCgroup moves the sandbox's init (pid) into a new memory cgroup
// limited to limit bytes, before it starts anything of the command's.
func joinMemCgroup(k *killer, pid int, limit int64) error {
	m, err := newMemCgroup()
	if err != nil {
		return fmt.Errorf("memory cgroup: %w", err)
	}
	if err := m.setLimit(limit); err != nil {
		m.remove()
		return fmt.Errorf("memory cgroup: setting the limit: %w", err)
	}
	if err := m.join(pid); err != nil {
		m.remove()
		return fmt.Errorf("memory cgroup: moving the sandbox's init (pid %d): %w", pid, err)
	}
	k.setMem(m)
	return nil
}
