package txn

import (
	"fmt"
	"sync"

	"go.etcd.io/bbolt"
)

// A group commit holds tens of calls, mostly of one token, and each
// charges its token's budget: decoding, re-encoding and storing the same
// record once per call is serial time on the store's sequencer. A write
// transaction for which CacheBudgets was called instead keeps every
// token's running usage in memory, decoded at its first read, and
// FlushBudgets stores each changed one once, in the transaction, before
// it commits. Every reader and writer of the budgets bucket in this
// package goes through usageOf and putUsage, so all of them see the
// running value, as they would see what each charge wrote through.
//
// Caching is opt-in per transaction so that it fails safe: a write
// transaction nobody enabled it for (a raw bbolt Update, a store opened
// without the hooks) writes through, and no path loses a charge by
// forgetting a flush. Read-only transactions always read bbolt.

// budgetCaches maps each write transaction that caches budgets to its
// cache. A bbolt.Tx has no room for a caller's state, and the functions
// that charge budgets take only the transaction.
var budgetCaches = struct {
	sync.Mutex
	m map[*bbolt.Tx]budgetCache
}{m: map[*bbolt.Tx]budgetCache{}}

// budgetCache is one transaction's running usages by token id. Like the
// transaction, it is used by one goroutine at a time.
type budgetCache map[string]*cachedUsage

type cachedUsage struct {
	used  Usage // owned by the cache: readers get a copy
	dirty bool  // changed since it was read or flushed
}

// CacheBudgets makes tx, a write transaction, keep the budget usages read
// and written in it in memory until FlushBudgets stores them: the budget
// checks and charges of every call in tx then decode each token's record
// once and store it once. Whoever calls it must call FlushBudgets before
// tx commits (or the charges are lost) and DiscardBudgets once tx has
// ended, committed or rolled back (store.Options BeginTx, BeforeCommit
// and EndTx do both). It does nothing for a read-only transaction or one
// that already caches.
func CacheBudgets(tx *bbolt.Tx) {
	if !tx.Writable() {
		return
	}
	budgetCaches.Lock()
	defer budgetCaches.Unlock()
	if budgetCaches.m[tx] == nil {
		budgetCaches.m[tx] = budgetCache{}
	}
}

// FlushBudgets stores in tx every usage changed in tx since CacheBudgets
// or the last FlushBudgets, encoded exactly as a write-through charge
// stores it, so the bytes committed are the same. tx keeps caching. It
// does nothing for a transaction that does not cache. An error (a record
// bbolt refuses) leaves tx half written: the caller must roll it back.
func FlushBudgets(tx *bbolt.Tx) error {
	c := budgetCacheOf(tx)
	if c == nil {
		return nil
	}
	// bbolt lays out pages by key, whatever order the puts come in.
	for id, u := range c {
		if !u.dirty {
			continue
		}
		if err := storeUsage(tx, id, u.used); err != nil {
			return fmt.Errorf("txn: store the budget usage of token %s: %w", id, err)
		}
		u.dirty = false
	}
	return nil
}

// DiscardBudgets forgets tx's cache without storing anything: call it
// once tx has ended, committed (after FlushBudgets) or rolled back (then
// nothing of the cache survives: the next transaction reads the usages
// stored). It does nothing for a transaction that does not cache.
func DiscardBudgets(tx *bbolt.Tx) {
	budgetCaches.Lock()
	defer budgetCaches.Unlock()
	delete(budgetCaches.m, tx)
}

// budgetCacheOf returns tx's cache, or nil when tx writes through.
func budgetCacheOf(tx *bbolt.Tx) budgetCache {
	if !tx.Writable() {
		return nil
	}
	budgetCaches.Lock()
	defer budgetCaches.Unlock()
	return budgetCaches.m[tx]
}

// peek returns the running usage of token id if c holds it. The caller
// must not change it.
func (c budgetCache) peek(id string) (Usage, bool) {
	u, ok := c[id]
	if !ok {
		return nil, false
	}
	return u.used, true
}

// keep records the usage u of token id, as read (dirty false) or as
// changed (dirty true); c owns u from then on.
func (c budgetCache) keep(id string, u Usage, dirty bool) {
	if e, ok := c[id]; ok {
		e.used, e.dirty = u, e.dirty || dirty
		return
	}
	c[id] = &cachedUsage{used: u, dirty: dirty}
}
