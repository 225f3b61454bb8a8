package kernel

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

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

// MaxLockKeys bounds the keys one call locks: its fs paths (each link
// of a read's chain counted), their ancestor directories, a proc.exec's
// writable roots, its kv keys and the kv keys its refs name, each
// counted once. A call naming more is refused (invalid_args) before it
// locks anything. The bound is what one call can hold of the 4096
// stripes while it runs: without it, 64 absent fs refs of deep paths
// named tens of thousands of ancestors, every stripe, and held them
// shared across a net.fetch, so no write of any agent could run. It
// leaves room for MaxPreconditions refs each naming a file six
// directories below its root, no two sharing a directory (448 keys),
// with the call's own resources and its roots' ancestors.
const MaxLockKeys = 512

// errTooManyLocks is the refusal of a plan over MaxLockKeys.
var errTooManyLocks = fmt.Errorf("the call would lock more than %d paths and keys (its fs paths and their ancestor directories, a command's writable roots, kv keys and the kv keys of its refs, each counted once); name fewer or shallower paths", MaxLockKeys)

// plan collects the stripes for exclusive keys and for the ancestors
// (shared) of the slash-separated fs keys among them, or returns
// errTooManyLocks when they are more than MaxLockKeys keys.
//
// Every ancestor is locked, up to the top, not only those within the
// key's root: roots nest (two tokens' roots, or a token's own), and a
// directory above a root is a key of the outer root's calls — deleted
// there (exclusive), or locked whole as a proc.exec's writable root —
// while a write through the inner root runs beneath it. The ancestors
// above a root are the same for every path in it, so they count once.
func (l *pathLocks) plan(fsKeys, otherKeys []string) (lockSet, error) {
	keys := make(map[string]bool, min(8*len(fsKeys)+len(otherKeys), MaxLockKeys+1)) // key -> exclusive
	for _, k := range fsKeys {
		_, seen := keys[k] // and so are its ancestors
		keys[k] = true
		// Slicing at the last slash is linear in k; path.Dir cleans
		// what is left at each step, quadratic in a deep path.
		for i := strings.LastIndexByte(k, '/'); !seen && i > 0; i = strings.LastIndexByte(k[:i], '/') {
			if _, seen = keys[k[:i]]; !seen {
				keys[k[:i]] = false
			}
			if len(keys) > MaxLockKeys {
				return lockSet{}, errTooManyLocks
			}
		}
	}
	for _, k := range otherKeys {
		keys[k] = true
	}
	if len(keys) > MaxLockKeys {
		return lockSet{}, errTooManyLocks
	}
	modes := map[int]bool{}
	for k, excl := range keys {
		i := int(maphash.String(l.seed, k) % uint64(len(l.stripes)))
		modes[i] = modes[i] || excl
	}
	var s lockSet
	for i := range modes {
		s.idx = append(s.idx, i)
	}
	slices.Sort(s.idx)
	for _, i := range s.idx {
		s.exclusive = append(s.exclusive, modes[i])
	}
	return s, nil
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
