package syscalls_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// An attenuated token's workspace refuses a write or delete whose
// physical target lies where an ancestor's innermost root is read-only,
// however the token's own roots reach it; elsewhere it resolves as
// before.
func TestResolveAncestorReadOnly(t *testing.T) {
	tr := newTree(t)
	// rootlink is a link to root: a child root spelled through it reaches
	// root/sub, which the ancestor holds read-only, without its spelling
	// containing it.
	link := filepath.Join(tr.base, "rootlink")
	if err := os.Symlink(tr.root, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(tr.root, "lsub")); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(tr.root, "sub")
	rw := func(p string) syscalls.RootSpec { return syscalls.RootSpec{Path: p, Writable: true} }
	ro := func(p string) syscalls.RootSpec { return syscalls.RootSpec{Path: p} }
	type call struct {
		path    string
		access  syscalls.Access
		refused bool
	}
	for _, c := range []struct {
		name      string
		roots     []syscalls.RootSpec
		ancestors [][]syscalls.RootSpec
		calls     []call
	}{
		{
			name:      "a read-only root below a link the child's root is spelled through",
			roots:     []syscalls.RootSpec{rw(link)},
			ancestors: [][]syscalls.RootSpec{{rw(link), ro(sub)}},
			calls: []call{
				{"sub/inner.txt", syscalls.AccessWrite, true},
				{filepath.Join(link, "sub", "new.txt"), syscalls.AccessWrite, true},
				{"lsub/inner.txt", syscalls.AccessWrite, true},
				{"sub/inner.txt", syscalls.AccessDelete, true},
				{"sub", syscalls.AccessDelete, true},
				{"lsub", syscalls.AccessDelete, false}, // the link itself, beside sub
				{"sub/inner.txt", syscalls.AccessRead, false},
				{"file.txt", syscalls.AccessWrite, false},
				{"new.txt", syscalls.AccessWrite, false},
				{"realdir", syscalls.AccessDelete, false},
			},
		},
		{
			name:      "the read-only root of the second of two ancestors",
			roots:     []syscalls.RootSpec{rw(link)},
			ancestors: [][]syscalls.RootSpec{{rw(tr.root)}, {rw(link), ro(filepath.Join(sub, "x"))}},
			calls: []call{
				{"sub/x/f", syscalls.AccessWrite, true},
				{"sub", syscalls.AccessDelete, true}, // takes sub/x with it
				{"sub/inner.txt", syscalls.AccessWrite, false},
			},
		},
		{
			name:      "a writable root inside the ancestor's read-only one",
			roots:     []syscalls.RootSpec{rw(sub)},
			ancestors: [][]syscalls.RootSpec{{ro(tr.root), rw(sub)}},
			calls: []call{
				{"inner.txt", syscalls.AccessWrite, false},
				{"inner.txt", syscalls.AccessDelete, false},
			},
		},
		{
			name:      "a root an ancestor holds doubled, read-only and writable",
			roots:     []syscalls.RootSpec{rw(link)},
			ancestors: [][]syscalls.RootSpec{{rw(sub), ro(sub), rw(tr.root)}},
			calls:     []call{{"sub/inner.txt", syscalls.AccessWrite, true}, {"file.txt", syscalls.AccessWrite, false}},
		},
		{
			name:      "outside every root of the ancestor",
			roots:     []syscalls.RootSpec{rw(tr.root)},
			ancestors: [][]syscalls.RootSpec{{ro(tr.ro)}},
			calls:     []call{{"sub/inner.txt", syscalls.AccessWrite, false}},
		},
		{
			name:      "an ancestor's read-only root missing when the workspace opens",
			roots:     []syscalls.RootSpec{rw(link)},
			ancestors: [][]syscalls.RootSpec{{rw(link), ro(filepath.Join(link, "later", "ro"))}},
			calls:     []call{{"later/ro/f", syscalls.AccessWrite, true}, {"later/f", syscalls.AccessWrite, false}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			as := make([]syscalls.AncestorRoots, len(c.ancestors))
			for i, a := range c.ancestors {
				as[i] = syscalls.AncestorRoots{Roots: a}
			}
			w, err := syscalls.OpenAttenuatedWorkspace(c.roots, as)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
			for _, cl := range c.calls {
				_, err := w.Resolve(cl.path, cl.access)
				var se *syscalls.ScopeError
				switch {
				case cl.refused && (!errors.As(err, &se) || !strings.Contains(se.Reason, "read-only for a token this one was attenuated from")):
					t.Errorf("Resolve(%q, %s) = %v, want a *ScopeError naming the ancestor's read-only root", cl.path, cl.access, err)
				case !cl.refused && err != nil:
					t.Errorf("Resolve(%q, %s) = %v, want it resolved", cl.path, cl.access, err)
				}
			}
		})
	}
}

func TestOpenAttenuatedWorkspaceRefusesRelativeAncestorRoot(t *testing.T) {
	tr := newTree(t)
	w, err := syscalls.OpenAttenuatedWorkspace([]syscalls.RootSpec{{Path: tr.root}}, []syscalls.AncestorRoots{{Roots: []syscalls.RootSpec{{Path: "root/sub"}}}})
	if err == nil {
		w.Close()
		t.Fatal("OpenAttenuatedWorkspace accepted a relative ancestor root")
	}
}

// ResolveLinks resolves the links of a path's deepest existing directory
// and keeps the missing rest as spelled.
func TestResolveLinks(t *testing.T) {
	tr := newTree(t)
	root := realDir(t, tr.root)
	for _, c := range []struct{ path, want string }{
		{tr.root, root},
		{filepath.Join(tr.root, "ldir"), filepath.Join(root, "realdir")},
		{filepath.Join(tr.root, "ldir", "f.txt"), filepath.Join(root, "realdir", "f.txt")},
		{filepath.Join(tr.root, "ldir", "missing", "x"), filepath.Join(root, "realdir", "missing", "x")},
		{filepath.Join(tr.root, "dangling"), filepath.Join(root, "dangling")},
		{filepath.Join(tr.root, "dangling", "x"), filepath.Join(root, "dangling", "x")},
		{filepath.Join(tr.root, "sub") + "/", filepath.Join(root, "sub")},
		{"/", "/"},
	} {
		if got := syscalls.ResolveLinks(c.path); got != c.want {
			t.Errorf("ResolveLinks(%q) = %q, want %q", c.path, got, c.want)
		}
	}
}
