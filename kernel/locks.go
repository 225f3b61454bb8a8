package kernel

import (
	"hash/maphash"
	"path"
	"slices"
	"sync"
)

// pathLocks serializes mutating calls whose resources overlap and lets
// disjoint ones run in parallel. A call locks each resource it touches
// exclusively and each ancestor directory of an fs resource shared, so a
// write to a/b conflicts with a delete of a, while writes to a/b and a/c
// proceed together. Locks are striped: keys hash onto a fixed array of
// RWMutexes and a call takes its stripes in index order, which rules out
// deadlock; two unrelated keys sharing a stripe only wait for each other.
type pathLocks struct {
	seed    maphash.Seed
	stripes [4096]sync.RWMutex
	// onWait, when set, runs before a call waits for a stripe another
	// holds: a call that finished may hold its stripes until a sync it
	// does not hurry (txn.Syncer.SyncLater).
	onWait func()
}

func newPathLocks() *pathLocks { return &pathLocks{seed: maphash.MakeSeed()} }

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

func (l *pathLocks) lock(s lockSet) {
	for n, i := range s.idx {
		m := &l.stripes[i]
		if s.exclusive[n] {
			if !m.TryLock() {
				l.waiting()
				m.Lock()
			}
		} else if !m.TryRLock() {
			l.waiting()
			m.RLock()
		}
	}
}

func (l *pathLocks) waiting() {
	if l.onWait != nil {
		l.onWait()
	}
}

func (l *pathLocks) unlock(s lockSet) {
	for n := len(s.idx) - 1; n >= 0; n-- {
		if s.exclusive[n] {
			l.stripes[s.idx[n]].Unlock()
		} else {
			l.stripes[s.idx[n]].RUnlock()
		}
	}
}
