package txn

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
)

// openBolt opens a bbolt file with the package's buckets, and records
// before (token id -> stored record) in it.
func openBolt(t testing.TB, before map[string]string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "b.db"), 0o600, &bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		for id, v := range before {
			if err := tx.Bucket(bucketBudget).Put([]byte(id), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return db
}

// storedBudgets returns every budget record in tx, by token id.
func storedBudgets(tx *bbolt.Tx) map[string]string {
	out := map[string]string{}
	tx.Bucket(bucketBudget).ForEach(func(k, v []byte) error {
		out[string(k)] = string(v)
		return nil
	})
	return out
}

// errText is err's message, or "ok".
func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// TestBudgetCacheSeesRunningValue runs sequences of budget reads and
// writes in one transaction, once writing through and once caching: every
// step must see what the steps before it charged, the cached run must
// leave bbolt untouched until FlushBudgets, and the flush must store the
// bytes that writing through stored.
func TestBudgetCacheSeesRunningValue(t *testing.T) {
	one := Usage{BudgetCalls: 1}
	tok := func(limits Usage) []Account { return []Account{{TokenID: "tok", Limits: limits}} }
	charge := func(accounts []Account, used Usage) func(*bbolt.Tx) string {
		return func(tx *bbolt.Tx) string { return errText(Charge(tx, accounts, one, used)) }
	}
	remaining := func(accounts []Account) func(*bbolt.Tx) string {
		return func(tx *bbolt.Tx) string {
			left, err := Remaining(tx, accounts)
			if err != nil {
				return err.Error()
			}
			return fmt.Sprint(left)
		}
	}
	prepare := func(op string, limits, reserved Usage, ancestors ...Account) func(*bbolt.Tx) string {
		return func(tx *bbolt.Tx) string {
			p := &Prepare{Intent: Intent{OperationID: op, AgentID: "agent", TokenID: "tok", Ancestors: ancestors, Reserved: reserved}, Limits: limits}
			if err := p.Encode(); err != nil {
				return err.Error()
			}
			_, err := p.Run(tx)
			return errText(err)
		}
	}
	rollback := func(op string, reserved Usage) func(*bbolt.Tx) string {
		return func(tx *bbolt.Tx) string {
			return errText(Rollback(tx, &Intent{OperationID: op, TokenID: "tok", Reserved: reserved}))
		}
	}
	canCommit := func(op string, limits Usage, wrote int64) func(*bbolt.Tx) string {
		return func(tx *bbolt.Tx) string {
			return errText(CanCommit(tx, &Intent{OperationID: op, TokenID: "tok"}, nil, limits, []Effect{{Op: OpWrite, Size: wrote}}))
		}
	}
	type step struct {
		do   func(*bbolt.Tx) string
		want string
	}
	disk := Usage{BudgetDiskWriteBytes: 150}
	parent := Account{TokenID: "parent", Limits: Usage{BudgetCalls: 2}}
	cases := []struct {
		name   string
		before map[string]string
		steps  []step
		after  map[string]string
	}{
		{name: "the second charge is refused at the limit", steps: []step{
			{charge(tok(Usage{BudgetCalls: 1}), nil), "ok"},
			{charge(tok(Usage{BudgetCalls: 1}), nil), "budget_exceeded: budget calls: 1 used + 1 needed > limit 1"},
			{remaining(tok(Usage{BudgetCalls: 1})), "map[calls:0]"},
		}, after: map[string]string{"tok": `{"calls":1}`}},
		{name: "remaining counts every charge so far", before: map[string]string{"tok": `{"calls":1}`}, steps: []step{
			{remaining(tok(Usage{BudgetCalls: 4, BudgetNetBytes: 10})), "map[calls:3 net_bytes:10]"},
			{charge(tok(Usage{BudgetCalls: 4, BudgetNetBytes: 10}), Usage{BudgetNetBytes: 4}), "ok"},
			{remaining(tok(Usage{BudgetCalls: 4, BudgetNetBytes: 10})), "map[calls:2 net_bytes:6]"},
			{charge(tok(Usage{BudgetCalls: 4, BudgetNetBytes: 10}), Usage{BudgetNetBytes: 7}), "budget_exceeded: budget net_bytes: 4 used + 7 needed > limit 10"},
			{remaining(tok(Usage{BudgetCalls: 4, BudgetNetBytes: 10})), "map[calls:1 net_bytes:0]"},
		}, after: map[string]string{"tok": `{"calls":3,"net_bytes":11}`}},
		{name: "a prepare sees a direct call's charge", steps: []step{
			{charge(tok(Usage{BudgetCalls: 2}), nil), "ok"},
			{prepare("op1", Usage{BudgetCalls: 2}, one), "ok"},
			{prepare("op2", Usage{BudgetCalls: 2}, one), "budget_exceeded: budget calls: 2 used + 1 needed > limit 2"},
		}, after: map[string]string{"tok": `{"calls":2}`}},
		{name: "a direct call sees a prepare's reservation", steps: []step{
			{prepare("op1", Usage{BudgetCalls: 2}, one), "ok"},
			{charge(tok(Usage{BudgetCalls: 2}), nil), "ok"},
			{charge(tok(Usage{BudgetCalls: 2}), nil), "budget_exceeded: budget calls: 2 used + 1 needed > limit 2"},
		}, after: map[string]string{"tok": `{"calls":2}`}},
		{name: "a rollback's release is seen", steps: []step{
			{prepare("op1", disk, Usage{BudgetCalls: 1, BudgetDiskWriteBytes: 100}), "ok"},
			{prepare("op2", disk, Usage{BudgetCalls: 1, BudgetDiskWriteBytes: 100}), "budget_exceeded: budget disk_write_bytes: 100 used + 100 needed > limit 150"},
			{canCommit("op1", disk, 60), "budget_exceeded: budget disk_write_bytes: 100 used + 60 needed > limit 150"},
			{rollback("op1", Usage{BudgetCalls: 1, BudgetDiskWriteBytes: 100}), "ok"},
			{canCommit("op3", disk, 60), "ok"},
			{prepare("op3", disk, Usage{BudgetCalls: 1, BudgetDiskWriteBytes: 100}), "ok"},
		}, after: map[string]string{"tok": `{"calls":2,"disk_write_bytes":100}`}},
		{name: "an ancestor's budget is shared", steps: []step{
			{charge([]Account{{TokenID: "tok"}, parent}, nil), "ok"},
			{charge([]Account{parent}, nil), "ok"},
			{prepare("op1", nil, one, parent), "budget_exceeded: budget calls: 2 used + 1 needed > limit 2 of ancestor token parent"},
			{charge([]Account{{TokenID: "tok"}, parent}, nil), "budget_exceeded: budget calls: 2 used + 1 needed > limit 2 of ancestor token parent"},
			{remaining([]Account{{TokenID: "tok", Limits: Usage{BudgetCalls: 5}}, parent}), "map[calls:0]"},
		}, after: map[string]string{"tok": `{"calls":1}`, "parent": `{"calls":2}`}},
		{name: "a token listed twice is charged once per call, as each account's write replaces the other's", steps: []step{
			{charge([]Account{{TokenID: "tok"}, {TokenID: "tok"}}, nil), "ok"},
			{charge([]Account{{TokenID: "tok"}, {TokenID: "tok"}}, nil), "ok"},
			{charge([]Account{{TokenID: "tok"}, {TokenID: "tok"}}, Usage{BudgetNetBytes: 1}), "ok"},
		}, after: map[string]string{"tok": `{"calls":3,"net_bytes":1}`}},
		{name: "a record json.Unmarshal decodes is stored as adjust writes it", before: map[string]string{"tok": `{"calls": 1, "net_bytes": 2}`}, steps: []step{
			{charge(tok(nil), nil), "ok"},
			{charge(tok(nil), Usage{BudgetNetBytes: 1}), "ok"},
		}, after: map[string]string{"tok": `{"calls":3,"net_bytes":3}`}},
		{name: "a refused call that consumed nothing writes nothing", before: map[string]string{"tok": `{"calls": 1}`}, steps: []step{
			{charge(tok(Usage{BudgetCalls: 1}), nil), "budget_exceeded: budget calls: 1 used + 1 needed > limit 1"},
		}, after: map[string]string{"tok": `{"calls": 1}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stored := map[bool]map[string]string{}
			for _, cached := range []bool{false, true} {
				db := openBolt(t, tc.before)
				var tx0 *bbolt.Tx
				if err := db.Update(func(tx *bbolt.Tx) error {
					tx0 = tx
					if cached {
						CacheBudgets(tx)
					}
					for i, s := range tc.steps {
						if got := s.do(tx); got != s.want {
							t.Errorf("cached %v, step %d: %s, want %s", cached, i, got, s.want)
						}
					}
					if cached {
						if got := storedBudgets(tx); !maps.Equal(got, storedBefore(tc.before)) {
							t.Errorf("before the flush, bbolt holds %v, want %v as stored before", got, tc.before)
						}
						if err := FlushBudgets(tx); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				DiscardBudgets(tx0)
				if err := db.View(func(tx *bbolt.Tx) error {
					stored[cached] = storedBudgets(tx)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			if !maps.Equal(stored[true], stored[false]) || !maps.Equal(stored[false], tc.after) {
				t.Errorf("stored when caching %v, writing through %v, want %v", stored[true], stored[false], tc.after)
			}
		})
	}
}

// storedBefore is before, or an empty map for nil.
func storedBefore(before map[string]string) map[string]string {
	if before == nil {
		return map[string]string{}
	}
	return before
}

// TestBudgetCacheDiscard: a rolled-back caching transaction leaves
// nothing in bbolt nor in the cache of the next one, which reads what
// is stored, and nothing of it stays registered.
func TestBudgetCacheDiscard(t *testing.T) {
	db := openBolt(t, map[string]string{"tok": `{"calls":1}`})
	accounts := []Account{{TokenID: "tok", Limits: Usage{BudgetCalls: 3}}}
	one := Usage{BudgetCalls: 1}
	var rolledBack *bbolt.Tx
	rollback := errors.New("roll back")
	err := db.Update(func(tx *bbolt.Tx) error {
		rolledBack = tx
		CacheBudgets(tx)
		for range 2 {
			if err := Charge(tx, accounts, one, Usage{BudgetNetBytes: 7}); err != nil {
				return err
			}
		}
		// Flushed, even: the rollback undoes what the flush wrote.
		if err := FlushBudgets(tx); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("rolled-back transaction: %v", err)
	}
	DiscardBudgets(rolledBack)
	budgetCaches.Lock()
	_, kept := budgetCaches.m[rolledBack]
	budgetCaches.Unlock()
	if kept {
		t.Error("the discarded transaction's cache is still registered")
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		defer DiscardBudgets(tx)
		CacheBudgets(tx)
		if got := storedBudgets(tx); got["tok"] != `{"calls":1}` {
			t.Errorf("after the rollback bbolt holds %v", got)
		}
		left, err := Remaining(tx, accounts)
		if err != nil || !maps.Equal(left, Usage{BudgetCalls: 2}) {
			t.Errorf("next transaction: Remaining = %v (%v), want calls:2", left, err)
		}
		for i, want := range []string{"ok", "ok", "budget_exceeded: budget calls: 3 used + 1 needed > limit 3"} {
			if got := errText(Charge(tx, accounts, one, nil)); got != want {
				t.Errorf("next transaction, charge %d: %s, want %s", i, got, want)
			}
		}
		return FlushBudgets(tx)
	}); err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bbolt.Tx) error {
		if got := storedBudgets(tx); got["tok"] != `{"calls":3}` {
			t.Errorf("stored %v, want calls:3", got)
		}
		return nil
	})
}

// TestBudgetsWriteThrough: a write transaction nobody enabled caching for
// stores each charge at once, and a read-only one reads bbolt even when
// CacheBudgets is called for it.
func TestBudgetsWriteThrough(t *testing.T) {
	db := openBolt(t, map[string]string{"tok": `{"calls":1}`})
	accounts := []Account{{TokenID: "tok", Limits: Usage{BudgetCalls: 5}}}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for i, want := range []string{`{"calls":2}`, `{"calls":3,"net_bytes":4}`} {
			var used Usage
			if i == 1 {
				used = Usage{BudgetNetBytes: 4}
			}
			if err := Charge(tx, accounts, Usage{BudgetCalls: 1}, used); err != nil {
				return err
			}
			if got := storedBudgets(tx)["tok"]; got != want {
				t.Errorf("after charge %d bbolt holds %s, want %s", i, got, want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		CacheBudgets(tx)
		defer DiscardBudgets(tx)
		if budgetCacheOf(tx) != nil {
			t.Error("a read-only transaction caches budgets")
		}
		left, err := Remaining(tx, accounts)
		if err != nil || !maps.Equal(left, Usage{BudgetCalls: 2}) {
			t.Errorf("Remaining = %v (%v), want calls:2", left, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetsGroupCommit queues calls charging one token with a calls
// budget of limit into one group commit of a store wired as the kernel
// wires it: exactly limit are admitted and stored, also when an op of the
// batch aborts and the store runs every op again alone.
func TestBudgetsGroupCommit(t *testing.T) {
	const limit, calls = 5, 12
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
			var mu sync.Mutex
			largest := 0 // the largest batch the store committed or tried
			db, err := store.Open(filepath.Join(t.TempDir(), "k.db"), store.Options{
				NoSync: true, BeginTx: CacheBudgets, BeforeCommit: FlushBudgets, EndTx: DiscardBudgets,
				Observe: func(n int, _ time.Duration) {
					mu.Lock()
					largest = max(largest, n)
					mu.Unlock()
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ctx := context.Background()
			if err := db.Update(ctx, Init); err != nil {
				t.Fatal(err)
			}
			// Hold the sequencer until every call is queued, so that
			// they all make one batch.
			started, release := make(chan struct{}), make(chan struct{})
			held := make(chan error, 1)
			go func() {
				held <- db.Update(ctx, func(*bbolt.Tx) error {
					close(started)
					<-release
					return nil
				})
			}()
			<-started
			accounts := []Account{{TokenID: "tok", Limits: Usage{BudgetCalls: limit}}}
			results := make([]error, calls)
			for i := range calls {
				if abort && i == calls/2 {
					// Charges, then fails: its batch is rolled back.
					if err := db.UpdateAsync(func(tx *bbolt.Tx) error {
						if err := Charge(tx, accounts, Usage{BudgetCalls: 1}, nil); err != nil {
							return err
						}
						return store.Abort(errors.New("failed after charging"))
					}); err != nil {
						t.Fatal(err)
					}
				}
				if err := db.UpdateAsync(func(tx *bbolt.Tx) error {
					// As the kernel does: a refusal is the call's outcome,
					// not the transaction's.
					results[i] = Charge(tx, accounts, Usage{BudgetCalls: 1}, nil)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			close(release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			// Queued after every call: done once they all are.
			if err := db.Update(ctx, func(*bbolt.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			// A lone call refused at the limit whose consumption is
			// charged all the same: its error fails it, yet what it
			// charged commits, as it does writing through.
			if err := db.Update(ctx, func(tx *bbolt.Tx) error {
				return Charge(tx, accounts, Usage{BudgetCalls: 1}, Usage{BudgetNetBytes: 3})
			}); classOf(err) != ClassBudget {
				t.Errorf("charge past the limit: %v", err)
			}
			mu.Lock()
			if largest < calls {
				t.Errorf("largest batch %d: the %d calls did not make one batch", largest, calls)
			}
			mu.Unlock()
			admitted := 0
			for i, err := range results {
				switch {
				case err == nil:
					admitted++
				case classOf(err) != ClassBudget:
					t.Errorf("call %d: %v", i, err)
				}
			}
			if admitted != limit {
				t.Errorf("%d of %d calls admitted, want %d", admitted, calls, limit)
			}
			for i := range limit {
				if results[i] != nil {
					t.Errorf("call %d refused (%v): the first %d in queue order fit", i, results[i], limit)
				}
			}
			db.View(func(tx *bbolt.Tx) error {
				if got := storedBudgets(tx); got["tok"] != fmt.Sprintf(`{"calls":%d,"net_bytes":3}`, limit) {
					t.Errorf("stored %v, want calls:%d, net_bytes:3", got, limit)
				}
				return nil
			})
			budgetCaches.Lock()
			if n := len(budgetCaches.m); n != 0 {
				t.Errorf("%d transactions' caches left registered", n)
			}
			budgetCaches.Unlock()
		})
	}
}

// BenchmarkChargeBatch charges one token 32 times per write transaction,
// as a group commit of direct calls does (echo's consume nothing, others
// some net_bytes), writing through and caching: the time per call is
// serial time on the store's sequencer.
func BenchmarkChargeBatch(b *testing.B) {
	const batch = 32
	accounts := []Account{{TokenID: "019a0b5c-7f3e-7a41-9c55-3b1f2d4e6a80", Limits: Usage{BudgetCalls: 1 << 40}}}
	want := Usage{BudgetCalls: 1}
	for _, used := range []Usage{nil, {BudgetNetBytes: 10}} {
		for _, cached := range []bool{false, true} {
			b.Run(fmt.Sprintf("used=%d/cached=%v", len(used), cached), func(b *testing.B) {
				db := openBolt(b, nil)
				b.ReportAllocs()
				for n := 0; n < b.N; n += batch {
					if err := db.Update(func(tx *bbolt.Tx) error {
						if cached {
							CacheBudgets(tx)
							defer DiscardBudgets(tx)
						}
						for range min(batch, b.N-n) {
							if err := Charge(tx, accounts, want, used); err != nil {
								return err
							}
						}
						return FlushBudgets(tx)
					}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestBudgetsAfterBatchFailsOnce: a batch whose AfterBatch fails is rolled
// back with everything its ops charged in the cache, and each op runs again
// alone: exactly the limit is admitted, and the stored usages count each
// admitted call once. A lazy charge, and an op that fails with a plain
// error after charging (its writes commit, as they would written through),
// are counted once too; no cache outlives its transaction.
func TestBudgetsAfterBatchFailsOnce(t *testing.T) {
	const limit, calls = 4, 10
	var fail atomic.Bool
	fail.Store(true)
	db, err := store.Open(filepath.Join(t.TempDir(), "k.db"), store.Options{
		NoSync: true, BeginTx: CacheBudgets, BeforeCommit: FlushBudgets, EndTx: DiscardBudgets,
		AfterBatch: func(tx *bbolt.Tx) error {
			if len(budgetCacheOf(tx)) > 0 && fail.CompareAndSwap(true, false) {
				return errors.New("after batch fails once")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	fail.Store(false)
	if err := db.Update(ctx, Init); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	started, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- db.Update(ctx, func(*bbolt.Tx) error { close(started); <-release; return nil })
	}()
	<-started
	fail.Store(true)
	accounts := []Account{{TokenID: "child", Limits: Usage{BudgetCalls: limit}}, {TokenID: "parent", Limits: Usage{BudgetCalls: limit + 1}}}
	results := make([]error, calls)
	for i := range calls {
		if i == 3 {
			// A lazy charge of the parent alone.
			db.UpdateLazy(func(tx *bbolt.Tx) error {
				return Charge(tx, accounts[1:], Usage{BudgetCalls: 1}, nil)
			})
		}
		if i == 5 {
			// A plain error after charging what was consumed.
			db.UpdateAsync(func(tx *bbolt.Tx) error {
				if err := Charge(tx, accounts, nil, Usage{BudgetNetBytes: 7}); err != nil {
					return err
				}
				return errors.New("plain error after charge")
			})
		}
		db.UpdateAsync(func(tx *bbolt.Tx) error {
			results[i] = Charge(tx, accounts, Usage{BudgetCalls: 1}, nil)
			return nil
		})
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := db.Update(ctx, func(*bbolt.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if fail.Load() {
		t.Fatal("AfterBatch never failed")
	}
	admitted := 0
	for _, e := range results {
		if e == nil {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("%d calls admitted, want %d (%v)", admitted, limit, results)
	}
	db.View(func(tx *bbolt.Tx) error {
		got := storedBudgets(tx)
		if got["child"] != fmt.Sprintf(`{"calls":%d,"net_bytes":7}`, limit) || got["parent"] != fmt.Sprintf(`{"calls":%d,"net_bytes":7}`, limit+1) {
			t.Errorf("stored usages %v", got)
		}
		return nil
	})
	budgetCaches.Lock()
	if n := len(budgetCaches.m); n != 0 {
		t.Errorf("%d budget caches outlived their transactions", n)
	}
	budgetCaches.Unlock()
}
