package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A run forked from a forker is born in its pids cgroup: bwrap and the
// sandbox's init are in the forker's cgroup while the sandbox waits at
// the gate, pids.max is Processes plus the forker's thread, bwrap and the
// init, a fork bomb is contained, the spare is used up,
// and the cgroup is removed afterwards.
func TestForkerRun(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	if _, v1, err := ownPidsCgroup(); err != nil || !v1 {
		t.Skipf("no cgroup v1 pids hierarchy here (%v): runs join their cgroups", err)
	}
	// The chain's command line names the /etc snapshot, under StagingDir
	// (the command's argv reaches the init through its environment).
	stagingDir := t.TempDir()
	s := New(Options{StagingDir: stagingDir, KillGrace: time.Second})
	defer s.Close()
	f, err := newForker()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.making = true // no other spare meanwhile
	s.spare = f
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.making = false
		s.mu.Unlock()
	}()
	marker := fmt.Sprintf("forker-%d", time.Now().UnixNano())
	rel := strings.TrimPrefix(f.cg.dir, "/sys/fs/cgroup/pids")
	var inCgroup []string
	var max string
	const procs = 16
	res, err := s.Run(context.Background(), Profile{Roots: []Root{{Path: t.TempDir()}}, Limits: Limits{Processes: procs}},
		Command{Argv: []string{"sh", "-c", "for i in $(seq 1 40); do sleep 5 & done; wait; echo " + marker}, Timeout: 10 * time.Second,
			Gate: func() error {
				b, _ := os.ReadFile(filepath.Join(f.cg.dir, "pids.max"))
				max = strings.TrimSpace(string(b))
				for _, comm := range []string{"bwrap", "sh"} {
					for _, pid := range procsNamed(comm, stagingDir+"/") {
						b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
						for _, l := range strings.Split(string(b), "\n") {
							if _, path, ok := strings.Cut(l, ":pids:"); ok {
								inCgroup = append(inCgroup, comm+" "+path)
							}
						}
					}
				}
				return nil
			}})
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	if want := strconv.Itoa(procs + 3); max != want {
		t.Errorf("pids.max %q, want %s", max, want)
	}
	if len(inCgroup) < 2 {
		t.Fatalf("bwrap and the init not found at the gate: %q", inCgroup)
	}
	for _, c := range inCgroup {
		if !strings.HasSuffix(c, " "+rel) {
			t.Errorf("%s, not in the forker's cgroup %s", c, rel)
		}
	}
	if os.Geteuid() == 0 && res.LimitExceeded != "processes" {
		t.Errorf("fork bomb not contained: limit %q, exit %d", res.LimitExceeded, res.ExitCode)
	}
	s.mu.Lock()
	spare := s.spare
	s.mu.Unlock()
	if spare == f {
		t.Error("the run did not use the spare forker")
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(f.cg.dir); os.IsNotExist(err) {
			break
		}
		if i == 50 {
			tasks, _ := os.ReadFile(filepath.Join(f.cg.dir, "tasks"))
			var who []string
			for _, p := range strings.Fields(string(tasks)) {
				st, _ := os.ReadFile("/proc/" + p + "/status")
				who = append(who, p+" "+strings.SplitN(string(st), "\n", 2)[0])
			}
			t.Fatalf("cgroup %s left after the run, tasks %q", f.cg.dir, who)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procsNamed lists the processes named comm whose command line holds s.
func procsNamed(comm, s string) []int {
	var out []int
	for _, pid := range procPids() {
		c, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		cl, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if strings.TrimSpace(string(c)) == comm && strings.Contains(string(cl), s) {
			out = append(out, pid)
		}
	}
	return out
}

// A spare chain is forked from the forker made ahead, and taking it starts
// the next one: a new forker waits for its thread's move into the cgroup
// (an RCU grace period, 6–12 ms on the loaded machine), longer than the gap
// between two calls, so a spare chain making its own was often not ready
// for the next run.
func TestSpareChainForkerAhead(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	if _, v1, err := ownPidsCgroup(); err != nil || !v1 {
		t.Skipf("no cgroup v1 pids hierarchy here (%v): runs join their cgroups", err)
	}
	s := New(Options{StagingDir: t.TempDir()})
	defer s.Close()
	tl, err := s.tools(false, os.Geteuid() == 0, false)
	if err != nil {
		t.Fatal(err)
	}
	s.kickSpareChain(tl)
	first := waitSpareChain(t, s)
	var ahead *forker
	for deadline := time.Now().Add(10 * time.Second); ahead == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("making the spare chain did not start making the next forker")
		}
		s.mu.Lock()
		ahead = s.spare
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.spareChain = nil
	s.mu.Unlock()
	first.end()
	s.kickSpareChain(tl)
	if next := waitSpareChain(t, s); next.f != ahead {
		t.Fatalf("the next spare chain was forked from %p, want the forker made ahead %p", next.f, ahead)
	}
}
