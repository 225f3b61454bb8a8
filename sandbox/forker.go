package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// forker is an OS thread that already sits in a fresh run pids cgroup,
// made ahead of a run. The run forks its chain from that thread, so the
// chain is born in the cgroup: it never waits for the RCU grace period
// that moving a process into a cgroup costs (a cold move took 12–23 ms on
// the loaded 2-core machine with HZ 250; bwrap's whole setup takes less).
// The thread was moved instead, off the run's path, while the previous run
// went on. Only cgroup v1 lets a thread sit in a cgroup of its own (its
// tasks file); elsewhere runs join their cgroup as before (joinPidsCgroup).
// A forker serves one run; its thread ends with the run, leaving the
// cgroup empty.
type forker struct {
	cg   *pidsCgroup
	jobs chan func() // the run's start-and-wait; closed to end an unused forker
}

// forkerThreads is what a forker adds to its cgroup's count: the thread.
const forkerThreads = 1

var errNoThreadCgroups = errors.New("the pids cgroup is not cgroup v1: a thread cannot sit in a cgroup of its own")

// newForker makes a run cgroup and moves a new locked OS thread into it.
func newForker() (*forker, error) {
	cg, err := newPidsCgroup()
	if err != nil {
		return nil, err
	}
	if !parentV1 {
		cg.remove()
		return nil, errNoThreadCgroups
	}
	f := &forker{cg: cg, jobs: make(chan func(), 1)}
	joined := make(chan error, 1)
	go f.serve(joined, nil)
	if err := <-joined; err != nil {
		cg.remove()
		return nil, err
	}
	return f, nil
}

// serve moves its OS thread into the forker's cgroup, reports on joined,
// then runs the one job it is given. It never unlocks the thread: the
// thread ends with the goroutine, after the run's chain is reaped, and so
// leaves the cgroup. locked, if set, is closed once the thread is locked.
func (f *forker) serve(joined chan<- error, locked chan<- struct{}) {
	runtime.LockOSThread()
	if locked != nil {
		close(locked)
	}
	if unix.Gettid() == unix.Getpid() {
		// The main thread never ends, so it would never leave the
		// cgroup: serve from another thread, made while this one is held.
		l := make(chan struct{})
		go f.serve(joined, l)
		<-l
		runtime.UnlockOSThread()
		return
	}
	err := os.WriteFile(filepath.Join(f.cg.dir, "tasks"), []byte(strconv.Itoa(unix.Gettid())), 0)
	joined <- err
	if err != nil {
		return
	}
	if job, ok := <-f.jobs; ok {
		job()
	}
}

// discard ends an unused forker.
func (f *forker) discard() {
	close(f.jobs)
	go f.cg.remove() // once the thread has ended
}

// takeForker returns the Sandbox's spare forker, or nil if none is ready,
// and starts making the next one.
func (s *Sandbox) takeForker() *forker {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.spare
	s.spare = nil
	if !s.closed && !s.making && !s.noForker {
		s.making = true
		go s.makeForker()
	}
	return f
}

// makeForker makes the spare forker (off any run's path).
func (s *Sandbox) makeForker() {
	f, err := newForker()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.making = false
	if err != nil {
		// No v1 pids hierarchy, or no permission: runs join their cgroups
		// (joinPidsCgroup) from now on.
		s.noForker = true
		return
	}
	if s.closed {
		f.discard()
		return
	}
	s.spare = f
}
