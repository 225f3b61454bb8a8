package txn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/obstacles"
	"github.com/capkernel/capkernel/syscalls"
)

// fullWorkspace returns a workspace directory on a full ext4 file
// system, with the directories of mkdirs made before it was filled.
func fullWorkspace(t *testing.T, mkdirs ...string) string {
	t.Helper()
	needRoot(t)
	base := t.TempDir()
	mnt := filepath.Join(base, "mnt")
	obstacles.FullExt4(t, base, mnt, append([]string{"ws"}, mkdirs...)...)
	return filepath.Join(mnt, "ws")
}

// opID is an operation id as long as the kernel's (a UUID), so that a
// staging name is as long as the kernel's.
func opID(i int) string { return fmt.Sprintf("01a21e5e-5bb3-7000-8000-%012d", i) }

// stageOne stages op of rel under root in a new Stage of operation id
// and returns its effects.
func stageOne(t *testing.T, root *os.Root, dir, id, op, rel string) ([]Effect, error) {
	t.Helper()
	sy := NewSyncer()
	t.Cleanup(sy.Close)
	s := NewStage(id, nil, sy)
	r := &syscalls.Resource{Root: root, RootPath: dir, Rel: rel}
	var err error
	switch op {
	case "write":
		err = s.WriteFile(r, nil, 0)
	case "delete":
		err = s.Delete(r)
	}
	if err != nil {
		s.Discard()
		return nil, err
	}
	return s.Effects(), nil
}

// TestFullFileSystemNewNames: on a full ext4 file system, a write of a
// new (empty) file is refused at staging, before the commit, with a
// *NotApplicableError naming ENOSPC; no staged write fails at Apply.
// Before, staging took the (long) staging entry in the directory's free
// room and, once that room held it but not the target's entry as well,
// the rename after the commit failed with ENOSPC (rev10-disk #2: the
// kernel failed stop, and every restart too).
func TestFullFileSystemNewNames(t *testing.T) {
	ws := fullWorkspace(t)
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	open := func(string) (*os.Root, error) { return root, nil }
	for i := range 300 {
		rel := fmt.Sprintf("e%d", i)
		effects, err := stageOne(t, root, ws, opID(i), "write", rel)
		if err != nil {
			var na *NotApplicableError
			if !errors.As(err, &na) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("stage %s: %v, want a NotApplicableError of ENOSPC", rel, err)
			}
			if left, _ := os.ReadDir(ws); len(left) != i {
				t.Errorf("%d entries after the refusal, want the %d files written", len(left), i)
			}
			return
		}
		if err := Apply(effects, open); err != nil {
			t.Fatalf("apply of write %d, after its staging succeeded: %v", i, err)
		}
	}
	t.Fatal("no write was refused on a full file system")
}

// TestFullFileSystemDelete: on a full ext4 file system whose directory
// can take no more entries, a file, a link and a directory tree are
// deleted by Apply, and a write over an existing file applies. Before,
// Apply moved a deleted entry aside under a new trash name first, and the
// rename failed with ENOSPC after the commit.
func TestFullFileSystemDelete(t *testing.T) {
	ws := fullWorkspace(t, "ws/d/e")
	for _, f := range []string{"f", "d/x", "d/e/y"} {
		if err := os.WriteFile(filepath.Join(ws, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("f", filepath.Join(ws, "l")); err != nil {
		t.Fatal(err)
	}
	// Fill the directory's room with names until it refuses one.
	n := 0
	for ; ; n++ {
		err := os.WriteFile(filepath.Join(ws, fmt.Sprintf("t%d", n)), nil, 0o644)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	open := func(string) (*os.Root, error) { return root, nil }
	for i, rel := range []string{"t5", "l", "d"} {
		effects, err := stageOne(t, root, ws, opID(i), "delete", rel)
		if err != nil {
			t.Fatalf("stage delete %s: %v", rel, err)
		}
		if err := Apply(effects, open); err != nil {
			t.Fatalf("apply delete %s (directory full after %d names): %v", rel, n, err)
		}
		if exists(ws, rel) {
			t.Errorf("%s is still there", rel)
		}
	}
	if !exists(ws, "f") {
		t.Error("f, the link's target, is gone")
	}
	if left, _ := stagingLeft(open, ws); len(left) != 0 {
		t.Errorf("staging left: %v", left)
	}
}

// TestRedoNoRoomIsRefused: a staged write whose rename the file system
// refuses for want of room for the new entry (ENOSPC: a file system
// filled between the staging and the apply) is a refusal: Apply's error
// is Refused (the kernel's fail stop says the next start reports it),
// and Redo reports it as a ConflictRefused naming ENOSPC, removes the
// staging file, and returns no error, so that the start goes on. Before,
// Redo failed on it, and every start with it.
func TestRedoNoRoomIsRefused(t *testing.T) {
	ws := fullWorkspace(t)
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	open := func(string) (*os.Root, error) { return root, nil }
	// Staging files made by hand, as a build without checkRoom staged
	// them: the directory's room shrinks by one short entry a round, so
	// a round comes where the staging entry fits but the target's does
	// not as well.
	for i := range 300 {
		id := opID(i)
		e := Effect{Op: OpWrite, Root: ws, Path: fmt.Sprintf("e%d", i), Stage: StagePrefix + id + "-0", NewHash: digest.Sum(nil)}
		if err := os.WriteFile(filepath.Join(ws, e.Stage), nil, 0o644); err != nil {
			t.Fatalf("no round refused the rename alone (round %d): %v", i, err)
		}
		err := Apply([]Effect{e}, open)
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ENOSPC) || !Refused(err) {
			t.Fatalf("apply: %v (Refused %v), want a refused ENOSPC", err, Refused(err))
		}
		conflicts, err := Redo(id, []Effect{e}, open)
		if err != nil {
			t.Fatalf("redo: %v, want the effect reported", err)
		}
		if len(conflicts) == 0 && exists(ws, e.Path) && !exists(ws, e.Stage) {
			// ext4 returns freed blocks to its allocator when its
			// journal commits, which may come between Apply and Redo:
			// the redo's rename then found room. Another round.
			continue
		}
		if len(conflicts) != 1 || conflicts[0].Reason != ConflictRefused || conflicts[0].Path != e.Path ||
			!strings.Contains(conflicts[0].Error, syscall.ENOSPC.Error()) {
			t.Fatalf("conflicts %+v, want one apply_refused of %s naming ENOSPC", conflicts, e.Path)
		}
		if exists(ws, e.Stage) || exists(ws, e.Path) {
			t.Errorf("after redo: staging file there %v, target there %v; want neither", exists(ws, e.Stage), exists(ws, e.Path))
		}
		return
	}
	t.Fatal("no rename was refused by both Apply and Redo")
}

// TestFullFileSystemMkdir: on a full ext4 file system a mkdir, which
// needs a block for the directory it makes, is refused at staging with a
// *NotApplicableError naming ENOSPC; an unchecked mkdir that the file
// system refuses at Apply is a lasting refusal (Refused). Before, the
// mkdir was staged and its apply failed after the commit.
func TestFullFileSystemMkdir(t *testing.T) {
	ws := fullWorkspace(t)
	s := newStager(t, ws)
	err := s.do("mkdir", "n", "")
	var na *NotApplicableError
	if !errors.As(err, &na) || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("stage mkdir: %v, want a NotApplicableError of ENOSPC", err)
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// Unchecked mkdirs until the file system refuses one: the blocks
	// staging's check allocated and freed may come back to ext4's
	// allocator when its journal commits, so the first may pass.
	for i := range 1000 {
		err = Apply([]Effect{{Op: OpMkdir, Root: ws, Path: fmt.Sprint("n", i), Mode: 0o755}}, func(string) (*os.Root, error) { return root, nil })
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ENOSPC) || !Refused(err) {
			t.Errorf("apply mkdir: %v (Refused %v), want a refused ENOSPC", err, Refused(err))
		}
		return
	}
	t.Fatal("1000 mkdirs on a full file system, none refused")
}

// TestRoomForRootReserve: on an ext4 file system with no blocks left for
// unprivileged users (statfs f_bavail 0) but root's reserved blocks free,
// a root kernel's write of a new name is staged and applied: checkRoom
// asks the file system rather than refusing on statfs alone.
func TestRoomForRootReserve(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	mnt := filepath.Join(base, "mnt")
	obstacles.Ext4(t, base, mnt)
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 16<<10)
	for {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		if st.Bavail == 0 {
			break
		}
		if _, err := f.Write(chunk[:min(int64(len(chunk)), int64(st.Bavail)*st.Bsize)]); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	effects, err := stageOne(t, root, mnt, opID(0), "write", "n")
	if err != nil {
		t.Fatalf("stage a new name with root's reserve free: %v", err)
	}
	if err := Apply(effects, func(string) (*os.Root, error) { return root, nil }); err != nil {
		t.Fatal(err)
	}
	if !exists(mnt, "n") {
		t.Error("n was not written")
	}
}
