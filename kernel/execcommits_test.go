package kernel

import (
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/txn"
)

// TestExecDurableCommits: a command that writes nothing costs two durable
// transactions (the prepared intent, then the commit with the audit record,
// which also finishes the intent); one that writes a file a third, the
// intent's finish after the renames, off the call's path. Either way no
// intent is left and a repeat is replayed.
func TestExecDurableCommits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    string
		script  string
		commits int64
	}{
		{"r-root", "r", "true", 2},
		{"rw-empty-delta", "rw", "true", 2},
		{"rw-write", "rw", "echo x > out.txt", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t)
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: tc.mode}}})
			before := h.k.commits.Load()
			r := h.invoke("proc.exec", execArgs("sh", "-c", tc.script), key("commits-"+tc.name))
			if r.Status != StatusOK || r.TxOutcome != Committed {
				t.Fatalf("result %+v", r)
			}
			// The finish of a call with effects is queued before the call
			// returns; wait until no intent is left.
			deadline := time.Now().Add(5 * time.Second)
			for {
				var n int
				h.k.View(func(tx *bbolt.Tx) error {
					in, err := txn.Intents(tx)
					n = len(in)
					return err
				})
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d intents left", n)
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // room for a commit that should not come
			if got := h.k.commits.Load() - before; got != tc.commits {
				t.Fatalf("%d durable transactions, want %d", got, tc.commits)
			}
			again := h.invoke("proc.exec", execArgs("sh", "-c", tc.script), key("commits-"+tc.name))
			if !again.Replayed {
				t.Fatalf("repeat not replayed: %+v", again)
			}
		})
	}
}
