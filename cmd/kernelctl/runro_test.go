package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// run --ro refuses a path that is, holds or lies in the data dir, or
// holds the token file, before anything runs (rev-runner #1: --ro over
// the data dir's parent let the agent read admin.token and
// keys/issuer.pem, and mint itself a "*" token through control.sock).
func TestRunReadOnlyRefusesKernelFiles(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	elsewhere := filepath.Join(t.TempDir(), "tokens")
	os.MkdirAll(elsewhere, 0o700)
	tok := filepath.Join(elsewhere, "agent.token")
	b, _ := os.ReadFile(f.token)
	os.WriteFile(tok, b, 0o600)
	link := filepath.Join(t.TempDir(), "up")
	os.Symlink(f.dir, link)
	tests := []struct{ name, ro, token, want string }{
		{"parent of the data dir", f.dir, tok, "holds the kernel's data dir"},
		{"the data dir", f.data, tok, "is in the kernel's data dir"},
		{"in the data dir", filepath.Join(f.data, "keys"), tok, "is in the kernel's data dir"},
		{"a link to the parent", link, tok, "holds the kernel's data dir"},
		{"the token file", tok, tok, "holds the token file"},
		{"the token's dir", elsewhere, tok, "holds the token file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, code := run(t, "run", "--data", f.data, "--token", tc.token, "--ro", tc.ro, "--", "/bin/sh", "-c", "echo AGENT-RAN")
			if code != 2 || !strings.Contains(stderr, tc.want) || strings.Contains(out, "AGENT-RAN") {
				t.Fatalf("exit %d, want 2 with %q\nstdout:\n%s\nstderr:\n%s", code, tc.want, out, stderr)
			}
		})
	}
	// A --ro beside the data dir is bound, with the secrets in it hidden.
	beside := filepath.Join(f.dir, "shared")
	os.MkdirAll(filepath.Join(beside, "keys"), 0o755)
	os.WriteFile(filepath.Join(beside, "readme.txt"), []byte("shared readme\n"), 0o644)
	os.WriteFile(filepath.Join(beside, "keys", "deploy.pem"), []byte("PRIVATE-KEY-MATERIAL\n"), 0o600)
	out, stderr, code := run(t, "run", "--data", f.data, "--token", tok, "--ro", beside, "--", "/bin/sh", "-c", `cat "$1"/readme.txt; cat "$1"/keys/deploy.pem 2>/dev/null; ls "$2" 2>/dev/null || echo no-data-dir`, "agent", beside, f.data)
	if code != 0 || !strings.Contains(out, "shared readme") || strings.Contains(out, "PRIVATE-KEY") || !strings.Contains(out, "no-data-dir") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
}

// A sandboxed run removes its staging, with all the agent wrote in its
// working directory, when it ends (rev-runner #4: each run left
// $TMPDIR/capsandbox-run-*/ behind); a run killed meanwhile leaves it in
// the data dir's sandbox dir, which the kernel empties when it opens.
func TestRunStagingRemoved(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	tmp := t.TempDir()
	cmd := exec.Command(kernelctl, "run", "--data", f.data, "--token", f.token, "--", "/bin/sh", "-c", "head -c 5000000 /dev/zero > big.bin; echo agent-data > note.txt")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, stderr, code := runExec(t, cmd); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	sandboxDir := filepath.Join(f.data, "sandbox")
	for _, dir := range []string{tmp, sandboxDir} {
		if left := written(t, dir, "note.txt"); left != "" {
			t.Fatalf("the agent's note.txt is left at %s after the run", left)
		}
	}

	// Killed while the agent runs: the staging stays until the kernel
	// next opens the data dir.
	cmd = exec.Command(kernelctl, "run", "--data", f.data, "--token", f.token, "--", "/bin/sh", "-c", "echo agent-data > note.txt; sleep 60")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var left string
	for deadline := time.Now().Add(30 * time.Second); left == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left = written(t, sandboxDir, "note.txt")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if left == "" {
		t.Fatal("the agent's note.txt was never staged under the data dir's sandbox dir")
	}
	if _, err := os.Stat(left); err != nil {
		t.Fatalf("the killed run's staging is gone before the kernel opened again: %v", err)
	}
	if out, stderr, code := run(t, "run", "--data", f.data, "--token", f.token, "--", "/bin/true"); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	if left := written(t, sandboxDir, "note.txt"); left != "" {
		t.Fatalf("the killed run's staging is left at %s after the kernel opened again", left)
	}
}

// written returns the path of a file named name under a sandbox staging
// directory (capsandbox-run-*) in dir, or "".
func written(t *testing.T, dir, name string) string {
	t.Helper()
	stages, _ := filepath.Glob(filepath.Join(dir, "capsandbox-run-*"))
	found := ""
	for _, st := range stages {
		filepath.WalkDir(st, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == name {
				found = p
				return fs.SkipAll
			}
			return nil
		})
	}
	return found
}

// checkReadOnly refuses a data dir or token file that lies in a
// directory the sandbox shows every agent whole (/usr and the like:
// with the data dir under /usr/local an agent read admin.token, review
// rev4 F1); here a stand-in for /usr.
func TestCheckReadOnlySystemDirs(t *testing.T) {
	sys := t.TempDir()
	data := filepath.Join(sys, "local", "capkernel")
	os.MkdirAll(data, 0o700)
	tok := filepath.Join(t.TempDir(), "agent.token")
	os.WriteFile(tok, []byte("x"), 0o600)
	old := systemDirs
	systemDirs = func() []string { return []string{sys} }
	defer func() { systemDirs = old }()
	if err := checkReadOnly(nil, data, tok); err == nil || !strings.Contains(err.Error(), "which the sandbox shows every agent") {
		t.Fatalf("a data dir in a system dir: %v", err)
	}
	if err := checkReadOnly(nil, filepath.Dir(tok), filepath.Join(sys, "local")); err == nil {
		t.Fatal("a token file in a system dir was let through")
	}
	if err := checkReadOnly(nil, filepath.Dir(tok), tok); err != nil {
		t.Fatalf("a data dir elsewhere: %v", err)
	}
	// A data dir elsewhere, bound into a system dir, or into an --ro path.
	elsewhere := filepath.Join(t.TempDir(), "data")
	os.MkdirAll(elsewhere, 0o700)
	at := filepath.Join(sys, "bound")
	os.MkdirAll(at, 0o755)
	if syscall.Mount(elsewhere, at, "", syscall.MS_BIND, "") != nil {
		t.Skip("no bind mounts here")
	}
	defer syscall.Unmount(at, syscall.MNT_DETACH)
	if err := checkReadOnly(nil, elsewhere, tok); err == nil || !strings.Contains(err.Error(), "is seen at "+at) {
		t.Fatalf("a data dir bound into a system dir: %v", err)
	}
	systemDirs = func() []string { return nil }
	if err := checkReadOnly([]string{sys}, elsewhere, tok); err == nil || !strings.Contains(err.Error(), "reaches a mount of the kernel's data dir") {
		t.Fatalf("an --ro path holding a mount of the data dir: %v", err)
	}
	// An --ro path inside such a mount (review rev6 F1).
	os.MkdirAll(filepath.Join(elsewhere, "keys"), 0o700)
	if err := checkReadOnly([]string{filepath.Join(at, "keys")}, elsewhere, tok); err == nil || !strings.Contains(err.Error(), "reaches a mount of the kernel's data dir") {
		t.Fatalf("an --ro path inside a mount of the data dir: %v", err)
	}
	// An --ro path holding a mount of the token file (review rev6 F2).
	view := t.TempDir()
	tokAt := filepath.Join(view, "t")
	os.WriteFile(tokAt, nil, 0o600)
	if err := syscall.Mount(tok, tokAt, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(tokAt, syscall.MNT_DETACH)
	if err := checkReadOnly([]string{view}, t.TempDir(), tok); err == nil || !strings.Contains(err.Error(), "holds a mount of the token file") {
		t.Fatalf("an --ro path holding a mount of the token file: %v", err)
	}
}
