package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/sandbox"
)

// A kernel that is not root may enter a directory it cannot list (mode
// 0311, another user's 0711), and so may the sandbox, which opens its
// files by name: their names cannot be checked for secrets, so the whole
// directory is hidden. As root (no permission bites) the test runs itself
// again as nobody.
func TestUnlistableDirHidden(t *testing.T) {
	if os.Getuid() == 0 {
		if os.Getenv("CAPK_UNLISTABLE_CHILD") != "" {
			t.Fatal("the child runs as root")
		}
		tmp, err := os.MkdirTemp("", "capk-unlistable-")
		must(t, err)
		defer os.RemoveAll(tmp)
		must(t, os.Chmod(tmp, 0o777))
		// A copy of the test binary nobody may run (go test's is in a
		// directory only root may enter).
		bin, err := os.ReadFile(os.Args[0])
		must(t, err)
		self := filepath.Join(tmp, "sandbox.test")
		must(t, os.WriteFile(self, bin, 0o755))
		cmd := exec.Command(self, "-test.run=^TestUnlistableDirHidden$", "-test.v")
		cmd.Env = append(os.Environ(), "CAPK_UNLISTABLE_CHILD=1", "TMPDIR="+tmp)
		cmd.Dir = tmp
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		switch {
		case strings.Contains(string(out), "--- SKIP"):
			t.Skipf("as nobody: %s", out)
		case err != nil:
			t.Fatalf("as nobody: %v\n%s", err, out)
		}
		return
	}
	requireSandbox(t)
	ws := t.TempDir()
	mkTree(t, ws, map[string]string{"deploy/id_rsa": "PRIVATE-KEY", "deploy/notes.txt": "NOTES", "plain/ok.txt": "VISIBLE"})
	must(t, os.Chmod(filepath.Join(ws, "deploy"), 0o311))
	defer os.Chmod(filepath.Join(ws, "deploy"), 0o755)
	for _, writable := range []bool{false, true} {
		s := newSandbox(t, sandbox.Options{StagingDir: t.TempDir()})
		res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: writable}}},
			`cat plain/ok.txt; cat deploy/id_rsa deploy/notes.txt 2>/dev/null; true`)
		if out := string(res.Stdout); out != "VISIBLE" {
			t.Fatalf("writable %v: the command read %q, want only VISIBLE", writable, out)
		}
	}
}
