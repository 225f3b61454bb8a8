package txn

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
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
type Syncer struct {
	reqs   chan *syncReq
	hurry  chan struct{} // cap 1
	delay  time.Duration // LaterDelay; tests set it
	rounds atomic.Uint64 // rounds of syncs run
}

type syncReq struct {
	roots []*os.Root
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

// Sync makes every change made so far under roots durable.
func (s *Syncer) Sync(roots ...*os.Root) error {
	if len(roots) == 0 {
		return nil
	}
	done := make(chan error, 1)
	s.reqs <- &syncReq{roots: roots, done: func(err error) { done <- err }}
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
	s.reqs <- &syncReq{roots: roots, done: then, later: true}
}

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

// Close stops the Syncer once queued requests are answered. No Sync may
// be called after Close.
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

// round syncs the roots of batch and answers each request.
func (s *Syncer) round(batch []*syncReq) {
	if len(batch) == 0 {
		return
	}
	var roots []*os.Root
	for _, r := range batch {
		roots = append(roots, r.roots...)
	}
	err := SyncRoots(roots...)
	s.rounds.Add(1)
	for _, r := range batch {
		r.done(err)
	}
}

// SyncRoots runs syncfs(2) once for each file system holding roots.
func SyncRoots(roots ...*os.Root) error {
	synced := map[uint64]bool{}
	seen := map[*os.Root]bool{}
	var errs []error
	for _, root := range roots {
		if seen[root] {
			continue
		}
		seen[root] = true
		f, err := root.Open(".")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			errs = append(errs, fmt.Errorf("stat %s: %w", root.Name(), err))
		} else if !synced[st.Dev] {
			synced[st.Dev] = true
			if err := unix.Syncfs(int(f.Fd())); err != nil {
				errs = append(errs, fmt.Errorf("syncfs %s: %w", root.Name(), err))
			}
		}
		f.Close()
	}
	return errors.Join(errs...)
}
