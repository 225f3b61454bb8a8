// Package obstacles sets up, for tests, what makes a file system refuse a
// change for good: a mount (Tmpfs), a read-only bind mount (ReadOnly), a
// chattr flag (Chattr), an unprivileged user (Nobody: permission
// checks bind a non-root process only), and a full file system
// (FullExt4). Each needs root; without it the
// test is skipped.
package obstacles

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// Tmpfs mounts a small tmpfs at dir (made first). When t ends, every
// mount under base is detached: a mount may have moved with a renamed
// directory.
func Tmpfs(t testing.TB, base, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs at %s: %v", dir, err)
	}
	unmountUnder(t, base)
}

// Bind bind-mounts src at dst (which must exist), read-only if ro. When t
// ends, every mount under base is detached.
func Bind(t testing.TB, base, src, dst string, ro bool) {
	t.Helper()
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("bind %s at %s: %v", src, dst, err)
	}
	unmountUnder(t, base)
	if !ro {
		return
	}
	if err := syscall.Mount("", dst, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("remount %s read-only: %v", dst, err)
	}
}

// ReadOnly bind-mounts dir on itself, read-only.
func ReadOnly(t testing.TB, base, dir string) { Bind(t, base, dir, dir, true) }

func unmountUnder(t testing.TB, base string) {
	t.Cleanup(func() {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		var points []string
		for l := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], base+"/") {
				points = append(points, f[4])
			}
		}
		// The deepest first.
		slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
		for _, p := range points {
			syscall.Unmount(p, syscall.MNT_DETACH)
		}
	})
}

// Chattr sets flags (as chattr(1) takes them: "+i", "+a") on path. When t
// ends, the immutable and append-only flags are cleared on everything
// under base, so that it can be removed.
func Chattr(t testing.TB, base, flags, path string) {
	t.Helper()
	if out, err := exec.Command("chattr", flags, path).CombinedOutput(); err != nil {
		t.Skipf("chattr %s %s: %v %s", flags, path, err, out)
	}
	t.Cleanup(func() {
		filepath.Walk(base, func(p string, _ os.FileInfo, _ error) error {
			exec.Command("chattr", "-i", "-a", p).Run()
			return nil
		})
	})
}

// FullExt4 mounts a new ext4 file system at dir (Ext4), makes the
// directories mkdirs in it, and fills it (Fill).
func FullExt4(t testing.TB, base, dir string, mkdirs ...string) {
	t.Helper()
	Ext4(t, base, dir)
	for _, d := range mkdirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	Fill(t, dir)
}

// Ext4 mounts at dir (made first) a new 8 MiB ext4 file system (1 KiB
// blocks, no inline data) on a loop device. When t ends, every mount
// under base is detached, which frees the loop device. It skips t when
// mkfs.ext4 or a loop device is missing.
func Ext4(t testing.TB, base, dir string) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "ext4.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 8<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^inline_data", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v %s", err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Skipf("mount %s on a loop device: %v %s", img, err, out)
	}
	unmountUnder(t, base)
}

// Fill fills the file system of directory dir: a new file of zeros
// there (named .filler-N) takes every block the caller (root, so the
// reserved blocks too) can allocate.
func Fill(t testing.TB, dir string) {
	t.Helper()
	f, err := os.CreateTemp(dir, ".filler-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zeros := make([]byte, 1024)
	for {
		if _, err := f.Write(zeros); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("fill %s: %v", dir, err)
	}
}
