package kernel

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/syscalls"
)

// holdWriteSys is a WRITE syscall on its "path" that runs until released:
// it holds that path's lock, and its session's slot, meanwhile.
type holdWriteSys struct {
	started chan<- struct{}
	release <-chan struct{}
}

func (holdWriteSys) Definition() syscalls.Definition {
	return syscalls.Definition{
		ID: "test.holdwrite", Description: "holds a path until released", SideEffect: syscalls.Write,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`),
		Resources:   []syscalls.ResourceArg{{Arg: "path", Kind: "fs", Access: syscalls.AccessWrite}},
	}
}

func (s holdWriteSys) Execute(context.Context, *syscalls.Call) (syscalls.Output, error) {
	s.started <- struct{}{}
	<-s.release
	return syscalls.Output{Result: json.RawMessage(`{}`)}, nil
}

// TestRevokedWhileWaiting: a call whose token is revoked while it waits
// for its session's slot or a path lock, or while it runs, does not run
// (or does not commit) afterwards: it is refused token_revoked, as a new
// call of the token is at once (rev10-race F1).
func TestRevokedWhileWaiting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tool    string
		args    map[string]any
		mods    []func(*Envelope)
		session bool // waits for the session's slot; else for f.txt's lock
		running bool // revoked while it runs: refused at its commit
	}{
		{name: "write waiting for the session's slot", tool: "fs.write", args: map[string]any{"path": "g.txt", "content": "x"}, mods: []func(*Envelope){key("w")}, session: true},
		{name: "read waiting for the session's slot", tool: "fs.read", args: map[string]any{"path": "r.txt"}, session: true},
		{name: "write waiting for a path lock", tool: "fs.write", args: map[string]any{"path": "f.txt", "content": "x"}, mods: []func(*Envelope){key("w")}},
		{name: "write revoked while it runs", tool: "test.holdwrite", args: map[string]any{"path": "f.txt"}, mods: []func(*Envelope){key("w")}, running: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.SessionConcurrency = 1 })
			h.write("r.txt", "r")
			started, release := make(chan struct{}, 2), make(chan struct{})
			if err := h.k.Registry().Register(func() syscalls.Syscall { return holdWriteSys{started, release} }); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var r *Result
			mods := append(tc.mods, session("s"))
			if tc.running {
				wg.Go(func() { r = h.invoke(tc.tool, tc.args, mods...) })
			} else {
				holder := session("s")
				if !tc.session {
					holder = session("other")
				}
				wg.Go(func() { h.invoke("test.holdwrite", map[string]any{"path": "f.txt"}, key("hold"), holder) })
				<-started
				wg.Go(func() { r = h.invoke(tc.tool, tc.args, mods...) })
				if tc.session {
					for waiting(h.k.sessions, h.agent, "s") == 0 {
						time.Sleep(time.Millisecond)
					}
				} else {
					time.Sleep(100 * time.Millisecond) // the write queues for f.txt's lock
				}
			}
			if tc.running {
				<-started
			}
			if err := h.k.Revoke(context.Background(), h.jti, "leaked"); err != nil {
				t.Fatal(err)
			}
			close(release)
			wg.Wait()
			if errClass(r) != ErrTokenRevoked || r.TxOutcome == Committed {
				t.Fatalf("%s: %s %s %s; want refused token_revoked, not committed", tc.name, r.Status, errClass(r), r.TxOutcome)
			}
			if tc.tool == "fs.write" {
				if _, err := os.Stat(filepath.Join(h.ws, tc.args["path"].(string))); err == nil {
					t.Fatalf("%s: the write landed", tc.name)
				}
			}
		})
	}
}
