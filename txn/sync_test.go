package txn

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/syscalls"
)

// TestSyncLater: a SyncLater request starts no round of its own; it is
// answered by the next round a Sync starts (one round for both), by a
// Hurry that comes before or after it, by its delay, or at Close.
func TestSyncLater(t *testing.T) {
	cases := []struct {
		name  string
		delay time.Duration
		run   func(s *Syncer, root *os.Root, later func())
	}{
		{"rides with the next Sync", time.Hour, func(s *Syncer, root *os.Root, later func()) {
			later()
			if err := s.Sync(root); err != nil {
				t.Error(err)
			}
		}},
		{"hurried after", time.Hour, func(s *Syncer, root *os.Root, later func()) { later(); s.Hurry() }},
		{"hurried before", time.Hour, func(s *Syncer, root *os.Root, later func()) { s.Hurry(); later() }},
		{"its delay", time.Millisecond, func(s *Syncer, root *os.Root, later func()) { later() }},
		{"at close", time.Hour, func(s *Syncer, root *os.Root, later func()) { later(); s.Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, err := os.OpenRoot(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			s := NewSyncer()
			s.delay = tc.delay
			done := make(chan error, 1)
			tc.run(s, root, func() { s.SyncLater(func(err error) { done <- err }, root) })
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the SyncLater request was never answered")
			}
			if n := s.Rounds(); n != 1 {
				t.Fatalf("%d rounds, want 1", n)
			}
			if tc.name != "at close" {
				s.Close()
			}
		})
	}
}

// TestSyncerOneDescriptorPerFileSystem: the Syncer syncs each file system
// through the one descriptor it opened when it first saw a root there,
// for every round; roots on one file system share it.
func TestSyncerOneDescriptorPerFileSystem(t *testing.T) {
	dir := t.TempDir()
	var roots []*os.Root
	for _, name := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := os.OpenRoot(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		roots = append(roots, r)
	}
	s := NewSyncer()
	defer s.Close()
	if err := s.Watch(roots[0]); err != nil {
		t.Fatal(err)
	}
	files := func() map[uint64]*os.File {
		s.fs.mu.Lock()
		defer s.fs.mu.Unlock()
		return maps.Clone(s.fs.files)
	}
	first := files()
	if len(first) != 1 {
		t.Fatalf("%d descriptors after watching one root, want 1", len(first))
	}
	for range 3 {
		if err := s.Sync(roots...); err != nil {
			t.Fatal(err)
		}
		s.SyncLater(func(error) {}, roots[1])
		if got := files(); !maps.Equal(got, first) {
			t.Fatalf("descriptors %v after a round, want the first %v", got, first)
		}
	}
}

// TestSyncfsErrorSeenBySyncer: a writeback error of staged content that
// another process's syncfs has already consumed still fails the Syncer's
// Sync, and every Sync after it, although the next syncfs returns 0. It
// runs TestSyncfsErrorChild in a private mount namespace (as root) on a
// file system whose writeback fails (failingExt4).
func TestSyncfsErrorSeenBySyncer(t *testing.T) { runInMountNamespace(t, "TestSyncfsErrorChild") }

// runInMountNamespace runs the test child of this binary in a private
// mount namespace (as root), with CAPK_SYNCFS_CHILD naming a directory
// for it, and passes on its skip or failure.
func runInMountNamespace(t *testing.T, child string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount, loop devices)")
	}
	for _, tool := range []string{"unshare", "mount", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^"+child+"$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPK_SYNCFS_CHILD="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if skip := regexp.MustCompile(`--- SKIP: ` + child + `.*\n\s*(.*)`).FindSubmatch(out); skip != nil {
		t.Skipf("%s", skip[1])
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+child)) {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", bytes.Join(regexp.MustCompile(`(?m)^\s*\w+_test.go:.*$`).FindAll(out, -1), []byte("\n")))
}

// failingExt4 mounts, at mnt, an ext4 file system on a loop device whose
// image lies on a small tmpfs mounted at dir, so that writing back more
// than the tmpfs holds (bigContent) fails with ENOSPC. It runs in a child
// of runInMountNamespace: the mounts, and the loop device (autoclear),
// go away with it. mnt may lie under dir.
func failingExt4(t *testing.T, dir, mnt string) {
	img := filepath.Join(dir, "img")
	for _, c := range [][]string{
		{"mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", dir},
		{"truncate", "-s", "32M", img},
		{"mkfs.ext4", "-q", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=0", img},
		{"mkdir", "-p", mnt},
		{"mount", "-o", "loop", img, mnt},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Skipf("%s: %v %s", strings.Join(c, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
}

// bigContent is more than failingExt4's tmpfs holds.
func bigContent() []byte {
	big := make([]byte, 12<<20)
	for i := range big {
		big[i] = byte(i * 7919 >> 3)
	}
	return big
}

// failingRoot starts a child of runInMountNamespace (the test parent):
// it skips unless parent runs it, mounts failingExt4 at mnt and opens ws
// as a root (both relative to the child's directory), closed when t
// ends. It returns ws's path and the root.
func failingRoot(t *testing.T, parent, ws, mnt string) (string, *os.Root) {
	dir := os.Getenv("CAPK_SYNCFS_CHILD")
	if dir == "" {
		t.Skip("run by " + parent)
	}
	failingExt4(t, dir, filepath.Join(dir, mnt))
	ws = filepath.Join(dir, ws)
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return ws, root
}

// TestSyncfsErrorChild is the child of TestSyncfsErrorSeenBySyncer.
func TestSyncfsErrorChild(t *testing.T) {
	mnt, root := failingRoot(t, "TestSyncfsErrorSeenBySyncer", "m", "m")
	e := newEnv(t)
	s := NewSyncer()
	defer s.Close()
	stage := NewStage("op", KV{View: e.db.View}, s)
	// More than the tmpfs under the image holds: its writeback fails.
	if err := stage.WriteFile(&syscalls.Resource{Root: root, RootPath: mnt, Rel: "big"}, bigContent(), 0); err != nil {
		t.Fatal(err)
	}
	// Another process's syncfs (a sandboxed `sync -f`, say) sees the
	// error first.
	other, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Syncfs(int(other.Fd())); err == nil {
		t.Skip("the writeback did not fail: the setup does not produce a writeback error here")
	} else {
		t.Logf("the other syncfs: %v", err)
	}
	err = s.Sync(stage.Roots()...)
	if err == nil {
		t.Fatal("Sync returned nil after the staged file's writeback failed (the error went to the other syncfs)")
	}
	t.Logf("the Syncer's syncfs: %v", err)
	// The next round comes after a rename within the root (an applied
	// commit's, say: here the failed stage's own), which writes back only
	// into blocks the image holds already: its syncfs through the same
	// descriptor returns 0 (the error reported to it already, the pages
	// that failed no longer dirty), while "big" never reached the disk.
	if err := Apply(stage.Effects(), stage.Root); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(root); !errors.Is(err, ErrSyncFailed) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("the Sync after a failed round returned %v, want ErrSyncFailed wrapping the round's ENOSPC", err)
	} else {
		t.Logf("the next Sync: %v", err)
	}
}

// TestSyncerFailureSticky: after a round's syncfs fails, every later
// Sync and SyncLater fails too, with ErrSyncFailed wrapping that failure,
// although a syncfs through the Syncer's descriptor would succeed again.
// The first round fails with EBADF: its descriptor is swapped for a
// closed one (TestSyncfsErrorSeenBySyncer makes a real writeback error,
// as root).
func TestSyncerFailureSticky(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := NewSyncer()
	defer s.Close()
	if err := s.Watch(root); err != nil {
		t.Fatal(err)
	}
	closed, err := os.Open(root.Name())
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	swap := func(f *os.File) *os.File {
		s.fs.mu.Lock()
		defer s.fs.mu.Unlock()
		for d, old := range s.fs.files {
			s.fs.files[d] = f
			return old
		}
		t.Fatal("no descriptor")
		return nil
	}
	good := swap(closed)
	first := s.Sync(root)
	if !errors.Is(first, unix.EBADF) {
		t.Fatalf("the first Sync: %v, want EBADF", first)
	}
	swap(good)
	if err := unix.Syncfs(int(good.Fd())); err != nil {
		t.Fatalf("the good descriptor's syncfs: %v", err)
	}
	later := make(chan error, 1)
	s.SyncLater(func(err error) { later <- err }, root)
	for name, err := range map[string]error{"Sync": s.Sync(root), "SyncLater": <-later} {
		if !errors.Is(err, ErrSyncFailed) || !errors.Is(err, unix.EBADF) || !strings.Contains(err.Error(), first.Error()) {
			t.Errorf("%s after a failed round: %v, want ErrSyncFailed naming %q", name, err, first)
		}
	}
}

// TestSyncerForget: a root its owner forgets and closes while a request
// made for it waits is still synced by that request's round (a request
// holds the file system, not the root), and the Syncer no longer holds
// the root: a kernel that opens and closes roots for as long as it runs
// (its workspace cache) would otherwise keep every root it ever synced.
func TestSyncerForget(t *testing.T) {
	s := NewSyncer()
	defer s.Close()
	s.delay = time.Hour
	roots := make([]*os.Root, 3)
	for i := range roots {
		r, err := os.OpenRoot(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		roots[i] = r
	}
	done := make(chan error, 1)
	s.SyncLater(func(err error) { done <- err }, roots...)
	s.Forget(roots...)
	for _, r := range roots {
		r.Close()
	}
	s.Hurry()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the round of a request whose roots were forgotten and closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request was never answered")
	}
	s.fs.mu.Lock()
	held, files := len(s.fs.seen), len(s.fs.files)
	s.fs.mu.Unlock()
	if held != 0 || files != 1 {
		t.Fatalf("after Forget: %d roots and %d file system descriptors held, want 0 and 1", held, files)
	}
	// A new root on the same file system is watched again and synced.
	r, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := s.Sync(r); err != nil {
		t.Fatal(err)
	}
}
