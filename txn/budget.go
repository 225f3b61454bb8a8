package txn

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"

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

// usageOf returns the usage of token tokenID in tx, for the caller to
// change: the running value when tx caches budgets (CacheBudgets), else
// the stored one.
func usageOf(tx *bbolt.Tx, tokenID string) (Usage, error) {
	c := budgetCacheOf(tx)
	if u, ok := c.peek(tokenID); ok {
		return maps.Clone(u), nil
	}
	u, err := loadUsage(tx, tokenID)
	if err != nil || c == nil {
		return u, err
	}
	c.keep(tokenID, maps.Clone(u), false)
	return u, nil
}

// loadUsage decodes the stored usage of token tokenID.
func loadUsage(tx *bbolt.Tx, tokenID string) (Usage, error) {
	v := tx.Bucket(bucketBudget).Get([]byte(tokenID))
	if u, ok := parseUsage(v); ok {
		return u, nil
	}
	u := Usage{}
	if err := json.Unmarshal(v, &u); err != nil {
		return nil, fmt.Errorf("txn: budget record of token %s: %w", tokenID, err)
	}
	return u, nil
}

// parseUsage decodes a budget record as adjust writes it ({"name":n,…}
// with plain names and integers, no whitespace) without encoding/json's
// reflection; ok is false for anything else, which json.Unmarshal then
// decodes (or refuses). A nil record is an empty usage.
func parseUsage(v []byte) (u Usage, ok bool) {
	u = Usage{}
	if v == nil {
		return u, true
	}
	if len(v) < 2 || v[0] != '{' || v[len(v)-1] != '}' {
		return nil, false
	}
	rest := v[1 : len(v)-1]
	for len(rest) > 0 {
		if rest[0] != '"' {
			return nil, false
		}
		end := bytes.IndexByte(rest[1:], '"')
		if end < 0 || end+2 >= len(rest) || rest[end+2] != ':' {
			return nil, false
		}
		name := rest[1 : end+1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return nil, false
		}
		rest = rest[end+3:]
		i := 0
		for i < len(rest) && rest[i] != ',' {
			i++
		}
		n, err := strconv.ParseInt(string(rest[:i]), 10, 64)
		if err != nil {
			return nil, false
		}
		if _, dup := u[string(name)]; dup {
			return nil, false
		}
		u[string(name)] = n
		if i < len(rest) {
			i++ // the comma
			if i == len(rest) {
				return nil, false
			}
		}
		rest = rest[i:]
	}
	return u, true
}

// appendUsage appends u as json.Marshal writes it: names sorted, each
// escaped as encoding/json does.
func appendUsage(b []byte, u Usage) ([]byte, error) {
	names := make([]string, 0, len(u))
	for n := range u {
		names = append(names, n)
	}
	sort.Strings(names)
	b = append(b, '{')
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		if plainName(n) {
			// Budget names are plain (calls, cpu_ms, …): quoted as they are.
			b = append(append(append(b, '"'), n...), '"')
		} else {
			k, err := json.Marshal(n)
			if err != nil {
				return nil, err
			}
			b = append(b, k...)
		}
		b = append(b, ':')
		b = strconv.AppendInt(b, u[n], 10)
	}
	return append(b, '}'), nil
}

// plainName reports whether json.Marshal writes name as it is, quoted:
// ASCII letters, digits, '_', '-' and '.'.
func plainName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// checkBudget refuses when used+want exceeds any limit, naming the first
// such budget in name order. Names absent from limits are unlimited.
func checkBudget(used, want, limits Usage) error {
	// The least refused name, found without sorting: this runs for every
	// call on the store's sequencer.
	first, refused := "", false
	for n, w := range want {
		if limit, ok := limits[n]; ok && used[n]+w > limit && (!refused || n < first) {
			first, refused = n, true
		}
	}
	if !refused {
		return nil
	}
	return refuse(ClassBudget, "budget %s: %d used + %d needed > limit %d", first, used[first], want[first], limits[first])
}

// add adds delta to used, never below 0.
func add(used, delta Usage) {
	for n, d := range delta {
		used[n] += d
		if used[n] < 0 {
			used[n] = 0
		}
	}
}

// putUsage stores the token's usage: in tx's cache when tx caches
// budgets, which then owns used (the caller must not change it after),
// else in bbolt. It refuses a token id bbolt refuses as a key, as
// storing it would.
func putUsage(tx *bbolt.Tx, tokenID string, used Usage) error {
	c := budgetCacheOf(tx)
	if c == nil {
		return storeUsage(tx, tokenID, used)
	}
	switch {
	case len(tokenID) == 0:
		return bbolt.ErrKeyRequired
	case len(tokenID) > bbolt.MaxKeySize:
		return bbolt.ErrKeyTooLarge
	}
	c.keep(tokenID, used, true)
	return nil
}

// storeUsage writes the token's usage to bbolt.
func storeUsage(tx *bbolt.Tx, tokenID string, used Usage) error {
	v, err := appendUsage(make([]byte, 0, 64), used)
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

// usages returns every account's usage, decoded once per call.
func usages(tx *bbolt.Tx, accounts []Account) ([]Usage, error) {
	out := make([]Usage, len(accounts))
	for i, a := range accounts {
		u, err := usageOf(tx, a.TokenID)
		if err != nil {
			return nil, err
		}
		out[i] = u
	}
	return out, nil
}

// Check refuses, with the *Error Charge would give, when want, added to
// what any account has used, exceeds that account's limits. It writes
// nothing: a call checks it before it runs, and Charge, at its record,
// decides, since concurrent calls may spend the budget in between.
func Check(tx *bbolt.Tx, accounts []Account, want Usage) error {
	used, err := usages(tx, accounts)
	if err != nil {
		return err
	}
	return checkUsed(accounts, used, want)
}

// charge adds delta to every account's usage, whatever the limits.
func charge(tx *bbolt.Tx, accounts []Account, delta Usage) error {
	used, err := usages(tx, accounts)
	if err != nil {
		return err
	}
	return chargeUsed(tx, accounts, used, delta)
}

// checkUsed is check against the accounts' usages used, decoded by the
// caller.
func checkUsed(accounts []Account, used []Usage, want Usage) error {
	for i, a := range accounts {
		if err := checkBudget(used[i], want, a.Limits); err != nil {
			var e *Error
			if i > 0 && errors.As(err, &e) {
				e.Message = fmt.Sprintf("%s of ancestor token %s", e.Message, a.TokenID)
			}
			return err
		}
	}
	return nil
}

// chargeUsed is charge with the accounts' usages used, decoded by the
// caller; it updates them.
func chargeUsed(tx *bbolt.Tx, accounts []Account, used []Usage, delta Usage) error {
	for i, a := range accounts {
		add(used[i], delta)
		if err := putUsage(tx, a.TokenID, used[i]); err != nil {
			return err
		}
	}
	return nil
}

// Charge charges a call that needed no prepare (a non-mutating call
// without an idempotency key) when it is recorded, in one read and one
// write of each account: want (the call itself) only if no account's
// limit refuses it, and used (what the call consumed running: the bytes
// were sent, the CPU was spent) whatever the limits. It writes nothing
// when want is refused and used is empty. The error joins want's budget
// refusal and the refusal for used taking a budget past its limit.
func Charge(tx *bbolt.Tx, accounts []Account, want, used Usage) error {
	have, err := usages(tx, accounts)
	if err != nil {
		return err
	}
	refused := checkUsed(accounts, have, want)
	if refused == nil {
		for i := range accounts {
			add(have[i], want)
		}
	}
	var over error
	if len(used) > 0 {
		over = checkUsed(accounts, have, used)
		for i := range accounts {
			add(have[i], used)
		}
	}
	if refused == nil || len(used) > 0 {
		for i, a := range accounts {
			if err := putUsage(tx, a.TokenID, have[i]); err != nil {
				return err
			}
		}
	}
	return errors.Join(refused, over)
}

// Limited reports whether any of accounts has a limit: Check and Remaining
// of accounts without one need no transaction.
func Limited(accounts []Account) bool {
	for _, a := range accounts {
		if len(a.Limits) > 0 {
			return true
		}
	}
	return false
}

// Remaining returns, for each budget an account limits, what is left of it
// across the accounts: the least any of them has left (never below 0).
// Budgets no account limits are absent from the result. In a write
// transaction that caches budgets (CacheBudgets) it counts every charge
// made in it so far, flushed or not; a read-only transaction reads what
// is stored.
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
