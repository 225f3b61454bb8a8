package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/internal/obstacles"
	"github.com/capkernel/capkernel/txn"
)

// TestFullWorkspace: with the workspace alone on a full ext4 file system
// (the kernel's data dir elsewhere), an fs.write of a new file is refused
// before the commit (execution_error, rolled_back, naming the full file
// system) and an fs.delete commits and removes its file; the kernel keeps
// serving. A file system filled by someone else between the staging and
// the apply (at the "decided" crash point), so that the rename onto the
// new name finds no room for its entry (ENOSPC), fails the kernel stop
// once, saying the next start reports it; that start reports an
// apply_refused conflict naming ENOSPC, removes the staging file, and
// serves. Before, the write and the delete each failed the kernel stop,
// and every start failed the same way (rev10-disk #2).
func TestFullWorkspace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a loop device")
	}
	h := newHarness(t)
	obstacles.Ext4(t, filepath.Dir(h.ws), h.ws)
	h.write("old.txt", "old")
	filler := filepath.Join(h.ws, "filler")
	if err := os.WriteFile(filler, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	obstacles.Fill(t, h.ws)

	r := h.invoke("fs.write", map[string]any{"path": "new.txt", "content": ""}, key("new"))
	if r.Status != StatusError || r.TxOutcome != RolledBack || errClass(r) != ErrExecution ||
		!strings.Contains(r.Error.Message, "new.txt") || !strings.Contains(r.Error.Message, "is full") ||
		!strings.Contains(r.Error.Message, "refused before the commit") {
		t.Fatalf("answer %s %s %+v: want execution_error, rolled_back, naming new.txt and the full file system", r.Status, r.TxOutcome, r.Error)
	}
	h.oneRecord(r.OperationID, RolledBack)
	mustOK(t, h.invoke("fs.delete", map[string]any{"path": "old.txt"}, key("del")))
	if _, err := os.Lstat(filepath.Join(h.ws, "old.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old.txt after its delete: %v", err)
	}
	if err := h.k.Err(); err != nil {
		t.Fatalf("the kernel failed stop: %v", err)
	}

	// Room again, then filled after the staging check: the file system,
	// and the directory with names as long as late.txt.
	names, _ := filepath.Glob(filepath.Join(h.ws, ".filler-*"))
	for _, n := range names {
		os.Remove(n)
	}
	crashHook = func(point string) {
		if point != "decided" {
			return
		}
		obstacles.Fill(t, h.ws)
		for i := 0; ; i++ {
			err := os.WriteFile(filepath.Join(h.ws, fmt.Sprintf("t%07d", i)), nil, 0o644)
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}
	defer func() { crashHook = nil }()
	r = h.invoke("fs.write", map[string]any{"path": "late.txt", "content": ""}, key("late"))
	crashHook = nil
	if r.TxOutcome != TxUnknown || h.k.Err() == nil || !strings.Contains(h.k.Err().Error(), "next start reports it as apply_refused") ||
		!errors.Is(h.k.Err(), syscall.ENOSPC) {
		t.Fatalf("answer %s %s %+v, kernel error %v: want a fail stop on ENOSPC, reported as apply_refused next", r.Status, r.TxOutcome, r.Error, h.k.Err())
	}
	if msg, _ := failureLog(h.k.Err()); !strings.Contains(msg, "no remount is needed") {
		t.Errorf("fail stop logged as %q: want it to say that a restart alone recovers", msg)
	}
	h.k.Close()
	h.open()
	cs := h.k.Recovered.Conflicts
	if len(cs) != 1 || cs[0].Reason != txn.ConflictRefused || cs[0].Path != "late.txt" || !strings.Contains(cs[0].Error, syscall.ENOSPC.Error()) {
		t.Fatalf("recovered conflicts %+v, want one apply_refused of late.txt naming ENOSPC", cs)
	}
	left, _ := filepath.Glob(filepath.Join(h.ws, txn.StagePrefix+"*"))
	if len(left) != 0 {
		t.Errorf("staging files left: %v", left)
	}
	mustOK(t, h.invoke("fs.delete", map[string]any{"path": "t0000000"}, key("del2")))
}
