package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// pidsCgroup is a pids cgroup made for one run, holding the sandbox's
// init and so everything the command starts: its pids.max makes the host
// kernel refuse a fork past Limits.Processes at once, whatever the load.
// The process watchdog (watchProcesses) alone cannot promise that for a
// kernel running as root (RLIMIT_NPROC is not enforced for uid 0): on a
// starved machine a fork bomb can outrun a 10 ms poll and take every pid
// of the host, and then every other process's fork fails with EAGAIN.
type pidsCgroup struct{ dir string }

// cgroupSeq names each run's cgroup uniquely within the process.
var cgroupSeq atomic.Uint64

// joinPidsCgroup makes a child of the kernel's own pids cgroup with
// pids.max = max and moves pid into it. It returns nil, with the reason,
// where the host offers no writable pids controller (no cgroup v1 pids
// hierarchy and no cgroup v2 pids delegation, or no permission): the
// watchdog then stands alone, as documented in doc.go.
func joinPidsCgroup(pid, max int) (*pidsCgroup, error) {
	c, err := newPidsCgroup()
	if err != nil {
		return nil, err
	}
	if err := c.setMax(max); err != nil {
		c.remove()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// newPidsCgroup makes an empty run cgroup under the kernel's own pids
// cgroup.
func newPidsCgroup() (*pidsCgroup, error) {
	parentOnce.Do(func() {
		if parent, parentV1, parentErr = ownPidsCgroup(); parentErr == nil {
			sweepStale(parent)
		}
	})
	if parentErr != nil {
		return nil, parentErr
	}
	dir, err := makeRunCgroup(parent)
	if err != nil {
		return nil, err
	}
	return &pidsCgroup{dir: dir}, nil
}

// makeRunCgroup makes a run's cgroup under parent, named for this process
// (sweepStale removes those of a kernel that is gone).
func makeRunCgroup(parent string) (string, error) {
	dir := filepath.Join(parent, fmt.Sprintf("capkernel-sandbox-%d-%d", os.Getpid(), cgroupSeq.Add(1)))
	return dir, os.Mkdir(dir, 0o755)
}

// eventCount reports whether the counter key of the cgroup's events file
// (lines "key count") is above zero.
func eventCount(file, key string) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutPrefix(l, key+" "); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64)
			return err == nil && v > 0
		}
	}
	return false
}

// setMax sets the cgroup's pids.max (no grace period: cheap).
func (c *pidsCgroup) setMax(max int) error {
	return os.WriteFile(filepath.Join(c.dir, "pids.max"), []byte(strconv.Itoa(max)), 0)
}

// refused reports whether the cgroup has refused a fork for its pids.max:
// the "max" count of its pids.events (cgroup v1 and v2) is above zero.
func (c *pidsCgroup) refused() bool { return eventCount(filepath.Join(c.dir, "pids.events"), "max") }

// remove deletes the cgroup once its processes are gone (removeCgroupDir).
func (c *pidsCgroup) remove() { removeCgroupDir(c.dir) }

// removeCgroupDir deletes a run's cgroup once its processes are gone:
// rmdir is refused while any is left, a zombie included, and the last of
// a killed sandbox can take a moment to be reaped. It waits up to a
// second, then goes on trying in the background for up to ten more.
func removeCgroupDir(dir string) {
	for i := 0; i < 100; i++ {
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	go func() {
		for i := 0; i < 100; i++ {
			time.Sleep(100 * time.Millisecond)
			if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
				return
			}
		}
	}()
}

// parent is this process's pids cgroup (or why there is none), found once
// at the first run, when run cgroups stale from exited processes are swept;
// parentV1 is whether it is in a cgroup v1 hierarchy.
var (
	parentOnce sync.Once
	parent     string
	parentV1   bool
	parentErr  error
)

// sweepStale removes the empty run cgroups that processes which have
// exited left behind (their background removal ended with them): a
// directory capkernel-sandbox-PID-N whose PID is not alive. rmdir refuses
// any that still holds a process.
func sweepStale(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		var pid, n int
		if _, err := fmt.Sscanf(e.Name(), "capkernel-sandbox-%d-%d", &pid, &n); err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			os.Remove(filepath.Join(parent, e.Name()))
		}
	}
}

// ownPidsCgroup is the directory of this process's pids cgroup.
func ownPidsCgroup() (dir string, v1 bool, err error) { return ownCgroup("pids") }

// ownCgroup is the directory of this process's cgroup for controller: the
// cgroup v1 hierarchy of that controller (v1 true), else the unified (v2)
// one when it offers the controller to its children.
func ownCgroup(controller string) (dir string, v1 bool, err error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	var unified string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == controller {
				return filepath.Join("/sys/fs/cgroup", controller, parts[2]), true, nil
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	if unified != "" {
		d := filepath.Join("/sys/fs/cgroup", unified)
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.subtree_control")); err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " "+controller+" ") {
			return d, false, nil
		}
	}
	return "", false, fmt.Errorf("no writable %s cgroup for this process", controller)
}
