package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/capkernel/capkernel/sandbox"
)

// BenchmarkBareBwrap is the floor: bwrap with comparable namespaces and
// binds running true, no staging, no limits, no init.
func BenchmarkBareBwrap(b *testing.B) {
	ws := b.TempDir()
	args := []string{"--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--unshare-net", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", ws, ws, "--chdir", ws,
		"--clearenv", "--", "/usr/bin/true"}
	for b.Loop() {
		if out, err := exec.Command("bwrap", args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

// BenchmarkRun runs true through Run: r root; rw roots of 1,000 files
// staged by overlay and by copy (the staging setup and the delta walk
// included).
func BenchmarkRun(b *testing.B) {
	small := b.TempDir()
	big := b.TempDir()
	for i := range 1000 {
		p := filepath.Join(big, fmt.Sprintf("d%02d", i/50), fmt.Sprintf("f%04d.txt", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprintf("file %d\n", i)), 0o644)
	}
	cases := []struct {
		name string
		root sandbox.Root
		mode sandbox.StagingMode
	}{
		{"r-root", sandbox.Root{Path: small}, sandbox.StagingOverlay},
		{"rw-1000-files-overlay", sandbox.Root{Path: big, Writable: true}, sandbox.StagingOverlay},
		{"rw-1000-files-copy", sandbox.Root{Path: big, Writable: true}, sandbox.StagingCopy},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := newSandbox(b, sandbox.Options{Staging: c.mode})
			for b.Loop() {
				res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{c.root}}, sandbox.Command{Argv: []string{"true"}})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("%v %+v", err, res)
				}
				res.Close()
			}
		})
	}
}
