package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A chain is the line of processes a run starts:
//
//	[unshare …] bwrap --args 9 -- /bin/sh -c initScript capkernel-init ETC
//
// started before the run's bwrap options are known: bwrap reads them,
// NUL-separated, from a pipe on fd 9 (chain.setArgs), and the init takes
// the command's argv from its environment (initEnv). So a Sandbox keeps a
// chain (without Command.Channel) started ahead of its next run
// (takeSpareChain): the run does not wait for unshare's and bwrap's execs
// (1–2 ms on the loaded 2-core machine). Until its options come, a chain
// is bwrap blocked in a read, in unshare's user and mount namespaces (a
// root kernel's, or one whose run mounts overlays there: mountOverlays):
// no sandbox, nothing of any run's.
//
// ETC, the /etc snapshot the chain's runs bind, names the chain on its
// command line: CleanupStale's killStale finds a chain a killed kernel
// left by it.
//
// The chain's descriptors: 0 stdin (a pipe, written by the run), 1 and 2
// stdout and stderr (to sinks the run attaches), 3 the init's "ready" and
// "started", 5 the release, 6 Command.Channel, 8 bwrap's
// info fd (infoFD), 9 bwrap's options, 10 the seccomp filter (seccompFD).
type chain struct {
	cmd     *exec.Cmd
	f       *forker // the forker it was forked from; nil: a locked goroutine's thread
	mountNS bool    // it has a user and a mount namespace of its own (chainSpec.mountNS)
	// ahead is what a spare chain has made ahead of its run: bwrap need
	// not make it (bwrapArgs).
	ahead ahead
	// netNS: the chain has a network namespace of its own (netns.go),
	// so a run with the full network posture cannot use it.
	netNS   bool
	done    chan struct{} // closed once the chain has exited and been reaped
	waitErr error         // the chain's Wait, once done is closed

	startR, relW, infoR, argsW, stdinW *os.File
	ends                               []*os.File // every end the kernel holds
	stdout, stderr                     *sink

	etc        *etcSnap
	releaseEtc func()

	// memDone, for a spare chain, is closed once its move into a memory
	// cgroup of its own has ended; mem is that cgroup (nil if the move
	// failed), read only after memDone (memcg.go).
	memDone chan struct{}
	mem     *memCgroup
}

// argsFD is the fd on which bwrap reads its options (--args).
const argsFD = 9

// seccompFD is the fd on which bwrap reads the seccomp filter (--seccomp,
// seccomp.go): a pipe holding it whole, written when the chain starts.
const seccompFD = 10

// chainSpec is what a chain is started with.
type chainSpec struct {
	prefix  []string // [unshare …]: run before bwrap, execing it
	env     []string // the prefix's environment
	channel *os.File // Command.Channel, or nil
	mountNS bool     // the prefix makes a user and a mount namespace of the chain's own (overlays are mounted there)
	netNS   bool     // the prefix makes a network namespace of the chain's own too (spareChainSpec)
}

// ahead is what a spare chain has made in its namespaces before its run.
type ahead struct {
	// mounted: the /etc directories are bound into the snapshot and the
	// sandbox's /dev is made (dev.go), in the chain's mount namespace
	// (mountAhead).
	mounted bool
	// loopback: the chain's own network namespace has its loopback
	// interface up (netns.go): bwrap need not --unshare-net.
	loopback bool
}

// startChain starts a chain (see chain) from f's thread, or, with f nil,
// from a goroutine locked to a thread of its own until the chain is
// reaped: the chain's parent-death signals (Go's Pdeathsig, bwrap's
// --die-with-parent) follow the thread that forked, not the process, and
// no other goroutine may run on that thread meanwhile (one that locked it
// and exited would end the thread, and the chain with it). The chain
// holds a reference to etc until close.
func (s *Sandbox) startChain(t *tools, sp chainSpec, etc *etcSnap, releaseEtc func(), f *forker) (*chain, error) {
	c := &chain{f: f, mountNS: sp.mountNS, netNS: sp.netNS, done: make(chan struct{}), etc: etc, releaseEtc: releaseEtc,
		stdout: &sink{}, stderr: &sink{}}
	var child []*os.File // ends only the chain keeps: closed here once it has started
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			c.ends = append(c.ends, r, w)
		}
		return r, w, err
	}
	fail := func(err error) (*chain, error) {
		c.closeEnds()
		c.releaseEtc()
		if f != nil {
			f.discard()
		}
		return nil, err
	}
	var startW, relR, infoW, argsR, stdinR, filterR *os.File
	var err error
	if c.startR, startW, err = pipe(); err != nil {
		return fail(err)
	}
	filter, err := seccompFilter()
	if err != nil {
		return fail(err)
	}
	var filterW *os.File
	if filterR, filterW, err = pipe(); err != nil {
		return fail(err)
	}
	_, err = filterW.Write(filter) // a few hundred bytes: the pipe holds them
	filterW.Close()
	if err != nil {
		return fail(err)
	}
	if relR, c.relW, err = pipe(); err != nil {
		return fail(err)
	}
	if c.infoR, infoW, err = pipe(); err != nil {
		return fail(err)
	}
	if argsR, c.argsW, err = pipe(); err != nil {
		return fail(err)
	}
	if stdinR, c.stdinW, err = pipe(); err != nil {
		return fail(err)
	}
	child = []*os.File{startW, relR, infoW, argsR, stdinR, filterR}

	argv := slices.Concat(sp.prefix, []string{t.bwrap, "--args", strconv.Itoa(argsFD), "--", "/bin/sh", "-c", initScript, "capkernel-init", etc.dir})
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = sp.env
	cmd.Stdin = stdinR
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	cmd.ExtraFiles = []*os.File{startW, nil, relR, sp.channel, nil, infoW, argsR, filterR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A process of the sandbox that escaped the kill could hold the
	// output pipes after the chain has exited.
	cmd.WaitDelay = s.opts.KillGrace + 2*time.Second
	c.cmd = cmd

	startErr := make(chan error, 1)
	job := func() {
		if err := cmd.Start(); err != nil {
			startErr <- err
			return
		}
		// The waiting is done elsewhere, by the poller (waitChain): a
		// thread blocked in wait(2) would keep its P, and whatever it had
		// just woken (the run's goroutine) would wait for the runtime's
		// sysmon to take the P back, up to 10 ms on an idle kernel.
		go func() {
			c.waitErr = waitChain(cmd)
			close(c.done)
		}()
		startErr <- nil
		<-c.done
	}
	if f != nil {
		f.jobs <- job
	} else {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			job()
		}()
	}
	err = <-startErr
	for _, e := range child {
		e.Close()
	}
	if err != nil {
		return fail(fmt.Errorf("sandbox: start: %w", err))
	}
	return c, nil
}

// setArgs hands bwrap its options (a NUL-separated list; none holds a
// NUL) and the command its stdin (nil: end of file at once). A chain takes
// them once.
func (c *chain) setArgs(opts []string, stdin []byte) error {
	var b []byte
	for _, o := range opts {
		b = append(append(b, o...), 0)
	}
	_, err := c.argsW.Write(b)
	c.argsW.Close()
	if stdin == nil {
		c.stdinW.Close()
	} else {
		go func() {
			// Blocked until the command reads it, or until close.
			c.stdinW.Write(stdin)
			c.stdinW.Close()
		}()
	}
	if err != nil {
		return fmt.Errorf("sandbox: passing bwrap its options: %w", err)
	}
	return nil
}

// exited reports whether the chain has ended (a spare that died waiting).
func (c *chain) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// killedBefore reports whether the chain, which a run has not killed,
// was killed by a signal before the run could set it up, which failed with
// err: its namespaces are gone (it is exiting, or has exited), or it
// refused its options, which bwrap reads whole before it acts on any.
func (c *chain) killedBefore(err error) bool {
	if errors.Is(err, syscall.EPIPE) {
		// bwrap's options pipe has no reader: bwrap is exiting.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
		}
	}
	if !c.gone() {
		return false
	}
	<-c.done // reaped at once: it has exited, or is exiting
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// gone reports whether the chain has ended, or is ending: a process
// killed but not yet reaped has released its namespaces already, and
// /proc has none of them to show.
func (c *chain) gone() bool {
	if c.exited() {
		return true
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/ns/mnt")
	return errors.Is(err, fs.ErrNotExist)
}

// closeEnds closes every end of the chain's pipes the kernel holds: the
// release's write end among them, so an init still waiting for its "go"
// exits having run nothing.
func (c *chain) closeEnds() {
	for _, f := range c.ends {
		f.Close()
	}
	c.ends = nil
}

// close ends a chain whose run is over (it has been waited for): its ends
// and its /etc snapshot reference are released.
func (c *chain) close() {
	c.closeEnds()
	c.releaseEtc()
}

// discard kills a chain no run will use (it is still waiting for its
// options) and releases what it holds, off the caller's path.
func (c *chain) discard() { go c.end() }

// end kills a chain no run will use, waits until it is gone and releases
// what it holds (its pids cgroup is removed in the background).
func (c *chain) end() {
	c.cmd.Process.Kill()
	<-c.done
	c.close()
	if c.f != nil {
		go c.f.cg.remove() // once its thread has ended, after the reaping
	}
	if c.memDone != nil {
		<-c.memDone
		if c.mem != nil {
			go c.mem.remove()
		}
	}
}

// joinMemCgroup moves the spare chain into a memory cgroup of its own, in
// the background: a move waits for an RCU grace period (7–22 ms measured
// on the loaded machine), which the run that takes the chain, an agent's
// think time later, need not wait for. Where the host has no memory
// cgroup, runs are bounded by RLIMIT_AS alone.
func (c *chain) joinMemCgroup() {
	if MemoryCgroup() != nil {
		return
	}
	c.memDone = make(chan struct{})
	go func() {
		defer close(c.memDone)
		m, err := newMemCgroup()
		if err != nil {
			return
		}
		if err := m.join(c.cmd.Process.Pid); err != nil {
			m.remove()
			return
		}
		c.mem = m
	}()
}

// waitChain waits for the chain through a pidfd polled by the runtime's
// network poller, then reaps it with cmd.Wait (which no longer blocks).
// A goroutine blocked in wait(2) holds its P until sysmon retakes it; the
// goroutines it wakes meanwhile (this run's, once the chain exits) wait as
// long. Without a pidfd it is cmd.Wait alone.
func waitChain(cmd *exec.Cmd) error {
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return cmd.Wait()
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if rc, err := f.SyscallConn(); err == nil {
		rc.Read(func(fd uintptr) bool {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0 || err != nil && !errors.Is(err, unix.EINTR)
		})
	}
	f.Close()
	return cmd.Wait()
}

// sinkEarly is how much a sink keeps of what a chain writes before its run
// attaches a writer (only a failing bwrap or unshare writes then).
const sinkEarly = 64 << 10

// sink is a chain's stdout or stderr: what the chain writes goes to the
// run's writer once attached; until then it is kept (up to sinkEarly
// bytes) and passed on at attach.
type sink struct {
	mu    sync.Mutex
	w     io.Writer
	early []byte
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		return s.w.Write(p)
	}
	if room := sinkEarly - len(s.early); room > 0 {
		s.early = append(s.early, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

// copyBufs are the buffers sinks read their pipe with (ReadFrom).
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// ReadFrom copies r (the chain's stdout or stderr pipe: os/exec copies
// it with io.Copy) to s until end of file, with a pooled buffer: io.Copy
// would allocate 32 KiB per pipe, per run.
func (s *sink) ReadFrom(r io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(buf)
	var n int64
	for {
		m, err := r.Read(buf[:])
		if m > 0 {
			s.Write(buf[:m])
			n += int64(m)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// attach sends what comes from now on, and what came before, to w.
func (s *sink) attach(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.early) > 0 {
		w.Write(s.early)
		s.early = nil
	}
	s.w = w
}

// takeSpareChain returns the Sandbox's spare chain if it can serve a run
// whose /etc snapshot is etc (and that mounts overlays, if overlay; that
// has the host's network, if fullNet), else nil: a stale or dead spare is
// discarded; an overlay run of a kernel whose spares have no mount
// namespace (sparesMountNS), and a run with the host's network on a
// kernel whose spares have a network namespace of their own, leave the
// spare, and its making, to the next plain run. A spare being
// made is waited for (until ctx is done, or spareWait has passed): it is
// further on than a chain the run would start now, which would also
// compete with it for the CPU; one that takes longer is stuck, and the run
// starts its own.
func (s *Sandbox) takeSpareChain(ctx context.Context, etc *etcSnap, overlay, fullNet bool) *chain {
	if overlay && !sparesMountNS() || fullNet && sparesMountNS() {
		return nil
	}
	s.mu.Lock()
	c, made := s.spareChain, s.makingChain
	if c == nil && made != nil {
		s.mu.Unlock()
		wait := time.NewTimer(spareWait)
		defer wait.Stop()
		select {
		case <-made:
		case <-ctx.Done():
			return nil
		case <-wait.C:
			return nil
		}
		s.mu.Lock()
		c = s.spareChain
	}
	s.spareChain = nil
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	if c.etc != etc || c.exited() {
		c.discard()
		return nil
	}
	return c
}

// spareWait bounds a run's wait for the spare chain being made, which
// takes a few milliseconds to some tens on a loaded machine.
const spareWait = 500 * time.Millisecond

// kickSpareChain starts making the next spare chain, unless there is one
// or one is being made.
func (s *Sandbox) kickSpareChain(t *tools) {
	s.mu.Lock()
	if s.closed || s.spareChain != nil || s.makingChain != nil {
		s.mu.Unlock()
		return
	}
	made := make(chan struct{})
	s.makingChain = made
	noForker := s.noForker
	s.chains.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.chains.Done()
		c, err := s.makeSpareChain(t, !noForker)
		s.mu.Lock()
		s.makingChain = nil
		closed := s.closed
		if err == nil && !closed {
			s.spareChain = c
		}
		s.mu.Unlock()
		close(made)
		if err == nil && closed {
			c.end() // Close waits for this
		}
	}()
}

// makeSpareChain starts a plain chain, from a forker of its own where the
// host offers one (so the run it serves is born in its pids cgroup).
func (s *Sandbox) makeSpareChain(t *tools, withForker bool) (*chain, error) {
	etc, releaseEtc, err := s.acquireEtc()
	if err != nil {
		return nil, err
	}
	var f *forker
	if withForker {
		// The forker made ahead (takeForker, which starts the next): a
		// new one waits for the RCU grace period of its thread's move
		// (6–12 ms on the loaded machine), longer than the gap between
		// two calls, which left every third run without a spare chain.
		if f = s.takeForker(); f == nil {
			f, err = newForker()
		}
		if err != nil {
			// As makeForker: no v1 pids hierarchy, or no permission, is
			// for good; later chains are made without trying again.
			f = nil
			s.mu.Lock()
			s.noForker = true
			s.mu.Unlock()
		}
	}
	c, err := s.startChain(t, s.spareChainSpec(t), etc, releaseEtc, f)
	if err != nil {
		return nil, err
	}
	c.joinMemCgroup()
	// The /etc directories are bound into the snapshot and the sandbox's
	// /dev is made, in the chain's own mount namespace, and the loopback
	// of its network namespace is set up, off the run's path: bwrap's one
	// recursive, read-only bind of the snapshot carries the /etc
	// directories (read-only, as it makes every mount below a read-only
	// bind), one bind carries /dev, and bwrap makes no network namespace.
	// Where the mounts fail the run makes them on its path (or fails);
	// where the loopback fails, bwrap makes a network namespace.
	if c.mountNS {
		// A chain that never runs bwrap serves no run: it is not kept.
		if err := c.waitExec(t); err != nil {
			c.end()
			return nil, err
		}
		c.ahead.mounted = s.mountAhead(t, c, etc) == nil
		c.ahead.loopback = c.netNS && loopbackUp(c.cmd.Process.Pid) == nil
	}
	return c, nil
}

// mountAhead binds etc's directories (etcDirBinds) at their places in the
// snapshot, read-only, and makes the sandbox's /dev (devFstab), in the
// chain's mount namespace: nsenter and mount, as mountOverlays does, from
// an fstab beside the snapshot.
func (s *Sandbox) mountAhead(t *tools, c *chain, etc *etcSnap) error {
	if t.nsenter == "" || t.mount == "" {
		return errors.New("sandbox: nsenter and mount are needed to make the sandbox's /dev")
	}
	fstab, err := etc.aheadFstab()
	if err != nil {
		return err
	}
	// Not "none,…": mount(8) reads a list that starts with "no" as the
	// types it must not mount.
	return nsenterMount(t, c, fstab, "devpts,none")
}

// fstabEscaper escapes what would split or end an fstab field. One for
// the process: a Replacer builds its tables (~6 KiB) on first use.
var fstabEscaper = strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`)

// fstabEscape escapes what would split or end an fstab field.
func fstabEscape(p string) string { return fstabEscaper.Replace(p) }

// plainChainSpec is the spec of a spare chain, and of a run's without
// overlays: a root kernel's starts in a user namespace and a mount
// namespace of its own (overlayChainSpec), so that bwrap never holds the
// host's capabilities and any run can take it; an ordinary user's starts
// bwrap directly, as a bare bwrap would be.
func (s *Sandbox) plainChainSpec(t *tools) chainSpec {
	if sparesMountNS() {
		return overlayChainSpec(t)
	}
	return chainSpec{env: []string{"PATH=" + hostPath}}
}

// sparesMountNS reports whether plain chains, and so spare chains, have
// the mount namespace of their own that overlay runs need (a root
// kernel's do: plainChainSpec).
func sparesMountNS() bool { return os.Geteuid() == 0 }

// spareChainSpec is the spec of a spare chain: plainChainSpec's, and a
// root kernel's starts in a network namespace of its own too (netns.go).
func (s *Sandbox) spareChainSpec(t *tools) chainSpec {
	sp := s.plainChainSpec(t)
	if sp.mountNS {
		sp.prefix = unsharePrefix(t, "--net")
		sp.netNS = true
	}
	return sp
}

// overlayChainSpec is the spec of a chain that starts in a new user
// namespace mapping only the kernel's own ids (to root inside) and a new
// mount namespace, private (unshare's default propagation): the overlays
// are mounted there (mountOverlays), never visible on the host, and gone
// with the chain. unshare(1) makes them and execs bwrap: an exec, where a
// Go fork with CLONE_NEWUSER cannot use vfork and copies the kernel's page
// tables (tens of milliseconds for a large heap).
func overlayChainSpec(t *tools) chainSpec {
	return chainSpec{
		prefix:  unsharePrefix(t),
		env:     []string{"PATH=" + hostPath},
		mountNS: true,
	}
}

// unsharePrefix is the command that starts a chain in a new user
// namespace mapping the kernel's ids to root, a new mount namespace and
// the more namespaces more names (unshare's options), and execs bwrap.
func unsharePrefix(t *tools, more ...string) []string {
	return append(append([]string{t.unshare, "--user", "--map-root-user", "--mount"}, more...), "--")
}

// hostPath is the PATH of the chain's processes before bwrap.
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
