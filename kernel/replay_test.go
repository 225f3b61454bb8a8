package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/txn"
)

// history makes a small history with every kind of idempotent outcome: a
// committed write and its replay, a conflict, a rolled-back write retried
// to commit, reads and a refusal.
func history(t *testing.T) *harness {
	h := newHarness(t)
	w := map[string]any{"path": "a.txt", "content": "one"}
	mustOK(t, h.invoke("fs.write", w, key("k1")))
	if r := h.invoke("fs.write", w, key("k1")); !r.Replayed {
		t.Fatalf("not replayed: %+v", r)
	}
	if r := h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "two"}, key("k1")); errClass(r) != ErrIdempotencyConflict {
		t.Fatalf("conflict: %+v", r.Error)
	}
	stale := func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{{Ref: "fs:b.txt", Absent: true}} }
	h.write("b.txt", "exists")
	if r := h.invoke("fs.write", map[string]any{"path": "b.txt", "content": "x"}, key("k2"), stale); errClass(r) != ErrPreconditionFailed {
		t.Fatalf("stale precondition: %+v", r.Error)
	}
	if err := os.Remove(filepath.Join(h.ws, "b.txt")); err != nil {
		t.Fatal(err)
	}
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "b.txt", "content": "x"}, key("k2"), stale))
	mustOK(t, h.invoke("fs.read", map[string]any{"path": "a.txt"}))
	if r := h.invoke("fs.read", map[string]any{"path": "../etc/passwd"}); errClass(r) != ErrScopeDenied {
		t.Fatalf("escape: %+v", r.Error)
	}
	return h
}

func TestReplayVerifyProvesHistory(t *testing.T) {
	h := history(t)
	rep, err := h.k.Inspector().ReplayVerify()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 0 {
		t.Fatalf("problems in a clean history: %+v", rep.Problems)
	}
	if rep.Committed != 2 || rep.Replays != 1 || rep.Keys != 2 || rep.Calls != 7 || rep.Receipts != 0 {
		t.Fatalf("report = %+v, want 2 committed keys, 1 replay, 7 calls and no JWS receipts", rep)
	}
	hs, err := h.k.Inspector().ReplayShow("k1", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || len(hs[0].Calls) != 3 || hs[0].Calls[1].ReplayOf != hs[0].Calls[0].OperationID ||
		hs[0].Calls[1].ResultHash != hs[0].Calls[0].ResultHash || hs[0].Calls[2].ErrorClass != ErrIdempotencyConflict {
		t.Fatalf("replay show k1 = %+v", hs)
	}
}

// TestReplayVerifyRefutes tampers with the stores behind the kernel's back
// and checks each tampering is named, with its key.
func TestReplayVerifyRefutes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, h *harness, tx *bbolt.Tx)
		kind   string
		key    string
	}{
		{"stored outcome changed", func(t *testing.T, h *harness, tx *bbolt.Tx) {
			editStoredOutcome(t, tx, "k1", func(r map[string]any) { r["result_hash"] = "blake3:" + strings.Repeat("0", 64) })
		}, ProblemIdemTable, "k1"},
		{"key dropped from the table", func(t *testing.T, h *harness, tx *bbolt.Tx) {
			if err := tx.Bucket([]byte("idempotency")).Delete([]byte("agent-1\x00k2")); err != nil {
				t.Fatal(err)
			}
		}, ProblemIdemTable, "k2"},
		{"a second committed effect", func(t *testing.T, h *harness, tx *bbolt.Tx) {
			c := firstCommitted(t, tx, "k1")
			c.OperationID = "01900000-0000-7000-8000-000000000000"
			b, _ := json.Marshal(c.auditRecord)
			if _, err := ledger.Append(tx, ledger.KindAudit, time.Now(), b); err != nil {
				t.Fatal(err)
			}
		}, ProblemDoubleCommit, "k1"},
		{"a replay with another result", func(t *testing.T, h *harness, tx *bbolt.Tx) {
			c := firstCommitted(t, tx, "k1")
			c.ReplayOf, c.TxOutcome, c.OperationID = c.OperationID, NoOp, "01900000-0000-7000-8000-000000000001"
			c.Commitments.Result = "blake3:" + strings.Repeat("1", 64)
			b, _ := json.Marshal(c.auditRecord)
			if _, err := ledger.Append(tx, ledger.KindAudit, time.Now(), b); err != nil {
				t.Fatal(err)
			}
		}, ProblemReplayMismatch, "k1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := history(t)
			if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
				tc.tamper(t, h, tx)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			rep, err := h.k.Inspector().ReplayVerify()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range rep.Problems {
				if p.Kind == tc.kind && p.Key == tc.key {
					found = true
				}
			}
			if !found {
				t.Fatalf("problems = %+v, want a %s problem for key %s", rep.Problems, tc.kind, tc.key)
			}
		})
	}
}

// editStoredOutcome edits the stored result envelope key k of agent-1
// replays: the operations table's row of the operation holding the key
// (the key's row refers to it).
func editStoredOutcome(t *testing.T, tx *bbolt.Tx, k string, edit func(map[string]any)) {
	t.Helper()
	var row struct {
		OperationID string          `json:"operation_id"`
		Result      json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(tx.Bucket([]byte("idempotency")).Get([]byte("agent-1\x00"+k)), &row); err != nil {
		t.Fatal(err)
	}
	if row.Result != nil {
		t.Fatalf("key %s holds its own copy of the outcome of committed operation %s", k, row.OperationID)
	}
	ops := tx.Bucket([]byte("operations"))
	env, err := txn.GetOperation(tx, row.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(env, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	v, _ := json.Marshal(m)
	if err := ops.Put([]byte(row.OperationID), v); err != nil {
		t.Fatal(err)
	}
}

func firstCommitted(t *testing.T, tx *bbolt.Tx, k string) *CallRecord {
	t.Helper()
	var out *CallRecord
	ledger.Scan(tx, 0, func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit || out != nil {
			return nil
		}
		c, err := DecodeCall(e)
		if err != nil {
			t.Fatal(err)
		}
		if c.IdempotencyKey == k && c.TxOutcome == Committed {
			out = c
		}
		return nil
	})
	if out == nil {
		t.Fatalf("no committed record for %s", k)
	}
	return out
}

// A JWS receipt entry (as kernels that signed every receipt wrote them)
// that is signed by the kernel's key but does not attest the record it
// names is a receipt problem.
func TestReplayVerifyForgedReceipt(t *testing.T) {
	h := history(t)
	key, err := LoadKey(filepath.Join(h.data, ReceiptKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		var r *receipts.Receipt
		ledger.Scan(tx, 0, func(e ledger.Entry) error {
			if e.Kind == ledger.KindAudit && r == nil {
				r, _ = receipts.Summarize(e)
			}
			return nil
		})
		// A record with commitments states no plain result_hash to
		// contradict; the forged receipt claims another outcome.
		r.ReceiptID, r.TxOutcome = "0194a0a4-7c00-7000-8000-000000000003", RolledBack
		jws, err := receipts.NewSigner(key).Sign(r)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(receiptBody{ReceiptID: r.ReceiptID, OperationID: r.OperationID, JWS: jws})
		_, err = ledger.Append(tx, ledger.KindReceipt, time.Now(), b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rep, err := h.k.Inspector().ReplayVerify()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != ProblemReceipt || !strings.Contains(rep.Problems[0].Detail, "tx_outcome") {
		t.Fatalf("problems = %+v, want one receipt problem about tx_outcome", rep.Problems)
	}
}

func TestInspector(t *testing.T) {
	h := history(t)
	in := h.k.Inspector()
	list, err := in.Receipts(ReceiptFilter{TxOutcome: Committed})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("%d committed receipts, want 2", len(list))
	}
	for _, r := range list {
		got, err := in.Receipt(r.ReceiptID)
		if err != nil || got.JWS != r.JWS || got.Seq != r.Seq {
			t.Fatalf("Receipt(%s) = %+v, %v", r.ReceiptID, got, err)
		}
		env, err := in.Operation(r.OperationID)
		if err != nil || !strings.Contains(string(env), r.ReceiptID) {
			t.Fatalf("Operation(%s) = %s, %v", r.OperationID, env, err)
		}
	}
	if errs, _ := in.Receipts(ReceiptFilter{TxOutcome: "error"}); len(errs) != 3 {
		t.Fatalf("%d error receipts, want 3 (conflict, stale precondition, escape)", len(errs))
	}
	if none, _ := in.Receipts(ReceiptFilter{Since: time.Now().Add(time.Hour)}); len(none) != 0 {
		t.Fatalf("%d receipts from the future", len(none))
	}
	if _, err := in.Receipt("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Receipt(nope) = %v, want ErrNotFound", err)
	}
	if _, err := in.Operation("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Operation(nope) = %v, want ErrNotFound", err)
	}
	page, err := in.Entries(2, 3)
	if err != nil || len(page) != 3 || page[0].Seq != 2 {
		t.Fatalf("Entries(2,3) = %d entries from %v, %v", len(page), page, err)
	}

	// A served data dir is locked: OpenInspector says so at once.
	start := time.Now()
	if _, err := OpenInspector(h.data); !errors.Is(err, ErrLocked) || time.Since(start) > 5*time.Second {
		t.Fatalf("OpenInspector on a served dir = %v", err)
	}
	// Stopped, it opens read-only and sees the same history, and the
	// receipt index is rebuilt when missing (data dirs from before it).
	h.k.Close()
	db, err := bbolt.Open(filepath.Join(h.data, DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket(bucketReceipts) })
	db.Close()
	h.open()
	if got, err := h.k.Inspector().Receipt(list[0].ReceiptID); err != nil || got.Seq != list[0].Seq {
		t.Fatalf("receipt after reindex = %+v, %v", got, err)
	}
	h.k.Close()
	ro, err := OpenInspector(h.data)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if c := mustVerify(t, ro); c.Entries == 0 {
		t.Fatalf("read-only verify: %+v", c)
	}
}

func TestReplayPolicy(t *testing.T) {
	h := history(t)
	// A bundle that sends every write to no_go: the recorded writes change,
	// the reads do not, and calls refused before the policy step are skipped.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.rego"), []byte(`package capkernel
decision := {"autonomy_mode": mode, "risk_score": 0.9, "risk_basis": ["writes are frozen"]} if {
	input.side_effect == "WRITE"
	mode := "no_go"
} else := {"autonomy_mode": "autopilot", "risk_score": 0.1, "risk_basis": []}
`), 0o644)
	eng, err := policy.Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	in := h.k.Inspector()
	out, err := ReplayPolicy(context.Background(), eng, ReplayFilter{}, func(fn func(EntryView) error) error { return in.ScanViews(0, AccessAll, fn) })
	if err != nil {
		t.Fatal(err)
	}
	if out.Skipped == 0 || out.Decided == 0 {
		t.Fatalf("decided %d, skipped %d", out.Decided, out.Skipped)
	}
	for _, c := range out.Changes {
		if c.ToolID != "fs.write" || c.NewMode != policy.NoGo || c.OldMode != policy.Autopilot {
			t.Fatalf("unexpected change %+v", c)
		}
	}
	if len(out.Changes) == 0 {
		t.Fatal("no write would change under a policy that freezes writes")
	}
	none, err := ReplayPolicy(context.Background(), h.k.policy, ReplayFilter{}, func(fn func(EntryView) error) error { return in.ScanViews(0, AccessAll, fn) })
	if err != nil || len(none.Changes) != 0 {
		t.Fatalf("replaying under the active policy changes %+v, %v", none, err)
	}
}
