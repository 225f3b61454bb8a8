package txn

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Syncer makes workspace changes durable for many calls at once. Sync
// returns once a syncfs(2) of every file system holding the given roots has
// run, started after Sync was called: one flush of the file system's
// journal then covers every call waiting, where an fsync of each file and
// directory would cost each call several.
//
// One goroutine issues the syncs: it takes every request queued, syncs each
// file system they name once, answers them all, and repeats as soon as the
// previous round is done. A request that may wait (SyncLater) starts no
// round of its own: it joins the next round a Sync starts, so that one
// flush serves one call's applied renames and the next call's staged
// files, or a round that Hurry asks for, or one LaterDelay after it came.
//
// Each file system is synced through one descriptor, opened when the
// Syncer first sees a root on it (Watch) and kept until Close: see
// fileSystems for why a descriptor opened later would miss errors.
//
// A failure is sticky: once a round's syncfs has failed, every request
// of that round and of every later one (Sync and SyncLater alike) is
// answered with an error, later ones with an ErrSyncFailed that wraps
// the first failure, and no syncfs runs again. Linux reports a writeback
// error once per descriptor, so the next syncfs through the same one
// returns 0 although what was staged before the failure, by any call,
// never reached the disk: a Sync answered nil then would let a call
// commit on content that is not durable (in the kernel, a call running
// concurrently with the one that saw the error, before the fail stop).
type Syncer struct {
	fs     fileSystems
	reqs   chan *syncReq
	hurry  chan struct{} // cap 1
	delay  time.Duration // LaterDelay; tests set it
	rounds atomic.Uint64 // rounds of syncs run
	failed error         // the first failed round's error; only loop uses it
}

// ErrSyncFailed is the error of every request after a failed round (see
// Syncer); the error wrapping it also wraps that round's failure.
var ErrSyncFailed = errors.New("txn: an earlier syncfs failed, so changes made before it may not be on disk; nothing is durable any more")

// syncReq is a request for a round: the file systems of its roots,
// resolved when it was made (the caller holds its roots open then; they
// may be closed and forgotten before the round), or why they could not be.
type syncReq struct {
	fss   []namedFS
	err   error
	done  func(error)
	later bool
}

// LaterDelay bounds how long a SyncLater request waits for a round.
const LaterDelay = 5 * time.Millisecond

// NewSyncer starts a Syncer; Close stops it.
func NewSyncer() *Syncer {
	s := &Syncer{reqs: make(chan *syncReq, 1024), hurry: make(chan struct{}, 1), delay: LaterDelay}
	go s.loop()
	return s
}

// Watch opens the descriptor through which the Syncer syncs root's file
// system, unless it holds one already. Call it before anything is written
// under root (Stage does): a writeback error that happens before Watch may
// be missed by every later Sync. A root that Sync or SyncLater sees first
// is watched then.
func (s *Syncer) Watch(root *os.Root) error {
	_, err := s.fs.watch(root)
	return err
}

// Sync makes every change made so far under roots durable, or returns
// why it could not; after any failed round it always fails (see Syncer).
func (s *Syncer) Sync(roots ...*os.Root) error {
	if len(roots) == 0 {
		return nil
	}
	done := make(chan error, 1)
	fss, err := s.fs.resolve(roots)
	s.reqs <- &syncReq{fss: fss, err: err, done: func(err error) { done <- err }}
	return <-done
}

// SyncLater is Sync without the wait, and without a round of its own
// (see Syncer): then runs with Sync's result once the changes made so far
// under roots are durable (or could not be made so), at most about
// LaterDelay later unless a round comes first. then runs on the Syncer's
// goroutine, so it must be quick and never call the Syncer.
func (s *Syncer) SyncLater(then func(error), roots ...*os.Root) {
	if len(roots) == 0 {
		then(nil)
		return
	}
	fss, err := s.fs.resolve(roots)
	s.reqs <- &syncReq{fss: fss, err: err, done: then, later: true}
}

// Forget drops what the Syncer remembers of roots, which their owner is
// closing: requests already made for them still sync their file systems
// (a request holds file systems, not roots). A root seen again after
// Forget is watched again, as a new one.
func (s *Syncer) Forget(roots ...*os.Root) { s.fs.forget(roots) }

// Hurry asks for a round now for the SyncLater requests waiting, or, if
// none waits, for the next one to come: the caller is about to wait for
// something such a request holds.
func (s *Syncer) Hurry() {
	select {
	case s.hurry <- struct{}{}:
	default:
	}
}

// Rounds returns how many rounds of syncs the Syncer has run: each
// answered every request queued when it began.
func (s *Syncer) Rounds() uint64 { return s.rounds.Load() }

// Close stops the Syncer once queued requests are answered, then closes
// its file system descriptors. No method may be called after Close.
func (s *Syncer) Close() { close(s.reqs) }

func (s *Syncer) loop() {
	var later []*syncReq     // SyncLater requests waiting for a round
	var due <-chan time.Time // LaterDelay after the first of them
	hurried := false         // a Hurry came while none waited
	for {
		var batch []*syncReq
		select {
		case r, ok := <-s.reqs:
			if !ok {
				s.round(later)
				s.fs.close()
				return
			}
			if r.later && !hurried {
				later = append(later, r)
				if due == nil {
					due = time.After(s.delay)
				}
				continue
			}
			batch = append(later, r)
		case <-s.hurry:
			if len(later) == 0 {
				hurried = true
				continue
			}
			batch = later
		case <-due:
			batch = later
		}
		later, due, hurried = nil, nil, false
	fill:
		for {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		s.round(batch)
	}
}

// round syncs the roots of batch and answers each request, or, after a
// failed round, answers each with that failure without syncing.
func (s *Syncer) round(batch []*syncReq) {
	if len(batch) == 0 {
		return
	}
	var err error
	if s.failed != nil {
		err = fmt.Errorf("%w: %w", ErrSyncFailed, s.failed)
	} else {
		var errs []error
		var fss []namedFS
		for _, r := range batch {
			errs = append(errs, r.err)
			fss = append(fss, r.fss...)
		}
		err = errors.Join(append(errs, s.fs.syncAll(fss))...)
		s.failed = err
	}
	s.rounds.Add(1)
	for _, r := range batch {
		r.done(err)
	}
}

// fileSystems syncs file systems through descriptors opened once, before
// anything is written to them. Linux reports a writeback error to
// syncfs(2) only through a descriptor opened before the error happened
// (the file system's error sequence is sampled at open), and only once per
// open file: if another process syncs the file system first (a sandboxed
// `sync -f`, a backup tool), it consumes the error for itself, and a
// descriptor opened after the error sees none. A new descriptor per round
// would then return 0 for a round whose files never reached the disk.
type fileSystems struct {
	mu     sync.Mutex
	seen   map[*os.Root]rootFS // each root seen
	files  map[uint64]*os.File // one descriptor per file system, by device
	closed bool
}

// rootFS is where a root's directory is: its file system's device and its
// mount.
type rootFS struct {
	dev uint64
	top mountID
}

var errSyncerClosed = errors.New("txn: the syncer is closed")

// watch returns the device of root's file system and the mount of its
// directory, opening and keeping a descriptor of the file system first if
// it is new.
func (f *fileSystems) watch(root *os.Root) (rootFS, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fs, ok := f.seen[root]; ok {
		return fs, nil
	}
	if f.closed {
		return rootFS{}, errSyncerClosed
	}
	dir, err := root.Open(".")
	if err != nil {
		return rootFS{}, fmt.Errorf("open %s for syncfs: %w", root.Name(), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		dir.Close()
		return rootFS{}, fmt.Errorf("stat %s: %w", root.Name(), err)
	}
	e, err := statEntry(int(dir.Fd()), "")
	if err != nil {
		dir.Close()
		return rootFS{}, fmt.Errorf("stat %s: %w", root.Name(), err)
	}
	if f.seen == nil {
		f.seen, f.files = map[*os.Root]rootFS{}, map[uint64]*os.File{}
	}
	if _, ok := f.files[st.Dev]; ok {
		dir.Close() // the file system's descriptor is older
	} else {
		f.files[st.Dev] = dir
	}
	fs := rootFS{dev: st.Dev, top: e.mount}
	f.seen[root] = fs
	return fs, nil
}

// namedFS is a file system, by device, and a root on it that names it.
type namedFS struct {
	dev  uint64
	name string
}

// resolve watches roots and returns their file systems, and the error of
// any root that could not be watched.
func (f *fileSystems) resolve(roots []*os.Root) ([]namedFS, error) {
	var errs []error
	fss := make([]namedFS, 0, len(roots))
	for _, root := range roots {
		fs, err := f.watch(root)
		if err != nil {
			errs = append(errs, err)
		} else {
			fss = append(fss, namedFS{fs.dev, root.Name()})
		}
	}
	return fss, errors.Join(errs...)
}

// forget drops roots from seen.
func (f *fileSystems) forget(roots []*os.Root) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range roots {
		delete(f.seen, r)
	}
}

// sync runs syncfs(2) once for each file system holding roots.
func (f *fileSystems) sync(roots []*os.Root) error {
	fss, err := f.resolve(roots)
	return errors.Join(err, f.syncAll(fss))
}

// syncAll runs syncfs(2) once for each file system of fss.
func (f *fileSystems) syncAll(fss []namedFS) error {
	var errs []error
	names := map[uint64]string{} // a root naming each file system
	for _, fs := range fss {
		if _, ok := names[fs.dev]; !ok {
			names[fs.dev] = fs.name
		}
	}
	for d, name := range names {
		f.mu.Lock()
		file := f.files[d]
		f.mu.Unlock()
		if file == nil {
			errs = append(errs, errSyncerClosed)
		} else if err := unix.Syncfs(int(file.Fd())); err != nil {
			errs = append(errs, fmt.Errorf("syncfs %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// close closes the descriptors.
func (f *fileSystems) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, file := range f.files {
		file.Close()
	}
	f.seen, f.files, f.closed = nil, nil, true
}
