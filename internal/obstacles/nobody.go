package obstacles

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// UID and GID are the ids the test runs again as: nobody's.
const (
	UID = 65534
	GID = 65534
)

// dirEnv carries the directory setup prepared to the run as nobody.
const dirEnv = "CAPK_OBSTACLES_DIR"

// Nobody runs the test t again as user nobody, through setpriv(1), when the
// test binary runs as root: it copies the binary where nobody can run it,
// makes a directory dir owned by nobody, calls setup(dir) as root, runs
// the copy with -test.run naming t alone, and fails t if that run fails.
// It returns "", false then: t's root part is over. Run again as nobody,
// it returns dir, true: the test goes on as nobody. Run as another user
// without root above it, or without setpriv, it skips t.
func Nobody(t *testing.T, setup func(dir string)) (string, bool) {
	t.Helper()
	if dir := os.Getenv(dirEnv); dir != "" && os.Geteuid() == UID {
		return dir, true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs itself again as nobody")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skipf("setpriv (util-linux) is needed to run as nobody: %v", err)
	}
	base, err := os.MkdirTemp("", "obstacles-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	bin := filepath.Join(base, "test")
	dir := filepath.Join(base, "dir")
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, UID, GID); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(dir)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
		bin, "-test.run", pattern(t.Name()), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), dirEnv+"="+dir, "HOME=/tmp", "TMPDIR=/tmp")
	// The package directory, as go test runs tests in (testdata).
	if cmd.Dir, err = os.Getwd(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil || !strings.Contains(string(out), "--- PASS"):
		t.Errorf("as nobody: %v\n%s", err, out)
	case strings.Contains(string(out), "--- SKIP"):
		t.Skipf("as nobody:\n%s", out)
	default:
		t.Logf("as nobody:\n%s", out)
	}
	return "", false
}

// pattern is the -test.run pattern naming the test name alone.
func pattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
