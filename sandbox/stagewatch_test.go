package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// makeReadable changes the directory it names below the staging, by a
// descriptor of that very inode, and nothing a link there points to; the
// walk counts what is below the staging only.
func TestMakeReadableAndWalkFollowNoLink(t *testing.T) {
	base := t.TempDir()
	stage := filepath.Join(base, "stage")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(stage, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "big"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stage, "d", "f"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(stage, "link")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(stage, "d"), outside} {
		if err := os.Chmod(d, 0o055); err != nil {
			t.Fatal(err)
		}
	}
	root, err := unix.Open(stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	makeReadable(root, "link")
	makeReadable(root, "d")
	for d, want := range map[string]os.FileMode{filepath.Join(stage, "d"): 0o755, outside: 0o055} {
		if fi, err := os.Lstat(d); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", d, fi.Mode().Perm(), err, want)
		}
	}
	var u stageUse
	dirUse(root, ".", &u)
	if u.bytes > 5 || u.entries != 3 { // d, link, d/f; at most f's 5 bytes
		t.Errorf("walk: %+v, want at most d/f's 5 bytes in 3 entries, nothing of the link's target", u)
	}
}

// A directory the command left readable but not searchable (0400) is made
// searchable by the descriptor the walk opened, where the kernel's user
// needs it (not root: searchesAll); a path too long to open by its path is
// reported, not skipped.
func TestWalkUnsearchableAndTooLong(t *testing.T) {
	stage := t.TempDir()
	d := filepath.Join(stage, "d")
	if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "sub", "f"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o400); err != nil {
		t.Fatal(err)
	}
	root, err := unix.Open(stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	defer func(v bool) { searchesAll = v }(searchesAll)
	searchesAll = false
	var u stageUse
	dirUse(root, ".", &u)
	if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the 0400 directory: %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	if u.entries != 3 || u.tooLong != "" {
		t.Errorf("walk: %+v, want d, d/sub, d/sub/f", u)
	}

	// 20 levels of 250-byte names: past PATH_MAX, made by descriptor.
	name := strings.Repeat("n", 250)
	fd, err := unix.Open(stage, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	u = stageUse{}
	dirUse(root, ".", &u)
	if u.tooLong == "" || len(u.tooLong) < unix.PathMax {
		t.Errorf("walk past PATH_MAX: tooLong %d bytes, want the first path past %d", len(u.tooLong), unix.PathMax)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(stage, name)) })
}
