package txn

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// spareEnv is a workspace root and a spare pool beside it, on one file
// system.
type spareEnv struct {
	*env
	root   *os.Root
	spares *Spares
	n      int
}

func newSpareEnv(t *testing.T) *spareEnv {
	e := newEnv(t)
	root, err := os.OpenRoot(e.ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	sp, err := OpenSpares(filepath.Join(filepath.Dir(e.ws), "spares"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return &spareEnv{env: e, root: root, spares: sp}
}

// write stages content for rel, applies it through the pool and releases
// the replaced inode as durable (or not); it returns the inode of the
// staging file, which is rel's inode afterwards.
func (e *spareEnv) write(rel, content string, durable bool) uint64 {
	e.t.Helper()
	e.n++
	s := NewStage("op"+string(rune('a'+e.n)), KV{View: e.db.View}, e.spares)
	if err := s.WriteFile(&syscalls.Resource{Root: e.root, RootPath: e.ws, Rel: rel}, []byte(content), 0); err != nil {
		e.t.Fatal(err)
	}
	effects := s.Effects()
	ino := inode(e.t, filepath.Join(e.ws, effects[0].Stage))
	ret, err := e.spares.Apply(effects, s.Root)
	if err != nil {
		e.t.Fatal(err)
	}
	e.spares.Release(ret, durable)
	return ino
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func (e *spareEnv) poolSize() int {
	e.t.Helper()
	names, err := os.ReadDir(e.spares.dir.Name())
	if err != nil {
		e.t.Fatal(err)
	}
	return len(names)
}

// TestSparesReuse: the inode a write replaces stages a later write once
// the replacement is durable, empty, with the new mode; an inode that
// anything else can still reach — another link, an open descriptor — or
// whose replacement is not known durable is never reused, and its content
// stays as the other holder sees it.
func TestSparesReuse(t *testing.T) {
	cases := []struct {
		name    string
		hold    func(e *spareEnv) func() string // keeps a reference to a.txt's inode; returns what it reads
		durable bool
		reused  bool
	}{
		{name: "sole inode, durable: reused", durable: true, reused: true},
		{name: "not durable: removed", durable: false},
		{name: "hard link elsewhere: kept", durable: true, hold: func(e *spareEnv) func() string {
			if err := os.Link(filepath.Join(e.ws, "a.txt"), filepath.Join(e.ws, "link.txt")); err != nil {
				e.t.Fatal(err)
			}
			return func() string { return e.read("link.txt") }
		}},
		{name: "open elsewhere: kept", durable: true, hold: func(e *spareEnv) func() string {
			f, err := os.Open(filepath.Join(e.ws, "a.txt"))
			if err != nil {
				e.t.Fatal(err)
			}
			e.t.Cleanup(func() { f.Close() })
			return func() string {
				b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
				if err != nil {
					e.t.Fatal(err)
				}
				return string(b)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newSpareEnv(t)
			e.env.write("a.txt", "old content of a")
			old := inode(t, filepath.Join(e.ws, "a.txt"))
			var held func() string
			if tc.hold != nil {
				held = tc.hold(e)
			}
			e.write("a.txt", "new a", tc.durable)
			if got := e.read("a.txt"); got != "new a" {
				t.Fatalf("a.txt = %q", got)
			}
			want := 0
			if tc.reused {
				want = 1
			}
			if e.spares.Free() != want || e.poolSize() != want {
				t.Fatalf("free %d, pool holds %d, want %d", e.spares.Free(), e.poolSize(), want)
			}
			ino := e.write("b.txt", "b", true)
			// A freed inode's number may be given to a new file, so a
			// match proves reuse only while the old inode lives on.
			if (ino == old) != tc.reused && (tc.reused || held != nil) {
				t.Fatalf("b.txt staged on inode %d, a.txt's old inode %d: reused %v, want %v", ino, old, ino == old, tc.reused)
			}
			if got := e.read("b.txt"); got != "b" {
				t.Fatalf("b.txt = %q", got)
			}
			if fi, err := os.Stat(filepath.Join(e.ws, "b.txt")); err != nil || fi.Mode().Perm() != 0o644 {
				t.Fatalf("b.txt: %v %v, want mode 0644", fi, err)
			}
			if held != nil {
				if got := held(); got != "old content of a" {
					t.Fatalf("the other holder of a.txt's old inode reads %q", got)
				}
			}
			open, closeAll := OpenRoots()
			defer closeAll()
			if left, _ := stagingLeft(open, e.ws); len(left) != 0 {
				t.Fatalf("staging files left: %v", left)
			}
		})
	}
}

// TestSparesApplyAgain: applying effects again after their renames are
// done (the kernel retries Apply, recovery redoes it) retires nothing: the
// inode a target holds then is its new content, which must never become a
// spare.
func TestSparesApplyAgain(t *testing.T) {
	e := newSpareEnv(t)
	e.env.write("a.txt", "old")
	s := NewStage("op-1", KV{View: e.db.View}, e.spares)
	if err := s.WriteFile(&syscalls.Resource{Root: e.root, RootPath: e.ws, Rel: "a.txt"}, []byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	effects := s.Effects()
	first, err := e.spares.Apply(effects, s.Root)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.spares.Apply(effects, s.Root)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.files) != 0 {
		t.Fatalf("the second apply retired %d inodes, want 0", len(again.files))
	}
	e.spares.Release(first, true)
	e.spares.Release(again, true)
	if e.spares.Free() != 1 || e.poolSize() != 1 {
		t.Fatalf("free %d, pool %d, want 1", e.spares.Free(), e.poolSize())
	}
	e.write("b.txt", "b", true)
	e.write("c.txt", "c", true)
	if a, b, c := e.read("a.txt"), e.read("b.txt"), e.read("c.txt"); a != "new" || b != "b" || c != "c" {
		t.Fatalf("a, b, c = %q %q %q", a, b, c)
	}
}

// TestSparesOpenEmpties: a pool left by an earlier process is emptied.
func TestSparesOpenEmpties(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spares")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "7"), []byte("left"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := OpenSpares(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if names, _ := os.ReadDir(dir); len(names) != 0 || sp.Free() != 0 {
		t.Fatalf("pool after open: %v, free %d", names, sp.Free())
	}
}
