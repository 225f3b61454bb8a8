package ledger

import (
	"bufio"
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
		cmd := exec.Command(os.Args[0], "-test.run=^TestGroupCommitCrashChild$")
		cmd.Env = append(os.Environ(), crashDBEnv+"="+path)
		// The child's output other than acknowledgements.
		var stderr, stdoutRest strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		n, killed := 0, false
		sc := bufio.NewScanner(stdout)
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
		err = cmd.Wait()
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
