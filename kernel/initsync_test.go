package kernel

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestInitIsDurable: Init fsyncs every file it writes and the directories
// holding them, kernel.json last (traced by strace, which prints the path
// of each fsynced descriptor), and a failed fsync fails Init (strace
// injects EIO): a data dir Init reported made survives a power loss.
func TestInitIsDurable(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace is not installed (make strace installs it)")
	}
	if out, err := exec.Command("strace", "-f", "-o", "/dev/null", "-e", "inject=getpid:error=EIO", "true").CombinedOutput(); err != nil {
		t.Skipf("strace cannot trace here (ptrace refused?): %v %s", err, out)
	}
	child := func(dir string, strace ...string) ([]byte, error) {
		cmd := exec.Command("strace", append(append([]string{"-f"}, strace...), os.Args[0], "-test.run=^TestInitDurableChild$", "-test.v")...)
		cmd.Env = append(os.Environ(), "CAPK_INIT_DIR="+dir)
		return cmd.CombinedOutput()
	}

	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "strace.log")
	if out, err := child(dir, "-y", "-e", "trace=fsync", "-o", log); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var synced []string
	// strace -f may print a call as "fsync(3</p> <unfinished ...>" and its
	// end on another line: the path is taken from the call's first line
	// (its result is what the EIO run below tests).
	for _, m := range regexp.MustCompile(`fsync\(\d+<([^>]*)>`).FindAllStringSubmatch(string(b), -1) {
		synced = append(synced, m[1])
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, name := range []string{IssuerKeyFile, ReceiptKeyFile, ReceiptPublicKeyFile, AdminFile, "keys", "."} {
		i := slices.Index(synced, filepath.Join(real, name))
		if i < 0 {
			t.Errorf("Init did not fsync %s; fsynced: %q", name, synced)
		}
		last = max(last, i)
	}
	if i := slices.Index(synced, filepath.Join(real, ConfigFile)); i < last {
		t.Errorf("kernel.json fsynced at %d, before the keys and their directories (up to %d): %q", i, last, synced)
	}

	out, err := child(filepath.Join(t.TempDir(), "data"), "-o", "/dev/null", "-e", "inject=fsync:error=EIO")
	if err == nil || !strings.Contains(string(out), "input/output error") {
		t.Fatalf("Init with every fsync failing: %v\n%s", err, out)
	}
}

// TestInitDurableChild is the child of TestInitIsDurable.
func TestInitDurableChild(t *testing.T) {
	dir := os.Getenv("CAPK_INIT_DIR")
	if dir == "" {
		t.Skip("run by TestInitIsDurable")
	}
	if _, err := Init(dir); err != nil {
		t.Fatal(err)
	}
}
