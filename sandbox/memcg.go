package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// memCgroup is a memory cgroup made for one run: every process of the
// command's is in it, and its limit (Limits.Memory) bounds what the whole
// tree holds — anonymous memory, the pages of its /tmp and /dev/shm, the
// page cache it dirties — where RLIMIT_AS bounds each process's address
// space only. Past the limit the host reclaims what it can, then its OOM
// killer kills a process of the cgroup, and the run ends with
// LimitExceeded "memory".
//
// The kernel's own threads never join it: the OOM killer picks the
// process with the largest footprint in the cgroup, which would be the
// kernel. So it is not the forker's cgroup (forker.go): a spare chain's
// bwrap is moved into a memory cgroup of its own while it waits for its
// run (off the run's path: a move waits for an RCU grace period), and
// the run's processes are born there; a chain started for its run has
// its sandbox's init moved in while bwrap sets the sandbox up.
type memCgroup struct {
	dir string
	v1  bool
}

// memParent is this process's memory cgroup (or why there is none),
// found once; memParentV1 is whether it is in a cgroup v1 hierarchy.
var (
	memParentOnce sync.Once
	memParent     string
	memParentV1   bool
	memParentErr  error
)

// MemoryCgroup reports whether runs get a memory cgroup (Limits.Memory)
// on this host: nil where the kernel's process sits in a writable memory
// cgroup (cgroup v1's memory hierarchy, or cgroup v2 with the memory
// controller enabled for its children), else why not; runs are then
// bounded by RLIMIT_AS (Limits.AddressSpace) alone.
func MemoryCgroup() error {
	memParentOnce.Do(func() {
		if memParent, memParentV1, memParentErr = ownMemCgroup(); memParentErr == nil {
			if err := checkWritable(memParent); err != nil {
				memParentErr = err
				return
			}
			sweepStale(memParent)
		}
	})
	return memParentErr
}

// checkWritable reports whether a child cgroup can be made under dir.
func checkWritable(dir string) error {
	c := filepath.Join(dir, fmt.Sprintf("capkernel-sandbox-%d-probe", os.Getpid()))
	if err := os.Mkdir(c, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("memory cgroup %s not writable: %w", dir, err)
	}
	return os.Remove(c)
}

// ownMemCgroup is the directory of this process's memory cgroup.
func ownMemCgroup() (dir string, v1 bool, err error) { return ownCgroup("memory") }

// newMemCgroup makes an empty run cgroup under the kernel's memory cgroup.
func newMemCgroup() (*memCgroup, error) {
	if err := MemoryCgroup(); err != nil {
		return nil, err
	}
	dir, err := makeRunCgroup(memParent)
	if err != nil {
		return nil, err
	}
	return &memCgroup{dir: dir, v1: memParentV1}, nil
}

// join moves process pid (and so its future children) into the cgroup.
func (c *memCgroup) join(pid int) error {
	return os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// maxTCPBytes bounds the TCP socket buffers of a run on a cgroup v1 host
// (setLimit).
const maxTCPBytes = 64 << 20

// setLimit sets the cgroup's limit to n bytes, swap included. On cgroup
// v1 it also bounds the run's TCP socket buffers, to n or maxTCPBytes
// if less: v1 charges them to no memory cgroup unless given a limit of
// their own, and every socket of the host, in any network namespace,
// draws on one pool (net.ipv4.tcp_mem), so a command queueing data on
// loopback connections to itself took the host's pool, and every TCP
// connection of the host stalled (v2 charges them to memory.max).
func (c *memCgroup) setLimit(n int64) error {
	v := []byte(strconv.FormatInt(n, 10))
	if c.v1 {
		if err := os.WriteFile(filepath.Join(c.dir, "memory.limit_in_bytes"), v, 0); err != nil {
			return err
		}
		// Memory plus swap: present only with swap accounting.
		if err := os.WriteFile(filepath.Join(c.dir, "memory.memsw.limit_in_bytes"), v, 0); err != nil && !os.IsNotExist(err) {
			return err
		}
		tcp := []byte(strconv.FormatInt(min(n, maxTCPBytes), 10))
		if err := os.WriteFile(filepath.Join(c.dir, "memory.kmem.tcp.limit_in_bytes"), tcp, 0); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	if err := os.WriteFile(filepath.Join(c.dir, "memory.max"), v, 0); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "memory.swap.max"), []byte("0"), 0); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// oomKilled reports whether the OOM killer has killed a process of the
// cgroup: the oom_kill count of memory.oom_control (v1) or memory.events
// (v2) is above zero.
func (c *memCgroup) oomKilled() bool {
	name := "memory.events"
	if c.v1 {
		name = "memory.oom_control"
	}
	return eventCount(filepath.Join(c.dir, name), "oom_kill")
}

// remove deletes the cgroup once its processes are gone (pidsCgroup.remove).
func (c *memCgroup) remove() { removeCgroupDir(c.dir) }
