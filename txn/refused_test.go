package txn

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/internal/obstacles"
	"github.com/capkernel/capkernel/syscalls"
)

// stager stages into the workspace dir: a Stage of operation "op" over
// an opened root, closed when the test ends.
type stager struct {
	t     testing.TB
	dir   string
	root  *os.Root
	stage *Stage
}

func newStager(t testing.TB, dir string) *stager {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	s := NewSyncer()
	t.Cleanup(s.Close)
	return &stager{t: t, dir: dir, root: root, stage: NewStage("op", nil, s)}
}

func (s *stager) res(rel string) *syscalls.Resource {
	return &syscalls.Resource{Root: s.root, RootPath: s.dir, Rel: rel}
}

// do stages op ("write", "writefrom", "mkdir", "delete") of rel.
func (s *stager) do(op, rel, content string) error {
	switch op {
	case "write":
		return s.stage.WriteFile(s.res(rel), []byte(content), 0)
	case "writefrom":
		_, err := s.stage.WriteFrom(s.res(rel), strings.NewReader(content), 0o644)
		return err
	case "mkdir":
		return s.stage.Mkdir(s.res(rel), 0o555)
	case "delete":
		return s.stage.Delete(s.res(rel))
	}
	s.t.Fatalf("unknown op %s", op)
	return nil
}

func (s *stager) must(op, rel, content string) {
	s.t.Helper()
	if err := s.do(op, rel, content); err != nil {
		s.t.Fatalf("stage %s %s: %v", op, rel, err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and chattr")
	}
}

// exists reports whether rel is under dir, following no link.
func exists(dir, rel string) bool {
	_, err := os.Lstat(filepath.Join(dir, rel))
	return err == nil
}

// findUnder reports whether a file named name is anywhere under dir.
func findUnder(dir, name string) bool {
	found := false
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		found = found || err == nil && d.Name() == name
		return nil
	})
	return found
}

// refusedCases are committed effects that the file system refuses for
// good once an obstacle appears after their staging: each stages its
// steps and then a write of "g", sets the obstacle up, and names the
// refused path and errno.
var refusedCases = []struct {
	name   string
	before map[string]string
	steps  []treeStep
	block  func(t *testing.T, ws string)
	path   string
	errno  syscall.Errno
	keep   string // a file the obstacle holds, that must survive
}{
	{name: "write over an immutable file", before: map[string]string{"f": "old"},
		steps: []treeStep{{"write", "f", "new"}},
		block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "f")) },
		path:  "f", errno: syscall.EPERM},
	{name: "write over a bind-mounted file", before: map[string]string{"f": "old"},
		steps: []treeStep{{"write", "f", "new"}},
		block: func(t *testing.T, ws string) {
			// The pre-image, so that the write is attempted.
			src := filepath.Join(t.TempDir(), "src")
			os.WriteFile(src, []byte("old"), 0o644)
			obstacles.Bind(t, ws, src, filepath.Join(ws, "f"), false)
		},
		path: "f", errno: syscall.EBUSY},
	{name: "delete under a read-only mount", before: map[string]string{"ro": "/", "ro/x": "x"},
		steps: []treeStep{{"delete", "ro/x", ""}},
		block: func(t *testing.T, ws string) { obstacles.ReadOnly(t, ws, filepath.Join(ws, "ro")) },
		path:  "ro/x", errno: syscall.EROFS, keep: "x"},
	{name: "delete of a mount point", before: map[string]string{"mnt": "/"},
		steps: []treeStep{{"delete", "mnt", ""}},
		block: func(t *testing.T, ws string) {
			obstacles.Tmpfs(t, ws, filepath.Join(ws, "mnt"))
			os.WriteFile(filepath.Join(ws, "mnt/keep.txt"), []byte("k"), 0o644)
		},
		path: "mnt", errno: syscall.EBUSY, keep: "keep.txt"},
	{name: "delete of a directory holding a mount", before: map[string]string{"d": "/", "d/x": "x", "d/mnt": "/"},
		steps: []treeStep{{"delete", "d", ""}},
		block: func(t *testing.T, ws string) {
			obstacles.Tmpfs(t, ws, filepath.Join(ws, "d/mnt"))
			os.WriteFile(filepath.Join(ws, "d/mnt/keep.txt"), []byte("k"), 0o644)
		},
		path: "d", errno: syscall.EBUSY, keep: "keep.txt"},
	{name: "delete of a directory holding an immutable file", before: map[string]string{"d": "/", "d/x": "x"},
		steps: []treeStep{{"delete", "d", ""}},
		block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "d/x")) },
		path:  "d", errno: syscall.EPERM, keep: "x"},
	{name: "proc.exec write under a mount", before: map[string]string{"mnt": "/"},
		steps: []treeStep{{"writefrom", "mnt/new", "new"}},
		block: func(t *testing.T, ws string) { obstacles.Tmpfs(t, ws, filepath.Join(ws, "mnt")) },
		path:  "mnt/new", errno: syscall.EXDEV},
}

// TestRedoRefused: an effect committed and then refused by the file
// system for good (an obstacle set up after its staging: a mount, a
// read-only mount, chattr +i) is reported by Redo as an apply_refused
// conflict naming the errno, the intent's other effects still apply,
// what the obstacle holds is kept, and Redo returns no error, so
// recovery is never blocked. Before, Redo returned the error and Recover
// failed on every start.
func TestRedoRefused(t *testing.T) {
	needRoot(t)
	for _, tc := range refusedCases {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			plant(t, ws, tc.before)
			s := newStager(t, ws)
			for _, st := range tc.steps {
				s.must(st.op, st.rel, st.content)
			}
			s.must("write", "g", "g")
			effects := s.stage.Effects()
			tc.block(t, ws)
			open, closeAll := OpenRoots()
			defer closeAll()
			conflicts, err := Redo("op", effects, open)
			if err != nil {
				t.Fatalf("Redo: %v, want no error (a refused effect is a conflict)", err)
			}
			if len(conflicts) != 1 || conflicts[0].Reason != ConflictRefused || conflicts[0].Path != tc.path ||
				!strings.Contains(conflicts[0].Error, tc.errno.Error()) {
				t.Errorf("conflicts %+v, want one %s of %s with %q", conflicts, ConflictRefused, tc.path, tc.errno.Error())
			}
			if got, _ := os.ReadFile(filepath.Join(ws, "g")); string(got) != "g" {
				t.Errorf("g = %q: the intent's other effect was not applied", got)
			}
			if tc.keep != "" && !findUnder(ws, tc.keep) {
				t.Errorf("%s, held by the obstacle, was removed", tc.keep)
			}
			// Once more, as a second recovery would: no error.
			if _, err := Redo("op", effects, open); err != nil {
				t.Errorf("second Redo: %v", err)
			}
		})
	}
}

// TestRecoverRefused: a decided intent whose write the file system
// refuses for good (chattr +i on its target after the commit) no longer
// blocks Recover: the intent is finished with an apply_refused conflict
// naming the path and errno, its other write lands, and the workspace
// check names the refused file.
func TestRecoverRefused(t *testing.T) {
	needRoot(t)
	e := newEnv(t)
	e.write("f", "old")
	p := newPrepare("op", "key")
	p.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "."}}
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	s := newStager(t, e.ws)
	s.must("write", "f", "new")
	s.must("write", "g", "g")
	effects := s.stage.Effects()
	e.commit(&p.Intent, effects, `{}`)
	obstacles.Chattr(t, e.ws, "+i", filepath.Join(e.ws, "f"))
	rec, err := Recover(context.Background(), e.db, func(*bbolt.Tx, *Intent) error { return nil })
	if err != nil {
		t.Fatalf("Recover: %v, want the refused write reported as a conflict", err)
	}
	if len(rec.Redone) != 1 || len(rec.Conflicts) != 1 {
		t.Fatalf("recovered %+v, want one intent redone with one conflict", rec)
	}
	c := rec.Conflicts[0]
	if c.Reason != ConflictRefused || c.Op != OpWrite || c.Path != "f" || c.Want != effects[0].NewHash ||
		!strings.Contains(c.Error, "operation not permitted") {
		t.Errorf("conflict %+v", c)
	}
	if e.read("f") != "old" || e.read("g") != "g" {
		t.Errorf("f = %q, g = %q, want old and g", e.read("f"), e.read("g"))
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	if left, _ := stagingLeft(open, e.ws); len(left) != 0 {
		t.Errorf("staging left: %v", left)
	}
	e.view(func(tx *bbolt.Tx) error {
		if ins, _ := Intents(tx); len(ins) != 0 {
			t.Errorf("intents left: %+v", ins)
		}
		rep, err := VerifyWorkspace(tx, open)
		if err != nil || len(rep.Problems) != 1 || rep.Problems[0].Path != "f" {
			t.Errorf("workspace check %+v, %v: want the refused f named", rep, err)
		}
		return nil
	})
}

// TestRecoverLeavesUnremovableStaging: a staging file the file system
// refuses to remove (its directory made read-only after the staging) is
// left and reported, not an error of Recover, for a rolled-back intent.
func TestRecoverLeavesUnremovableStaging(t *testing.T) {
	needRoot(t)
	e := newEnv(t)
	os.Mkdir(filepath.Join(e.ws, "d"), 0o755)
	p := newPrepare("op-m", "key-m")
	p.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "d"}}
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	e.write("d/"+StagePrefix+"op-m-0", "staged")
	obstacles.ReadOnly(t, e.ws, filepath.Join(e.ws, "d"))
	rec, err := Recover(context.Background(), e.db, func(*bbolt.Tx, *Intent) error { return nil })
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(rec.RolledBack) != 1 || len(rec.Conflicts) != 1 || rec.Conflicts[0].Op != OpCleanup ||
		rec.Conflicts[0].Path != "d/"+StagePrefix+"op-m-0" || !strings.Contains(rec.Conflicts[0].Error, "read-only") {
		t.Errorf("recovered %+v", rec)
	}
}

// TestApplyDeleteOneFileSystem: a delete whose tree holds a mount made
// after the staging removes what is on its own file system and nothing
// on the mounted one, leaving the directories that lead to it, and says
// so (EBUSY), as rm --one-file-system. Before, RemoveAll emptied the
// mounted file system.
func TestApplyDeleteOneFileSystem(t *testing.T) {
	needRoot(t)
	ws := t.TempDir()
	plant(t, ws, map[string]string{"d": "/", "d/x": "x", "d/e": "/", "d/e/mnt": "/"})
	s := newStager(t, ws)
	s.must("delete", "d", "")
	effects := s.stage.Effects()
	obstacles.Tmpfs(t, ws, filepath.Join(ws, "d/e/mnt"))
	os.WriteFile(filepath.Join(ws, "d/e/mnt/keep.txt"), []byte("k"), 0o644)
	open, closeAll := OpenRoots()
	defer closeAll()
	err := Apply(effects, open)
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "mount point") {
		t.Errorf("Apply: %v, want EBUSY naming the mount point", err)
	}
	if !findUnder(ws, "keep.txt") {
		t.Errorf("keep.txt, on the mounted file system, was removed")
	}
	if got, want := tree(t, ws), map[string]string{"d": "/", "d/e": "/", "d/e/mnt": "/", "d/e/mnt/keep.txt": "k"}; !maps.Equal(got, want) {
		t.Errorf("tree %v, want %v", got, want)
	}
}

// TestStageRefuses: what Apply could not do after the commit is refused
// at staging (a root kernel: mounts, read-only mounts, chattr flags),
// with a NotApplicableError naming the path and carrying the errno; the
// refused effect is not staged.
func TestStageRefuses(t *testing.T) {
	needRoot(t)
	cases := []struct {
		name    string
		before  map[string]string
		block   func(t *testing.T, ws string)
		earlier []treeStep // staged before, allowed
		op, rel string
		errno   syscall.Errno
	}{
		{name: "write of a bind-mounted file", before: map[string]string{"app.env": "A=1"},
			block: func(t *testing.T, ws string) {
				src := filepath.Join(t.TempDir(), "src")
				os.WriteFile(src, []byte("A=1"), 0o644)
				obstacles.Bind(t, ws, src, filepath.Join(ws, "app.env"), false)
			}, op: "write", rel: "app.env", errno: syscall.EBUSY},
		{name: "write of an immutable file", before: map[string]string{"f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "f")) },
			op:    "write", rel: "f", errno: syscall.EPERM},
		{name: "write of an append-only file", before: map[string]string{"f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+a", filepath.Join(ws, "f")) },
			op:    "write", rel: "f", errno: syscall.EPERM},
		{name: "write in an append-only directory", before: map[string]string{"d": "/", "d/f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+a", filepath.Join(ws, "d")) },
			op:    "write", rel: "d/f", errno: syscall.EPERM},
		{name: "delete under a read-only mount", before: map[string]string{"config": "/", "config/x.txt": "x"},
			block: func(t *testing.T, ws string) { obstacles.ReadOnly(t, ws, filepath.Join(ws, "config")) },
			op:    "delete", rel: "config/x.txt", errno: syscall.EROFS},
		{name: "delete of a mount point", before: map[string]string{},
			block: func(t *testing.T, ws string) { obstacles.Tmpfs(t, ws, filepath.Join(ws, "mnt")) },
			op:    "delete", rel: "mnt", errno: syscall.EBUSY},
		{name: "delete of a directory holding a mount", before: map[string]string{"d": "/", "d/x": "x"},
			block: func(t *testing.T, ws string) { obstacles.Tmpfs(t, ws, filepath.Join(ws, "d/e/mnt")) },
			op:    "delete", rel: "d", errno: syscall.EBUSY},
		{name: "delete of an immutable file", before: map[string]string{"f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "f")) },
			op:    "delete", rel: "f", errno: syscall.EPERM},
		{name: "delete of a directory holding an immutable file", before: map[string]string{"d": "/", "d/e": "/", "d/e/f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "d/e/f")) },
			op:    "delete", rel: "d", errno: syscall.EPERM},
		{name: "delete in an immutable directory", before: map[string]string{"d": "/", "d/f": "x"},
			block: func(t *testing.T, ws string) { obstacles.Chattr(t, ws, "+i", filepath.Join(ws, "d")) },
			op:    "delete", rel: "d/f", errno: syscall.EPERM},
		{name: "proc.exec write under a mount", before: map[string]string{},
			block: func(t *testing.T, ws string) { obstacles.Tmpfs(t, ws, filepath.Join(ws, "mnt")) },
			op:    "writefrom", rel: "mnt/new.txt", errno: syscall.EXDEV},
		{name: "proc.exec write in a new directory under a mount", before: map[string]string{},
			block:   func(t *testing.T, ws string) { obstacles.Tmpfs(t, ws, filepath.Join(ws, "mnt")) },
			earlier: []treeStep{{"mkdir", "mnt/sub", ""}},
			op:      "writefrom", rel: "mnt/sub/new.txt", errno: syscall.EXDEV},
		{name: "proc.exec write of a bind-mounted file", before: map[string]string{"app.env": "A=1"},
			block: func(t *testing.T, ws string) {
				src := filepath.Join(t.TempDir(), "src")
				os.WriteFile(src, []byte("A=1"), 0o644)
				obstacles.Bind(t, ws, src, filepath.Join(ws, "app.env"), false)
			}, op: "writefrom", rel: "app.env", errno: syscall.EBUSY},
		{name: "proc.exec mkdir under a read-only mount", before: map[string]string{"ro": "/"},
			block: func(t *testing.T, ws string) { obstacles.ReadOnly(t, ws, filepath.Join(ws, "ro")) },
			op:    "mkdir", rel: "ro/d", errno: syscall.EROFS},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			plant(t, ws, tc.before)
			tc.block(t, ws)
			s := newStager(t, ws)
			for _, st := range tc.earlier {
				s.must(st.op, st.rel, st.content)
			}
			n := len(s.stage.Touched())
			err := s.do(tc.op, tc.rel, "new")
			var na *NotApplicableError
			if !errors.As(err, &na) || !errors.Is(err, tc.errno) || !strings.Contains(err.Error(), "refused before the commit") {
				t.Fatalf("stage %s %s: %v, want a NotApplicableError with %v", tc.op, tc.rel, err, tc.errno)
			}
			if got := len(s.stage.Touched()); got != n {
				t.Errorf("%d effects after the refusal, want %d", got, n)
			}
		})
	}
}

// TestStageRefusesAsNobody: for a kernel that is not root, staging
// refuses what the kernel's user could not apply: a delete in a
// directory it cannot write, or of a tree holding one, another user's
// file in a sticky directory, a proc.exec file or directory in a
// directory it cannot write. What it can apply is staged.
func TestStageRefusesAsNobody(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(t *testing.T, dir string) // as root
		op, rel string
		errno   syscall.Errno // 0: staged
	}{
		{name: "delete in a read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"ro": "/", "ro/f.txt": "x"}, 0o555)
		}, op: "delete", rel: "ro/f.txt", errno: syscall.EACCES},
		{name: "delete of a tree holding a read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"d": "/", "d/ro": "/", "d/ro/f.txt": "x"}, 0o755)
			os.Chmod(filepath.Join(dir, "d/ro"), 0o555)
		}, op: "delete", rel: "d", errno: syscall.EACCES},
		{name: "delete of an empty read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"e": "/"}, 0o555)
		}, op: "delete", rel: "e"},
		{name: "delete of a tree holding an empty read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"t": "/", "t/e": "/"}, 0o755)
			os.Chmod(filepath.Join(dir, "t/e"), 0o555)
		}, op: "delete", rel: "t"},
		{name: "write over another user's file in a sticky directory", setup: sticky,
			op: "write", rel: "shared/other.txt", errno: syscall.EPERM},
		{name: "delete of another user's file in a sticky directory", setup: sticky,
			op: "delete", rel: "shared/other.txt", errno: syscall.EPERM},
		{name: "write of one's own file in a sticky directory", setup: sticky,
			op: "write", rel: "shared/mine.txt"},
		{name: "proc.exec write in a read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"ro": "/"}, 0o555)
		}, op: "writefrom", rel: "ro/new.txt", errno: syscall.EACCES},
		{name: "proc.exec mkdir in a read-only directory", setup: func(t *testing.T, dir string) {
			plantAs(t, dir, map[string]string{"ro": "/"}, 0o555)
		}, op: "mkdir", rel: "ro/d", errno: syscall.EACCES},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, ok := obstacles.Nobody(t, func(dir string) { tc.setup(t, dir) })
			if !ok {
				return
			}
			s := newStager(t, dir)
			err := s.do(tc.op, tc.rel, "new")
			if tc.errno == 0 {
				if err != nil {
					t.Fatalf("stage %s %s: %v", tc.op, tc.rel, err)
				}
				return
			}
			var na *NotApplicableError
			if !errors.As(err, &na) || !errors.Is(err, tc.errno) {
				t.Fatalf("stage %s %s: %v, want a NotApplicableError with %v", tc.op, tc.rel, err, tc.errno)
			}
		})
	}
}

// plantAs plants want under dir, owned by nobody, directories with mode
// dirMode (made writable while planting).
func plantAs(t *testing.T, dir string, want map[string]string, dirMode fs.FileMode) {
	t.Helper()
	plant(t, dir, want)
	for _, rel := range sortedKeys(want) {
		p := filepath.Join(dir, rel)
		if err := os.Lchown(p, obstacles.UID, obstacles.GID); err != nil {
			t.Fatal(err)
		}
	}
	for _, rel := range sortedKeys(want) {
		if want[rel] == "/" {
			os.Chmod(filepath.Join(dir, rel), dirMode)
		}
	}
}

// sticky makes shared, a sticky directory of root's writable by all,
// holding other.txt, root's, writable by all.
func sticky(t *testing.T, dir string) {
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shared, "other.txt"), []byte("root's"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(shared, "other.txt"), 0o666)
}

// TestApplyReadOnlyNewDir: a delta that makes a directory, puts files in
// it and makes it read-only (proc.exec `mkdir d && echo x > d/f && chmod
// 555 d`) applies for a kernel that is not root, by Apply and by Redo
// after a crash at any point of it, and leaves the directory read-only.
// Before, Apply made d 0555 at once and could not rename d/f into it.
func TestApplyReadOnlyNewDir(t *testing.T) {
	dir, ok := obstacles.Nobody(t, nil)
	if !ok {
		return
	}
	steps := []treeStep{{"mkdir", "d", ""}, {"mkdir", "d/e", ""}, {"writefrom", "d/f", "x"}, {"writefrom", "d/e/g", "y"}}
	want := map[string]string{"d": "/", "d/e": "/", "d/f": "x", "d/e/g": "y"}
	stageIn := func(t *testing.T) (string, []Effect) {
		ws, err := os.MkdirTemp(dir, "ws-")
		if err != nil {
			t.Fatal(err)
		}
		s := newStager(t, ws)
		for _, st := range steps {
			s.must(st.op, st.rel, st.content)
		}
		return ws, s.stage.Effects()
	}
	check := func(t *testing.T, ws, what string) {
		t.Helper()
		if got := tree(t, ws); len(got) != len(want) || got["d/f"] != "x" || got["d/e/g"] != "y" {
			t.Errorf("%s: tree %v, want %v", what, got, want)
		}
		for _, d := range []string{"d", "d/e"} {
			if fi, err := os.Stat(filepath.Join(ws, d)); err != nil || fi.Mode().Perm() != 0o555 {
				t.Errorf("%s: %s mode %v, %v; want 0555", what, d, fi.Mode(), err)
			}
		}
	}
	ws, effects := stageIn(t)
	open, closeAll := OpenRoots()
	defer closeAll()
	if err := Apply(effects, open); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	check(t, ws, "Apply")
	for crash := 0; crash <= len(effects); crash++ {
		ws, effects := stageIn(t)
		r, err := open(ws)
		if err != nil {
			t.Fatal(err)
		}
		later := laterWrites(effects)
		for i := range crash {
			if err := applyEffect(r, effects, i, later); err != nil {
				t.Fatal(err)
			}
		}
		for pass := range 2 {
			conflicts, err := Redo("op", effects, open)
			if err != nil || len(conflicts) != 0 {
				t.Errorf("Redo after %d effects, pass %d: %v, conflicts %+v", crash, pass+1, err, conflicts)
			}
			check(t, ws, "Redo")
		}
	}
}

// TestRedoWriteWithoutItsDirectory: a decided write whose directory is
// no longer one at redo (a file stands where its mkdir was to make it) is
// reported as refused, naming the path, not taken for a write renamed
// already and dropped with its staged content unreported.
func TestRedoWriteWithoutItsDirectory(t *testing.T) {
	ws := t.TempDir()
	s := newStager(t, ws)
	s.must("mkdir", "d", "")
	s.must("writefrom", "d/f", "x")
	s.must("write", "g", "g")
	effects := s.stage.Effects()
	if err := os.WriteFile(filepath.Join(ws, "d"), []byte("in the way"), 0o644); err != nil {
		t.Fatal(err)
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	conflicts, err := Redo("op", effects, open)
	if err != nil {
		t.Fatalf("Redo: %v", err)
	}
	if len(conflicts) != 1 || conflicts[0].Reason != ConflictRefused || conflicts[0].Path != "d/f" || !strings.Contains(conflicts[0].Error, "not a directory") {
		t.Fatalf("conflicts %+v, want d/f refused: not a directory", conflicts)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "g")); string(got) != "g" {
		t.Errorf("g = %q: the intent's other write was not applied", got)
	}
}

// TestRedoUnderLinkOut: decided effects whose directory was replaced by
// a symbolic link leading out of the root after the commit (a write, a
// mkdir under it) are reported as refused, naming the escape, and do not
// block the intent's other effects or a second recovery: os.Root refuses
// the path, with an error recovery takes for lasting. (A link within the
// root is followed, as the live apply follows one: the kernel stages
// paths as spelled, links among their directories included.)
func TestRedoUnderLinkOut(t *testing.T) {
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := newStager(t, ws)
	s.must("mkdir", "d", "")
	s.must("writefrom", "d/f", "x")
	s.must("mkdir", "p/new", "")
	s.must("write", "g", "g")
	effects := s.stage.Effects()
	out := t.TempDir()
	for _, dir := range []string{"d", "p"} {
		os.RemoveAll(filepath.Join(ws, dir))
		if err := os.Symlink(out, filepath.Join(ws, dir)); err != nil {
			t.Fatal(err)
		}
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	for range 2 {
		conflicts, err := Redo("op", effects, open)
		if err != nil {
			t.Fatalf("Redo: %v, want the escaping effects reported", err)
		}
		var paths []string
		for _, c := range conflicts {
			if c.Reason == ConflictRefused && strings.Contains(c.Error, escapes) {
				paths = append(paths, c.Path)
			}
		}
		if !slices.Contains(paths, "d/f") || !slices.Contains(paths, "p/new") {
			t.Fatalf("conflicts %+v, want d/f and p/new refused as escaping the root", conflicts)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Fatalf("the effects followed the link out of the root: %v", entries)
		}
		if got, _ := os.ReadFile(filepath.Join(ws, "g")); string(got) != "g" {
			t.Fatalf("g = %q: the intent's other write was not applied", got)
		}
	}
}

// TestRedoThroughExistingLink: a write staged through a link that was
// there at staging (d → sub, path d/f as the agent spelled it) is redone
// through it, landing in sub/f as the live apply would.
func TestRedoThroughExistingLink(t *testing.T) {
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	s := newStager(t, ws)
	s.must("write", "d/f", "x")
	open, closeAll := OpenRoots()
	defer closeAll()
	conflicts, err := Redo("op", s.stage.Effects(), open)
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("Redo: %v %+v, want the write applied through the link", err, conflicts)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "sub", "f")); string(got) != "x" {
		t.Fatalf("sub/f = %q", got)
	}
}
