package txn

import (
	"encoding/json"
	"fmt"
	"sort"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
)

// Usage counts budget units by name: calls, cpu_ms, disk_write_bytes,
// net_bytes.
type Usage map[string]int64

// Budget names, as capability tokens name them.
const (
	BudgetCalls          = captoken.BudgetCalls
	BudgetCPUMillis      = captoken.BudgetCPUMillis
	BudgetDiskWriteBytes = captoken.BudgetDiskWriteBytes
	BudgetNetBytes       = captoken.BudgetNetBytes
)

func usageOf(tx *bbolt.Tx, tokenID string) (Usage, error) {
	u := Usage{}
	if v := tx.Bucket(bucketBudget).Get([]byte(tokenID)); v != nil {
		if err := json.Unmarshal(v, &u); err != nil {
			return nil, fmt.Errorf("txn: budget record of token %s: %w", tokenID, err)
		}
	}
	return u, nil
}

// checkBudget refuses when used+want exceeds any limit. Names absent from
// limits are unlimited.
func checkBudget(used, want, limits Usage) error {
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		limit, ok := limits[n]
		if !ok {
			continue
		}
		if used[n]+want[n] > limit {
			return refuse(ClassBudget, "budget %s: %d used + %d needed > limit %d", n, used[n], want[n], limit)
		}
	}
	return nil
}

// adjust adds delta to the token's usage.
func adjust(tx *bbolt.Tx, tokenID string, used, delta Usage) error {
	for n, d := range delta {
		used[n] += d
		if used[n] < 0 {
			used[n] = 0
		}
	}
	v, err := json.Marshal(used)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketBudget).Put([]byte(tokenID), v)
}

// Charge consumes want from the token's budgets in one step, for calls that
// need no prepare (non-mutating calls without an idempotency key). It writes
// nothing when a limit would be exceeded.
func Charge(tx *bbolt.Tx, tokenID string, want, limits Usage) error {
	used, err := usageOf(tx, tokenID)
	if err != nil {
		return err
	}
	if err := checkBudget(used, want, limits); err != nil {
		return err
	}
	return adjust(tx, tokenID, used, want)
}

// Consume adds used, what a call that already ran consumed, to the token's
// budgets whatever the limits: the bytes were sent, the CPU was spent. It
// returns a budget refusal when that takes a budget past its limit.
func Consume(tx *bbolt.Tx, tokenID string, used, limits Usage) error {
	if len(used) == 0 {
		return nil
	}
	before, err := usageOf(tx, tokenID)
	if err != nil {
		return err
	}
	over := checkBudget(before, used, limits)
	if err := adjust(tx, tokenID, before, used); err != nil {
		return err
	}
	return over
}

// Remaining returns, for each budget limits names, what is left of it for
// the token (never below 0). Budgets absent from limits are unlimited and
// absent from the result.
func Remaining(tx *bbolt.Tx, tokenID string, limits Usage) (Usage, error) {
	used, err := usageOf(tx, tokenID)
	if err != nil {
		return nil, err
	}
	left := Usage{}
	for n, l := range limits {
		left[n] = max(l-used[n], 0)
	}
	return left, nil
}
