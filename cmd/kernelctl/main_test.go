package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

var kernelctl string

// TestMain builds the real binary once; the tests run it as a user would.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kernelctl-test-")
	if err != nil {
		panic(err)
	}
	kernelctl = filepath.Join(dir, "kernelctl")
	if out, err := exec.Command("go", "build", "-o", kernelctl, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runExec(t, exec.Command(kernelctl, args...))
}

// runExec runs cmd and returns its output and exit status.
func runExec(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// mustRun runs kernelctl and fails the test unless it exits 0; it
// returns the standard output.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, stderr)
	}
	return out
}

// demoFailed matches a demo line marking a call that did not behave as the
// script expects (the legend names the mark too, not at a line's start).
var demoFailed = regexp.MustCompile(`(?m)^FAIL`)

func TestUsageExitsTwo(t *testing.T) {
	for _, args := range [][]string{{"init"}, {"nosuchverb"}, {"ledger", "verify", "--bogus"}, {"demo", "extra-arg"}} {
		if _, stderr, code := run(t, args...); code != 2 {
			t.Errorf("kernelctl %v: exit %d, want 2 (%s)", args, code, stderr)
		}
	}
}

// TestDemoThenTamper runs the demo on a data dir, verifies the ledger, flips
// one byte of a stored entry and expects verify to fail naming its seq.
func TestDemoThenTamper(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if out, stderr, code := run(t, "init", "--data", data); code != 0 || !strings.Contains(out, "kernel id") {
		t.Fatalf("init: exit %d\n%s%s", code, out, stderr)
	}
	if _, _, code := run(t, "init", "--data", data); code != 1 {
		t.Fatalf("second init over the same dir: exit %d, want 1", code)
	}
	out, stderr, code := run(t, "demo", "--data", data)
	if code != 0 || demoFailed.MatchString(out) || !strings.Contains(out, "ledger intact") {
		t.Fatalf("demo: exit %d\n%s%s", code, out, stderr)
	}
	// It explains itself: where its data is kept, what the columns mean,
	// and a cut message ends in an ellipsis.
	for _, want := range []string{"data dir  " + data + " (kept: kernelctl receipts list --data", "Columns:", "\nCHECK  # WHAT", "MODE    the autonomy mode", "…"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	for _, want := range []string{"policy_denied", "scope_denied", "replayed=true", "precondition_failed", "budget_exceeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %s", want)
		}
	}
	if out, stderr, code := run(t, "ledger", "verify", "--data", data); code != 0 || !strings.Contains(out, "intact") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, stderr)
	}
	// Run again on the same data dir at once: its idempotency keys are
	// its own, so nothing replays the first run's answers.
	if out, stderr, code := run(t, "demo", "--data", data); code != 0 || demoFailed.MatchString(out) {
		t.Fatalf("second demo on the same data dir: exit %d\n%s%s", code, out, stderr)
	}

	db, err := bbolt.Open(filepath.Join(data, "kernel.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seqKey []byte
	err = db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("ledger"))
		// The sixth entry record: records are the 8-byte keys of the
		// bucket, which also holds tree nodes, payloads and checkpoints.
		c := b.Cursor()
		k, _ := c.First()
		for i := 0; k != nil && (len(k) != 8 || i < 5); k, _ = c.Next() {
			if len(k) == 8 {
				i++
			}
		}
		v := append([]byte(nil), b.Get(k)...)
		i := bytes.Index(v, []byte(`"body":{`)) + 10
		v[i] ^= 0x01
		seqKey = append([]byte(nil), k...)
		return b.Put(k, v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code = run(t, "ledger", "verify", "--data", data)
	seq := 0
	for _, b := range seqKey {
		seq = seq<<8 | int(b)
	}
	if code != 1 || !strings.Contains(stderr, "entry "+strconv.Itoa(seq)+":") {
		t.Fatalf("verify after tampering seq %d: exit %d, stderr %q", seq, code, stderr)
	}
}
