package txn

import (
	"maps"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// TestCharge: a call is counted only when no account's limit refuses it,
// what it consumed is charged whatever the limits, each refusal is
// returned, and a refused call that consumed nothing writes nothing.
func TestCharge(t *testing.T) {
	one := Usage{BudgetCalls: 1}
	cases := []struct {
		name      string
		accounts  []Account
		before    map[string]Usage // stored usage per token
		used      Usage
		want      map[string]Usage
		refusals  []string // substrings of the error, in order; none: nil error
		unwritten bool     // the refused call writes no record
	}{
		{name: "within limits", accounts: []Account{{TokenID: "t", Limits: Usage{BudgetCalls: 2}}},
			used: Usage{BudgetNetBytes: 10}, want: map[string]Usage{"t": {BudgetCalls: 1, BudgetNetBytes: 10}}},
		{name: "no limits, nothing consumed", accounts: []Account{{TokenID: "t"}},
			want: map[string]Usage{"t": {BudgetCalls: 1}}},
		{name: "calls spent: consumption still charged", accounts: []Account{{TokenID: "t", Limits: Usage{BudgetCalls: 1}}},
			before: map[string]Usage{"t": {BudgetCalls: 1}}, used: Usage{BudgetNetBytes: 10},
			want: map[string]Usage{"t": {BudgetCalls: 1, BudgetNetBytes: 10}}, refusals: []string{"budget calls: 1 used + 1 needed > limit 1"}},
		{name: "calls spent, nothing consumed: nothing written", accounts: []Account{{TokenID: "t", Limits: Usage{BudgetCalls: 1}}},
			before: map[string]Usage{"t": {BudgetCalls: 1}},
			want:   map[string]Usage{"t": {BudgetCalls: 1}}, refusals: []string{"budget calls"}, unwritten: true},
		{name: "consumption past a limit", accounts: []Account{{TokenID: "t", Limits: Usage{BudgetNetBytes: 5}}},
			used: Usage{BudgetNetBytes: 10}, want: map[string]Usage{"t": {BudgetCalls: 1, BudgetNetBytes: 10}},
			refusals: []string{"budget net_bytes: 0 used + 10 needed > limit 5"}},
		{name: "both refused", accounts: []Account{{TokenID: "t", Limits: Usage{BudgetCalls: 1, BudgetNetBytes: 5}}},
			before: map[string]Usage{"t": {BudgetCalls: 1}}, used: Usage{BudgetNetBytes: 10},
			want:     map[string]Usage{"t": {BudgetCalls: 1, BudgetNetBytes: 10}},
			refusals: []string{"budget calls", "budget net_bytes"}},
		{name: "ancestor's limit refuses for both", accounts: []Account{{TokenID: "child"}, {TokenID: "parent", Limits: Usage{BudgetCalls: 3}}},
			before: map[string]Usage{"parent": {BudgetCalls: 3}}, used: Usage{BudgetNetBytes: 1},
			want:     map[string]Usage{"child": {BudgetNetBytes: 1}, "parent": {BudgetCalls: 3, BudgetNetBytes: 1}},
			refusals: []string{"of ancestor token parent"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if err := e.update(func(tx *bbolt.Tx) error {
				for id, u := range tc.before {
					if err := putUsage(tx, id, u); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if tc.unwritten {
				// A record Charge never writes (it writes no spaces): it
				// stays as it is unless Charge writes one.
				if err := e.update(func(tx *bbolt.Tx) error {
					return tx.Bucket(bucketBudget).Put([]byte("t"), []byte(`{"calls": 1}`))
				}); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			if uerr := e.update(func(tx *bbolt.Tx) error { err = Charge(tx, tc.accounts, one, tc.used); return nil }); uerr != nil {
				t.Fatal(uerr)
			}
			if tc.unwritten {
				e.view(func(tx *bbolt.Tx) error {
					if v := tx.Bucket(bucketBudget).Get([]byte("t")); string(v) != `{"calls": 1}` {
						t.Errorf("record rewritten: %s", v)
					}
					return nil
				})
			}
			if len(tc.refusals) == 0 && err != nil {
				t.Fatalf("Charge: %v", err)
			}
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			at := 0
			for _, r := range tc.refusals {
				i := strings.Index(msg[at:], r)
				if i < 0 {
					t.Fatalf("error %q lacks %q (in order)", msg, r)
				}
				at += i + len(r)
			}
			if len(tc.refusals) > 0 && classOf(err) != ClassBudget {
				t.Fatalf("class %q, want %q", classOf(err), ClassBudget)
			}
			e.view(func(tx *bbolt.Tx) error {
				for _, a := range tc.accounts {
					got, err := usageOf(tx, a.TokenID)
					if err != nil {
						t.Fatal(err)
					}
					if w := tc.want[a.TokenID]; !maps.Equal(got, w) && !(len(got) == 0 && len(w) == 0) {
						t.Errorf("token %s: usage %v, want %v", a.TokenID, got, w)
					}
				}
				return nil
			})
		})
	}
}

// TestCheckBudget: the refusal names the first refused budget in name
// order, whatever the map order; budgets without a limit never refuse.
func TestCheckBudget(t *testing.T) {
	want := Usage{BudgetCalls: 1, BudgetCPUMillis: 3, BudgetDiskWriteBytes: 4, BudgetNetBytes: 5}
	cases := []struct {
		name   string
		used   Usage
		limits Usage
		refuse string // "" for none
	}{
		{"no limits", Usage{BudgetCalls: 100}, nil, ""},
		{"within every limit", nil, Usage{BudgetCalls: 1, BudgetCPUMillis: 3, BudgetDiskWriteBytes: 4, BudgetNetBytes: 5}, ""},
		{"all refused", Usage{BudgetCalls: 1}, Usage{BudgetCalls: 1, BudgetCPUMillis: 1, BudgetDiskWriteBytes: 1, BudgetNetBytes: 1},
			"budget calls: 1 used + 1 needed > limit 1"},
		{"the later ones refused", Usage{BudgetNetBytes: 2}, Usage{BudgetCalls: 5, BudgetDiskWriteBytes: 3, BudgetNetBytes: 6},
			"budget disk_write_bytes: 0 used + 4 needed > limit 3"},
		{"the last one refused", Usage{BudgetNetBytes: 2}, Usage{BudgetNetBytes: 6, "x": 0}, "budget net_bytes: 2 used + 5 needed > limit 6"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Maps iterate in a new order each time: try several.
			for range 20 {
				err := checkBudget(tc.used, want, tc.limits)
				if got := errText(err); tc.refuse == "" && err != nil || tc.refuse != "" && (classOf(err) != ClassBudget || !strings.HasSuffix(got, tc.refuse)) {
					t.Fatalf("checkBudget = %v, want %q", err, tc.refuse)
				}
			}
		})
	}
}
