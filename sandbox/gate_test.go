package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/sandbox"
)

// lockedBuffer collects a command's output as it comes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestGate: the command starts only once Command.Gate has returned nil,
// and not at all when it returns an error (Run then fails with it).
func TestGate(t *testing.T) {
	requireSandbox(t)
	s := newSandbox(t, sandbox.Options{StagingDir: t.TempDir()})
	ws := t.TempDir()
	prof := sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}

	t.Run("refused", func(t *testing.T) {
		refused := errors.New("intent refused")
		var out lockedBuffer
		calls := 0
		res, err := s.Run(context.Background(), prof, sandbox.Command{
			Argv: []string{"sh", "-c", "echo ran; echo x > f"}, Stdout: &out,
			Gate: func() error { calls++; return refused },
		})
		if !errors.Is(err, refused) || res != nil {
			t.Fatalf("Run = %+v, %v; want the gate's error", res, err)
		}
		if calls != 1 || out.String() != "" {
			t.Fatalf("gate called %d times, command output %q: the command ran", calls, out.String())
		}
	})

	t.Run("open", func(t *testing.T) {
		var opened time.Time
		res, err := s.Run(context.Background(), prof, sandbox.Command{
			Argv: []string{"sh", "-c", "date +%s%N; echo x > f"},
			Gate: func() error {
				time.Sleep(200 * time.Millisecond)
				opened = time.Now()
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer res.Close()
		ns, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exit %d, stdout %q: %v", res.ExitCode, res.Stdout, err)
		}
		if ran := time.Unix(0, ns); ran.Before(opened) {
			t.Fatalf("the command ran at %v, %v before the gate opened", ran, opened.Sub(ran))
		}
		if len(res.Delta.Changes) != 1 || res.Delta.Changes[0].Rel != "f" {
			t.Fatalf("delta %+v", res.Delta)
		}
	})
}

// TestChainUserNamespace: a root kernel's bwrap runs in a user namespace
// of its own (unshare's), never with the host's capabilities; seen from
// the gate, when the sandbox is set up and bwrap is monitoring it.
func TestChainUserNamespace(t *testing.T) {
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("an ordinary-user kernel's bwrap has no host capabilities to lose")
	}
	// The chain's command line names the /etc snapshot, under StagingDir.
	stagingDir := t.TempDir()
	s := newSandbox(t, sandbox.Options{StagingDir: stagingDir})
	ws := t.TempDir()
	marker := fmt.Sprintf("userns-marker-%d", time.Now().UnixNano())
	own, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, sandbox.Command{
		Argv: []string{"echo", marker},
		Gate: func() error {
			for _, pid := range pidsWithComm("bwrap", stagingDir+"/") {
				ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
				if err == nil {
					seen = append(seen, ns)
				}
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	if len(seen) == 0 {
		t.Fatal("no bwrap process found while the sandbox was set up")
	}
	for _, ns := range seen {
		if ns == own {
			t.Fatalf("bwrap runs in the kernel's user namespace %s", ns)
		}
	}
}

// pidsWithComm lists the processes named comm whose command line holds s.
func pidsWithComm(comm, s string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(c)) == comm && strings.Contains(string(cl), s) {
			out = append(out, pid)
		}
	}
	return out
}
