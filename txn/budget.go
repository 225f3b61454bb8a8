package txn

import (
	"encoding/json"
	"errors"
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

// Account is a token whose budgets a call is charged to, and their
// limits (a budget absent from Limits is unlimited). A call is charged to
// its own token's account and to the account of every token that one was
// attenuated from, in one transaction, so a parent's budget shared by its
// children is never overspent.
type Account struct {
	TokenID string `json:"jti"`
	Limits  Usage  `json:"limits,omitempty"`
}

// check refuses when want, added to what any account has used, exceeds
// that account's limits. It writes nothing.
func check(tx *bbolt.Tx, accounts []Account, want Usage) error {
	for i, a := range accounts {
		used, err := usageOf(tx, a.TokenID)
		if err != nil {
			return err
		}
		if err := checkBudget(used, want, a.Limits); err != nil {
			var e *Error
			if i > 0 && errors.As(err, &e) {
				e.Message = fmt.Sprintf("%s of ancestor token %s", e.Message, a.TokenID)
			}
			return err
		}
	}
	return nil
}

// charge adds delta to every account's usage, whatever the limits.
func charge(tx *bbolt.Tx, accounts []Account, delta Usage) error {
	for _, a := range accounts {
		used, err := usageOf(tx, a.TokenID)
		if err != nil {
			return err
		}
		if err := adjust(tx, a.TokenID, used, delta); err != nil {
			return err
		}
	}
	return nil
}

// Charge consumes want from the accounts' budgets in one step, for calls
// that need no prepare (non-mutating calls without an idempotency key). It
// writes nothing when a limit of any account would be exceeded.
func Charge(tx *bbolt.Tx, accounts []Account, want Usage) error {
	if err := check(tx, accounts, want); err != nil {
		return err
	}
	return charge(tx, accounts, want)
}

// Consume adds used, what a call that already ran consumed, to every
// account whatever the limits: the bytes were sent, the CPU was spent. It
// returns a budget refusal when that takes a budget past its limit.
func Consume(tx *bbolt.Tx, accounts []Account, used Usage) error {
	if len(used) == 0 {
		return nil
	}
	over := check(tx, accounts, used)
	if err := charge(tx, accounts, used); err != nil {
		return err
	}
	return over
}

// Remaining returns, for each budget an account limits, what is left of it
// across the accounts: the least any of them has left (never below 0).
// Budgets no account limits are absent from the result.
func Remaining(tx *bbolt.Tx, accounts []Account) (Usage, error) {
	left := Usage{}
	for _, a := range accounts {
		used, err := usageOf(tx, a.TokenID)
		if err != nil {
			return nil, err
		}
		for n, l := range a.Limits {
			v := max(l-used[n], 0)
			if cur, ok := left[n]; !ok || v < cur {
				left[n] = v
			}
		}
	}
	return left, nil
}
