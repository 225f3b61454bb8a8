package ledger

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/store"
)

const (
	crashDBEnv     = "CAPK_LEDGER_CRASH_DB"
	crashAppenders = 64
)

// openCheckpointed opens a store whose every group commit ends with a
// checkpoint signed by the test key, as the kernel's does, and runs Init.
func openCheckpointed(tb testing.TB, path string, opts store.Options) *store.DB {
	tb.Helper()
	s := testSigner(tb)
	opts.AfterBatch = func(tx *bbolt.Tx) error {
		_, err := WriteCheckpoint(tx, s, testOrigin)
		return err
	}
	d, err := store.Open(path, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.Update(context.Background(), Init); err != nil {
		d.Close()
		tb.Fatal(err)
	}
	return d
}

// TestGroupCommitCrashChild is the child process of TestGroupCommitCrash:
// crashAppenders goroutines append through store.DB as fast as they can,
// each printing "<seq> <body>" on stdout once its append is acknowledged,
// until the parent kills the process.
func TestGroupCommitCrashChild(t *testing.T) {
	path := os.Getenv(crashDBEnv)
	if path == "" {
		t.Skip("run by TestGroupCommitCrash")
	}
	d := openCheckpointed(t, path, store.Options{})
	for g := range crashAppenders {
		go func() {
			for i := 0; ; i++ {
				body := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)
				var seq uint64
				err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
					e, err := Append(tx, KindAudit, time.Now(), json.RawMessage(body))
					seq = e.Seq
					return err
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(3)
				}
				// One write per line: atomic on a pipe, so lines never mix.
				os.Stdout.Write([]byte(strconv.FormatUint(seq, 10) + " " + body + "\n"))
			}
		}()
	}
	time.Sleep(time.Minute)
	t.Fatal("not killed")
}

// TestGroupCommitCrash kills (SIGKILL) a process in the middle of a burst
// of concurrent group-committed appends, three times on the same file.
// After each crash the reopened ledger must pass CheckTree and VerifyWith
// with checkpoint signatures checked, and every append the child saw
// acknowledged must be there with its body, covered by the latest
// checkpoint (its inclusion proof verifies against that checkpoint's
// signed root).
func TestGroupCommitCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	acked := map[uint64]string{} // seq -> body, over all rounds
	verifier := testVerifier(t)
	for round, killAfter := range []int{100, 1000, 3000} {
		cmd, sc, stderr := startChild(t, "TestGroupCommitCrashChild", crashDBEnv+"="+path)
		var stdoutRest strings.Builder // the child's output other than acknowledgements
		n, killed := 0, false
		for sc.Scan() {
			seqText, body, ok := strings.Cut(sc.Text(), " ")
			seq, err := strconv.ParseUint(seqText, 10, 64)
			if !ok || err != nil || !strings.HasPrefix(body, `{"g":`) {
				stdoutRest.WriteString(sc.Text() + "\n") // the test binary's own output
				continue
			}
			if prev, dup := acked[seq]; dup && prev != body {
				t.Fatalf("round %d: seq %d acknowledged for %s and for %s", round, seq, prev, body)
			}
			acked[seq] = body
			if n++; n == killAfter {
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child not killed after %d acknowledged appends: %v\n%s%s", round, n, err, stdoutRest.String(), stderr.String())
		}

		d := openCheckpointed(t, path, store.Options{})
		r := checkRecovered(t, d, acked, verifier)
		t.Logf("round %d: killed after %d acknowledged appends (%d in all); reopened with %d entries, %d checkpoints",
			round, killAfter, len(acked), r.Entries, r.Checkpoints)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// startChild starts this test binary running only the test named run,
// with env added to its environment, and returns it with a scanner of its
// standard output and its standard error as collected so far.
func startChild(t *testing.T, run string, env ...string) (*exec.Cmd, *bufio.Scanner, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), env...)
	stderr := new(strings.Builder)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(stdout), stderr
}

// checkRecovered checks a reopened ledger against the appends acknowledged
// before the crash.
func checkRecovered(t *testing.T, d *store.DB, acked map[uint64]string, verifier note.Verifier) Report {
	t.Helper()
	var r Report
	if err := d.View(func(tx *bbolt.Tx) error {
		if err := CheckTree(tx); err != nil {
			return err
		}
		var err error
		if r, err = VerifyWith(tx, VerifyOptions{Verifier: verifier, Origin: testOrigin}); err != nil {
			return err
		}
		cp, err := LatestCheckpoint(tx)
		if err != nil {
			return err
		}
		c, err := OpenCheckpoint(cp.Signed, verifier)
		if err != nil {
			return err
		}
		for seq, body := range acked {
			e, err := Get(tx, seq)
			if err != nil {
				return fmt.Errorf("acknowledged entry %d: %w", seq, err)
			}
			if string(e.Body) != body {
				return fmt.Errorf("entry %d has body %s, acknowledged with %s", seq, e.Body, body)
			}
			if seq >= c.Size {
				return fmt.Errorf("acknowledged entry %d is not covered by the latest checkpoint (size %d)", seq, c.Size)
			}
			p, err := InclusionProof(tx, seq, c.Size)
			if err != nil {
				return err
			}
			leaf, _ := digest.Parse(e.Hash)
			if err := VerifyInclusion(seq, c.Size, leaf, p, c.Root); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

const rekeyCrashDBEnv = "CAPK_LEDGER_REKEY_CRASH_DB"

// TestRekeyCrashChild is the child process of TestRekeyCrash: it opens
// the level-major ledger at the path given, prints "open", runs Init
// (which rekeys the tree and moves it and the checkpoints into the
// entries' bucket) and prints "rekeyed", then waits to be killed.
func TestRekeyCrashChild(t *testing.T) {
	path := os.Getenv(rekeyCrashDBEnv)
	if path == "" {
		t.Skip("run by TestRekeyCrash")
	}
	// Synced commits and the freelist kept in memory, as the kernel's
	// store opens the file (store.Open).
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.Write([]byte("open\n"))
	if err := db.Update(Init); err != nil {
		t.Fatal(err)
	}
	os.Stdout.Write([]byte("rekeyed\n"))
	time.Sleep(time.Minute)
	t.Fatal("not killed")
}

// TestRekeyCrash kills (SIGKILL) a process while Init moves a level-major
// file of 20k entries to layout 3, at several moments from before the
// transaction to after its commit. The file must then hold the old layout
// exactly (no layout recorded, the level-major tree and the checkpoints in
// buckets of their own, as they were) or the new one exactly (layout 3
// recorded, every bucket as in a ledger written in it), never a mix, and
// open and verify either way.
func TestRekeyCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "old.db")
	db := openDB(t, src)
	for range 4 {
		appendBatch(t, db, 5000)
		writeCheckpoint(t, db, testSigner(t))
	}
	fresh := dumpAll(t, db)
	toOldLayout(t, db, layoutLevelMajor)
	old := dumpAll(t, db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	for round, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond} {
		path := filepath.Join(dir, fmt.Sprintf("round%d.db", round))
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, sc, stderr := startChild(t, "TestRekeyCrashChild", rekeyCrashDBEnv+"="+path)
		for sc.Scan() && sc.Text() != "open" {
		}
		time.Sleep(delay)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() {
		}
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child not killed: %v\n%s", round, err, stderr.String())
		}

		// What the child left, read without Init.
		raw, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		layout := recordedLayout(t, raw)
		left := dumpAll(t, raw)
		raw.Close()
		outcome := "old layout"
		switch {
		case layout == nil && equalDumpAll(left, old):
		case bytes.Equal(layout, []byte{layoutOneBucket}) && equalDumpAll(left, fresh):
			outcome = "new layout"
		default:
			t.Fatalf("round %d (killed %v after open): layout %x and %d buckets that are neither the old file nor the moved one", round, delay, layout, len(left))
		}
		outcomes[outcome]++

		d := openDB(t, path) // Init rekeys if the child did not
		if _, err := verifyDB(d); err != nil {
			t.Errorf("round %d (%s): %v", round, outcome, err)
		}
		if err := d.View(CheckTree); err != nil {
			t.Errorf("round %d (%s): %v", round, outcome, err)
		}
		if !equalDumpAll(dumpAll(t, d), fresh) {
			t.Errorf("round %d (%s): the file after Init differs from the moved one", round, outcome)
		}
		d.Close()
	}
	t.Logf("outcomes: %v", outcomes)
}
