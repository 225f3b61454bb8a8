package txn

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/obstacles"
	"github.com/capkernel/capkernel/syscalls"
)

// TestMountedWriteErrorSeen: a write staged into a file system mounted
// below the workspace root, whose writeback fails, fails its staging,
// although the Syncer's syncfs of the root's own file system succeeds: a
// commit would otherwise follow content that never reached the disk. It
// runs TestMountedWriteErrorChild in a private mount namespace (as root).
func TestMountedWriteErrorSeen(t *testing.T) {
	runInMountNamespace(t, "TestMountedWriteErrorChild")
}

// TestMountedWriteErrorChild is the child of TestMountedWriteErrorSeen:
// the root is a tmpfs, with failingExt4 mounted at m inside it.
func TestMountedWriteErrorChild(t *testing.T) {
	ws, root := failingRoot(t, "TestMountedWriteErrorSeen", "ws", "ws/m")
	e := newEnv(t)
	s := NewSyncer()
	defer s.Close()
	stage := NewStage("op", KV{View: e.db.View}, s)
	err := stage.WriteFile(&syscalls.Resource{Root: root, RootPath: ws, Rel: "m/big"}, bigContent(), 0)
	if err == nil {
		err = s.Sync(stage.FileRoots()...)
	}
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("staging into the mount below the root and syncing returned %v, want the writeback's ENOSPC", err)
	}
	t.Logf("staging into the mount below the root: %v", err)
}

// TestMountedEffects: the effects of a stage on a mount below the root
// are marked Mounted, and only those; they apply and redo as any other.
func TestMountedEffects(t *testing.T) {
	ws := t.TempDir()
	obstacles.Tmpfs(t, ws, filepath.Join(ws, "m")) // skips without root
	for _, f := range []string{"top.txt", "m/old.txt", "m/gone.txt"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	e := newEnv(t)
	s := NewSyncer()
	defer s.Close()
	res := func(rel string) *syscalls.Resource { return &syscalls.Resource{Root: root, RootPath: ws, Rel: rel} }
	for _, redo := range []bool{false, true} {
		stage := NewStage("op", KV{View: e.db.View}, s)
		for _, err := range []error{
			stage.WriteFile(res("top.txt"), []byte("new"), 0),
			stage.WriteFile(res("m/old.txt"), []byte("new"), 0),
			stage.Mkdir(res("m/d"), 0o755),
			stage.Mkdir(res("d"), 0o755),
			stage.Delete(res("m/gone.txt")),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		want := map[string]bool{"top.txt": false, "m/old.txt": true, "m/d": true, "d": false, "m/gone.txt": true}
		effects := stage.Effects()
		for _, ef := range effects {
			if m, ok := want[ef.Path]; ok && ef.Mounted != m {
				t.Errorf("%s %s: Mounted %v, want %v", ef.Op, ef.Path, ef.Mounted, m)
			}
		}
		if redo {
			if c, err := Redo("op", effects, stage.Root); err != nil || len(c) > 0 {
				t.Fatalf("redo: %v %+v", err, c)
			}
		} else if err := Apply(effects, stage.Root); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(ws, "m/old.txt")); err != nil || string(b) != "new" {
			t.Fatalf("m/old.txt: %q, %v", b, err)
		}
		if fi, err := os.Stat(filepath.Join(ws, "m/d")); err != nil || !fi.IsDir() {
			t.Fatalf("m/d: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(ws, "m/gone.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("m/gone.txt after the delete: %v", err)
		}
		// Again, over what the first round made.
		for _, f := range []string{"m/d", "d"} {
			os.Remove(filepath.Join(ws, f))
		}
		os.WriteFile(filepath.Join(ws, "m/gone.txt"), []byte("old"), 0o644)
		os.WriteFile(filepath.Join(ws, "m/old.txt"), []byte("old"), 0o644)
		os.WriteFile(filepath.Join(ws, "top.txt"), []byte("old"), 0o644)
	}
}

// TestRedoMountedOldIntent: Redo of a write into a file system mounted
// below the root, by an intent that does not say so (decided by a build
// before Effect.Mounted, whose staging file was never fsynced), syncs
// that file system: the written file's failed writeback fails the Redo
// (so recovery does not finish the intent) with ErrNotDurable, which is
// never taken for a lasting refusal. It runs TestRedoMountedOldIntentChild in a
// private mount namespace (as root).
func TestRedoMountedOldIntent(t *testing.T) {
	runInMountNamespace(t, "TestRedoMountedOldIntentChild")
}

// TestRedoMountedOldIntentChild is the child of TestRedoMountedOldIntent.
func TestRedoMountedOldIntentChild(t *testing.T) {
	ws, root := failingRoot(t, "TestRedoMountedOldIntent", "ws", "ws/m")
	content := bigContent()
	stage := "m/" + StagePrefix + "op-0"
	if err := root.WriteFile(stage, content, 0o644); err != nil {
		t.Fatal(err)
	}
	var effects []Effect // as the old build encoded it: no "mounted"
	if err := json.Unmarshal([]byte(`[{"op":"write","root":"`+ws+`","path":"m/big","stage":"`+stage+`","new_hash":"`+digest.Sum(content)+`","size":12582912}]`), &effects); err != nil {
		t.Fatal(err)
	}
	rs := recoveryRoots{roots: rootCache{}}
	defer rs.close()
	conflicts, err := Redo("op", effects, rs.open)
	// The file system's writeback error: ENOSPC or EIO, as the kernel
	// records it.
	if !errors.Is(err, ErrNotDurable) || !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EIO) || len(conflicts) > 0 || Refused(err) {
		t.Fatalf("Redo: conflicts %v, %v; want the failed sync of the written file's file system (ErrNotDurable), not refused", conflicts, err)
	}
	t.Logf("Redo: %v", err)
}

// TestApplyStagingGone: Apply of a write whose staging file is gone is
// done only when its target holds the committed content (an earlier
// attempt renamed it); otherwise (the file removed, or hidden by a mount
// that appeared over its directory) it fails, and Redo reports a
// staging_damaged conflict, where both took the write for done and the
// committed content was nowhere.
func TestApplyStagingGone(t *testing.T) {
	ws := t.TempDir()
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	e := newEnv(t)
	s := NewSyncer()
	defer s.Close()
	res := &syscalls.Resource{Root: root, RootPath: ws, Rel: "f.txt"}
	for _, tc := range []struct {
		name  string
		after func(effects []Effect) // between the stage and Apply
		ok    bool
	}{
		{"applied twice", func(ef []Effect) {
			if err := Apply(ef, func(string) (*os.Root, error) { return root, nil }); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"staging file removed", func(ef []Effect) { os.Remove(filepath.Join(ws, ef[0].Stage)) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stage := NewStage("op-"+tc.name[:3], KV{View: e.db.View}, s)
			if err := stage.WriteFile(res, []byte("committed "+tc.name), 0); err != nil {
				t.Fatal(err)
			}
			effects := stage.Effects()
			tc.after(effects)
			if err := Apply(effects, stage.Root); (err == nil) != tc.ok {
				t.Fatalf("Apply: %v, want ok %v", err, tc.ok)
			}
			// Recovery's Redo says the same: a conflict, not a write done.
			conflicts, err := Redo("op", effects, stage.Root)
			if err != nil || (len(conflicts) == 0) != tc.ok || !tc.ok && conflicts[0].Reason != ConflictStaging {
				t.Fatalf("Redo: %+v, %v; want a %s conflict: %v", conflicts, err, ConflictStaging, !tc.ok)
			}
		})
	}
}
