package txn

import (
	"encoding/json"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// TestDiskWriteBudgetCountsKVValues: a kv put's value is charged to
// disk_write_bytes at commit like a written file's content (its JSON
// bytes as stored; the key is not counted), so a put past the limit is
// refused budget_exceeded and one within it is charged. kv values were
// stored for free before (found by review: five puts of 900 KiB
// committed under disk_write_bytes=10).
func TestDiskWriteBudgetCountsKVValues(t *testing.T) {
	put := func(key, value string) Effect {
		return Effect{Op: OpKVPut, Key: key, Value: json.RawMessage(value), Version: 1, Size: int64(len(value))}
	}
	write := func(size int64) Effect { return Effect{Op: OpWrite, Root: "/r", Path: "f", Size: size} }
	big := `"` + strings.Repeat("x", 900<<10) + `"`
	cases := []struct {
		name    string
		limit   int64 // disk_write_bytes
		effects []Effect
		refused string // CanCommit's refusal, "" for none
		charged int64  // disk_write_bytes charged by Spend when admitted
	}{
		{name: "a value within the limit", limit: 10, effects: []Effect{put("k", `"abcd"`)}, charged: 6},
		{name: "the key does not count", limit: 6, effects: []Effect{put(strings.Repeat("k", 200), `"abcd"`)}, charged: 6},
		{name: "a value past the limit", limit: 10, effects: []Effect{put("k", big)},
			refused: "budget disk_write_bytes: 0 used + 921602 needed > limit 10"},
		{name: "values and files add up", limit: 10, effects: []Effect{put("a", `123`), put("b", `45`), write(6)},
			refused: "budget disk_write_bytes: 0 used + 11 needed > limit 10"},
		{name: "values and files at the limit", limit: 11, effects: []Effect{put("a", `123`), put("b", `45`), write(6)}, charged: 11},
		{name: "a deletion is free", limit: 1, effects: []Effect{{Op: OpDelete, Root: "/r", Path: "f", Size: 50}}, charged: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := newPrepare("op", "key")
			p.Limits = Usage{BudgetDiskWriteBytes: tc.limit}
			if _, err := e.prepare(p); err != nil {
				t.Fatal(err)
			}
			in := &p.Intent
			err := e.update(func(tx *bbolt.Tx) error {
				if err := CanCommit(tx, in, nil, p.Limits, tc.effects); err != nil {
					return err
				}
				return Spend(tx, in, tc.effects)
			})
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("CanCommit refused %v", err)
			case tc.refused != "" && (classOf(err) != ClassBudget || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("CanCommit: %v, want %s %q", err, ClassBudget, tc.refused)
			}
			e.view(func(tx *bbolt.Tx) error {
				u, err := usageOf(tx, "tok")
				if err != nil || u[BudgetDiskWriteBytes] != tc.charged {
					t.Errorf("disk_write_bytes charged: %v (%v), want %d", u, err, tc.charged)
				}
				return nil
			})
		})
	}
}
