package sandbox

import (
	"context"
	"os"
	"strconv"
	"strings"
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
	if res := run("echo", "from the spare"); string(res.Stdout) != "from the spare\n" || res.ExitCode != 0 {
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
			res, err := s.Run(context.Background(), p, Command{Argv: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Close()
			spare := waitSpareChain(t, s)
			tc.spoil(spare)
			res, err = s.Run(context.Background(), p, Command{Argv: []string{"echo", "ok"}})
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
