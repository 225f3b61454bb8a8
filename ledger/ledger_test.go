package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)

// openDB opens (creating) a bbolt file and runs Init on it.
func openDB(tb testing.TB, path string) *bbolt.DB {
	tb.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if err := db.Update(Init); err != nil {
		tb.Fatal(err)
	}
	return db
}

func newDB(tb testing.TB) *bbolt.DB {
	tb.Helper()
	return openDB(tb, filepath.Join(tb.TempDir(), "ledger.db"))
}

// appendN appends n audit entries, one transaction each, and returns them.
func appendN(tb testing.TB, db *bbolt.DB, n int) []Entry {
	tb.Helper()
	var out []Entry
	for i := range n {
		body := json.RawMessage(`{"i":` + strings.Repeat("1", i+1) + `,"tool_id":"echo"}`)
		if err := db.Update(func(tx *bbolt.Tx) error {
			e, err := Append(tx, KindAudit, t0.Add(time.Duration(i)*time.Second), body)
			out = append(out, e)
			return err
		}); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

func TestAppendChainsEntries(t *testing.T) {
	db := newDB(t)
	es := appendN(t, db, 3)
	for i, e := range es {
		if e.Seq != uint64(i) {
			t.Errorf("entry %d: seq %d", i, e.Seq)
		}
		want := ZeroHash
		if i > 0 {
			want = es[i-1].Hash
		}
		if e.PrevHash != want {
			t.Errorf("entry %d: prev_hash %s, want %s", i, e.PrevHash, want)
		}
		h, err := EntryHash(e)
		if err != nil || h != e.Hash {
			t.Errorf("entry %d: EntryHash = %s, %v; Append said %s", i, h, err, e.Hash)
		}
	}
	if es[1].Time != "2025-01-02T03:04:06.000000006Z" {
		t.Errorf("time = %q", es[1].Time)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		for _, want := range es {
			got, err := Get(tx, want.Seq)
			if err != nil {
				return err
			}
			if !equalEntries(got, want) {
				t.Errorf("Get(%d) = %+v, want %+v", want.Seq, got, want)
			}
		}
		n, err := Verify(tx)
		if n != 3 || err != nil {
			t.Errorf("Verify = %d, %v; want 3, nil", n, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAppendCanonicalizesBody(t *testing.T) {
	db := newDB(t)
	var e Entry
	if err := db.Update(func(tx *bbolt.Tx) (err error) {
		e, err = Append(tx, KindRevocation, t0, json.RawMessage("{ \"b\" : [1, 2],\n \"a\" : \"x\" }"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := string(e.Body), `{"a":"x","b":[1,2]}`; got != want {
		t.Errorf("body = %s, want %s", got, want)
	}
}

func TestAppendManyInOneTransaction(t *testing.T) {
	db := newDB(t)
	const n = 500
	if err := db.Update(func(tx *bbolt.Tx) error {
		for i := range n {
			if _, err := Append(tx, KindReceipt, t0, json.RawMessage(`{"n":1}`)); err != nil {
				return err
			}
			if h, err := HeadOf(tx); err != nil || h.Size != uint64(i+1) {
				t.Fatalf("after %d appends: HeadOf = %+v, %v", i+1, h, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		got, err := Verify(tx)
		if got != n || err != nil {
			t.Errorf("Verify = %d, %v; want %d, nil", got, err, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAppendRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind string
		time time.Time
		body string
	}{
		{"array body", KindAudit, t0, `[1,2]`},
		{"string body", KindAudit, t0, `"x"`},
		{"number body", KindAudit, t0, `1`},
		{"null body", KindAudit, t0, `null`},
		{"empty body", KindAudit, t0, ``},
		{"truncated body", KindAudit, t0, `{"a":`},
		{"trailing data", KindAudit, t0, `{"a":1} {}`},
		{"duplicate keys", KindAudit, t0, `{"a":1,"a":2}`},
		{"empty kind", "", t0, `{}`},
		{"upper-case kind", "Audit", t0, `{}`},
		{"kind with quote", `a"b`, t0, `{}`},
		{"kind with dash", "a-b", t0, `{}`},
		{"kind too long", strings.Repeat("a", 65), t0, `{}`},
		{"year after 9999", KindAudit, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), `{}`},
		{"year before 0", KindAudit, time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			appendN(t, db, 1)
			if err := db.Update(func(tx *bbolt.Tx) error {
				if _, err := Append(tx, tc.kind, tc.time, json.RawMessage(tc.body)); err == nil {
					t.Errorf("Append(%q, %v, %s) succeeded", tc.kind, tc.time, tc.body)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// A refused Append writes nothing, even if its transaction commits.
			if err := db.View(func(tx *bbolt.Tx) error {
				n, err := Verify(tx)
				if n != 1 || err != nil {
					t.Errorf("after refused Append: Verify = %d, %v; want 1, nil", n, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAppendNeedsWritableInitializedTx(t *testing.T) {
	db := newDB(t)
	if err := db.View(func(tx *bbolt.Tx) error {
		_, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`))
		if err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("Append in a read-only tx: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	raw, err := bbolt.Open(filepath.Join(t.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.Update(func(tx *bbolt.Tx) error {
		_, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`))
		if err == nil || !strings.Contains(err.Error(), "Init") {
			t.Errorf("Append without Init: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAppendRefusesToOverwrite(t *testing.T) {
	db := newDB(t)
	es := appendN(t, db, 2)
	// Roll the head back by one entry, as a stale or tampered head would.
	if err := db.Update(func(tx *bbolt.Tx) error {
		h, _ := digest.Parse(es[0].Hash)
		return tx.Bucket(bucketMeta).Put(keyHead, encodeHead(1, h))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "entry 1 is stored although the head says 1 entries") {
			t.Errorf("Append over entry 1: %v", err)
		}
		got, err := Get(tx, 1)
		if err != nil || !equalEntries(got, es[1]) {
			t.Errorf("entry 1 changed: %+v, %v", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestReturnedEntryIsNotStored(t *testing.T) {
	db := newDB(t)
	if err := db.Update(func(tx *bbolt.Tx) error {
		e, err := Append(tx, KindAudit, t0, json.RawMessage(`{"a":"xxxx"}`))
		if err != nil {
			return err
		}
		for i := range e.Body {
			e.Body[i] = ' '
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		if n, err := Verify(tx); err != nil {
			t.Errorf("Verify after caller scribbled on the returned body: %d, %v", n, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestHeadSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := openDB(t, path)
	if err := db.View(func(tx *bbolt.Tx) error {
		h, err := HeadOf(tx)
		if err != nil || h != (Head{0, ZeroHash}) {
			t.Errorf("HeadOf(empty) = %+v, %v", h, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	es := appendN(t, db, 3)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, path)
	var next Entry
	if err := db.Update(func(tx *bbolt.Tx) error {
		h, err := HeadOf(tx)
		if err != nil || h != (Head{3, es[2].Hash}) {
			t.Errorf("HeadOf after reopen = %+v, %v; want {3 %s}", h, err, es[2].Hash)
		}
		next, err = Append(tx, KindAudit, t0, json.RawMessage(`{}`))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if next.Seq != 3 || next.PrevHash != es[2].Hash {
		t.Errorf("append after reopen: seq %d prev %s", next.Seq, next.PrevHash)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		n, err := Verify(tx)
		if n != 4 || err != nil {
			t.Errorf("Verify = %d, %v", n, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestGetAndScan(t *testing.T) {
	db := newDB(t)
	es := appendN(t, db, 5)
	if err := db.View(func(tx *bbolt.Tx) error {
		if _, err := Get(tx, 5); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(5) = %v, want ErrNotFound", err)
		}
		var seen []uint64
		if err := Scan(tx, 2, func(e Entry) error {
			if !equalEntries(e, es[e.Seq]) {
				t.Errorf("Scan gave %+v, want %+v", e, es[e.Seq])
			}
			seen = append(seen, e.Seq)
			return nil
		}); err != nil {
			return err
		}
		if len(seen) != 3 || seen[0] != 2 || seen[2] != 4 {
			t.Errorf("Scan from 2 saw %v", seen)
		}
		stop := errors.New("stop")
		calls := 0
		if err := Scan(tx, 0, func(Entry) error { calls++; return stop }); err != stop || calls != 1 {
			t.Errorf("Scan with a failing fn = %v after %d calls", err, calls)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestEntryHashRejectsMalformedEntries(t *testing.T) {
	good := Entry{Seq: 0, Kind: KindAudit, Time: "2025-01-02T03:04:05.000000006Z", PrevHash: ZeroHash, Body: json.RawMessage(`{}`)}
	if _, err := EntryHash(good); err != nil {
		t.Fatalf("EntryHash(good) = %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Entry)
	}{
		{"time without nanoseconds", func(e *Entry) { e.Time = "2025-01-02T03:04:05Z" }},
		{"time not in UTC", func(e *Entry) { e.Time = "2025-01-02T03:04:05.000000006+01:00" }},
		{"upper-case prev_hash", func(e *Entry) { e.PrevHash = strings.ToUpper(ZeroHash) }},
		{"short prev_hash", func(e *Entry) { e.PrevHash = ZeroHash[:70] }},
		{"seq beyond 2^53-1", func(e *Entry) { e.Seq = 1 << 53 }},
		{"array body", func(e *Entry) { e.Body = json.RawMessage(`[]`) }},
		{"bad kind", func(e *Entry) { e.Kind = "a b" }},
	} {
		e := good
		tc.edit(&e)
		if h, err := EntryHash(e); err == nil {
			t.Errorf("%s: EntryHash = %s, want an error", tc.name, h)
		}
	}
}

func equalEntries(a, b Entry) bool {
	return a.Seq == b.Seq && a.Kind == b.Kind && a.Time == b.Time && a.PrevHash == b.PrevHash &&
		string(a.Body) == string(b.Body) && a.Hash == b.Hash
}

// ParseEntry accepts exactly a canonical record whose entry_hash
// recomputes.
func TestParseEntry(t *testing.T) {
	e := Entry{Seq: 0, Kind: "audit", Time: "2025-01-02T03:04:05.000000000Z", PrevHash: ZeroHash, Body: json.RawMessage(`{"a":1}`)}
	h, err := EntryHash(e)
	if err != nil {
		t.Fatal(err)
	}
	e.Hash = h
	good := string(appendRecord(nil, &e))
	tests := []struct {
		name, rec string
		ok        bool
	}{
		{"canonical", good, true},
		{"not canonical", strings.Replace(good, `"a":1`, `"a": 1`, 1), false},
		{"body changed", strings.Replace(good, `"a":1`, `"a":2`, 1), false},
		{"entry_hash of another entry", strings.Replace(good, h[len(h)-4:], "0000", 1), false},
		{"not JSON", "{", false},
	}
	for _, tc := range tests {
		got, err := ParseEntry([]byte(tc.rec))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.ok && (got.Hash != h || string(got.Body) != `{"a":1}`) {
			t.Errorf("%s: parsed %+v", tc.name, got)
		}
	}
}

// TestBodyAppendedAgain: a Body's record memory, made with it, serves its
// first append only. Appending it again (in the same transaction, or after
// the first transaction rolled back, as the store's retry does) neither
// writes over the record an earlier append returned nor stores a wrong
// entry: every record read back is the one its append returned, and the
// ledger verifies.
func TestBodyAppendedAgain(t *testing.T) {
	for _, kind := range []string{KindAudit, strings.Repeat("k", 40)} { // a kind past tailRoom's 32 bytes
		t.Run(fmt.Sprintf("kind of %d bytes", len(kind)), func(t *testing.T) {
			db := newDB(t)
			body, err := Canonicalize(json.RawMessage(`{"tool_id":"echo","n":1}`))
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bbolt.Tx) error {
				a, err := NewWriter().AppendCanonical(tx, kind, t0, body)
				if err != nil {
					return err
				}
				// The first append of a kind that fits writes into the
				// body's memory; every later one allocates.
				if own := &a.Record[0] == &body.bufs.rec[:1][0]; own != (len(kind) <= 32) {
					t.Errorf("first append of a %d-byte kind: record in the body's memory %v", len(kind), own)
				}
				return errors.New("rolled back")
			}); err == nil {
				t.Fatal("the first transaction committed")
			}
			var got, live [][]byte // records as returned (copies), and the returned slices
			w := NewWriter()
			if err := db.Update(func(tx *bbolt.Tx) error {
				for i := range 3 {
					a, err := w.AppendCanonical(tx, kind, t0.Add(time.Duration(i)*time.Second), body)
					if err != nil {
						return err
					}
					got, live = append(got, bytes.Clone(a.Record)), append(live, a.Record)
					if &a.Record[0] == &body.bufs.rec[:1][0] {
						t.Errorf("append %d after the first wrote into the body's memory", i)
					}
					for j := range i {
						if string(live[j]) != string(got[j]) {
							t.Errorf("append %d changed the record append %d returned: %s", i, j, live[j])
						}
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.View(func(tx *bbolt.Tx) error {
				for i, g := range got {
					rec, err := Record(tx, uint64(i))
					if err != nil || string(rec) != string(g) {
						t.Errorf("entry %d stored as %s (%v), appended as %s", i, rec, err, g)
					}
				}
				if n, err := Verify(tx); n != 3 || err != nil {
					t.Errorf("Verify = %d, %v", n, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
