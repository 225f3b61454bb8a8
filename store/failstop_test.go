package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"go.etcd.io/bbolt"
)

// limitFileSize makes every write of this process past the current size of
// path fail with EFBIG (RLIMIT_FSIZE; Go ignores SIGXFSZ): a real failure
// of bbolt's Commit, which must grow the file (bbolt preallocates 16 MiB) for a large write.
func limitFileSize(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := syscall.Rlimit{Cur: uint64(fi.Size()), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old) })
}

// TestFailedCommitFailsStop: when bbolt's Commit fails, every op of the
// batch gets a FatalError naming the file, no op runs again (the old
// sequencer re-ran each op alone after any failure), every later write is
// refused at once, Failed is closed, a reopen sees nothing of the failed
// batch, and EndTx ran for every transaction BeginTx saw, the failed one
// too.
func TestFailedCommitFailsStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	var begun, ended atomic.Int32
	d, err := Open(path, Options{BeginTx: func(*bbolt.Tx) { begun.Add(1) }, EndTx: func(*bbolt.Tx) { ended.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { d.Close() }()
	if err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket([]byte("b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(context.Background(), put("before")); err != nil {
		t.Fatal(err)
	}
	limitFileSize(t, path)

	var runs atomic.Int32
	big := func(k string) func(*bbolt.Tx) error {
		return func(tx *bbolt.Tx) error {
			runs.Add(1)
			return tx.Bucket([]byte("b")).Put([]byte(k), make([]byte, 8<<20))
		}
	}
	errs := inOneBatch(t, d, big("x1"), big("x2"), big("x3"))
	for i, err := range errs {
		var f *FatalError
		// bbolt formats the cause with %s: its text is all there is.
		if !errors.As(err, &f) || f.Path != path || !strings.Contains(err.Error(), "file too large") {
			t.Errorf("op %d: %v, want a FatalError naming %s and saying why", i, err, path)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("the failed batch's ops ran %d times in all, want 3 (never again after a failed commit)", n)
	}
	select {
	case <-d.Failed():
	default:
		t.Error("Failed is not closed after a failed commit")
	}
	ran := false
	err = d.Update(context.Background(), func(*bbolt.Tx) error { ran = true; return nil })
	if !IsFatal(err) || ran {
		t.Errorf("write after the failure: ran=%v err=%v, want refused with the fatal error", ran, err)
	}
	if err := d.UpdateAsync(put("later")); !IsFatal(err) {
		t.Errorf("async write after the failure: %v, want the fatal error", err)
	}

	if b, e := begun.Load(), ended.Load(); b != 4 || e != b {
		t.Errorf("%d transactions begun and %d ended, want 4 and 4 (two to set up, inOneBatch's blocker, the failed batch)", b, e)
	}

	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim)
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim)
	d.Close()
	if d, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	got := keys(t, d)
	if !got["before"] || got["x1"] || got["x2"] || got["x3"] {
		t.Errorf("after reopen: %v, want only the write before the failure", got)
	}
}

// TestAbortBeforeCommitIsNotFatal: an op's Abort rolls back in memory only;
// the other ops of its batch still commit, and the DB keeps serving.
func TestAbortBeforeCommitIsNotFatal(t *testing.T) {
	d := openTest(t, Options{})
	errs := inOneBatch(t, d, put("a"), func(tx *bbolt.Tx) error {
		put("z")(tx)
		return Abort(errors.New("bad op"))
	}, put("c"))
	if errs[0] != nil || errs[2] != nil || errs[1] == nil || IsFatal(errs[1]) {
		t.Fatalf("errs %v: want only op 1 to fail, not fatally", errs)
	}
	if d.Err() != nil {
		t.Fatalf("an abort made the DB fail stop: %v", d.Err())
	}
	if got := keys(t, d); !got["a"] || !got["c"] || got["z"] {
		t.Fatalf("keys %v", got)
	}
}

// TestFailDuringAbortedBatch: when the DB fails stop (a Fail from another
// goroutine: the kernel's, after a workspace sync failed) while a batch
// runs, and an op of that batch then aborts, nothing of the batch is
// committed and nothing runs again, so every op, the ones that succeeded
// and the ones that never ran, gets the sticky error, never nil.
func TestFailDuringAbortedBatch(t *testing.T) {
	d := openTest(t, Options{})
	disk := errors.New("syncfs of the workspace: input/output error")
	var runs atomic.Int32
	counted := func(fn func(*bbolt.Tx) error) func(*bbolt.Tx) error {
		return func(tx *bbolt.Tx) error { runs.Add(1); return fn(tx) }
	}
	errs := inOneBatch(t, d, counted(put("a")), counted(func(tx *bbolt.Tx) error {
		d.Fail(disk)
		return Abort(errors.New("bad op"))
	}), counted(put("c")))
	for i, err := range errs {
		if !IsFatal(err) || !errors.Is(err, disk) {
			t.Errorf("op %d: %v, want the sticky error", i, err)
		}
	}
	if n := runs.Load(); n > 3 {
		t.Errorf("the ops ran %d times in all, want at most once each", n)
	}
	if got := keys(t, d); len(got) != 0 {
		t.Errorf("keys %v, want none", got)
	}
}

// TestFailDuringBatch: a batch during which the DB fails stop (a Fail from
// another goroutine) is not committed, even with no op aborting: every op
// gets the sticky error, and nothing of the batch is stored.
func TestFailDuringBatch(t *testing.T) {
	d := openTest(t, Options{})
	disk := errors.New("syncfs of the workspace: input/output error")
	errs := inOneBatch(t, d, put("a"), func(tx *bbolt.Tx) error {
		d.Fail(disk)
		return put("b")(tx)
	}, put("c"))
	for i, err := range errs {
		if !IsFatal(err) || !errors.Is(err, disk) {
			t.Errorf("op %d: %v, want the sticky error", i, err)
		}
	}
	if got := keys(t, d); len(got) != 0 {
		t.Errorf("keys %v, want none", got)
	}
}
