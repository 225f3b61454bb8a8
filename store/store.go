// Package store holds capkernel's bbolt file and the group-commit sequencer
// through which every durable write goes.
//
// One goroutine, the sequencer, owns all write transactions. Update queues a
// function and waits; the sequencer takes everything queued so far, runs the
// functions in queue order inside one bbolt transaction and commits it (one
// fsync for many calls) as soon as the previous commit is done. There is no
// timer: under low load a lone request commits at once, under high load
// batches grow by themselves.
//
// Do queues an Op, a write in three steps whose middle step (CPU work such
// as signing) runs concurrently for all ops of a batch.
//
// UpdateLazy queues a function that makes no commit of its own: it joins
// a transaction that commits for another reason, ahead of every write
// queued after it, or commits after LazyDelay when none comes.
//
// Unlike bbolt's db.Batch, a function's error is its own result and does not
// fail its batch: functions must decide before they write, so an error
// returned by a function means it wrote nothing. A function that fails after
// writing must return Abort(err); the sequencer then rolls the batch back
// (in memory: nothing reached the file) and runs each of its functions
// again, alone, in a transaction of its own. Functions must therefore depend
// only on the transaction's state and their own arguments, never on memory
// they changed in an earlier run.
//
// A failed commit is different: once bbolt's Commit has failed, its writes
// or its fdatasync may have reached the disk in part, and neither the file
// nor bbolt's view of it can be trusted. The DB then fails stop: every op of
// the batch gets a *FatalError, nothing is retried, and every later write
// is refused with the same error (Err, Failed). Only a new process that
// opens the file again can tell from what is durable what happened.
package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
)

// MaxBatch bounds the number of functions committed in one transaction.
const MaxBatch = 1024

// ErrClosed is returned by Update after Close.
var ErrClosed = errors.New("store: closed")

// FatalError is a failure after which the durable state is unknown: a
// failed commit of the bbolt file, or (reported through Fail) a failed
// sync of files the kernel made durable beside it. Op names the failed
// operation and Path the file.
type FatalError struct {
	Op   string
	Path string
	Err  error
}

func (e *FatalError) Error() string {
	return fmt.Sprintf("%s %s failed: %v (whether it reached the disk is unknown: this process accepts no more writes; the next start recovers from what is durable)", e.Op, e.Path, e.Err)
}

func (e *FatalError) Unwrap() error { return e.Err }

// IsFatal reports whether err is, or wraps, a *FatalError.
func IsFatal(err error) bool {
	var f *FatalError
	return errors.As(err, &f)
}

// Options tunes Open. The zero value is the production default.
type Options struct {
	// OpenTimeout bounds the wait for the file lock held by another process.
	OpenTimeout time.Duration
	// NoSync turns off fsync (tests and benchmarks of non-durable paths only).
	NoSync bool
	// MustExist refuses a file that is missing or empty (ErrNoFile),
	// which bbolt would otherwise make a new database of: for a caller
	// whose file was made once (kernel.Init) and whose loss must not pass
	// for a fresh start.
	MustExist bool
	// AfterBatch, if set, runs at the end of every batch transaction in
	// which at least one op succeeded: after every op's Finish, before the
	// commit, in the same transaction (the kernel signs one ledger
	// checkpoint per group commit there). It does not run when every op
	// of the batch failed, since then nothing was written. An error or a
	// panic from it aborts the batch as an op's Abort does: the batch is
	// rolled back and each op runs again alone, in a transaction that
	// again ends with AfterBatch; an op whose transaction still fails gets
	// AfterBatch's error.
	AfterBatch func(tx *bbolt.Tx) error
	// BatchWork, if set, runs on the sequencer after every op's Prepare
	// in a batch in which one succeeded, in the batch's transaction; the
	// function it returns, if not nil, then runs beside the ops' Work
	// steps, concurrently when there are enough to share out (and must not
	// touch the transaction, nor wait for a Work step). It is for
	// batch-wide CPU work on what the Prepares wrote, such as signing a
	// checkpoint, which AfterBatch then stores. An error or a panic from
	// either aborts the batch as AfterBatch's does.
	BatchWork func(tx *bbolt.Tx) func() error
	// BeginTx, BeforeCommit and EndTx, if set, let a caller keep state
	// per write transaction of the sequencer (the kernel coalesces budget
	// charges there: txn.CacheBudgets). BeginTx runs right after each
	// batch transaction begins, before any op's step: the batch's, and,
	// after an abort, each op's own. BeforeCommit runs last in every
	// transaction about to commit, after AfterBatch, whether or not an op
	// succeeded (unlike AfterBatch): what it writes commits with the
	// batch. An error or a panic from either aborts the batch as
	// AfterBatch's does. EndTx runs once each transaction has ended,
	// committed, rolled back or failed to commit, on every path; it must
	// not use tx but as a key, nor panic.
	BeginTx      func(tx *bbolt.Tx)
	BeforeCommit func(tx *bbolt.Tx) error
	EndTx        func(tx *bbolt.Tx)
	// Observe, if set, is told of each batch transaction: its number of
	// writes and how long it took, commit and fsync included. It runs on
	// the sequencer, so it must be quick.
	Observe func(batch int, took time.Duration)
}

// DB is a bbolt file with a group-commit sequencer. It is safe for
// concurrent use.
type DB struct {
	bolt         *bbolt.DB
	queue        chan *request
	afterBatch   func(*bbolt.Tx) error
	batchWork    func(*bbolt.Tx) func() error
	beginTx      func(*bbolt.Tx)
	beforeCommit func(*bbolt.Tx) error
	endTx        func(*bbolt.Tx)
	observe      func(int, time.Duration)

	mu     sync.RWMutex // guards closed against sends on queue
	closed bool
	done   chan struct{}

	lazyMu   sync.Mutex
	lazy     []*request    // UpdateLazy's, for the next batch
	lazyWake chan struct{} // cap 1: lazy is not empty

	failMu sync.Mutex
	fatal  error         // the first fatal error, sticky
	failed chan struct{} // closed when fatal is set
}

type request struct {
	op    Op
	steps Steps // instead of op, when set
	err   error
	done  chan struct{} // nil for UpdateAsync and UpdateLazy
}

func (r *request) prepare(tx *bbolt.Tx) error {
	if r.steps != nil {
		return r.steps.Prepare(tx)
	}
	return r.op.Prepare(tx)
}

func (r *request) hasWork() bool { return r.steps != nil || r.op.Work != nil }

func (r *request) work() error {
	if r.steps != nil {
		return r.steps.Work()
	}
	return r.op.Work()
}

func (r *request) hasFinish() bool { return r.steps != nil || r.op.Finish != nil }

func (r *request) finish(tx *bbolt.Tx) error {
	if r.steps != nil {
		return r.steps.Finish(tx)
	}
	return r.op.Finish(tx)
}

// Op is a write in three steps. Within one batch, every op's Prepare runs
// first, in queue order; then every op's Work runs, concurrently when there
// are enough of them to share out (runWork), so no Work may wait for
// another; then
// every op's Finish, in queue order; then the transaction commits. Work is
// for CPU-heavy steps that need no transaction (signing, hashing), so they
// use every core instead of holding up the sequencer.
//
// Prepare's error is the op's result and ends it (Prepare must decide
// before it writes, or return Abort). Work and Finish run after Prepare
// wrote, so any error of theirs aborts the batch. Work and Finish may be
// nil.
type Op struct {
	Prepare func(*bbolt.Tx) error
	Work    func() error
	Finish  func(*bbolt.Tx) error
}

// Steps is an Op's three steps as methods (DoSteps), for a caller that
// keeps its state in one value: an Op of method values allocates each.
type Steps interface {
	Prepare(*bbolt.Tx) error
	Work() error
	Finish(*bbolt.Tx) error
}

type abortError struct{ err error }

func (a *abortError) Error() string { return a.err.Error() }
func (a *abortError) Unwrap() error { return a.err }

// ErrNoFile is the error of a file Open with MustExist finds missing or
// empty.
var ErrNoFile = errors.New("no database where one was made")

// Abort wraps the error of a function that failed after it had written to
// the transaction, so that the sequencer discards the whole batch.
func Abort(err error) error { return &abortError{err} }

// Open opens (creating if needed) the bbolt file at path and starts the
// sequencer. A file locked by another process fails after opts.OpenTimeout
// (default 1s) with an error that says so.
//
// A file shorter than its metadata says is refused (CheckLength,
// ErrTruncated), and with opts.MustExist a missing or empty one
// (ErrNoFile).
func Open(path string, opts Options) (*DB, error) {
	if opts.MustExist {
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("store: %s is missing: %w", path, ErrNoFile)
		case err != nil:
			return nil, fmt.Errorf("store: %w", err)
		case fi.Size() == 0:
			return nil, fmt.Errorf("store: %s is empty (0 bytes): %w", path, ErrNoFile)
		}
	}
	if err := CheckLength(path); err != nil {
		return nil, err
	}
	timeout := opts.OpenTimeout
	if timeout == 0 {
		timeout = time.Second
	}
	b, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:         timeout,
		NoFreelistSync:  true,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: 1 << 30,
		NoSync:          opts.NoSync,
	})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("store: %s is locked by another process (is another kernel serving this data dir?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	d := &DB{bolt: b, queue: make(chan *request, MaxBatch), lazyWake: make(chan struct{}, 1), afterBatch: opts.AfterBatch, batchWork: opts.BatchWork, beginTx: opts.BeginTx, beforeCommit: opts.BeforeCommit, endTx: opts.EndTx, observe: opts.Observe, done: make(chan struct{}), failed: make(chan struct{})}
	go d.sequence()
	return d, nil
}

// View runs fn in a read-only transaction.
func (d *DB) View(fn func(*bbolt.Tx) error) error { return d.bolt.View(fn) }

// Path returns the bbolt file's path.
func (d *DB) Path() string { return d.bolt.Path() }

// Update runs fn in a group-committed write transaction and returns once that
// transaction is durable, with fn's own error, or with a *FatalError when
// the DB failed stop (then fn may or may not have run, and its writes may
// or may not be durable: only a reopen tells). The context bounds only the
// wait to be queued: once queued, fn runs and Update waits for its outcome,
// so a caller never loses track of a write that may have happened.
func (d *DB) Update(ctx context.Context, fn func(*bbolt.Tx) error) error {
	return d.Do(ctx, Op{Prepare: fn})
}

// Do runs op in a group-committed write transaction, as Update does fn.
func (d *DB) Do(ctx context.Context, op Op) error {
	return d.do(ctx, &request{op: op, done: make(chan struct{})})
}

// DoSteps is Do of the Op s's methods make.
func (d *DB) DoSteps(ctx context.Context, s Steps) error {
	return d.do(ctx, &request{steps: s, done: make(chan struct{})})
}

func (d *DB) do(ctx context.Context, r *request) error {
	if err := d.enqueue(ctx, r); err != nil {
		return err
	}
	<-r.done
	return r.err
}

// UpdateAsync queues fn without waiting for it. Use it only for writes whose
// loss in a crash is harmless (for example, marking redo work finished).
func (d *DB) UpdateAsync(fn func(*bbolt.Tx) error) error {
	return d.enqueue(context.Background(), &request{op: Op{Prepare: fn}})
}

// LazyDelay bounds how long an UpdateLazy function waits for another
// transaction to join.
const LazyDelay = 10 * time.Millisecond

// UpdateLazy queues fn without waiting for it, like UpdateAsync, but makes
// no commit for it alone: fn runs in the transaction of the first Update,
// Do or UpdateAsync request the sequencer takes after UpdateLazy returned,
// ahead of that request, or in an earlier transaction (one whose batch
// was being gathered meanwhile); with no such request, after LazyDelay,
// or at Close. What holds: every write queued after UpdateLazy returns
// commits in fn's transaction, after fn, or in a later one. Use it for
// writes whose loss in a crash is harmless (for example, marking redo
// work finished).
func (d *DB) UpdateLazy(fn func(*bbolt.Tx) error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if err := d.open(); err != nil {
		return err
	}
	d.lazyMu.Lock()
	d.lazy = append(d.lazy, &request{op: Op{Prepare: fn}})
	d.lazyMu.Unlock()
	select {
	case d.lazyWake <- struct{}{}:
	default:
	}
	return nil
}

// takeLazy returns the UpdateLazy requests queued so far.
func (d *DB) takeLazy() []*request {
	d.lazyMu.Lock()
	defer d.lazyMu.Unlock()
	l := d.lazy
	d.lazy = nil
	return l
}

// Fail makes the DB fail stop with err (wrapped in a *FatalError unless it
// is one): every later write is refused with it. Only the first error is
// kept. The kernel calls it when a sync of the workspace fails.
func (d *DB) Fail(err error) {
	if !IsFatal(err) {
		err = &FatalError{Op: "write", Path: d.Path(), Err: err}
	}
	d.failMu.Lock()
	defer d.failMu.Unlock()
	if d.fatal == nil {
		d.fatal = err
		close(d.failed)
	}
}

// Err returns the error the DB failed stop with, or nil.
func (d *DB) Err() error {
	d.failMu.Lock()
	defer d.failMu.Unlock()
	return d.fatal
}

// Failed returns a channel closed when the DB fails stop (see Err).
func (d *DB) Failed() <-chan struct{} { return d.failed }

// open is ErrClosed after Close, the fail-stop error after one, else nil
// (under mu).
func (d *DB) open() error {
	if d.closed {
		return ErrClosed
	}
	return d.Err()
}

func (d *DB) enqueue(ctx context.Context, r *request) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if err := d.open(); err != nil {
		return err
	}
	select {
	case d.queue <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close waits for queued writes to commit, stops the sequencer and closes
// the file.
func (d *DB) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	d.closed = true
	close(d.queue)
	d.mu.Unlock()
	<-d.done
	return d.bolt.Close()
}

// gatherHook, set by tests only, runs on the sequencer once a batch's
// first request is taken, before the rest of the batch is.
var gatherHook func()

func (d *DB) sequence() {
	defer close(d.done)
	batch := make([]*request, 0, MaxBatch)
	var lazyDue <-chan time.Time // armed while lazy requests wait
	for {
		var first *request
		select {
		case r, ok := <-d.queue:
			if !ok {
				if l := d.takeLazy(); len(l) > 0 {
					d.commit(l)
				}
				return
			}
			first = r
		case <-d.lazyWake:
			if lazyDue == nil {
				lazyDue = time.After(LazyDelay)
			}
			continue
		case <-lazyDue:
			lazyDue = nil
			if l := d.takeLazy(); len(l) > 0 {
				d.commit(l)
			}
			continue
		}
		// Each request taken is preceded by the lazy requests queued
		// so far: every one of them was queued before that request
		// was taken, so possibly before it was queued, and must not
		// commit after it. The batch may exceed MaxBatch by them.
		batch = append(append(batch[:0], d.takeLazy()...), first)
		if gatherHook != nil {
			gatherHook()
		}
	fill:
		for len(batch) < MaxBatch {
			select {
			case r, ok := <-d.queue:
				if !ok {
					break fill
				}
				batch = append(append(batch, d.takeLazy()...), r)
			default:
				break fill
			}
		}
		d.commit(batch)
		for _, r := range batch {
			if r.done != nil {
				close(r.done)
			}
		}
		// The slice is reused: its requests (and what their functions
		// hold, a call's args) must not stay reachable until overwritten.
		clear(batch)
	}
}

// commit runs batch in one transaction; if an op aborts, it runs each op
// again in a transaction of its own. After a fatal error it runs nothing:
// every op left gets the error.
func (d *DB) commit(batch []*request) {
	if err := d.Err(); err != nil {
		for _, r := range batch {
			r.err = err
		}
		return
	}
	start := time.Now()
	err := d.try(batch)
	if d.observe != nil {
		d.observe(len(batch), time.Since(start))
	}
	if err == nil {
		return
	}
	if fe := d.Err(); fe != nil {
		// The DB failed stop while the batch ran (a Fail from another
		// goroutine, or try's own): nothing of it was committed, and
		// nothing may run again, so every op gets the sticky error, not
		// whatever its steps left (nil for one that succeeded, or that
		// never ran after the abort).
		for _, r := range batch {
			r.err = fe
		}
		return
	}
	if len(batch) == 1 {
		batch[0].err = err
		return
	}
	for i, r := range batch {
		if e := d.try([]*request{r}); e != nil {
			r.err = e
		}
		if err := d.Err(); err != nil {
			for _, r := range batch[i:] {
				r.err = err
			}
			return
		}
	}
}

// try runs batch in one write transaction and commits it. An op's abort
// rolls the transaction back, in memory, and is returned. A failure to
// begin or to commit the transaction is fatal: the DB fails stop and
// every op of batch gets the error.
func (d *DB) try(batch []*request) error {
	tx, err := d.bolt.Begin(true)
	if err != nil {
		return d.failBatch(batch, &FatalError{Op: "begin a write transaction on", Path: d.Path(), Err: err})
	}
	if d.endTx != nil {
		defer d.endTx(tx)
	}
	if err := d.runBatch(tx, batch); err != nil {
		tx.Rollback()
		return err
	}
	if err := d.Err(); err != nil {
		// The DB failed stop while the batch ran (a Fail from another
		// goroutine): nothing more is committed (commit answers every op
		// with the sticky error).
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return d.failBatch(batch, &FatalError{Op: "commit (write and fdatasync) of", Path: d.Path(), Err: err})
	}
	return nil
}

// failBatch fails the DB stop with err and gives every op of batch the
// sticky error.
func (d *DB) failBatch(batch []*request, err error) error {
	d.Fail(err)
	err = d.Err()
	for _, r := range batch {
		r.err = err
	}
	return err
}

// runBatch runs BeginTx, the three steps of every op of batch in tx,
// AfterBatch if an op succeeded, then BeforeCommit, and returns the first
// abort.
func (d *DB) runBatch(tx *bbolt.Tx, batch []*request) error {
	if d.beginTx != nil {
		if err := run(func() error { d.beginTx(tx); return nil }); err != nil {
			return fmt.Errorf("store: begin transaction: %w", err)
		}
	}
	live := batch[:0:0]
	for _, r := range batch {
		r.err = run(func() error { return r.prepare(tx) })
		if isAbort(r.err) {
			return r.err
		}
		if r.err == nil {
			live = append(live, r)
		}
	}
	var batchWork func() error
	if d.batchWork != nil && len(live) > 0 {
		if err := run(func() error { batchWork = d.batchWork(tx); return nil }); err != nil {
			return fmt.Errorf("store: batch work: %w", err)
		}
	}
	work := make([]func(), 0, len(live)+1)
	var batchErr error
	if batchWork != nil {
		work = append(work, func() { batchErr = run(batchWork) })
	}
	for _, r := range live {
		if r.hasWork() {
			work = append(work, func() {
				if err := run(r.work); err != nil {
					r.err = Abort(err)
				}
			})
		}
	}
	runWork(work)
	if batchErr != nil {
		return fmt.Errorf("store: batch work: %w", batchErr)
	}
	for _, r := range live {
		if r.err != nil {
			return r.err
		}
		if !r.hasFinish() {
			continue
		}
		if err := run(func() error { return r.finish(tx) }); err != nil {
			r.err = Abort(err)
			return r.err
		}
	}
	// Every op in live has succeeded.
	if d.afterBatch != nil && len(live) > 0 {
		if err := run(func() error { return d.afterBatch(tx) }); err != nil {
			return fmt.Errorf("store: after batch: %w", err)
		}
	}
	if d.beforeCommit != nil {
		if err := run(func() error { return d.beforeCommit(tx) }); err != nil {
			return fmt.Errorf("store: before commit: %w", err)
		}
	}
	return nil
}

// helpMin is the least number of functions runWork shares out. Fewer run
// on the sequencer alone: a helper would have one function to run, and
// waking a processor for it (a futex wake, and on a machine whose other
// cores sleep an interrupt to wake one) costs more than the function takes.
// A lone call's batch has two, its Work and the checkpoint's signature:
// BenchmarkInvoke/echo/p=1 ran 632 → 589 µs per call and 523 → 479 µs of
// CPU with them on the sequencer (5 alternated pairs).
const helpMin = 3

// runWork runs the functions of work, concurrently from helpMin of them
// on, on as many goroutines as there are processors (the sequencer's own
// among them, rather than one goroutine per function while it waits), and
// returns when all are done. The functions must not wait for one another.
func runWork(work []func()) {
	if len(work) < helpMin {
		for _, f := range work {
			f()
		}
		return
	}
	var next atomic.Int64
	do := func() {
		for {
			i := next.Add(1) - 1
			if i >= int64(len(work)) {
				return
			}
			work[i]()
		}
	}
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(work)) - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do()
		}()
	}
	do()
	wg.Wait()
}

func isAbort(err error) bool {
	var a *abortError
	return errors.As(err, &a)
}

// run calls fn, turning a panic into an abort so one bad function cannot
// take the sequencer (and with it every later write) down.
func run(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Abort(fmt.Errorf("store: panic in transaction function: %v\n%s", p, debug.Stack()))
		}
	}()
	return fn()
}
