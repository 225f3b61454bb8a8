package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
)

// putRawCheckpoint stores v (packed or not, and possibly damaged) as
// checkpoint #num, unchecked, the way a tamperer would: under
// checkpointKey(size, num), size being the tree size v's note states, or,
// when it states none, the size of the checkpoint #num it replaces (0 if
// there is none). Any checkpoint stored under number num is removed, and
// the new one is recorded as the latest (keyLastCheckpoint) unless a
// higher-numbered one is recorded: the old layout's checkpoint bucket
// (keyed by number) made the highest number the latest.
func putRawCheckpoint(tx *bbolt.Tx, num uint64, v []byte) error {
	var size uint64
	replaced := storedCheckpointKeys(tx, num)
	if len(replaced) > 0 {
		size, _, _ = parseCheckpointKey(replaced[0])
	}
	if signed, err := loadCheckpoint(v); err == nil {
		if cp, _, err := parseSigned(signed); err == nil {
			size = cp.Size
		}
	}
	for _, k := range replaced {
		if err := tx.Bucket(bucketEntries).Delete(k); err != nil {
			return err
		}
	}
	return putCheckpointAt(tx, size, num, v)
}

// putCheckpointAt stores v under checkpointKey(size, num), whatever size
// its note states, and records it as the latest unless a higher-numbered
// one is recorded.
func putCheckpointAt(tx *bbolt.Tx, size, num uint64, v []byte) error {
	meta := tx.Bucket(bucketMeta)
	k := checkpointKey(size, num)
	if err := tx.Bucket(bucketEntries).Put(k, v); err != nil {
		return err
	}
	if last := meta.Get(keyLastCheckpoint); last != nil {
		if _, n, ok := parseCheckpointKey(last); ok && n > num {
			return nil
		}
	}
	return meta.Put(keyLastCheckpoint, k)
}

// dumpKind returns a copy of every key and value of one kind stored in the
// ledger's bucket, in key order.
func dumpKind(tb testing.TB, db *bbolt.DB, kind keyKind) [][2][]byte {
	tb.Helper()
	var out [][2][]byte
	if err := db.View(func(tx *bbolt.Tx) error {
		c := newKindCursor(tx.Bucket(bucketEntries), kind)
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if kindOf(k) != kind {
				return fmt.Errorf("malformed key %x", k)
			}
			out = append(out, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

// storedCheckpointKeys returns the keys under which checkpoint #num is
// stored: one, unless the ledger is damaged.
func storedCheckpointKeys(tx *bbolt.Tx, num uint64) [][]byte {
	var keys [][]byte
	c := newKindCursor(tx.Bucket(bucketEntries), kindCheckpoint)
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if _, n, _ := parseCheckpointKey(k); n == num {
			keys = append(keys, bytes.Clone(k))
		}
	}
	return keys
}

// storedCheckpointKey returns the key of checkpoint #num, or nil when none
// is stored.
func storedCheckpointKey(tx *bbolt.Tx, num uint64) []byte {
	if keys := storedCheckpointKeys(tx, num); len(keys) > 0 {
		return keys[0]
	}
	return nil
}

// layoutTreeless stands, in toOldLayout, for a file of a build from
// before the Merkle tree and the checkpoints existed: entries and the head
// only.
const layoutTreeless = 0

// toOldLayout rewrites db, a ledger of layoutOneBucket, as a build of an
// older layout stored the same ledger: the tree in a bucket of its own
// (bucketTree), under level-major keys and no layout recorded
// (layoutLevelMajor) or under the same keys as now and layout 02 recorded
// (layoutCompletion); the checkpoints in theirs (bucketCheckpoints), keyed
// by number; no checkpoint_last. layoutTreeless drops the tree and needs a
// ledger without checkpoints. Older builds had no attachments: db must
// hold none.
func toOldLayout(tb testing.TB, db *bbolt.DB, layout int) {
	tb.Helper()
	if err := db.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		var records, nodes, cps [][2][]byte
		c := tx.Bucket(bucketEntries).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			kv := [2][]byte{bytes.Clone(k), bytes.Clone(v)}
			switch kindOf(k) {
			case kindEntry:
				records = append(records, kv)
			case kindNode:
				nodes = append(nodes, kv)
			case kindCheckpoint:
				cps = append(cps, kv)
			default:
				return fmt.Errorf("key %x: no older layout stores it", k)
			}
		}
		// The entries' bucket, rewritten as appends filled it: full pages.
		if err := tx.DeleteBucket(bucketEntries); err != nil {
			return err
		}
		entries, err := tx.CreateBucket(bucketEntries)
		if err != nil {
			return err
		}
		entries.FillPercent = 1
		for _, kv := range records {
			if err := entries.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		if err := meta.Delete(keyLastCheckpoint); err != nil {
			return err
		}
		if layout == layoutTreeless {
			if len(cps) > 0 {
				return fmt.Errorf("%d checkpoints in a ledger to store as a build before checkpoints existed", len(cps))
			}
			return meta.Delete(keyTreeLayout)
		}
		tree, err := tx.CreateBucket(bucketTree)
		if err != nil {
			return err
		}
		for _, kv := range nodes {
			k := kv[0]
			if layout == layoutLevelMajor {
				id, _ := completionID(k)
				k = levelMajorKey(id)
			}
			if err := tree.Put(k, kv[1]); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucket(bucketCheckpoints)
		if err != nil {
			return err
		}
		for _, kv := range cps {
			_, num, _ := parseCheckpointKey(kv[0])
			if err := b.Put(seqKey(num), kv[1]); err != nil {
				return err
			}
		}
		if layout == layoutLevelMajor {
			return meta.Delete(keyTreeLayout)
		}
		return meta.Put(keyTreeLayout, []byte{byte(layout)})
	}); err != nil {
		tb.Fatal(err)
	}
}

// dumpAll returns a copy of every top-level bucket of db, by name.
func dumpAll(tb testing.TB, db *bbolt.DB) map[string][][2][]byte {
	tb.Helper()
	out := map[string][][2][]byte{}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			var kvs [][2][]byte
			err := b.ForEach(func(k, v []byte) error {
				kvs = append(kvs, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				return nil
			})
			out[string(name)] = kvs
			return err
		})
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func equalDumpAll(a, b map[string][][2][]byte) bool {
	return maps.EqualFunc(a, b, equalDumps)
}

// TestKeyKinds: kindOf names the kind of every key layout 3 stores, and
// the keys of a tree of size n sort before entry n's, but for the
// checkpoints of size n, which sort after every key of entry n−1.
func TestKeyKinds(t *testing.T) {
	for _, tc := range []struct {
		k    []byte
		want keyKind
	}{
		{seqKey(5), kindEntry},
		{treeKey(compact.NewNodeID(0, 5)), kindNode},
		{treeKey(compact.NewNodeID(3, 1)), kindNode},
		{checkpointKey(5, 2), kindCheckpoint},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 4, 1}, kindMalformed},    // no node of level 1 ends at 4
		{[]byte{0, 0, 0, 0, 0, 0, 0, 5, 0x40}, kindMalformed}, // level 64
		{append(seqKey(5), 0x80, 0), kindMalformed},
		{append(seqKey(5), make([]byte, 9)...), kindMalformed}, // 17 bytes, no checkpoint tag
		{[]byte{1, 2, 3}, kindMalformed},
		{nil, kindMalformed},
	} {
		if got := kindOf(tc.k); got != tc.want {
			t.Errorf("kindOf(%x) = %d, want %d", tc.k, got, tc.want)
		}
	}
	if size, num, ok := parseCheckpointKey(checkpointKey(7, 3)); !ok || size != 7 || num != 3 {
		t.Errorf("parseCheckpointKey(checkpointKey(7, 3)) = %d, %d, %v", size, num, ok)
	}
	// In key order: entry 4 and its node; the checkpoints of size 4 (after
	// entry 4's keys, though entry 4 is not in their tree); entry 5's keys;
	// the checkpoints of size 5. A ledger of n entries thus holds nothing
	// past seqKey(n) but checkpoints of size n (beyondHead).
	ordered := [][]byte{
		seqKey(4),
		treeKey(compact.NewNodeID(0, 4)),
		checkpointKey(4, 0),
		checkpointKey(4, 9),
		seqKey(5),
		treeKey(compact.NewNodeID(0, 5)),
		treeKey(compact.NewNodeID(1, 2)),
		checkpointKey(5, 0),
		checkpointKey(5, 1),
		seqKey(6),
		seqKey(maxSeq),
		checkpointKey(maxSeq+1, 1<<63),
	}
	if !slices.IsSortedFunc(ordered, bytes.Compare) {
		t.Errorf("keys out of order: %x", ordered)
	}
}

// TestAttachments: Attach stores a value beside a stored entry (and only
// such an entry), Attachment reads it, Detach removes it, Attachments
// walks them in sequence order; none of it changes what verification,
// proofs, the export, Scan or the checkpoints read, nor stops appends.
func TestAttachments(t *testing.T) {
	db := checkpointed(t) // 37 entries
	want := viewOf(t, db)
	var scanned []Entry
	scan := func(t *testing.T) []Entry {
		t.Helper()
		var es []Entry
		if err := db.View(func(tx *bbolt.Tx) error {
			return Scan(tx, 0, func(e Entry) error { es = append(es, e); return nil })
		}); err != nil {
			t.Fatal(err)
		}
		return es
	}
	scanned = scan(t)
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, seq := range []uint64{36, 0, 7, 15, 16} {
			if err := Attach(tx, seq, []byte(fmt.Sprintf("payload %d", seq))); err != nil {
				return err
			}
		}
		if err := Attach(tx, 7, []byte("payload 7, again")); err != nil {
			return err
		}
		for _, seq := range []uint64{37, 38, 1 << 40} {
			if err := Attach(tx, seq, []byte("x")); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("attach to entry %d: the ledger has 37 entries", seq)) {
				t.Errorf("Attach(%d) to a ledger of 37 entries = %v", seq, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantAttached := map[uint64]string{0: "payload 0", 7: "payload 7, again", 15: "payload 15", 16: "payload 16", 36: "payload 36"}
	check := func(t *testing.T, want map[uint64]string) {
		t.Helper()
		db.View(func(tx *bbolt.Tx) error {
			for seq := range uint64(38) {
				v, err := Attachment(tx, seq)
				if w, ok := want[seq]; err != nil || ok != (v != nil) || string(v) != w {
					t.Errorf("Attachment(%d) = %q, %v; want %q", seq, v, err, w)
				}
			}
			var seqs []uint64
			if err := Attachments(tx, 0, func(seq uint64, v []byte) error {
				if string(v) != want[seq] {
					t.Errorf("Attachments: %d holds %q, want %q", seq, v, want[seq])
				}
				seqs = append(seqs, seq)
				return nil
			}); err != nil {
				t.Error(err)
			}
			if w := slices.Sorted(maps.Keys(want)); !slices.Equal(seqs, w) {
				t.Errorf("Attachments walked %v, want %v", seqs, w)
			}
			for _, from := range []uint64{1, 7, 8, 36, 37} {
				var got []uint64
				if err := Attachments(tx, from, func(seq uint64, _ []byte) error {
					got = append(got, seq)
					return nil
				}); err != nil {
					t.Error(err)
				}
				var w []uint64
				for _, seq := range seqs {
					if seq >= from {
						w = append(w, seq)
					}
				}
				if !slices.Equal(got, w) {
					t.Errorf("Attachments from %d walked %v, want %v", from, got, w)
				}
			}
			return nil
		})
	}
	check(t, wantAttached)
	if got := viewOf(t, db); !got.equal(want) {
		t.Errorf("with attachments, the view differs:\n%+v\n%+v", got.report, want.report)
	}
	if got := scan(t); !slices.EqualFunc(got, scanned, equalEntries) {
		t.Error("with attachments, Scan differs")
	}
	errStop := errors.New("stop")
	n := 0
	if err := db.View(func(tx *bbolt.Tx) error {
		return Attachments(tx, 0, func(uint64, []byte) error { n++; return errStop })
	}); err != errStop || n != 1 {
		t.Errorf("Attachments with fn failing = %v after %d calls, want fn's error after 1", err, n)
	}

	// Appends, a checkpoint and an attachment to a new entry, in one
	// transaction: the Writer's tail stays in key order.
	if err := db.Update(func(tx *bbolt.Tx) error {
		w := NewWriter()
		for i := range 3 {
			a, err := w.Append(tx, KindAudit, t0, json.RawMessage(`{}`))
			if err != nil {
				return err
			}
			if err := Attach(tx, a.Entry.Seq, []byte("new")); err != nil {
				return err
			}
			if i == 1 {
				if _, err := w.Checkpoint(tx, testSigner(t), testOrigin); err != nil {
					return err
				}
			}
		}
		return CheckTree(tx)
	}); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{37, 38, 39} {
		wantAttached[seq] = "new"
	}
	check(t, wantAttached)
	if _, err := verifyDBWith(db, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}); err != nil {
		t.Error(err)
	}

	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, seq := range []uint64{7, 36, 39} {
			if had, err := Detach(tx, seq); !had || err != nil {
				t.Errorf("Detach(%d) = %v, %v; want true", seq, had, err)
			}
			delete(wantAttached, seq)
		}
		for _, seq := range []uint64{7, 8, 99} {
			if had, err := Detach(tx, seq); had || err != nil {
				t.Errorf("Detach(%d) of no attachment = %v, %v; want false", seq, had, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check(t, wantAttached)
	if _, err := verifyDBWith(db, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}); err != nil {
		t.Error(err)
	}
}

// TestVerifyChecksLatestCheckpointRecord: checkpoint_last in ledger_meta
// must name the last stored checkpoint (LatestCheckpoint and the Writer
// trust it for the latest, and the next number); Verify reports a record
// that does not, and LatestCheckpoint one that names no checkpoint.
func TestVerifyChecksLatestCheckpointRecord(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record []byte // nil: deleted
		latest string // LatestCheckpoint's error, "" for none
	}{
		{"deleted", nil, "no checkpoint"},
		{"names the one before", checkpointKey(3, 0), ""},
		{"names none stored", checkpointKey(5, 2), "recorded under key 0000000000000005c00000000000000002, which holds none"},
		{"names an entry", seqKey(2), "malformed checkpoint key 0000000000000002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := twoCommits(t, testSigner(t), 3, 2)
			if err := db.Update(func(tx *bbolt.Tx) error {
				if tc.record == nil {
					return tx.Bucket(bucketMeta).Delete(keyLastCheckpoint)
				}
				return tx.Bucket(bucketMeta).Put(keyLastCheckpoint, tc.record)
			}); err != nil {
				t.Fatal(err)
			}
			_, err := verifyDB(db)
			checkErr(t, err, &CheckpointError{Num: 1}, fmt.Sprintf("the latest checkpoint's key recorded in the metadata (\"checkpoint_last\") is %x, the last stored checkpoint's is 0000000000000005c00000000000000001", tc.record))
			db.View(func(tx *bbolt.Tx) error {
				_, err := LatestCheckpoint(tx)
				if tc.latest == "" && err != nil || tc.latest != "" && (err == nil || !strings.Contains(err.Error(), tc.latest)) {
					t.Errorf("LatestCheckpoint = %v, want %q", err, tc.latest)
				}
				return nil
			})
		})
	}
	// Recorded while none is stored, or beside one beyond the entries.
	db := newDB(t)
	appendBatch(t, db, 3)
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyLastCheckpoint, checkpointKey(3, 0)) }); err != nil {
		t.Fatal(err)
	}
	_, err := verifyDB(db)
	checkErr(t, err, &CheckpointError{Num: 0}, "is 0000000000000003c00000000000000000, the last stored checkpoint's is ")
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyLastCheckpoint) }); err != nil {
		t.Fatal(err)
	}
	writeCheckpoint(t, db, testSigner(t))
	if err := db.Update(func(tx *bbolt.Tx) error {
		signed := mustSign(t, testSigner(t), Checkpoint{Origin: testOrigin, Size: 9})
		if err := tx.Bucket(bucketEntries).Put(checkpointKey(9, 1), signed); err != nil {
			return err
		}
		return nil // checkpoint_last still names #0
	}); err != nil {
		t.Fatal(err)
	}
	_, err = verifyDB(db)
	checkErr(t, err, &CheckpointError{Num: 0}, "is 0000000000000003c00000000000000000, the last stored checkpoint's is 0000000000000009c00000000000000001")
}

// TestCheckpointAt: CheckpointAt reads a checkpoint by its size and
// number; Checkpoints walks them from a number on.
func TestCheckpointAt(t *testing.T) {
	db := checkpointed(t) // checkpoints #0 to #4 of sizes 1, 5, 12, 28, 37
	sizes := []uint64{1, 5, 12, 28, 37}
	db.View(func(tx *bbolt.Tx) error {
		for num, size := range sizes {
			cp, err := CheckpointAt(tx, size, uint64(num))
			if err != nil || cp.Num != uint64(num) || cp.Size != size || cp.Root != rootAt(t, db, size) {
				t.Errorf("CheckpointAt(%d, %d) = %+v, %v", size, num, cp, err)
			}
		}
		for _, sn := range [][2]uint64{{5, 0}, {1, 1}, {37, 5}, {38, 4}} {
			if _, err := CheckpointAt(tx, sn[0], sn[1]); !errors.Is(err, ErrNoCheckpoint) {
				t.Errorf("CheckpointAt(%d, %d) = %v, want ErrNoCheckpoint", sn[0], sn[1], err)
			}
		}
		for from := range uint64(6) {
			var nums []uint64
			if err := Checkpoints(tx, from, func(cp StoredCheckpoint) error {
				nums = append(nums, cp.Num)
				return nil
			}); err != nil {
				t.Error(err)
			}
			var want []uint64
			for num := from; num < 5; num++ {
				want = append(want, num)
			}
			if !slices.Equal(nums, want) {
				t.Errorf("Checkpoints from %d walked %v, want %v", from, nums, want)
			}
		}
		return nil
	})
}

// TestMoveKeepsUndecodableCheckpoint: a checkpoint of an old file whose
// note does not unpack or parse has no size of its own to be keyed by in
// layout 3: Init moves it under the size of the checkpoint before it,
// number kept, and Verify then reports it as it did before the move,
// naming its number; the checkpoints around it are moved as they were.
func TestMoveKeepsUndecodableCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    []byte
		want string
	}{
		{"malformed note", []byte("garbage"), "malformed note"},
		{"undecodable packed note", packedNote("o", repeat("", 100), 0), "malformed note"},
	} {
		for _, layout := range oldLayouts {
			t.Run(fmt.Sprintf("%s/layout%d", tc.name, layout), func(t *testing.T) {
				db := checkpointed(t)
				var first StoredCheckpoint
				db.View(func(tx *bbolt.Tx) error {
					var err error
					first, err = CheckpointAt(tx, 1, 0)
					return err
				})
				toOldLayout(t, db, layout)
				if err := db.Update(func(tx *bbolt.Tx) error {
					return tx.Bucket(bucketCheckpoints).Put(seqKey(1), tc.v)
				}); err != nil {
					t.Fatal(err)
				}
				if err := db.Update(Init); err != nil {
					t.Fatalf("Init: %v", err)
				}
				db.View(func(tx *bbolt.Tx) error {
					if v := tx.Bucket(bucketEntries).Get(checkpointKey(first.Size, 1)); !bytes.Equal(v, tc.v) {
						t.Errorf("checkpoint #1 under the size of #0: %q, want %q", v, tc.v)
					}
					_, err := VerifyWith(tx, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin})
					var ce *CheckpointError
					if !errors.As(err, &ce) || ce.Num != 1 || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("Verify = %v, want checkpoint #1 reported: %q", err, tc.want)
					}
					if cp, err := LatestCheckpoint(tx); err != nil || cp.Num != 4 {
						t.Errorf("latest checkpoint #%d, %v; want #4", cp.Num, err)
					}
					return nil
				})
			})
		}
	}
}

// TestCheckpointNeverWrittenOver: with the record of the latest checkpoint
// naming an earlier one, the next checkpoint would be numbered as one
// already stored: writing it is refused, and the stored one stays.
func TestCheckpointNeverWrittenOver(t *testing.T) {
	signer := testSigner(t)
	db := twoCommits(t, signer, 7, 4)
	var before []byte
	db.Update(func(tx *bbolt.Tx) error {
		before = bytes.Clone(tx.Bucket(bucketEntries).Get(checkpointKey(11, 1)))
		return tx.Bucket(bucketMeta).Put(keyLastCheckpoint, checkpointKey(7, 0))
	})
	err := db.Update(func(tx *bbolt.Tx) error {
		_, err := WriteCheckpoint(tx, otherSigner(t), testOrigin)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "one is stored under its key already") {
		t.Fatalf("WriteCheckpoint over #1 = %v, want it refused", err)
	}
	db.View(func(tx *bbolt.Tx) error {
		if got := tx.Bucket(bucketEntries).Get(checkpointKey(11, 1)); !bytes.Equal(got, before) {
			t.Error("checkpoint #1 was changed")
		}
		return nil
	})
}

// TestMoveInSteps: Move run in small steps, each committed on its own
// after CheckMove accepted the file, leaves a file of every older layout
// (0: made before the tree, 1: level-major tree, 2: tree and checkpoints in
// buckets of their own) exactly as Init's single transaction does, and
// every reader refuses the file until the last step.
func TestMoveInSteps(t *testing.T) {
	for _, layout := range []int{0, layoutLevelMajor, layoutCompletion} {
		t.Run(fmt.Sprint("layout", layout), func(t *testing.T) {
			file := checkpointed
			if layout == 0 {
				file = func(t *testing.T) *bbolt.DB { db := newDB(t); appendBatch(t, db, 40); return db }
			}
			oneShot, stepped := file(t), file(t)
			toOldLayout(t, oneShot, layout)
			toOldLayout(t, stepped, layout)
			if err := oneShot.Update(Init); err != nil {
				t.Fatal(err)
			}
			if err := stepped.View(func(tx *bbolt.Tx) error {
				steps, err := CheckMove(tx)
				if err == nil && steps != (layout == layoutCompletion) {
					t.Errorf("CheckMove reports steps %v for layout %d", steps, layout)
				}
				return err
			}); err != nil {
				t.Fatalf("CheckMove: %v", err)
			}
			steps := 0
			seen := map[int]bool{}
			for done := false; !done; steps++ {
				readable := stepped.View(CheckLayout) == nil
				if err := stepped.Update(func(tx *bbolt.Tx) error {
					var err error
					done, err = Move(tx, 3)
					return err
				}); err != nil {
					t.Fatalf("Move, step %d: %v", steps, err)
				}
				if readable != done {
					t.Fatalf("before step %d, CheckLayout accepted the file: %v; the step found it moved: %v", steps, readable, done)
				}
				if l := recordedLayout(t, stepped); len(l) == 1 {
					seen[int(l[0])] = true
				}
			}
			// Moved in part, the file is recorded as such (0x82), which the
			// build of layout 2 refuses by name.
			if !seen[layoutMoving] {
				t.Errorf("no step recorded layout %x; recorded %v", layoutMoving, seen)
			}
			if steps < 10 {
				t.Fatalf("moved in %d steps of 3 keys", steps)
			}
			if err := stepped.Update(Init); err != nil { // as the kernel's open goes on
				t.Fatal(err)
			}
			if !equalDumpAll(dumpAll(t, stepped), dumpAll(t, oneShot)) {
				t.Fatal("the file moved in steps differs from the one Init moved")
			}
			if err := stepped.View(func(tx *bbolt.Tx) error { _, err := Verify(tx); return err }); err != nil {
				t.Fatal(err)
			}
		})
	}
}
