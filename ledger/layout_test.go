package ledger

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
)

// levelMajorKey returns the layoutLevelMajor key of node id.
func levelMajorKey(id compact.NodeID) []byte {
	k := make([]byte, treeKeyLen)
	setLevelMajorKey(k, id)
	return k
}

func TestTreeKey(t *testing.T) {
	for _, tc := range []struct {
		level uint
		index uint64
		key   string // hex
	}{
		{0, 0, "000000000000000000"},
		{0, 5, "000000000000000500"},
		{1, 0, "000000000000000101"},
		{1, 2, "000000000000000501"},
		{3, 0, "000000000000000703"},
		{2, 3, "000000000000000f02"},
		{63, 1, "ffffffffffffffff3f"},
		{0, 1<<64 - 1, "ffffffffffffffff00"},
	} {
		id := compact.NewNodeID(tc.level, tc.index)
		k := treeKey(id)
		if got := fmt.Sprintf("%x", k); got != tc.key {
			t.Errorf("treeKey(%d, %d) = %s, want %s", tc.level, tc.index, got, tc.key)
		}
		if back, ok := completionID(k); !ok || back != id {
			t.Errorf("completionID(%x) = %v, %v; want %v", k, back, ok, id)
		}
		if back, ok := levelMajorID(levelMajorKey(id)); !ok || back != id {
			t.Errorf("levelMajorID(%x) = %v, %v; want %v", levelMajorKey(id), back, ok, id)
		}
	}
	for _, tc := range []struct {
		name string
		f    func([]byte) (compact.NodeID, bool)
		key  []byte
	}{
		{"completion: short", completionID, []byte{0, 0, 0, 0, 0, 0, 0, 0}},
		{"completion: long", completionID, make([]byte, 10)},
		{"completion: level 64", completionID, []byte{0, 0, 0, 0, 0, 0, 0, 0, 64}},
		{"completion: no node of level 1 ends at 4", completionID, []byte{0, 0, 0, 0, 0, 0, 0, 4, 1}},
		{"completion: no node of level 2 ends at 5", completionID, []byte{0, 0, 0, 0, 0, 0, 0, 5, 2}},
		{"level-major: short", levelMajorID, []byte{1, 0, 0, 0}},
		{"level-major: level 64", levelMajorID, []byte{64, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"level-major: ends past 2^64", levelMajorID, []byte{1, 0x80, 0, 0, 0, 0, 0, 0, 0}},
	} {
		if id, ok := tc.f(tc.key); ok {
			t.Errorf("%s: %x names %v, want no node", tc.name, tc.key, id)
		}
	}
}

// TestBatchNodesAtTail: every batch of appends stores exactly its entries
// and the nodes it completes, as the last keys of the bucket, each entry
// followed by the nodes its append completes, in the order it completes
// them, so that a group commit writes to the bucket's tail only.
func TestBatchNodesAtTail(t *testing.T) {
	db := newDB(t)
	var f fold
	seq := uint64(0)
	for _, n := range []int{1, 1, 2, 5, 8, 13, 64, 3, 100} {
		before := dumpBucket(t, db, bucketEntries)
		leaves := appendBatch(t, db, n)
		var want [][]byte
		for i := range leaves {
			want = append(want, seqKey(seq))
			seq++
			f.append(&leaves[i], func(id compact.NodeID, _ *[32]byte) { want = append(want, treeKey(id)) })
		}
		all := dumpBucket(t, db, bucketEntries)
		if len(all) != len(before)+len(want) || !equalDumps(all[:len(before)], before) {
			t.Fatalf("batch of %d: %d keys stored, want %d after the %d there were", n, len(all)-len(before), len(want), len(before))
		}
		for i, kv := range all[len(before):] {
			if !bytes.Equal(kv[0], want[i]) {
				t.Fatalf("batch of %d: key %d of the tail is %x, want %x (entry, then the nodes it completes)", n, i, kv[0], want[i])
			}
		}
		if !slices.IsSortedFunc(all, func(a, b [2][]byte) int { return bytes.Compare(a[0], b[0]) }) {
			t.Fatal("bucket not in key order") // bbolt's guarantee; checks the test
		}
	}
}

// ledgerView is everything a reader gets from a ledger: verification,
// roots, proofs and the export, to compare two databases by.
type ledgerView struct {
	report  Report
	roots   [][32]byte
	proofs  []string
	export  string
	checked error // CheckTree
}

func viewOf(t *testing.T, db *bbolt.DB) ledgerView {
	t.Helper()
	var v ledgerView
	if err := db.View(func(tx *bbolt.Tx) error {
		var err error
		if v.report, err = VerifyWith(tx, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}); err != nil {
			return err
		}
		v.checked = CheckTree(tx)
		n := v.report.Entries
		for size := range n + 1 {
			r, err := Root(tx, size)
			if err != nil {
				return err
			}
			v.roots = append(v.roots, r)
			for i := range size {
				p, err := ProveInclusion(tx, i, size)
				if err != nil {
					return err
				}
				v.proofs = append(v.proofs, fmt.Sprint(p))
			}
			c, err := ProveConsistency(tx, size, n)
			if err != nil {
				return err
			}
			v.proofs = append(v.proofs, fmt.Sprint(c))
		}
		var b strings.Builder
		err = Export(tx, &b)
		v.export = b.String()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v ledgerView) equal(o ledgerView) bool {
	return v.report.Entries == o.report.Entries && v.report.Root == o.report.Root &&
		v.report.Checkpoints == o.report.Checkpoints && slices.Equal(v.roots, o.roots) &&
		slices.Equal(v.proofs, o.proofs) && v.export == o.export && fmt.Sprint(v.checked) == fmt.Sprint(o.checked)
}

// checkpointed builds a ledger of 37 entries in batches, with a checkpoint
// after each.
func checkpointed(t *testing.T) *bbolt.DB {
	db := newDB(t)
	s := testSigner(t)
	for _, n := range []int{1, 4, 7, 16, 9} {
		appendBatch(t, db, n)
		writeCheckpoint(t, db, s)
	}
	return db
}

// oldLayouts are the layouts of earlier builds that Init moves to
// layoutOneBucket, with the tree and checkpoints in buckets of their own.
var oldLayouts = []int{layoutLevelMajor, layoutCompletion}

// readers are the functions that read what layoutOneBucket keeps beside
// the entries, and so refuse a file of an older layout.
var readers = map[string]func(*bbolt.Tx) error{
	"CheckTree":        CheckTree,
	"Verify":           func(tx *bbolt.Tx) error { _, err := Verify(tx); return err },
	"Root":             func(tx *bbolt.Tx) error { _, err := Root(tx, 3); return err },
	"ProveInclusion":   func(tx *bbolt.Tx) error { _, err := ProveInclusion(tx, 1, 3); return err },
	"ProveConsistency": func(tx *bbolt.Tx) error { _, err := ProveConsistency(tx, 1, 3); return err },
	"LatestCheckpoint": func(tx *bbolt.Tx) error { _, err := LatestCheckpoint(tx); return err },
	"CheckpointAt":     func(tx *bbolt.Tx) error { _, err := CheckpointAt(tx, 1, 0); return err },
	"Checkpoints":      func(tx *bbolt.Tx) error { return Checkpoints(tx, 0, func(StoredCheckpoint) error { return nil }) },
	"Attachment":       func(tx *bbolt.Tx) error { _, err := Attachment(tx, 0); return err },
	"Attachments":      func(tx *bbolt.Tx) error { return Attachments(tx, 0, func(uint64, []byte) error { return nil }) },
	"Export":           func(tx *bbolt.Tx) error { return Export(tx, io.Discard) },
}

// TestOldLayoutRefusedBeforeInit: every reader of the tree, checkpoints
// and attachments refuses a file of layout 1 or 2 (errOldLayout) in a
// read-only transaction, and appends, checkpoints and attachments refuse
// it naming its layout or Init; nothing changes.
func TestOldLayoutRefusedBeforeInit(t *testing.T) {
	for _, layout := range oldLayouts {
		t.Run(fmt.Sprintf("layout%d", layout), func(t *testing.T) {
			db := checkpointed(t)
			toOldLayout(t, db, layout)
			before := dumpAll(t, db)
			db.View(func(tx *bbolt.Tx) error {
				for name, f := range readers {
					if err := f(tx); !errors.Is(err, errOldLayout) {
						t.Errorf("%s of a layout %d file = %v, want errOldLayout", name, layout, err)
					}
				}
				return nil
			})
			for name, f := range map[string]func(*bbolt.Tx) error{
				"Append": func(tx *bbolt.Tx) error {
					_, err := NewWriter().Append(tx, KindAudit, t0, []byte(`{}`))
					if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("key layout %d", layout)) || !strings.Contains(err.Error(), "run Init") {
						return fmt.Errorf("%v, want a refusal naming layout %d and Init", err, layout)
					}
					return nil
				},
				"WriteCheckpoint": func(tx *bbolt.Tx) error {
					if _, err := WriteCheckpoint(tx, testSigner(t), testOrigin); !errors.Is(err, errOldLayout) {
						return fmt.Errorf("%v, want errOldLayout", err)
					}
					return nil
				},
				"Attach": func(tx *bbolt.Tx) error {
					if err := Attach(tx, 0, []byte("x")); !errors.Is(err, errOldLayout) {
						return fmt.Errorf("%v, want errOldLayout", err)
					}
					return nil
				},
				"Detach": func(tx *bbolt.Tx) error {
					if _, err := Detach(tx, 0); !errors.Is(err, errOldLayout) {
						return fmt.Errorf("%v, want errOldLayout", err)
					}
					return nil
				},
			} {
				if err := db.Update(f); err != nil {
					t.Errorf("%s on a layout %d file: %v", name, layout, err)
				}
			}
			if !equalDumpAll(dumpAll(t, db), before) {
				t.Error("refused calls changed the file")
			}
		})
	}
}

// TestInitMovesOldLayouts: a ledger written in layout 1 (level-major tree
// keys) or 2 (completion order), each with the tree and the checkpoints in
// buckets of their own, is moved by Init into the one bucket a fresh
// ledger of the same entries has, byte for byte (the same nodes, the
// checkpoints under their sizes and numbers), the old buckets deleted,
// layout 3 and the latest checkpoint recorded; both then verify, prove and
// export the same, and grow the same. A second Init changes nothing.
func TestInitMovesOldLayouts(t *testing.T) {
	for _, layout := range oldLayouts {
		t.Run(fmt.Sprintf("layout%d", layout), func(t *testing.T) {
			fresh, old := checkpointed(t), checkpointed(t)
			want := viewOf(t, fresh)
			freshDump := dumpAll(t, fresh)
			toOldLayout(t, old, layout)
			if equalDumpAll(dumpAll(t, old), freshDump) {
				t.Fatal("toOldLayout changed nothing")
			}
			for range 2 { // the second Init finds layout 3 and changes nothing
				if err := old.Update(Init); err != nil {
					t.Fatal(err)
				}
				if got := dumpAll(t, old); !equalDumpAll(got, freshDump) {
					t.Errorf("moved file differs from the fresh ledger's: buckets %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(freshDump)))
				}
				if got := viewOf(t, old); !got.equal(want) {
					t.Errorf("moved ledger's view differs from the fresh one:\n%+v\n%+v", got.report, want.report)
				}
			}
			if v := recordedLayout(t, old); !bytes.Equal(v, []byte{layoutOneBucket}) {
				t.Errorf("recorded layout %x, want 03", v)
			}
			old.View(func(tx *bbolt.Tx) error {
				if tx.Bucket(bucketTree) != nil || tx.Bucket(bucketCheckpoints) != nil {
					t.Error("the old layout's buckets are left")
				}
				if k, want := tx.Bucket(bucketMeta).Get(keyLastCheckpoint), checkpointKey(37, 4); !bytes.Equal(k, want) {
					t.Errorf("checkpoint_last = %x, want %x", k, want)
				}
				return nil
			})
			s := testSigner(t)
			for _, db := range []*bbolt.DB{fresh, old} {
				appendBatch(t, db, 11)
				writeCheckpoint(t, db, s)
			}
			if !equalDumpAll(dumpAll(t, old), dumpAll(t, fresh)) {
				t.Error("after 11 more entries the moved ledger differs from the fresh one")
			}
			if got, want := viewOf(t, old), viewOf(t, fresh); !got.equal(want) {
				t.Errorf("after 11 more entries the moved ledger's view differs:\n%+v\n%+v", got.report, want.report)
			}
		})
	}
}

// TestMoveAtomic: a transaction that moves an old file and then fails (an
// Open whose later check refuses the ledger, or a crash before the commit)
// leaves the file as it was: its tree and checkpoint buckets, its layout.
func TestMoveAtomic(t *testing.T) {
	for _, layout := range append(oldLayouts, layoutTreeless) {
		t.Run(fmt.Sprintf("layout%d", layout), func(t *testing.T) {
			db := newDB(t)
			appendBatch(t, db, 37)
			if layout != layoutTreeless {
				writeCheckpoint(t, db, testSigner(t))
			}
			toOldLayout(t, db, layout)
			before := dumpAll(t, db)
			err := db.Update(func(tx *bbolt.Tx) error {
				if err := Init(tx); err != nil {
					return err
				}
				if tx.Bucket(bucketTree) != nil || tx.Bucket(bucketCheckpoints) != nil {
					t.Error("Init left the old layout's buckets")
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatal(err)
			}
			if !equalDumpAll(dumpAll(t, db), before) {
				t.Error("a rolled-back Init changed the file")
			}
		})
	}
}

// TestInitRefusesOldBucketsInLayout3: a file that records layout 3 but
// holds a bucket of an older layout (an older build wrote to it after the
// move) is refused by Init, unchanged.
func TestInitRefusesOldBucketsInLayout3(t *testing.T) {
	for _, name := range [][]byte{bucketTree, bucketCheckpoints} {
		t.Run(string(name), func(t *testing.T) {
			db := checkpointed(t)
			if err := db.Update(func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket(name)
				if err != nil {
					return err
				}
				return b.Put(seqKey(0), make([]byte, 32))
			}); err != nil {
				t.Fatal(err)
			}
			before := dumpAll(t, db)
			err := db.Update(Init)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("holds the bucket %q of an older layout", name)) {
				t.Errorf("Init = %v, want a refusal naming %q", err, name)
			}
			if !equalDumpAll(dumpAll(t, db), before) {
				t.Error("the refused Init changed the file")
			}
		})
	}
}

// TestDamagedOldTree: damage in an old layout's tree is refused where it
// was before the layout changed: by Init, by CheckTree (which the kernel
// runs in Init's transaction, so the refusal leaves the old file) or by
// Verify after the move, naming the same node as on the old file.
func TestDamagedOldTree(t *testing.T) {
	id := compact.NewNodeID
	for _, tc := range []struct {
		name   string
		tamper func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error
		// init is Init's error; levelMajorInit, if set, replaces it in
		// layout 1.
		init, levelMajorInit string
		check                string // CheckTree's error, after Init
		verify               error  // Verify's error, after Init
		reason               string
	}{
		{name: "key of no node", tamper: func(b *bbolt.Bucket, _ func(compact.NodeID) []byte) error {
			return b.Put([]byte{200}, make([]byte, 32))
		},
			init: "key c8 names no tree node (the database is unchanged"},
		{name: "key past 2^64 entries", tamper: func(b *bbolt.Bucket, _ func(compact.NodeID) []byte) error {
			return b.Put([]byte{1, 0x80, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 32))
		}, levelMajorInit: "key 018000000000000000 names no tree node",
			check:  "tree node (level 0, index 108086391056891904) is stored beyond the head's 37 entries",
			verify: &NodeError{Level: 0, Index: 0x0180000000000000}, reason: "not part of the tree of 37 entries"},
		// Damage to a value is carried over, as evidence: the kernel opens
		// as it did before the move, and Verify names the node.
		{name: "node truncated", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error {
			return b.Put(key(id(1, 2)), []byte{1, 2})
		},
			verify: &NodeError{Level: 1, Index: 2}, reason: "stored hash a 2-byte value differs"},
		{name: "leaf emptied", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error { return b.Put(key(id(0, 9)), nil) },
			verify: &VerifyError{Seq: 9}, reason: "Merkle tree leaf: stored hash a 0-byte value differs"},
		{name: "right edge node flipped", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error {
			k := key(id(5, 0))
			v := bytes.Clone(b.Get(k))
			v[0] ^= 1
			return b.Put(k, v)
		}, check: "latest checkpoint #4 has root", verify: &NodeError{Level: 5, Index: 0}, reason: "stored hash"},
		{name: "leaf beyond the head", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error {
			return b.Put(key(id(0, 37)), make([]byte, 32))
		},
			check: "tree node (level 0, index 37) is stored beyond the head's 37 entries", verify: &NodeError{Level: 0, Index: 37}, reason: "not part of the tree of 37 entries"},
		{name: "bucket at a node key", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error {
			if err := b.Delete(key(id(3, 1))); err != nil {
				return err
			}
			_, err := b.CreateBucket(key(id(3, 1)))
			return err
		},
			init: "key 000000000000000f03 names no tree node (the database is unchanged", levelMajorInit: "key 030000000000000001 holds a bucket, not a hash (the database is unchanged"},
		{name: "inner node deleted", tamper: func(b *bbolt.Bucket, key func(compact.NodeID) []byte) error { return b.Delete(key(id(2, 3))) },
			verify: &NodeError{Level: 2, Index: 3}, reason: "missing"},
	} {
		for _, layout := range oldLayouts {
			t.Run(fmt.Sprintf("%s/layout%d", tc.name, layout), func(t *testing.T) {
				db := checkpointed(t)
				toOldLayout(t, db, layout)
				key, init := treeKey, tc.init
				if layout == layoutLevelMajor {
					key = levelMajorKey
					if tc.levelMajorInit != "" {
						init = tc.levelMajorInit
					}
				}
				if err := db.Update(func(tx *bbolt.Tx) error { return tc.tamper(tx.Bucket(bucketTree), key) }); err != nil {
					t.Fatal(err)
				}
				before := dumpAll(t, db)
				err := openAsKernel(db)
				want := init
				if want == "" {
					want = tc.check
				}
				switch {
				case want == "" && err != nil:
					t.Fatalf("Init and CheckTree: %v", err)
				case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
					t.Fatalf("Init and CheckTree = %v, want %q", err, want)
				case want != "":
					if !equalDumpAll(dumpAll(t, db), before) {
						t.Error("the refused open changed the file")
					}
					if init != "" || tc.verify == nil {
						return
					}
					if err := db.Update(Init); err != nil { // as kernelctl verify opens
						t.Fatal(err)
					}
				}
				_, err = verifyDB(db)
				checkErr(t, err, tc.verify, tc.reason)
			})
		}
	}
}

// TestUnknownTreeLayout: a layout this build does not know is refused by
// every reader and writer of the ledger, with the value it found.
func TestUnknownTreeLayout(t *testing.T) {
	for _, v := range [][]byte{{4}, {1}, {2, 0}, {3, 0}, {}} {
		t.Run(fmt.Sprintf("%x", v), func(t *testing.T) {
			db := checkpointed(t)
			if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyTreeLayout, v) }); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("ledger key layout %x (meta key \"tree_layout\") is unknown to this build", v)
			fs := maps.Clone(readers)
			fs["Init"] = Init
			fs["Append"] = func(tx *bbolt.Tx) error {
				_, err := Append(tx, KindAudit, t0, []byte(`{}`))
				return err
			}
			for name, f := range fs {
				err := db.Update(func(tx *bbolt.Tx) error {
					if err := f(tx); err != nil {
						return err
					}
					return errRollback
				})
				if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "ledger: ") || strings.Contains(err.Error(), "ledger: ledger:") {
					t.Errorf("%s = %v, want one error, prefixed once, with %q", name, err, want)
				}
			}
		})
	}
}

// BenchmarkRekeyTree measures Init's move of a level-major file of 100k
// entries (200k nodes), in one transaction, as an upgraded kernel's first
// Open does: time and allocated bytes per entry.
func BenchmarkRekeyTree(b *testing.B) {
	const n = 100_000
	db := newDB(b)
	for i := 0; i < n; i += 10_000 {
		appendBatch(b, db, 10_000)
	}
	toOldLayout(b, db, layoutLevelMajor)
	b.ReportAllocs()
	for b.Loop() {
		err := db.Update(func(tx *bbolt.Tx) error {
			if err := Init(tx); err != nil {
				return err
			}
			return errRollback // the next round moves the same tree
		})
		if !errors.Is(err, errRollback) {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/entry")
}

// TestLayoutMismatch: keys of one old layout under the other's record —
// an earlier build appended to a rekeyed file, or the record was removed
// — are refused by the open (nothing changed), naming both layouts
// (ErrLayoutMismatch) rather than a missing node.
func TestLayoutMismatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(tx *bbolt.Tx) error
		want   string
	}{
		{"head leaf written level-major under layout 2", func(tx *bbolt.Tx) error {
			b, leaf := tx.Bucket(bucketTree), compact.NewNodeID(0, 36)
			v := bytes.Clone(b.Get(treeKey(leaf)))
			if err := b.Delete(treeKey(leaf)); err != nil {
				return err
			}
			return b.Put(levelMajorKey(leaf), v)
		}, "the layout is layout 2 (recorded as 02) in ledger_meta, but the leaf of the head (entry 36) is stored under layout 1 (level-major)"},
		{"layout record removed", func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyTreeLayout) },
			"the layout is layout 1 (no layout recorded) in ledger_meta, but the leaf of the head (entry 36) is stored under layout 2 (completion order)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := checkpointed(t)
			toOldLayout(t, db, layoutCompletion)
			if err := db.Update(tc.tamper); err != nil {
				t.Fatal(err)
			}
			before := dumpAll(t, db)
			err := db.Update(func(tx *bbolt.Tx) error {
				if err := Init(tx); err != nil {
					return err
				}
				return CheckTree(tx)
			})
			if !errors.Is(err, ErrLayoutMismatch) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the database is unchanged") {
				t.Errorf("open = %v, want ErrLayoutMismatch with %q", err, tc.want)
			}
			if !equalDumpAll(dumpAll(t, db), before) {
				t.Error("a refused open changed the file")
			}
		})
	}
}

// TestMoveFillsPages: the pages a move writes into the entries' bucket of
// an old file (full pages of entries, as appends filled them) are nearly
// full, as appends fill them, not half-full as bbolt splits pages by
// default: the nodes go between the entries, which splits their pages
// (a fresh ledger of 640 entries has 37 pages, the moved one 39).
func TestMoveFillsPages(t *testing.T) {
	for _, layout := range append(oldLayouts, layoutTreeless) {
		t.Run(fmt.Sprintf("layout%d", layout), func(t *testing.T) {
			fresh, old := newDB(t), newDB(t)
			for _, db := range []*bbolt.DB{fresh, old} {
				for range 10 {
					appendBatch(t, db, 64)
				}
			}
			toOldLayout(t, old, layout)
			if err := old.Update(Init); err != nil {
				t.Fatal(err)
			}
			got, want := entriesStats(t, old), entriesStats(t, fresh)
			if fill := float64(got.LeafInuse) / float64(got.LeafAlloc); got.KeyN != want.KeyN || fill < 0.9 || want.LeafPageN < 4 {
				t.Errorf("moved bucket: %d keys in %d leaf pages, %.0f%% full; a fresh ledger's: %d keys in %d pages", got.KeyN, got.LeafPageN, 100*fill, want.KeyN, want.LeafPageN)
			}
		})
	}
}

func entriesStats(tb testing.TB, db *bbolt.DB) (s bbolt.BucketStats) {
	tb.Helper()
	db.View(func(tx *bbolt.Tx) error {
		s = tx.Bucket(bucketEntries).Stats()
		return nil
	})
	return s
}

// TestMoveFileOfAnEarlierBuild: a ledger file written by commit 9da916f
// (level-major keys; testdata/levelmajor-9da916f.db.gz, made as
// checkpointed makes its ledger) is refused as it is read-only, and Init
// moves it into the bucket this build writes for the same entries.
func TestMoveFileOfAnEarlierBuild(t *testing.T) {
	gz, err := os.ReadFile("testdata/levelmajor-9da916f.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := checkpointed(t)
	want := viewOf(t, fresh)

	ro, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if v := recordedLayout(t, ro); v != nil {
		t.Fatalf("the earlier build's file records layout %x", v)
	}
	ro.View(func(tx *bbolt.Tx) error {
		for name, f := range readers {
			if err := f(tx); !errors.Is(err, errOldLayout) {
				t.Errorf("%s of the earlier build's file = %v, want errOldLayout", name, err)
			}
		}
		return nil
	})
	ro.Close()

	db := openDB(t, path) // Init moves
	if !equalDumpAll(dumpAll(t, db), dumpAll(t, fresh)) {
		t.Error("the moved file differs from the one this build writes")
	}
	if got := viewOf(t, db); !got.equal(want) {
		t.Errorf("moved view differs:\n%+v\n%+v", got.report, want.report)
	}
}

// TestLostHeadLeafIsNotALayoutMismatch: the other layout's key of the head
// leaf can name another node of this layout (n = 257: 00‖…0100 is node
// (0, 256)'s level-major key and also a completion key); a lost head leaf
// is reported missing, not blamed on an earlier build, in a file of
// layout 2 as in one of layout 3.
func TestLostHeadLeafIsNotALayoutMismatch(t *testing.T) {
	for _, layout := range []int{layoutCompletion, layoutOneBucket} {
		for _, n := range []int{256, 257, 258} {
			db := newDB(t)
			appendBatch(t, db, n)
			b := bucketEntries
			if layout == layoutCompletion {
				toOldLayout(t, db, layout)
				b = bucketTree
			}
			if err := db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(b).Delete(treeKey(compact.NewNodeID(0, uint64(n-1))))
			}); err != nil {
				t.Fatal(err)
			}
			err := db.Update(func(tx *bbolt.Tx) error {
				if err := Init(tx); err != nil {
					return err
				}
				return CheckTree(tx)
			})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("tree node (level 0, index %d) missing", n-1)) || strings.Contains(err.Error(), "layout") {
				t.Errorf("layout %d, %d entries, head leaf lost: %v, want it reported missing", layout, n, err)
			}
		}
	}
}

// recordedLayout returns the key layout recorded in db's ledger_meta (a
// copy), or nil when none is.
func recordedLayout(t *testing.T, db *bbolt.DB) []byte {
	t.Helper()
	var v []byte
	if err := db.View(func(tx *bbolt.Tx) error {
		v = bytes.Clone(tx.Bucket(bucketMeta).Get(keyTreeLayout))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// openAsKernel opens db as the kernel does (kernel.upgrade, then load):
// CheckMove; for a file it may move in steps, Move in committed steps of a
// few keys; then Init and CheckTree in one transaction.
func openAsKernel(db *bbolt.DB) error {
	var steps bool
	if err := db.View(func(tx *bbolt.Tx) error {
		var err error
		steps, err = CheckMove(tx)
		return err
	}); err != nil {
		return err
	}
	for done := !steps; !done; {
		if err := db.Update(func(tx *bbolt.Tx) error {
			var err error
			done, err = Move(tx, 5)
			return err
		}); err != nil {
			return err
		}
	}
	return db.Update(func(tx *bbolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		return CheckTree(tx)
	})
}

// TestMoveOfDamageTheOldBuildOpened: a layout-2 file whose checkpoints the
// layout-2 build opened and served although its Verify named them — a
// checkpoint numbered after one of a larger size, one of a size beyond the
// entries (a flipped bit), both not the latest — is moved as the kernel
// moves it, in committed steps, and opens: each such checkpoint goes under
// the size of the one before it, and Verify names it. A key of the
// layout-2 entries bucket that a moved key would take is refused before
// any step, the file left as it was.
func TestMoveOfDamageTheOldBuildOpened(t *testing.T) {
	s := testSigner(t)
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, root3 [32]byte, tx *bbolt.Tx) error
		open   string // the refusal, "" when the open succeeds
		verify string // what Verify names once opened
	}{
		{"checkpoint of a smaller size numbered after a larger", func(t *testing.T, root3 [32]byte, tx *bbolt.Tx) error {
			signed := mustSign(t, s, Checkpoint{Origin: testOrigin, Size: 3, Root: root3})
			return tx.Bucket(bucketCheckpoints).Put(seqKey(2), packCheckpoint(signed))
		}, "", "checkpoint #2"},
		{"middle checkpoint of a size beyond the entries", func(t *testing.T, root3 [32]byte, tx *bbolt.Tx) error {
			signed := mustSign(t, s, Checkpoint{Origin: testOrigin, Size: 97, Root: root3})
			return tx.Bucket(bucketCheckpoints).Put(seqKey(0), packCheckpoint(signed))
		}, "", "checkpoint #0"},
		{"stray key in the entries bucket at a node's key", func(t *testing.T, root3 [32]byte, tx *bbolt.Tx) error {
			return tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(0, 4)), make([]byte, 32))
		}, "is taken", ""},
		{"entry beyond the head", func(t *testing.T, root3 [32]byte, tx *bbolt.Tx) error {
			return tx.Bucket(bucketEntries).Put(seqKey(5), []byte("{}"))
		}, "entry 5 is stored beyond the head's 5 entries", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := twoCommits(t, s, 3, 2)
			root3 := rootAt(t, db, 3)
			toOldLayout(t, db, layoutCompletion)
			if err := db.Update(func(tx *bbolt.Tx) error { return tc.damage(t, root3, tx) }); err != nil {
				t.Fatal(err)
			}
			before := dumpAll(t, db)
			err := openAsKernel(db)
			if tc.open != "" {
				if err == nil || !strings.Contains(err.Error(), tc.open) {
					t.Fatalf("open = %v, want it refused: %q", err, tc.open)
				}
				if !equalDumpAll(dumpAll(t, db), before) {
					t.Fatal("the refused open changed the file")
				}
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			_, err = verifyDB(db)
			if err == nil || !strings.Contains(err.Error(), tc.verify) {
				t.Fatalf("Verify = %v, want it to name %s", err, tc.verify)
			}
		})
	}
}

// TestKernelOpenAgreesWithCheckMove: damage in a layout-2 file that the
// moved file's open (CheckTree) would refuse is refused by CheckMove
// before any step commits, so the file stays as its build left it; what
// CheckTree accepts once moved, CheckMove lets through.
func TestKernelOpenAgreesWithCheckMove(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(tx *bbolt.Tx) error
		open   string // the refusal; "" for an open that succeeds
	}{
		{"stray checkpoint key of the head's size in the entries' bucket", func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketEntries).Put(checkpointKey(37, 1<<40), []byte("x"))
		}, "a malformed key 0000000000000025c00000010000000000 in the \"ledger\" bucket"},
		{"stray node key in the entries' bucket", func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(0, 3)), make([]byte, 32))
		}, "its key in \"ledger\", 000000000000000300, is taken"},
		{"stray record of a latest checkpoint, none stored", func(tx *bbolt.Tx) error {
			if err := tx.DeleteBucket(bucketCheckpoints); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketCheckpoints); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyLastCheckpoint, checkpointKey(3, 0))
		}, ""},
		{"nested bucket at an attachments' pad", func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(bucketAttachments)
			if err != nil {
				return err
			}
			if err := b.Delete(attachmentPads[1]); err != nil {
				return err
			}
			_, err = b.CreateBucket(attachmentPads[1])
			return err
		}, "a nested bucket at key ffffffffffffffff among the attachments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := checkpointed(t) // 37 entries
			toOldLayout(t, db, layoutCompletion)
			if err := db.Update(tc.damage); err != nil {
				t.Fatal(err)
			}
			before := dumpAll(t, db)
			err := openAsKernel(db)
			if tc.open == "" {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				if _, err := verifyDB(db); err != nil {
					t.Fatalf("verify after the open: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.open) {
				t.Fatalf("open = %v, want it refused: %q", err, tc.open)
			}
			if !equalDumpAll(dumpAll(t, db), before) {
				t.Fatal("the refused open changed the file")
			}
		})
	}
}
