package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// killer ends a run: on a timeout or cancellation, SIGTERM to every process
// of the sandbox's pid namespace but its init (this covers the command's
// process group and anything that left it), then, after the grace period,
// SIGKILL to the namespace's init — the kernel then kills every process
// left in the namespace — and to bwrap.
type killer struct {
	proc  *os.Process // the chain's process (bwrap after the execs)
	grace time.Duration

	mu      sync.Mutex
	in      *info
	timer   *time.Timer
	stopped bool
}

func (k *killer) setInfo(in info) {
	k.mu.Lock()
	k.in = &in
	k.mu.Unlock()
}

func (k *killer) hasInfo() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.in != nil
}

// terminate sends SIGTERM now and SIGKILL after the grace period. Before
// the sandbox exists there is nothing to be graceful to: it kills at once.
func (k *killer) terminate() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	if k.in == nil {
		k.killLocked()
		return
	}
	for _, pid := range nsPids(k.in.PidNS) {
		if pid != k.in.ChildPid {
			syscall.Kill(pid, syscall.SIGTERM)
		}
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

func (k *killer) killLocked() {
	if k.stopped {
		return
	}
	if k.in != nil && pidNS(k.in.ChildPid) == k.in.PidNS {
		syscall.Kill(k.in.ChildPid, syscall.SIGKILL)
	}
	k.proc.Signal(syscall.SIGKILL) // by pidfd: never a recycled pid
}

// stop disarms the killer once the run has been waited for.
func (k *killer) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
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

// nsPids lists the host pids of the processes in pid namespace ns.
func nsPids(ns uint64) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if pidNS(pid) == ns {
			out = append(out, pid)
		}
	}
	return out
}

// watchInterval is how often the process watchdog counts.
const watchInterval = 20 * time.Millisecond

// watchProcesses counts the processes of the sandbox (in its own /proc,
// through its init's root) and reports "processes" once there are more
// than max besides the init. RLIMIT_NPROC does the same job for a kernel
// running as an ordinary user; for a kernel running as root it is not
// enforced (processes of uid 0 of the host are exempt), so this watchdog
// is what contains a fork bomb there.
func watchProcesses(in info, max int, stop <-chan struct{}) <-chan string {
	ch := make(chan string, 1)
	dir := fmt.Sprintf("/proc/%d/root/proc", in.ChildPid)
	go func() {
		t := time.NewTicker(watchInterval)
		defer t.Stop()
		for {
			if pidNS(in.ChildPid) != in.PidNS {
				return // gone
			}
			n, err := countPids(dir)
			if err != nil {
				return
			}
			if n-1 > max {
				ch <- "processes"
				return
			}
			select {
			case <-stop:
				return
			case <-t.C:
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
