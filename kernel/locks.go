package kernel

import (
	"context"
	"hash/maphash"
	"path"
	"slices"

	"golang.org/x/sync/semaphore"
)

// pathLocks serializes mutating calls whose resources overlap and lets
// disjoint ones run in parallel. A call locks each resource it touches
// exclusively and each ancestor directory of an fs resource shared, so a
// write to a/b conflicts with a delete of a, while writes to a/b and a/c
// proceed together. Locks are striped: keys hash onto a fixed array of
// RWMutexes and a call takes its stripes in index order, which rules out
// deadlock; two unrelated keys sharing a stripe only wait for each other.
// A stripe is a weighted semaphore, held shared with weight 1 and
// exclusively with all of it (stripeWeight), so that a call whose context
// ends while it waits stops waiting; waiters are served in order, and one
// waiting for exclusive use holds back later shared ones, as with an
// RWMutex.
type pathLocks struct {
	seed    maphash.Seed
	stripes [4096]*semaphore.Weighted
	// onWait, when set, runs before a call waits for a stripe another
	// holds: a call that finished may hold its stripes until a sync it
	// does not hurry (txn.Syncer.SyncLater).
	onWait func()
}

// stripeWeight is a stripe's capacity: exclusive use takes all of it.
const stripeWeight = 1 << 30

func newPathLocks() *pathLocks {
	l := &pathLocks{seed: maphash.MakeSeed()}
	for i := range l.stripes {
		l.stripes[i] = semaphore.NewWeighted(stripeWeight)
	}
	return l
}

// lockSet is a set of stripes with their modes, ready to lock in order.
type lockSet struct {
	idx       []int
	exclusive []bool
}

// plan collects the stripes for exclusive keys and for the ancestors
// (shared) of the slash-separated fs keys among them.
func (l *pathLocks) plan(fsKeys, otherKeys []string) lockSet {
	modes := map[int]bool{}
	add := func(key string, excl bool) {
		i := int(maphash.String(l.seed, key) % uint64(len(l.stripes)))
		modes[i] = modes[i] || excl
	}
	for _, k := range fsKeys {
		add(k, true)
		for d := path.Dir(k); d != "/" && d != "."; d = path.Dir(d) {
			add(d, false)
		}
	}
	for _, k := range otherKeys {
		add(k, true)
	}
	var s lockSet
	for i := range modes {
		s.idx = append(s.idx, i)
	}
	slices.Sort(s.idx)
	for _, i := range s.idx {
		s.exclusive = append(s.exclusive, modes[i])
	}
	return s
}

// lock takes s's stripes in index order. When ctx ends while it waits,
// it gives back those it took and returns ctx's error.
func (l *pathLocks) lock(ctx context.Context, s lockSet) error {
	for n, i := range s.idx {
		m, w := l.stripes[i], s.weight(n)
		if m.TryAcquire(w) {
			continue
		}
		l.waiting()
		if err := m.Acquire(ctx, w); err != nil {
			l.release(s, n)
			return err
		}
	}
	return nil
}

// weight is what the n-th stripe of s takes of it.
func (s lockSet) weight(n int) int64 {
	if s.exclusive[n] {
		return stripeWeight
	}
	return 1
}

func (l *pathLocks) waiting() {
	if l.onWait != nil {
		l.onWait()
	}
}

func (l *pathLocks) unlock(s lockSet) { l.release(s, len(s.idx)) }

// release gives back the first n stripes of s, the last first.
func (l *pathLocks) release(s lockSet, n int) {
	for j := n - 1; j >= 0; j-- {
		l.stripes[s.idx[j]].Release(s.weight(j))
	}
}
