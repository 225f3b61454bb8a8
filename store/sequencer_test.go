package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"go.etcd.io/bbolt"
)

// openTest opens a store with opts in a test's own directory, closed when
// the test ends, and makes its bucket "b".
func openTest(t *testing.T, opts Options) *DB {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket([]byte("b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

func put(k string) func(*bbolt.Tx) error {
	return func(tx *bbolt.Tx) error { return tx.Bucket([]byte("b")).Put([]byte(k), []byte("v")) }
}

func keys(t *testing.T, d *DB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	d.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("b")).ForEach(func(k, _ []byte) error { out[string(k)] = true; return nil })
	})
	return out
}

// TestSequencerResultsAreTheirOwn: in concurrent batches, a refusal, an
// abort after a write and a panic each reach only their own caller; every
// other write commits.
func TestSequencerResultsAreTheirOwn(t *testing.T) {
	d := openTest(t, Options{})
	const n = 60
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprint("k", i)
			errs[i] = d.Update(context.Background(), func(tx *bbolt.Tx) error {
				switch i % 6 {
				case 1:
					return fmt.Errorf("refused %d", i)
				case 2:
					if err := put(k)(tx); err != nil {
						return err
					}
					return Abort(fmt.Errorf("aborted %d", i))
				case 3:
					put(k)(tx)
					panic("bug")
				}
				return put(k)(tx)
			})
		}()
	}
	wg.Wait()
	got := keys(t, d)
	for i := range n {
		k := fmt.Sprint("k", i)
		switch i % 6 {
		case 1, 2, 3:
			if errs[i] == nil || got[k] {
				t.Errorf("op %d: err %v, key written %v; want an error and no write", i, errs[i], got[k])
			}
		default:
			if errs[i] != nil || !got[k] {
				t.Errorf("op %d: err %v, key written %v; want success", i, errs[i], got[k])
			}
		}
	}
	if err := d.Update(context.Background(), put("after")); err != nil {
		t.Fatalf("sequencer dead after a panic: %v", err)
	}
}

// TestDoRunsWorkBetweenPrepareAndFinish: Work sees what Prepare computed,
// Finish sees Work's result, and a failing Work aborts only its op; for
// ops of functions (Do) and of methods (DoSteps) alike, in one batch.
func TestDoRunsWorkBetweenPrepareAndFinish(t *testing.T) {
	d := openTest(t, Options{})
	var wg sync.WaitGroup
	errs := make([]error, 20)
	failing := func(i int) bool { return i == 7 || i == 8 }
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &testSteps{i: i, fail: failing(i)}
			if i%2 == 1 {
				errs[i] = d.DoSteps(context.Background(), s)
				return
			}
			errs[i] = d.Do(context.Background(), Op{Prepare: s.Prepare, Work: s.Work, Finish: s.Finish})
		}()
	}
	wg.Wait()
	got := keys(t, d)
	for i := range 20 {
		if failing(i) {
			if p := fmt.Sprint("p", i); errs[i] == nil || got[p] || got[p+"w"] {
				t.Fatalf("failed Work of op %d: err %v, writes %v %v", i, errs[i], got[p], got[p+"w"])
			}
			continue
		}
		if errs[i] != nil || !got[fmt.Sprint("p", i)] || !got[fmt.Sprint("p", i, "w")] {
			t.Fatalf("op %d: err %v", i, errs[i])
		}
	}
}

// testSteps puts "p<i>" in Prepare and "p<i>w" in Finish, made by Work
// from what Prepare staged; Work fails when fail is set.
type testSteps struct {
	i              int
	fail           bool
	staged, worked string
}

func (s *testSteps) Prepare(tx *bbolt.Tx) error {
	s.staged = fmt.Sprint("p", s.i)
	return put(s.staged)(tx)
}

func (s *testSteps) Work() error {
	if s.fail {
		return errors.New("work failed")
	}
	s.worked = s.staged + "w"
	return nil
}

func (s *testSteps) Finish(tx *bbolt.Tx) error { return put(s.worked)(tx) }

func TestCloseAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Open(path, Options{OpenTimeout: 100 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked") || time.Since(start) > 5*time.Second {
		t.Fatalf("second open: %v after %v; want a fast 'locked' error", err, time.Since(start))
	}
	done := false
	d.UpdateAsync(func(tx *bbolt.Tx) error { done = true; return nil })
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("Close did not wait for a queued async write")
	}
	if err := d.Update(context.Background(), put("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Close: %v, want ErrClosed", err)
	}
}

// inOneBatch runs fns as concurrent Updates that the sequencer takes as one
// batch: an op that blocks the sequencer is queued first, and released
// once all of fns are queued behind it.
func inOneBatch(t *testing.T, d *DB, fns ...func(*bbolt.Tx) error) []error {
	t.Helper()
	release, started := make(chan struct{}), make(chan struct{})
	blocker := make(chan error, 1)
	go func() {
		blocker <- d.Update(context.Background(), func(*bbolt.Tx) error {
			close(started)
			<-release
			return errors.New("blocker writes nothing")
		})
	}()
	<-started
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Update(context.Background(), fn)
		}()
	}
	for len(d.queue) < len(fns) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	<-blocker
	return errs
}

// afterBatchLog is an AfterBatch that records, in the transaction, how
// many "k" keys it sees (as a key of bucket "after"), fails when it sees
// the key "poison" and panics when it sees "panic".
type afterBatchLog struct {
	mu    sync.Mutex
	calls int
}

func (l *afterBatchLog) hook(tx *bbolt.Tx) error {
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	b := tx.Bucket([]byte("b"))
	switch {
	case b.Get([]byte("poison")) != nil:
		return errors.New("poisoned")
	case b.Get([]byte("panic")) != nil:
		panic("after-batch bug")
	}
	n := 0
	b.ForEach(func(k, _ []byte) error {
		if strings.HasPrefix(string(k), "k") {
			n++
		}
		return nil
	})
	return tx.Bucket([]byte("after")).Put(fmt.Appendf(nil, "%03d", n), nil)
}

func (l *afterBatchLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

func openWithAfterBatch(t *testing.T) (*DB, *afterBatchLog) {
	t.Helper()
	log := &afterBatchLog{}
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{AfterBatch: log.hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("after")); err != nil {
			return err
		}
		_, err := tx.CreateBucket([]byte("b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return d, log
}

func afterKeys(t *testing.T, d *DB) []string {
	t.Helper()
	var out []string
	d.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("after")).ForEach(func(k, _ []byte) error { out = append(out, string(k)); return nil })
	})
	return out
}

// TestAfterBatchRunsOncePerBatchInItsTransaction: one batch of three writes
// and a refusal runs AfterBatch once, after all writes, and commits what it
// writes with them.
func TestAfterBatchRunsOncePerBatchInItsTransaction(t *testing.T) {
	d, log := openWithAfterBatch(t)
	before := log.count()
	errs := inOneBatch(t, d, put("k1"), func(*bbolt.Tx) error { return errors.New("refused") }, put("k2"), put("k3"))
	if errs[0] != nil || errs[1] == nil || errs[2] != nil || errs[3] != nil {
		t.Fatalf("results %v", errs)
	}
	if n := log.count() - before; n != 1 {
		t.Errorf("AfterBatch ran %d times for one batch, want 1", n)
	}
	// 000 is from the setup transaction.
	if got := afterKeys(t, d); fmt.Sprint(got) != "[000 003]" {
		t.Errorf("AfterBatch wrote %v, want [000 003] (it saw all three writes of its batch)", got)
	}
}

// TestAfterBatchSkipsBatchesWithoutSuccess: a batch whose ops all fail
// wrote nothing, so AfterBatch does not run.
func TestAfterBatchSkipsBatchesWithoutSuccess(t *testing.T) {
	d, log := openWithAfterBatch(t)
	before := log.count()
	refuse := func(*bbolt.Tx) error { return errors.New("refused") }
	abort := func(tx *bbolt.Tx) error { put("k9")(tx); return Abort(errors.New("aborted")) }
	errs := inOneBatch(t, d, refuse, abort, refuse)
	for i, err := range errs {
		if err == nil {
			t.Errorf("op %d succeeded", i)
		}
	}
	if n := log.count() - before; n != 0 {
		t.Errorf("AfterBatch ran %d times for batches without a success", n)
	}
	if got := keys(t, d); len(got) != 0 {
		t.Errorf("writes committed: %v", got)
	}
}

// TestAfterBatchErrorAbortsTheBatch: when AfterBatch fails, the batch and
// AfterBatch's own writes roll back, and each op runs again alone; only the
// op that makes AfterBatch fail gets its error.
func TestAfterBatchErrorAbortsTheBatch(t *testing.T) {
	for _, bad := range []string{"poison", "panic"} {
		t.Run(bad, func(t *testing.T) {
			d, log := openWithAfterBatch(t)
			before := log.count()
			errs := inOneBatch(t, d, put("k1"), put(bad), put("k2"))
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("good ops failed: %v", errs)
			}
			want := map[string]string{"poison": "store: after batch: poisoned", "panic": "store: after batch: store: panic in transaction function: after-batch bug"}[bad]
			if errs[1] == nil || !strings.HasPrefix(errs[1].Error(), want) {
				t.Errorf("bad op: %v, want %q", errs[1], want)
			}
			got := keys(t, d)
			if !got["k1"] || !got["k2"] || got[bad] {
				t.Errorf("committed %v", got)
			}
			// The batch, then each op alone.
			if n := log.count() - before; n != 4 {
				t.Errorf("AfterBatch ran %d times, want 4", n)
			}
			if got := afterKeys(t, d); fmt.Sprint(got) != "[000 001 002]" {
				t.Errorf("committed AfterBatch writes %v, want those of the two good ops' own transactions", got)
			}
			if err := d.Update(context.Background(), put("k3")); err != nil {
				t.Errorf("sequencer after a failing AfterBatch: %v", err)
			}
		})
	}
}

// TestAfterBatchErrorOfALoneOp: a batch of one op whose AfterBatch fails
// returns that error to the op and commits nothing.
func TestAfterBatchErrorOfALoneOp(t *testing.T) {
	d, log := openWithAfterBatch(t)
	before := log.count()
	err := d.Update(context.Background(), put("poison"))
	if err == nil || err.Error() != "store: after batch: poisoned" {
		t.Errorf("Update = %v", err)
	}
	if n := log.count() - before; n != 1 {
		t.Errorf("AfterBatch ran %d times, want 1", n)
	}
	if got := keys(t, d); got["poison"] {
		t.Error("the op's write committed")
	}
}

// TestBatchWork: BatchWork runs once per batch after every Prepare, in the
// transaction; its function runs beside the Work steps and before
// AfterBatch, which sees its result; its error aborts the batch.
func TestBatchWork(t *testing.T) {
	for _, fail := range []bool{false, true} {
		var mu sync.Mutex
		var seen []string // what BatchWork saw written, and what AfterBatch saw signed
		var signed string
		d := openTest(t, Options{
			BatchWork: func(tx *bbolt.Tx) func() error {
				b := tx.Bucket([]byte("b"))
				if b == nil {
					return nil
				}
				got := "-"
				if b.Get([]byte("k")) != nil {
					got = "k"
				}
				return func() error {
					if fail && got == "k" {
						return errors.New("signing failed")
					}
					signed = got
					return nil
				}
			},
			AfterBatch: func(tx *bbolt.Tx) error {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, signed)
				signed = ""
				return nil
			},
		})
		err := d.Do(context.Background(), Op{Prepare: put("k"), Work: func() error { return nil }})
		stored := false
		if verr := d.View(func(tx *bbolt.Tx) error {
			stored = tx.Bucket([]byte("b")).Get([]byte("k")) != nil
			return nil
		}); verr != nil {
			t.Fatal(verr)
		}
		switch {
		case fail && (err == nil || !strings.Contains(err.Error(), "signing failed")):
			t.Fatalf("a failing BatchWork: %v, want its error", err)
		case fail && stored:
			t.Fatal("the put of a batch whose BatchWork failed was committed")
		case !fail && !stored:
			t.Fatal("the put was not committed")
		case !fail && err != nil:
			t.Fatal(err)
		case !fail && fmt.Sprint(seen) != "[- k]":
			// The bucket's creation wrote no key; the put's batch saw its key.
			t.Fatalf("AfterBatch saw %q, want [- k]", seen)
		}
	}
}

// TestUpdateLazy: a lazy write commits in the transaction of the next
// write queued after it or an earlier one — never a later one — and, with
// no other write, on its own (after LazyDelay) or at Close.
func TestUpdateLazy(t *testing.T) {
	t.Run("joins the next write", func(t *testing.T) {
		d := openTest(t, Options{})
		for i := range 50 {
			var lazyTx, nextTx int
			if err := d.UpdateLazy(func(tx *bbolt.Tx) error { lazyTx = tx.ID(); return put(fmt.Sprint("lazy", i))(tx) }); err != nil {
				t.Fatal(err)
			}
			if err := d.Update(context.Background(), func(tx *bbolt.Tx) error { nextTx = tx.ID(); return put(fmt.Sprint("next", i))(tx) }); err != nil {
				t.Fatal(err)
			}
			if lazyTx == 0 || lazyTx > nextTx {
				t.Fatalf("round %d: the lazy write ran in transaction %d, the next write in %d", i, lazyTx, nextTx)
			}
		}
		if k := keys(t, d); len(k) != 100 {
			t.Fatalf("%d keys, want 100", len(k))
		}
	})
	// A lazy write queued while a batch is being gathered (its first
	// request taken, the rest not yet), and a write queued right after
	// it that the same batch takes: the lazy write must go in ahead of it.
	t.Run("queued while a batch is gathered", func(t *testing.T) {
		taken, resume := make(chan struct{}), make(chan struct{})
		var armed atomic.Bool
		gatherHook = func() {
			if armed.CompareAndSwap(true, false) {
				close(taken)
				<-resume
			}
		}
		t.Cleanup(func() { gatherHook = nil }) // after the DB's Close, a later cleanup
		d := openTest(t, Options{})
		armed.Store(true)
		if err := d.UpdateAsync(put("first")); err != nil {
			t.Fatal(err)
		}
		<-taken
		if err := d.UpdateLazy(put("lazy")); err != nil {
			t.Fatal(err)
		}
		var lazyFirst bool
		next := make(chan error, 1)
		go func() {
			next <- d.Update(context.Background(), func(tx *bbolt.Tx) error {
				lazyFirst = tx.Bucket([]byte("b")).Get([]byte("lazy")) != nil
				return nil
			})
		}()
		for len(d.queue) == 0 { // the next write is queued
			time.Sleep(time.Millisecond)
		}
		close(resume)
		if err := <-next; err != nil {
			t.Fatal(err)
		}
		if !lazyFirst {
			t.Fatal("a write queued after UpdateLazy returned committed before the lazy write")
		}
	})
	t.Run("alone", func(t *testing.T) {
		d := openTest(t, Options{})
		if err := d.UpdateLazy(put("alone")); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); !keys(t, d)["alone"]; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("a lone lazy write never committed")
			}
		}
	})
	t.Run("at close", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "s.db")
		d, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Update(context.Background(), func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
			t.Fatal(err)
		}
		if err := d.UpdateLazy(put("closing")); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.UpdateLazy(put("late")); !errors.Is(err, ErrClosed) {
			t.Fatalf("UpdateLazy after Close: %v", err)
		}
		d, err = Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if !keys(t, d)["closing"] {
			t.Fatal("the lazy write queued before Close was lost")
		}
	})
}

// TestRunWork: runWork runs every function exactly once and returns only
// when all have, whether it shares them out (helpMin and more) or runs
// them on the calling goroutine.
func TestRunWork(t *testing.T) {
	for n := range 2*helpMin + 3 {
		ran := make([]atomic.Int32, n)
		work := make([]func(), n)
		for i := range work {
			work[i] = func() { ran[i].Add(1) }
		}
		runWork(work)
		for i := range ran {
			if got := ran[i].Load(); got != 1 {
				t.Errorf("%d functions: function %d ran %d times", n, i, got)
			}
		}
	}
}

// TestCommittedRequestsNotHeld: once Update returns, the sequencer holds
// nothing of the function it ran: its batch slice, reused for the next
// batch, kept every request until a later batch overwrote it, and with it
// what the function held (a call's args, megabytes of them under a burst
// of calls).
func TestCommittedRequestsNotHeld(t *testing.T) {
	d := openTest(t, Options{})
	const n = 16
	ws := make([]weak.Pointer[[1 << 20]byte], n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			held := new([1 << 20]byte) // reachable from the function alone
			if err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
				return tx.Bucket([]byte("b")).Put([]byte(fmt.Sprint(i)), held[:8])
			}); err != nil {
				t.Error(err)
			}
			ws[i] = weak.Make(held)
		})
	}
	wg.Wait()
	for range 3 {
		runtime.GC()
	}
	for i, w := range ws {
		if w.Value() != nil {
			t.Fatalf("the sequencer still holds what committed request %d's function held", i)
		}
	}
}
