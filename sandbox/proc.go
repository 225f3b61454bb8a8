package sandbox

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// killer ends a run. The chain process (bwrap, after the execs) is our
// child; its only child is the sandbox's init, pid 1 of the sandbox's pid
// namespace, whose host pid bwrap reports on its info fd (setInit).
//
// On a timeout or cancellation: SIGTERM to every process of the sandbox's
// pid namespace (the init forwards it to the command too; this covers the
// command's process group and anything that left it), then, after the
// grace period, SIGKILL to the init — the kernel then kills every process
// left in the namespace — and to bwrap.
type killer struct {
	proc  *os.Process
	grace time.Duration

	mu       sync.Mutex
	init     int    // host pid of the sandbox's init, once found
	ns       uint64 // its pid namespace
	timer    *time.Timer
	backstop *time.Timer
	stopped  bool
	cgroup   *pidsCgroup // the run's pids cgroup, when the host offers one (pidscg.go)
	mem      *memCgroup  // the run's memory cgroup, when the host offers one (memcg.go)
}

// setMem records the run's memory cgroup for removeCgroup.
func (k *killer) setMem(c *memCgroup) {
	k.mu.Lock()
	k.mem = c
	k.mu.Unlock()
}

// memOOM reports whether the OOM killer killed a process of the run's
// memory cgroup (its limit was reached); false without one.
func (k *killer) memOOM() bool {
	k.mu.Lock()
	c := k.mem
	k.mu.Unlock()
	return c != nil && c.oomKilled()
}

// setCgroup records the run's pids cgroup for removeCgroup.
func (k *killer) setCgroup(c *pidsCgroup) {
	k.mu.Lock()
	k.cgroup = c
	k.mu.Unlock()
}

// forkRefused reports whether the run's pids cgroup has refused a fork
// (its pids.max was reached); false without a cgroup.
func (k *killer) forkRefused() bool {
	k.mu.Lock()
	c := k.cgroup
	k.mu.Unlock()
	return c != nil && c.refused()
}

// removeCgroup deletes the run's pids and memory cgroups, if it has them, once the
// run's processes (and a forker's thread, which ends just after the run)
// are gone, off the run's path.
func (k *killer) removeCgroup() {
	k.mu.Lock()
	c, m := k.cgroup, k.mem
	k.cgroup, k.mem = nil, nil
	k.mu.Unlock()
	if c != nil {
		go c.remove()
	}
	if m != nil {
		go m.remove()
	}
}

// setInit records the sandbox's init: the host pid that bwrap writes to
// its info fd as soon as it has cloned it, before the child runs anything
// (so nothing in the sandbox can forge it). It reports false, recording
// nothing, unless that process is bwrap's child (as /proc says) in a pid
// namespace of its own.
func (k *killer) setInit(pid int) bool {
	ns := pidNS(pid)
	if ns == 0 || ns == pidNS(k.proc.Pid) || parentOf(pid) != k.proc.Pid {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return false
	}
	k.init, k.ns = pid, ns
	return true
}

// sandboxInit returns the sandbox's init (0, 0 before bwrap has made it).
func (k *killer) sandboxInit() (int, uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.init, k.ns
}

// terminate sends SIGTERM now and SIGKILL after the grace period. Before
// the sandbox exists there is nothing to be graceful to: it kills at once.
func (k *killer) terminate() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	if k.ns == 0 {
		k.killLocked()
		return
	}
	for _, pid := range nsPids(k.ns) {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	if k.timer == nil {
		k.timer = time.AfterFunc(k.grace, k.kill)
	}
}

// kill sends SIGKILL now.
func (k *killer) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killLocked()
}

// killLocked kills the sandbox's init, which makes the kernel kill every
// process in its namespace; bwrap exits once they are all gone. Should
// bwrap still be there 5 s later, or the init be unknown, bwrap is killed.
func (k *killer) killLocked() {
	if k.stopped {
		return
	}
	if k.init != 0 && pidNS(k.init) == k.ns {
		syscall.Kill(k.init, syscall.SIGKILL)
		// The init's exit kills the whole namespace, but only once the
		// init gets the CPU, which a fork bomb's thousands of processes
		// delay; meanwhile they fork on. So kill them from here too, at
		// the kernel's priority, until none is left: a process with
		// SIGKILL pending can fork no more.
		for range 100 {
			pids := nsPids(k.ns)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if k.backstop == nil {
			k.backstop = time.AfterFunc(5*time.Second, func() {
				k.mu.Lock()
				defer k.mu.Unlock()
				if !k.stopped {
					k.proc.Signal(syscall.SIGKILL)
				}
			})
		}
		return
	}
	k.proc.Signal(syscall.SIGKILL) // by pidfd: never a recycled pid
}

// waitGone waits (up to max) until the sandbox's init has finished
// exiting — the kernel has then killed and reaped every process of its
// namespace — so that Run never returns with a sandboxed process alive.
func (k *killer) waitGone(max time.Duration) {
	k.mu.Lock()
	init, ns := k.init, k.ns
	k.mu.Unlock()
	if init == 0 {
		return
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if pidNS(init) != ns {
			return
		}
		if exited(init) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stop disarms the killer once the run has been waited for.
func (k *killer) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
	}
	if k.backstop != nil {
		k.backstop.Stop()
	}
}

// pidNS is the inode of pid's pid namespace, 0 if unknown.
func pidNS(pid int) uint64 {
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if err != nil {
		return 0
	}
	l = strings.TrimSuffix(strings.TrimPrefix(l, "pid:["), "]")
	n, _ := strconv.ParseUint(l, 10, 64)
	return n
}

func procPids() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// nsPids lists the host pids of the processes in pid namespace ns.
func nsPids(ns uint64) []int {
	var out []int
	for _, pid := range procPids() {
		if pidNS(pid) == ns {
			out = append(out, pid)
		}
	}
	return out
}

// watchInterval is how often the process watchdog counts.
const watchInterval = 10 * time.Millisecond

// watchProcesses counts the processes of the sandbox (in its own /proc,
// through its init's root) and reports "processes" once there are more
// than max besides the init. RLIMIT_NPROC does the same job for a kernel
// running as an ordinary user; for a kernel running as root it is not
// enforced (processes of the host's uid 0 are exempt), so this watchdog is
// what contains a fork bomb there.
func watchProcesses(k *killer, max int, stop <-chan struct{}) <-chan string {
	ch := make(chan string, 1)
	go func() {
		t := time.NewTicker(watchInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			init, ns := k.sandboxInit()
			if init == 0 {
				continue
			}
			if pidNS(init) != ns {
				return // gone
			}
			dir := "/proc/" + strconv.Itoa(init) + "/root/proc"
			// Until bwrap has pivoted into the new root and mounted the
			// sandbox's own /proc, that path is the host's /proc, whose
			// process count is not the sandbox's. In the sandbox's procfs
			// the kernel's own pid does not exist, so "self" resolves only
			// in a procfs of the host's (or an outer) pid namespace.
			if _, err := os.Readlink(dir + "/self"); err == nil {
				continue
			}
			// The run's pids cgroup caps the count at max plus the init,
			// so the count alone shows the limit only if
			// a 10 ms sample catches every slot full; a fork it refused
			// shows it for good.
			if k.forkRefused() {
				ch <- "processes"
				return
			}
			n, err := countPids(dir)
			if err != nil {
				continue // not mounted yet, or gone
			}
			if n-1 > max {
				ch <- "processes"
				return
			}
		}
	}()
	return ch
}

func countPids(dir string) (int, error) {
	d, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		if name[0] >= '0' && name[0] <= '9' {
			n++
		}
	}
	return n, nil
}

// killStale kills, with SIGKILL, every process whose command line names a
// path under dir (a stale staging directory) and waits up to a second for
// them to go. A kernel killed while bwrap was still setting a sandbox up
// can leave bwrap's child behind: it is pid 1 of its namespace, blocked
// waiting for its dead parent, before the init exists and before bwrap's
// --die-with-parent is armed. Its command line still holds bwrap's, which
// names the run's /etc snapshot (a staging directory).
// Killing a namespace's pid 1 ends every process of the namespace.
func killStale(dir string) int {
	needle := []byte(dir + "/")
	var pids []int
	for _, pid := range procPids() {
		if pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && bytes.Contains(b, needle) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				pids = append(pids, pid)
			}
		}
	}
	deadline := time.Now().Add(time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if exited(pid) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return len(pids)
}

// parentOf is the parent pid of process pid (from /proc/pid/stat), 0 if
// unknown.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// exited reports whether process pid is gone or a zombie (its state in
// /proc/pid/stat, after the command name, is Z or X).
func exited(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
