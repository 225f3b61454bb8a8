package syscalls_test

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// tree is a test directory:
//
//	base/
//	  root/            the first root, writable
//	    file.txt       "hello"
//	    sub/inner.txt  "inner"
//	    realdir/f.txt  "in realdir"
//	    ldir     -> realdir
//	    lin      -> file.txt
//	    dangling -> missing
//	    out_abs  -> base/outside/secret
//	    out_rel  -> ../outside/secret
//	    outdir   -> base/outside
//	    outdir_rel -> ../outside
//	    chain_a  -> chain_b
//	    chain_b  -> ../outside/secret
//	    chain_abs_a -> chain_abs_b
//	    chain_abs_b -> base/outside/secret
//	    sub/up   -> ../../outside/secret
//	  root2/f.txt      shares a prefix with root; no root
//	  ro/r.txt         the second root, read-only
//	  outside/secret   "secret"
type tree struct {
	base, root, ro, outside string
}

func newTree(t testing.TB) tree {
	t.Helper()
	base := t.TempDir()
	tr := tree{base: base, root: filepath.Join(base, "root"), ro: filepath.Join(base, "ro"), outside: filepath.Join(base, "outside")}
	files := map[string]string{
		"root/file.txt":      "hello",
		"root/sub/inner.txt": "inner",
		"root/realdir/f.txt": "in realdir",
		"root2/f.txt":        "not in any root",
		"ro/r.txt":           "read only",
		"outside/secret":     "secret",
	}
	for name, content := range files {
		p := filepath.Join(base, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"root/ldir":        "realdir",
		"root/lin":         "file.txt",
		"root/dangling":    "missing",
		"root/out_abs":     filepath.Join(tr.outside, "secret"),
		"root/out_rel":     "../outside/secret",
		"root/outdir":      tr.outside,
		"root/outdir_rel":  "../outside",
		"root/chain_a":     "chain_b",
		"root/chain_b":     "../outside/secret",
		"root/chain_abs_a": "chain_abs_b",
		"root/chain_abs_b": filepath.Join(tr.outside, "secret"),
		"root/sub/up":      "../../outside/secret",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

func openWorkspace(t testing.TB, roots ...syscalls.RootSpec) *syscalls.Workspace {
	t.Helper()
	w, err := syscalls.OpenWorkspace(roots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// workspace opens tr's root (writable, first) and ro (read-only).
func (tr tree) workspace(t testing.TB) *syscalls.Workspace {
	return openWorkspace(t, syscalls.RootSpec{Path: tr.root, Writable: true}, syscalls.RootSpec{Path: tr.ro})
}

var allAccesses = []syscalls.Access{syscalls.AccessRead, syscalls.AccessList, syscalls.AccessStat, syscalls.AccessWrite, syscalls.AccessDelete}

func TestResolveRefuses(t *testing.T) {
	tr := newTree(t)
	w := tr.workspace(t)
	tests := []struct {
		name     string
		path     string
		accesses []syscalls.Access
		reason   string // a substring of the ScopeError's reason
	}{
		{"dot-dot", "../x", allAccesses, "escapes"},
		{"dot-dot to an existing file", "../outside/secret", allAccesses, "escapes"},
		{"dot-dot after a name", "a/../../x", allAccesses, "escapes"},
		{"dot-dot alone", "..", allAccesses, "escapes"},
		{"absolute outside every root", filepath.Join(tr.outside, "secret"), allAccesses, "outside every root"},
		{"absolute root-prefixed sibling", filepath.Join(tr.base, "root2", "f.txt"), allAccesses, "outside every root"},
		{"absolute dot-dot out of a root", tr.root + "/../outside/secret", allAccesses, "outside every root"},
		{"symlink to outside, absolute target", "out_abs", allAccesses, "outside its root"},
		{"symlink to outside, relative target", "out_rel", allAccesses, "outside its root"},
		{"symlink in a subdirectory to outside", "sub/up", allAccesses, "outside its root"},
		{"symlinked directory to outside as parent", "outdir/secret", allAccesses, "escapes"},
		{"relative symlinked directory to outside as parent", "outdir_rel/secret", allAccesses, "escapes"},
		{"new file under a symlinked directory to outside", "outdir/new.txt", allAccesses, "escapes"},
		{"symlinked directory to outside itself", "outdir", allAccesses, "outside its root"},
		{"symlink chain to outside", "chain_a", allAccesses, "outside its root"},
		{"symlink chain to outside, absolute last link", "chain_abs_a", allAccesses, "outside its root"},
		{"NUL byte", "file.txt\x00.png", allAccesses, "NUL"},
		{"empty path", "", allAccesses, "empty"},
		{"write in a read-only root", filepath.Join(tr.ro, "r.txt"), []syscalls.Access{syscalls.AccessWrite, syscalls.AccessDelete}, "read-only"},
		{"new file in a read-only root", filepath.Join(tr.ro, "new.txt"), []syscalls.Access{syscalls.AccessWrite}, "read-only"},
		{"delete the root", ".", []syscalls.Access{syscalls.AccessDelete}, "root cannot be deleted"},
		{"delete the root by absolute path", tr.root, []syscalls.Access{syscalls.AccessDelete}, "root cannot be deleted"},
		{"delete the root through a name", "sub/..", []syscalls.Access{syscalls.AccessDelete}, "root cannot be deleted"},
	}
	for _, tt := range tests {
		for _, a := range tt.accesses {
			t.Run(tt.name+"/"+string(a), func(t *testing.T) {
				r, err := w.Resolve(tt.path, a)
				var se *syscalls.ScopeError
				if !errors.As(err, &se) {
					t.Fatalf("Resolve(%q, %s) = %+v, %v; want a *ScopeError", tt.path, a, r, err)
				}
				if r != nil {
					t.Errorf("Resolve returned a resource with its error: %+v", r)
				}
				if se.Path != tt.path || !strings.Contains(se.Reason, tt.reason) {
					t.Errorf("ScopeError{Path %q, Reason %q}, want path %q and a reason mentioning %q", se.Path, se.Reason, tt.path, tt.reason)
				}
			})
		}
	}
}

// TestResolvePathSize: a path over MaxPathBytes or MaxPathComponents is
// refused with a *PathSizeError (the kernel's invalid_args), whatever its
// access, before anything else: even one escaping its root, or naming a
// root the token has not; the error tells its size, not the path. One
// at the limits resolves (absent).
func TestResolvePathSize(t *testing.T) {
	tr := newTree(t)
	w := tr.workspace(t)
	comps := func(n int) string { return strings.Repeat("a/", n-1) + "x" }
	atBytes := strings.Repeat(strings.Repeat("b", 63)+"/", 63) + strings.Repeat("c", 64) // 4096 bytes
	tests := []struct {
		name       string
		path       string
		bytes, n   int // the error's; bytes 0: it resolves
		inTheError string
	}{
		{"4096 bytes", atBytes, 0, 0, ""},
		{"255 components", comps(255), 0, 0, ""},
		{"255 components and slashes to spare", "/" + strings.ReplaceAll(tr.root+"/"+comps(255-strings.Count(tr.root, "/")), "/", "//"), 0, 0, ""},
		{"4097 bytes", atBytes + "c", 4097, 0, "limit of 4096 bytes"},
		{"256 components", comps(256), 511, 256, "limit of 255 components"},
		{"256 components absolute", tr.root + "/" + comps(256-strings.Count(tr.root, "/")), len(tr.root) + 1 + 2*(256-strings.Count(tr.root, "/")) - 1, 256, "limit of 255 components"},
		{"a megabyte, escaping", "../" + strings.Repeat("a/", 1<<19), 3 + 1<<20, 0, "limit of 4096 bytes"},
		{"256 components outside every root", "/elsewhere/" + comps(255), 11 + 509, 256, "limit of 255 components"},
	}
	for _, tt := range tests {
		for _, a := range allAccesses {
			t.Run(tt.name+"/"+string(a), func(t *testing.T) {
				r, err := w.Resolve(tt.path, a)
				if tt.bytes == 0 {
					if err != nil || r.Exists {
						t.Fatalf("Resolve of %d bytes = %+v, %v; want it absent", len(tt.path), r, err)
					}
					return
				}
				var pe *syscalls.PathSizeError
				if !errors.As(err, &pe) || r != nil {
					t.Fatalf("Resolve of %d bytes = %+v, %v; want a *PathSizeError", len(tt.path), r, err)
				}
				if pe.Bytes != tt.bytes || pe.Components != tt.n || !strings.Contains(err.Error(), tt.inTheError) || len(err.Error()) > 120 {
					t.Errorf("%+v %q, want %d bytes, %d components, saying %q", pe, err, tt.bytes, tt.n, tt.inTheError)
				}
			})
		}
	}
}

func TestResolveNoRoots(t *testing.T) {
	w := openWorkspace(t)
	var se *syscalls.ScopeError
	if _, err := w.Resolve("a.txt", syscalls.AccessRead); !errors.As(err, &se) {
		t.Errorf("Resolve with no roots = %v, want a *ScopeError", err)
	}
}

func TestOpenWorkspaceRefuses(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want string
	}{
		{"relative", "some/dir", "not absolute"},
		{"missing", filepath.Join(dir, "missing"), "no such file"},
		{"a file", file, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := syscalls.OpenWorkspace([]syscalls.RootSpec{{Path: dir}, {Path: tt.path}})
			if err == nil {
				w.Close()
				t.Fatal("OpenWorkspace succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	tr := newTree(t)
	w := tr.workspace(t)
	tests := []struct {
		name     string
		path     string
		access   syscalls.Access
		rootPath string // tr.root unless set
		rel      string
		real     string
		exists   bool
		isDir    bool
		size     int64 // checked for existing regular files
	}{
		{"relative file", "file.txt", syscalls.AccessRead, "", "file.txt", "file.txt", true, false, 5},
		{"uncleaned relative path", "./sub//x/../inner.txt", syscalls.AccessRead, "", "sub/inner.txt", "sub/inner.txt", true, false, 5},
		{"absolute inside", filepath.Join(tr.root, "sub", "inner.txt"), syscalls.AccessRead, "", "sub/inner.txt", "sub/inner.txt", true, false, 5},
		{"absolute root itself", tr.root, syscalls.AccessList, "", ".", ".", true, true, -1},
		{"dot", ".", syscalls.AccessList, "", ".", ".", true, true, -1},
		{"directory", "sub", syscalls.AccessStat, "", "sub", "sub", true, true, -1},
		{"absolute in the second root", filepath.Join(tr.ro, "r.txt"), syscalls.AccessRead, tr.ro, "r.txt", "r.txt", true, false, 9},
		{"symlink inside, read", "lin", syscalls.AccessRead, "", "lin", "file.txt", true, false, 5},
		{"symlink inside, stat", "lin", syscalls.AccessStat, "", "lin", "file.txt", true, false, 5},
		{"symlink inside, write", "lin", syscalls.AccessWrite, "", "lin", "lin", true, false, -1},
		{"symlink inside, delete", "lin", syscalls.AccessDelete, "", "lin", "lin", true, false, -1},
		{"symlinked directory inside, list", "ldir", syscalls.AccessList, "", "ldir", "realdir", true, true, -1},
		{"symlinked parent inside, read", "ldir/f.txt", syscalls.AccessRead, "", "ldir/f.txt", "realdir/f.txt", true, false, 10},
		{"symlinked parent inside, write", "ldir/f.txt", syscalls.AccessWrite, "", "ldir/f.txt", "realdir/f.txt", true, false, 10},
		{"symlinked parent inside, new file", "ldir/new.txt", syscalls.AccessWrite, "", "ldir/new.txt", "realdir/new.txt", false, false, -1},
		{"new file in the root", "new.txt", syscalls.AccessWrite, "", "new.txt", "new.txt", false, false, -1},
		{"new file in a directory", "sub/new.txt", syscalls.AccessWrite, "", "sub/new.txt", "sub/new.txt", false, false, -1},
		{"missing file, stat", "sub/nope", syscalls.AccessStat, "", "sub/nope", "sub/nope", false, false, -1},
		{"new file in a missing directory", "a/b/new.txt", syscalls.AccessWrite, "", "a/b/new.txt", "a/b/new.txt", false, false, -1},
		{"dangling symlink inside, read", "dangling", syscalls.AccessRead, "", "dangling", "dangling", false, false, -1},
		{"dangling symlink inside, stat", "dangling", syscalls.AccessStat, "", "dangling", "dangling", false, false, -1},
		// A write or delete acts on the link itself, which exists.
		{"dangling symlink inside, write", "dangling", syscalls.AccessWrite, "", "dangling", "dangling", true, false, -1},
		{"dangling symlink inside, delete", "dangling", syscalls.AccessDelete, "", "dangling", "dangling", true, false, -1},
		{"read in a read-only root", filepath.Join(tr.ro, "r.txt"), syscalls.AccessStat, tr.ro, "r.txt", "r.txt", true, false, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := w.Resolve(tt.path, tt.access)
			if err != nil {
				t.Fatalf("Resolve(%q, %s): %v", tt.path, tt.access, err)
			}
			rootPath := tt.rootPath
			if rootPath == "" {
				rootPath = tr.root
			}
			if r.RootPath != rootPath || r.Rel != tt.rel || r.Real != tt.real || r.Exists != tt.exists || r.IsDir != tt.isDir || r.Access != tt.access {
				t.Errorf("Resolve(%q, %s) = {RootPath %q Rel %q Real %q Exists %v IsDir %v Access %s}\nwant {RootPath %q Rel %q Real %q Exists %v IsDir %v Access %s}",
					tt.path, tt.access, r.RootPath, r.Rel, r.Real, r.Exists, r.IsDir, r.Access,
					rootPath, tt.rel, tt.real, tt.exists, tt.isDir, tt.access)
			}
			if tt.size >= 0 && r.Size != tt.size {
				t.Errorf("Size = %d, want %d", r.Size, tt.size)
			}
			if r.Root == nil {
				t.Fatal("Root is nil")
			}
			if want := realDir(t, rootPath); r.RealRoot != want {
				t.Errorf("RealRoot = %q, want %q", r.RealRoot, want)
			}
			// Real names, from the root, the file the access reaches.
			if tt.exists && !tt.access.Writes() {
				got, err := r.Root.Lstat(r.Real)
				if err != nil {
					t.Fatalf("Lstat(Real %q): %v", r.Real, err)
				}
				if got.Mode()&fs.ModeSymlink != 0 {
					t.Errorf("Real %q of a read is a symlink", r.Real)
				}
			}
		})
	}
}

// realDir returns dir with every symlink resolved.
func realDir(t testing.TB, dir string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// TestResolveRootThroughSymlink: a root named through a symlink resolves
// lexically under the name the token gives, and RealRoot is the directory
// itself.
func TestResolveRootThroughSymlink(t *testing.T) {
	tr := newTree(t)
	link := filepath.Join(tr.base, "rootlink")
	if err := os.Symlink(tr.root, link); err != nil {
		t.Fatal(err)
	}
	w := openWorkspace(t, syscalls.RootSpec{Path: link, Writable: true})
	tests := []struct {
		path    string
		wantErr bool
	}{
		{filepath.Join(link, "file.txt"), false},
		{"file.txt", false},
		// The root's real name is not one the token grants.
		{filepath.Join(tr.root, "file.txt"), true},
	}
	for _, tt := range tests {
		r, err := w.Resolve(tt.path, syscalls.AccessRead)
		if tt.wantErr {
			var se *syscalls.ScopeError
			if !errors.As(err, &se) {
				t.Errorf("Resolve(%q) = %v, want a *ScopeError", tt.path, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Resolve(%q): %v", tt.path, err)
		}
		if r.RootPath != link || r.RealRoot != realDir(t, tr.root) || r.Rel != "file.txt" || r.Real != "file.txt" {
			t.Errorf("Resolve(%q) = {RootPath %q RealRoot %q Rel %q Real %q}, want {%q %q file.txt file.txt}",
				tt.path, r.RootPath, r.RealRoot, r.Rel, r.Real, link, realDir(t, tr.root))
		}
	}
}

func TestResolveLongestRootWins(t *testing.T) {
	tr := newTree(t)
	outer := syscalls.RootSpec{Path: tr.root, Writable: true}
	inner := syscalls.RootSpec{Path: filepath.Join(tr.root, "sub")}
	tests := []struct {
		name  string
		roots []syscalls.RootSpec
	}{
		{"outer first", []syscalls.RootSpec{outer, inner}},
		{"inner first", []syscalls.RootSpec{inner, outer}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := openWorkspace(t, tt.roots...)
			r, err := w.Resolve(filepath.Join(tr.root, "sub", "inner.txt"), syscalls.AccessRead)
			if err != nil {
				t.Fatal(err)
			}
			if r.RootPath != inner.Path || r.Rel != "inner.txt" || r.Real != "inner.txt" {
				t.Errorf("resolved in root %q as %q (real %q), want root %q as inner.txt", r.RootPath, r.Rel, r.Real, inner.Path)
			}
			// The inner root is read-only: an absolute write there is refused.
			var se *syscalls.ScopeError
			if _, err := w.Resolve(filepath.Join(tr.root, "sub", "inner.txt"), syscalls.AccessWrite); !errors.As(err, &se) {
				t.Errorf("write in the read-only inner root = %v, want a *ScopeError", err)
			}
			// Outside the inner root, the outer one applies.
			r, err = w.Resolve(filepath.Join(tr.root, "file.txt"), syscalls.AccessWrite)
			if err != nil {
				t.Fatal(err)
			}
			if r.RootPath != outer.Path || r.Rel != "file.txt" {
				t.Errorf("resolved in root %q as %q, want root %q as file.txt", r.RootPath, r.Rel, outer.Path)
			}
		})
	}
}

// TestResolveNestedReadOnlyRoot: with a writable root and a read-only root
// inside it, a write to a file of the read-only root is refused however
// the path is spelled, not only when it is spelled as an absolute path.
func TestResolveNestedReadOnlyRoot(t *testing.T) {
	tr := newTree(t)
	if err := os.Symlink("sub", filepath.Join(tr.root, "lsub")); err != nil {
		t.Fatal(err)
	}
	w := openWorkspace(t, syscalls.RootSpec{Path: tr.root, Writable: true}, syscalls.RootSpec{Path: filepath.Join(tr.root, "sub")})
	tests := []struct {
		name   string
		path   string
		access syscalls.Access
	}{
		{"absolute", filepath.Join(tr.root, "sub", "inner.txt"), syscalls.AccessWrite},
		{"absolute through a symlink", filepath.Join(tr.root, "lsub", "inner.txt"), syscalls.AccessWrite},
		{"relative to the first root", "sub/inner.txt", syscalls.AccessWrite},
		{"relative, new file", "sub/new.txt", syscalls.AccessWrite},
		{"relative through a symlink", "lsub/inner.txt", syscalls.AccessWrite},
		{"relative delete", "sub/inner.txt", syscalls.AccessDelete},
		{"delete the read-only root", "sub", syscalls.AccessDelete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := w.Resolve(tt.path, tt.access)
			var se *syscalls.ScopeError
			if !errors.As(err, &se) {
				t.Errorf("Resolve(%q, %s) = %+v, %v; want a *ScopeError: the file lies in a read-only root", tt.path, tt.access, r, err)
			}
		})
	}
}

// snapshot describes every file under dir: type, mode, size, mtime and
// link target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		s := fi.Mode().String() + " " + fi.ModTime().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s += " " + string(b)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			s += " -> " + target
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestResolveChangesNothing(t *testing.T) {
	tr := newTree(t)
	w := tr.workspace(t)
	before := snapshot(t, tr.base)
	paths := []string{
		".", "file.txt", "sub", "sub/inner.txt", "new.txt", "sub/new.txt", "a/b/c/new.txt", "newdir/",
		"lin", "ldir", "ldir/new.txt", "dangling", "dangling/x", "out_abs", "out_rel", "outdir/secret",
		"outdir/new.txt", "outdir_rel/new/x", "chain_a", "../x", filepath.Join(tr.ro, "new.txt"),
		filepath.Join(tr.outside, "new.txt"), filepath.Join(tr.root, "x", "y"),
	}
	for _, p := range paths {
		for _, a := range allAccesses {
			w.Resolve(p, a)
		}
	}
	after := snapshot(t, tr.base)
	if !maps.Equal(before, after) {
		for _, k := range slices.Sorted(maps.Keys(after)) {
			if before[k] != after[k] {
				t.Errorf("%s: %q, before Resolve %q", k, after[k], before[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(before)) {
			if _, ok := after[k]; !ok {
				t.Errorf("%s: removed by Resolve", k)
			}
		}
	}
}

// TestResolveSymlinkLoop: a loop of symlinks ends in an error for a read
// instead of hanging; a write acts on the link itself.
func TestResolveSymlinkLoop(t *testing.T) {
	tr := newTree(t)
	for name, target := range map[string]string{"loop_a": "loop_b", "loop_b": "loop_a"} {
		if err := os.Symlink(target, filepath.Join(tr.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	w := tr.workspace(t)
	tests := []struct {
		access  syscalls.Access
		wantErr bool
	}{
		{syscalls.AccessRead, true},
		{syscalls.AccessStat, true},
		{syscalls.AccessWrite, false},
		{syscalls.AccessDelete, false},
	}
	for _, tt := range tests {
		r, err := w.Resolve("loop_a", tt.access)
		if tt.wantErr {
			if err == nil {
				t.Errorf("Resolve(loop_a, %s) = %+v, want an error", tt.access, r)
			}
			continue
		}
		if err != nil {
			t.Errorf("Resolve(loop_a, %s): %v", tt.access, err)
			continue
		}
		if r.Real != "loop_a" || !r.Exists {
			t.Errorf("Resolve(loop_a, %s) = {Real %q Exists %v}, want the link itself", tt.access, r.Real, r.Exists)
		}
	}
}

// A root opened from a base must be reached without a symbolic link and
// without leaving the base.
func TestOpenWorkspaceBase(t *testing.T) {
	base := t.TempDir()
	outside := t.TempDir()
	os.MkdirAll(filepath.Join(base, "a", "b"), 0o755)
	os.Symlink(outside, filepath.Join(base, "out"))
	os.Symlink(filepath.Join(base, "a"), filepath.Join(base, "alias"))
	cases := []struct {
		name, path string
		ok         bool
	}{
		{"the base itself", base, true},
		{"a directory below", filepath.Join(base, "a", "b"), true},
		{"a link out", filepath.Join(base, "out"), false},
		{"a link that stays inside", filepath.Join(base, "alias", "b"), false},
		{"outside the base", outside, false},
		{"missing", filepath.Join(base, "nope"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := syscalls.OpenWorkspace([]syscalls.RootSpec{{Path: c.path, Base: base}})
			if (err == nil) != c.ok {
				t.Fatalf("OpenWorkspace(%s from %s) = %v, want ok=%v", c.path, base, err, c.ok)
			}
			if w != nil {
				w.Close()
			}
		})
	}
}
