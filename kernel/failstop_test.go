package kernel

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/txn"
)

// TestApplyFailureFailsStop: when a committed call's staged file cannot be
// renamed into place (its target turned into a directory between commit
// and apply: a real EISDIR from rename(2), every retry), the call is not
// answered ok, the kernel fails stop (every later call refused without
// running), and the next Open applies the decided delta only where the
// target still holds the pre-image; newer content is never overwritten.
// Either way no staging file is left and the operation has exactly one
// audit record.
func TestApplyFailureFailsStop(t *testing.T) {
	cases := []struct {
		name string
		// repair is what the operator finds on disk at restart, after
		// the directory is removed: the old content back, or newer.
		repair   string
		want     string
		conflict bool
	}{
		{name: "pre-image back: recovery applies", repair: "old\n", want: "new\n"},
		{name: "newer content: recovery leaves it", repair: "newer\n", want: "newer\n", conflict: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.write("f.txt", "old\n")
			target := filepath.Join(h.ws, "f.txt")
			crashHook = func(point string) {
				if point != "decided" {
					return
				}
				os.Remove(target)
				os.MkdirAll(filepath.Join(target, "sub"), 0o755)
			}
			defer func() { crashHook = nil }()
			r := h.invoke("fs.write", map[string]any{"path": "f.txt", "content": "new\n"}, key("k"))
			crashHook = nil
			if r.Status != StatusError || errClass(r) != ErrInternal || r.TxOutcome != TxUnknown || r.Receipt != nil ||
				!strings.Contains(r.Error.Message, "apply of committed operation") || !strings.Contains(r.Error.Message, h.ws) {
				t.Fatalf("answer to a call whose apply failed: %+v %+v, want internal, tx_outcome unknown, naming the apply and the root", r, r.Error)
			}
			select {
			case <-h.k.Failed():
			default:
				t.Fatal("the kernel did not fail stop")
			}
			later := h.invoke("fs.write", map[string]any{"path": "g.txt", "content": "g"}, key("k2"))
			if errClass(later) != ErrInternal || later.TxOutcome != NoOp || later.Receipt != nil || !strings.Contains(later.Error.Message, "did not run") {
				t.Fatalf("a call after the fail stop: %+v %+v, want internal, no_op, unrecorded, saying it did not run", later, later.Error)
			}
			if _, err := os.Stat(filepath.Join(h.ws, "g.txt")); !os.IsNotExist(err) {
				t.Fatalf("a call after the fail stop ran: %v", err)
			}
			h.k.Close()
			os.RemoveAll(target)
			h.write("f.txt", tc.repair)
			h.open()
			if got := h.read("f.txt"); got != tc.want {
				t.Fatalf("after recovery f.txt = %q, want %q", got, tc.want)
			}
			if n := len(h.k.Recovered.Redone); n != 1 {
				t.Fatalf("recovery redid %d intents, want 1", n)
			}
			conflicts := h.k.Recovered.Conflicts
			if tc.conflict != (len(conflicts) == 1) {
				t.Fatalf("conflicts %+v, want conflict=%v", conflicts, tc.conflict)
			}
			if tc.conflict && (conflicts[0].Path != "f.txt" || conflicts[0].Found != digest.Sum([]byte(tc.repair))) {
				t.Fatalf("conflict %+v", conflicts[0])
			}
			names, _ := os.ReadDir(h.ws)
			for _, n := range names {
				if strings.HasPrefix(n.Name(), txn.StagePrefix) || strings.HasPrefix(n.Name(), txn.TrashPrefix) {
					t.Errorf("staging file %s left after recovery", n.Name())
				}
			}
			h.oneRecord(r.OperationID, Committed)
			// The same key now has its definitive answer: the commit.
			again := h.invoke("fs.write", map[string]any{"path": "f.txt", "content": "new\n"}, key("k"))
			mustOK(t, again)
			if !again.Replayed || again.OperationID != r.OperationID || again.TxOutcome != Committed {
				t.Fatalf("same-key retry after restart: %+v", again)
			}
			// And the key of the refused call is free.
			mustOK(t, h.invoke("fs.write", map[string]any{"path": "g.txt", "content": "g"}, key("k2")))
		})
	}
}

// TestRecordFailureReleasesKey: when recording a commit fails without a
// durability failure (here the kv record the commit checks is unreadable,
// a real error from CanCommit), nothing was written, so the call is rolled
// back at once: one audit record, rolled_back (never committed), the
// kernel keeps serving, and the same key gets a definitive answer as soon
// as the cause is gone, not idempotency_in_flight until a restart.
func TestRecordFailureReleasesKey(t *testing.T) {
	h := newHarness(t)
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "cfg", "value": 1}, key("first")))
	var saved []byte
	crashHook = func(point string) {
		if point != "staged" {
			return
		}
		h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
			saved = append([]byte(nil), tx.Bucket([]byte("kv")).Get([]byte("cfg"))...)
			return tx.Bucket([]byte("kv")).Put([]byte("cfg"), []byte("{not json"))
		})
	}
	r := h.invoke("kv.put", map[string]any{"key": "cfg", "value": 2}, key("second"))
	crashHook = nil
	if errClass(r) != ErrInternal || r.TxOutcome != RolledBack || r.ReceiptID == "" {
		t.Fatalf("answer: %+v %+v, want internal, rolled_back, with its receipt", r, r.Error)
	}
	if h.k.Err() != nil {
		t.Fatalf("the kernel failed stop on an error that wrote nothing: %v", h.k.Err())
	}
	h.oneRecord(r.OperationID, RolledBack)
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("kv")).Put([]byte("cfg"), saved)
	}); err != nil {
		t.Fatal(err)
	}
	again := h.invoke("kv.put", map[string]any{"key": "cfg", "value": 2}, key("second"))
	mustOK(t, again)
	if again.Replayed || again.TxOutcome != Committed {
		t.Fatalf("same-key retry: %+v, want a fresh commit", again)
	}
}

// TestDeferredSyncfsFailure: the syncfs that makes a call's applied
// changes durable runs after the call is answered (finish). When it fails,
// the kernel fails stop and never finishes the intent, so the next start
// redoes the call from its intent. The child kernel runs under strace,
// which fails every syncfs(2) with EIO: a delete stages no file, so the
// first syncfs is the deferred one.
func TestDeferredSyncfsFailure(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace is not installed (make strace installs it)")
	}
	if out, err := exec.Command("strace", "-f", "-o", "/dev/null", "-e", "inject=getpid:error=EIO", "true").CombinedOutput(); err != nil {
		t.Skipf("strace cannot trace here (ptrace refused?): %v %s", err, out)
	}
	h := newHarness(t)
	h.write("f.txt", "old")
	env := h.env("fs.delete", map[string]any{"path": "f.txt"}, key("del"), func(e *Envelope) { e.OperationID = newID() })
	envJSON, _ := json.Marshal(env)
	h.k.Close()

	cmd := exec.Command("strace", "-f", "-o", "/dev/null", "-e", "inject=syncfs:error=EIO",
		os.Args[0], "-test.run=^TestDeferredSyncfsChild$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPK_SYNCFS_DATA="+h.data, "CAPK_ENVELOPE="+string(envJSON))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	h.open()
	if n := len(h.k.Recovered.Redone); n != 1 {
		t.Fatalf("recovery redid %d intents, want 1: the intent was finished although its syncfs failed\n%s", n, out)
	}
	if _, err := os.Lstat(filepath.Join(h.ws, "f.txt")); !os.IsNotExist(err) {
		t.Fatalf("f.txt after recovery: %v, want it deleted", err)
	}
	h.oneRecord(env.OperationID, Committed)
	mustVerify(t, h.k.Inspector())
}

// TestDeferredSyncfsChild is the child of TestDeferredSyncfsFailure.
func TestDeferredSyncfsChild(t *testing.T) {
	data := os.Getenv("CAPK_SYNCFS_DATA")
	if data == "" {
		t.Skip("run by TestDeferredSyncfsFailure")
	}
	k, err := Open(context.Background(), Config{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	var env Envelope
	if err := json.Unmarshal([]byte(os.Getenv("CAPK_ENVELOPE")), &env); err != nil {
		t.Fatal(err)
	}
	op := env.OperationID
	mustOK(t, k.Invoke(context.Background(), &env))
	select {
	case <-k.Failed():
	case <-time.After(5 * time.Second):
		// Push a transaction, which would carry a Finish queued lazily.
		echo := env
		echo.ToolID, echo.Args, echo.IdempotencyKey, echo.OperationID = "echo", json.RawMessage(`{"text":"x"}`), "", ""
		k.Invoke(context.Background(), &echo)
		k.Close()
		t.Fatalf("no fail stop after the deferred syncfs of operation %s failed", op)
	}
	if err := k.Err(); err == nil || !strings.Contains(err.Error(), "syncfs (making applied files durable)") {
		t.Fatalf("fail stop cause %v, want the deferred syncfs", err)
	}
	k.Close()
}
