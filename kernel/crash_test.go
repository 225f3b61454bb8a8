package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// writeTwo stages two files in one call: its commit must be all or nothing.
type writeTwo struct{}

func (writeTwo) Definition() syscalls.Definition {
	return syscalls.Definition{
		ID: "test.write2", Description: "writes a and b", SideEffect: syscalls.Write,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"content":{"type":"string"}},"required":["a","b","content"],"additionalProperties":false}`),
		Resources:   []syscalls.ResourceArg{{Arg: "a", Kind: "fs", Access: syscalls.AccessWrite}, {Arg: "b", Kind: "fs", Access: syscalls.AccessWrite}},
	}
}

func (writeTwo) Execute(_ context.Context, c *syscalls.Call) (syscalls.Output, error) {
	var a struct{ Content string }
	if err := json.Unmarshal(c.Args, &a); err != nil {
		return syscalls.Output{}, err
	}
	for _, r := range c.Resources {
		if err := c.Stage.WriteFile(r, []byte(a.Content), 0); err != nil {
			return syscalls.Output{}, err
		}
	}
	return syscalls.Output{Result: json.RawMessage(`{"written":2}`)}, nil
}

// TestCrashChild is the child process of TestCrashRecovery: it opens the
// kernel, arms the crash hook and makes the two-file write, dying by
// SIGKILL at the armed point.
func TestCrashChild(t *testing.T) {
	point := os.Getenv("CAPK_CRASH_POINT")
	if point == "" {
		t.Skip("run by TestCrashRecovery")
	}
	k, err := Open(context.Background(), Config{DataDir: os.Getenv("CAPK_DATA")})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Registry().Register(func() syscalls.Syscall { return writeTwo{} }); err != nil {
		t.Fatal(err)
	}
	var env Envelope
	if err := json.Unmarshal([]byte(os.Getenv("CAPK_ENVELOPE")), &env); err != nil {
		t.Fatal(err)
	}
	env.PolicyHash = k.PolicyHash()
	crashHook = func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	r := k.Invoke(context.Background(), &env)
	t.Fatalf("survived the crash point %s: %+v", point, r)
}

func TestCrashRecovery(t *testing.T) {
	cases := []struct {
		point   string
		partial bool // one of the two renames happened before the crash
		applied bool // what the reopened kernel must show
	}{
		{"prepared", false, false},
		{"staged", false, false},
		{"decided", false, true},
		{"decided", true, true},
		{"applied", false, true}, // renamed, not yet durable
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s partial=%v", tc.point, tc.partial), func(t *testing.T) {
			h := newHarness(t)
			h.write("a.txt", "old")
			h.write("b.txt", "old")
			tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"test.*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			env := Envelope{ToolID: "test.write2", Args: json.RawMessage(`{"a":"a.txt","b":"b.txt","content":"new"}`),
				AgentID: h.agent, CapabilityToken: tok, CapabilityTokenID: jti, IdempotencyKey: "crash", OperationID: newID()}
			envJSON, _ := json.Marshal(env)
			h.k.Close()

			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
			cmd.Env = append(os.Environ(), "CAPK_CRASH_POINT="+tc.point, "CAPK_DATA="+h.data, "CAPK_ENVELOPE="+string(envJSON))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed at %s: %v\n%s", tc.point, err, out)
			}
			if tc.point == "decided" {
				if h.read("a.txt") != "old" || h.read("b.txt") != "old" {
					t.Fatal("effects visible before the renames")
				}
			}
			if tc.partial {
				renameOneStaged(t, h.ws, "a.txt")
			}

			h.open()
			wantA := "old"
			if tc.applied {
				wantA = "new"
			}
			if a, b := h.read("a.txt"), h.read("b.txt"); a != wantA || b != wantA {
				t.Fatalf("after recovery a=%q b=%q, want both %q", a, b, wantA)
			}
			assertNoStaging(t, h.ws)
			rec := h.k.Recovered
			if tc.applied && len(rec.Redone) != 1 || !tc.applied && len(rec.RolledBack) != 1 {
				t.Fatalf("recovery report %+v", rec)
			}
			mustVerify(t, h.k.Inspector())
			if !tc.applied {
				a := h.audits(0)
				last := a[len(a)-1]
				if last.OperationID != env.OperationID || last.TxOutcome != RolledBack {
					t.Fatalf("rolled-back call not audited: %+v", last)
				}
			}
			// A retry with the same key: replayed if the call committed, run
			// afresh (exactly once) if it was rolled back.
			if err := h.k.Registry().Register(func() syscalls.Syscall { return writeTwo{} }); err != nil {
				t.Fatal(err)
			}
			retry := env
			retry.OperationID = ""
			retry.PolicyHash = h.k.PolicyHash()
			r := h.k.Invoke(context.Background(), &retry)
			mustOK(t, r)
			if r.Replayed != tc.applied {
				t.Fatalf("retry replayed=%v, want %v", r.Replayed, tc.applied)
			}
			if h.read("a.txt") != "new" || h.read("b.txt") != "new" {
				t.Fatal("retry did not leave both files written")
			}
		})
	}
}

// renameOneStaged moves the staging file meant for target into place, as a
// crash in the middle of applying a decided commit would leave it.
func renameOneStaged(t *testing.T, ws, target string) {
	t.Helper()
	entries, err := os.ReadDir(ws)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), txn.StagePrefix) && strings.HasSuffix(e.Name(), "-0") {
			if err := os.Rename(filepath.Join(ws, e.Name()), filepath.Join(ws, target)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("no staging file to rename")
}
