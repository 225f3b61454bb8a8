package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/jsonpack"
)

// tamper edits the raw buckets of a 5-entry ledger.
type tamper func(t *testing.T, entries, meta *bbolt.Bucket)

// edit returns a tamper that rewrites the record of entry seq with f.
func edit(seq uint64, f func([]byte) []byte) tamper {
	return func(t *testing.T, entries, _ *bbolt.Bucket) {
		rec, err := loadRecord(nil, entries.Get(seqKey(seq)))
		if err != nil {
			t.Fatal(err)
		}
		if err := entries.Put(seqKey(seq), f(rec)); err != nil {
			t.Fatal(err)
		}
	}
}

// flipAfter flips the lowest bit of the byte that follows the first
// occurrence of marker.
func flipAfter(t *testing.T, rec []byte, marker string) []byte {
	i := bytes.Index(rec, []byte(marker))
	if i < 0 {
		t.Fatalf("%q not in %s", marker, rec)
	}
	rec[i+len(marker)] ^= 1
	return rec
}

func TestVerifyNamesFirstBadEntry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper tamper
		seq    uint64
		reason string
	}{
		{"body byte flipped", func(t *testing.T, e, _ *bbolt.Bucket) {
			edit(2, func(r []byte) []byte { return flipAfter(t, r, `"tool_id":"`) })(t, e, nil)
		}, 2, "entry_hash"},
		{"body structure byte flipped", func(t *testing.T, e, _ *bbolt.Bucket) {
			edit(2, func(r []byte) []byte { return flipAfter(t, r, `{"body":{"i"`) })(t, e, nil)
		}, 2, "undecodable"},
		{"prev_hash flipped", func(t *testing.T, e, _ *bbolt.Bucket) {
			edit(2, func(r []byte) []byte { return flipAfter(t, r, `"prev_hash":"blake3:`) })(t, e, nil)
		}, 2, "prev_hash"},
		{"entry_hash flipped", func(t *testing.T, e, _ *bbolt.Bucket) {
			edit(2, func(r []byte) []byte { return flipAfter(t, r, `"entry_hash":"blake3:`) })(t, e, nil)
		}, 2, "entry_hash"},
		{"time flipped", func(t *testing.T, e, _ *bbolt.Bucket) {
			edit(2, func(r []byte) []byte { return flipAfter(t, r, `"time":"2025-01-02T03:04:0`) })(t, e, nil)
		}, 2, "entry_hash"},
		{"seq field changed", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`"seq":2`), []byte(`"seq":3`), 1)
		}), 2, "record says seq 3"},
		{"entry deleted", func(t *testing.T, e, _ *bbolt.Bucket) {
			if err := e.Delete(seqKey(2)); err != nil {
				t.Fatal(err)
			}
		}, 2, "missing"},
		{"last entry deleted", func(t *testing.T, e, _ *bbolt.Bucket) {
			if err := e.Delete(seqKey(4)); err != nil {
				t.Fatal(err)
			}
		}, 4, "missing"},
		{"entries swapped", func(t *testing.T, e, _ *bbolt.Bucket) {
			a, b := bytes.Clone(e.Get(seqKey(1))), bytes.Clone(e.Get(seqKey(3)))
			if e.Put(seqKey(1), b) != nil || e.Put(seqKey(3), a) != nil {
				t.Fatal("put failed")
			}
		}, 1, "record says seq 3"},
		{"malformed key among the entries", func(t *testing.T, e, _ *bbolt.Bucket) {
			// 9 bytes, of no kind (seq 2 || 0x00 is leaf 2's key): sorts
			// after entry 2's key, before entry 3's.
			if err := e.Put(append(seqKey(2), 0x40), bytes.Clone(e.Get(seqKey(2)))); err != nil {
				t.Fatal(err)
			}
		}, 3, "malformed key 000000000000000240"},
		{"value truncated", edit(2, func(r []byte) []byte { return r[:len(r)/2] }), 2, "undecodable"},
		{"value emptied", edit(3, func(r []byte) []byte { return []byte{} }), 3, "undecodable"},
		{"whitespace between members", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`,"kind"`), []byte(`, "kind"`), 1)
		}), 2, "not canonical"},
		{"whitespace inside body", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`{"body":{"i":`), []byte(`{"body":{"i": `), 1)
		}), 2, "not canonical"},
		{"body keys reordered", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`{"i":111,"tool_id":"echo"}`), []byte(`{"tool_id":"echo","i":111}`), 1)
		}), 2, "not canonical"},
		{"member added", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`,"kind"`), []byte(`,"extra":1,"kind"`), 1)
		}), 2, "not canonical"},
		{"duplicate member", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`,"kind":"audit"`), []byte(`,"kind":"receipt","kind":"audit"`), 1)
		}), 2, "not canonical"},
		{"kind changed", edit(2, func(r []byte) []byte {
			return bytes.Replace(r, []byte(`"kind":"audit"`), []byte(`"kind":"receipt"`), 1)
		}), 2, "entry_hash"},
		{"entry rewritten with recomputed hash", func(t *testing.T, e, _ *bbolt.Bucket) {
			var x Entry
			if err := decodeStoredRecord(&x, e.Get(seqKey(2))); err != nil {
				t.Fatal(err)
			}
			x.Body = []byte(`{"i":0}`)
			h, err := EntryHash(x)
			if err != nil {
				t.Fatal(err)
			}
			x.Hash = h
			if err := e.Put(seqKey(2), appendRecord(nil, &x)); err != nil {
				t.Fatal(err)
			}
		}, 2, "Merkle tree leaf: stored hash"},
		{"head counts too many", func(t *testing.T, _, m *bbolt.Bucket) {
			setHead(t, m, 6, nil)
		}, 5, "head metadata counts 6"},
		{"head counts too few", func(t *testing.T, _, m *bbolt.Bucket) {
			setHead(t, m, 4, nil)
		}, 4, "not counted"},
		{"head hash flipped", func(t *testing.T, _, m *bbolt.Bucket) {
			setHead(t, m, 5, func(h []byte) { h[0] ^= 1 })
		}, 4, "head metadata hash"},
		{"head missing", func(t *testing.T, _, m *bbolt.Bucket) {
			if err := m.Delete(keyHead); err != nil {
				t.Fatal(err)
			}
		}, 0, "not counted"},
		{"head malformed", func(t *testing.T, _, m *bbolt.Bucket) {
			if err := m.Put(keyHead, []byte{0, 5}); err != nil {
				t.Fatal(err)
			}
		}, 4, "head metadata is 2 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			appendN(t, db, 5)
			if err := db.Update(func(tx *bbolt.Tx) error {
				tc.tamper(t, tx.Bucket(bucketEntries), tx.Bucket(bucketMeta))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			checkVerifyFails(t, db, tc.seq, tc.reason)
		})
	}
}

// TestVerifyDetectsEveryByteFlip flips each bit of one stored record in
// turn, packed (as Append stores it) and as JSON (as ledgers from before
// packing hold it).
func TestVerifyDetectsEveryByteFlip(t *testing.T) {
	for _, packed := range []bool{true, false} {
		t.Run(fmt.Sprintf("packed=%v", packed), func(t *testing.T) { testByteFlips(t, packed) })
	}
}

func testByteFlips(t *testing.T, packed bool) {
	db := newDB(t)
	appendN(t, db, 5)
	var orig []byte
	if err := db.View(func(tx *bbolt.Tx) error {
		orig = bytes.Clone(tx.Bucket(bucketEntries).Get(seqKey(2)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if jsonpack.Packed(orig) != true {
		t.Fatalf("record 2 is stored as %q, not packed", orig)
	}
	if !packed {
		orig = mustLoad(t, orig)
	}
	for i := range orig {
		for bit := range 8 {
			rec := bytes.Clone(orig)
			rec[i] ^= 1 << bit
			if err := db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(bucketEntries).Put(seqKey(2), rec)
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.View(func(tx *bbolt.Tx) error {
				_, err := Verify(tx)
				var ve *VerifyError
				if !errors.As(err, &ve) || ve.Seq != 2 {
					t.Errorf("byte %d (%q) bit %d flipped: Verify = %v, want a VerifyError for entry 2", i, orig[i], bit, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func setHead(t *testing.T, meta *bbolt.Bucket, size uint64, f func([]byte)) {
	t.Helper()
	v := bytes.Clone(meta.Get(keyHead))
	if f != nil {
		f(v[8:])
	}
	var h [digest.Size]byte
	copy(h[:], v[8:])
	if err := meta.Put(keyHead, encodeHead(size, h)); err != nil {
		t.Fatal(err)
	}
}

func checkVerifyFails(t *testing.T, db *bbolt.DB, seq uint64, reason string) {
	t.Helper()
	if err := db.View(func(tx *bbolt.Tx) error {
		n, err := Verify(tx)
		var ve *VerifyError
		if !errors.As(err, &ve) {
			t.Fatalf("Verify = %d, %v; want a *VerifyError", n, err)
		}
		if ve.Seq != seq || !strings.Contains(ve.Reason, reason) {
			t.Errorf("Verify: %v; want entry %d, reason containing %q", err, seq, reason)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// truncateTail cuts a ledger back to its first keep entries as an attacker
// who understands the format would: entries, the tree nodes beyond them and
// the head all agree afterwards. With dropCheckpoints it also deletes the
// checkpoints for larger sizes.
func truncateTail(t *testing.T, db *bbolt.DB, keep uint64, dropCheckpoints bool) {
	t.Helper()
	if err := db.Update(func(tx *bbolt.Tx) error {
		deleteWhere := func(b *bbolt.Bucket, drop func(k, v []byte) bool) {
			var keys [][]byte
			b.ForEach(func(k, v []byte) error {
				if drop(k, v) {
					keys = append(keys, bytes.Clone(k))
				}
				return nil
			})
			for _, k := range keys {
				if err := b.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
		}
		entries, meta := tx.Bucket(bucketEntries), tx.Bucket(bucketMeta)
		deleteWhere(entries, func(k, v []byte) bool {
			if kindOf(k) != kindCheckpoint {
				// An entry, its attachment, or a node completed by a
				// dropped entry.
				return binary.BigEndian.Uint64(k) >= keep
			}
			if !dropCheckpoints {
				return false
			}
			signed, err := loadCheckpoint(v)
			if err != nil {
				return true
			}
			c, _, err := parseSigned(signed)
			return err != nil || c.Size > keep
		})
		if dropCheckpoints {
			// The latest checkpoint recorded is then the last one left.
			var last []byte
			c := newKindCursor(entries, kindCheckpoint)
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				last = bytes.Clone(k)
			}
			var err error
			if last == nil {
				err = meta.Delete(keyLastCheckpoint)
			} else {
				err = meta.Put(keyLastCheckpoint, last)
			}
			if err != nil {
				return err
			}
		}
		last, err := getNode(storedTree{b: entries}, compact.NewNodeID(0, keep-1))
		if err != nil {
			return err
		}
		return meta.Put(keyHead, encodeHead(keep, last))
	}); err != nil {
		t.Fatal(err)
	}
}

// TestTailTruncation cuts the last entries off a ledger of 8 entries with
// checkpoints #0 (size 3), #1 (size 5) and #2 (size 8), keeping 4, and
// checks that a checkpoint reveals it: one still stored, or #2 held by
// someone who saw it earlier and checks the ledger's export against it (a
// checkpoint line appended to the export is checked where it stands, after
// all the entries, like any other).
func TestTailTruncation(t *testing.T) {
	opts := VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}
	build := func(t *testing.T) (*bbolt.DB, []string, string) {
		db := newDB(t)
		s := testSigner(t)
		var held StoredCheckpoint
		for _, n := range []int{3, 2, 3} {
			appendBatch(t, db, n)
			held = writeCheckpoint(t, db, s)
		}
		line, err := marshalCheckpointLine(held.Signed)
		if err != nil {
			t.Fatal(err)
		}
		return db, exportLines(t, db), string(line)
	}
	// The intact export: e0 e1 e2 c3 e3 e4 c5 e5 e6 e7 c8.
	const keptLines = 5 // e0 e1 e2 c3 e3

	t.Run("stored checkpoints kept", func(t *testing.T) {
		db, _, _ := build(t)
		truncateTail(t, db, 4, false)
		_, err := verifyDBWith(db, opts)
		checkErr(t, err, &CheckpointError{Num: 1}, "is for tree size 5 but the ledger has 4 entries")
		if err := db.View(CheckTree); err == nil || !strings.Contains(err.Error(), "a checkpoint of size 5 is stored beyond the head's 4 entries") {
			t.Errorf("CheckTree = %v", err)
		}
		_, err = VerifyExport(strings.NewReader(joinLines(exportLines(t, db))), opts)
		checkErr(t, err, &CheckpointError{Num: 1}, "line 6: ledger: checkpoint #1: is for tree size 5 but follows 4 entries")
	})
	t.Run("stored checkpoints cut too", func(t *testing.T) {
		db, intact, held := build(t)
		truncateTail(t, db, 4, true)
		r, err := verifyDBWith(db, opts)
		if err != nil || r.Entries != 4 || r.Checkpoints != 1 {
			t.Fatalf("VerifyWith of the consistently truncated ledger = %+v, %v; want 4 entries, 1 checkpoint", r, err)
		}
		lines := exportLines(t, db)
		if !slices.Equal(lines, intact[:keptLines]) {
			t.Fatalf("export of the truncated ledger\n%s\nis not the intact export's first %d lines", joinLines(lines), keptLines)
		}
		_, err = VerifyExport(strings.NewReader(joinLines(append(lines, held))), opts)
		checkErr(t, err, &CheckpointError{Num: 1}, "line 6: ledger: checkpoint #1: is for tree size 8 but follows 4 entries")
	})
	t.Run("export lines cut", func(t *testing.T) {
		_, intact, held := build(t)
		cut := intact[:keptLines]
		if r, err := VerifyExport(strings.NewReader(joinLines(cut)), opts); err != nil || r.Entries != 4 || r.Latest.Size != 3 {
			t.Fatalf("VerifyExport of the cut export alone = %+v, %v; want a valid prefix", r, err)
		}
		_, err := VerifyExport(strings.NewReader(joinLines(append(slices.Clone(cut), held))), opts)
		checkErr(t, err, &CheckpointError{Num: 1}, "line 6: ledger: checkpoint #1: is for tree size 8 but follows 4 entries")
		// The held checkpoint at its place in the intact export verifies.
		whole := append(slices.Clone(intact), held)
		if r, err := VerifyExport(strings.NewReader(joinLines(whole)), opts); err != nil || r.Checkpoints != 4 {
			t.Errorf("VerifyExport of the intact export with the held checkpoint = %+v, %v", r, err)
		}
	})
}

// TestVerifyNamesLowestBadSeqAcrossBatches tampers with entries in
// different batches of the parallel verifier (and a checkpoint's
// signature between them): whichever worker finishes first, VerifyWith and
// VerifyExport report the lowest bad entry.
func TestVerifyNamesLowestBadSeqAcrossBatches(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	const n = 4*batchItems + 10
	db := newDB(t)
	s := testSigner(t)
	if err := db.Update(func(tx *bbolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		for i := range n {
			if _, err := Append(tx, KindAudit, t0, []byte(`{"i":`+strconv.Itoa(i)+`,"tool_id":"echo"}`)); err != nil {
				return err
			}
			if i%100 == 99 {
				if _, err := WriteCheckpoint(tx, s, testOrigin); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	opts := VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}
	bad := []uint64{3*batchItems + 1, batchItems + 7, 4 * batchItems}
	for i, seq := range bad {
		if err := db.Update(func(tx *bbolt.Tx) error {
			entries, meta, err := buckets(tx)
			if err != nil {
				return err
			}
			edit(seq, func(r []byte) []byte { return flipAfter(t, r, `"tool_id":"`) })(t, entries, meta)
			if i == 0 {
				// A forged signature on the checkpoint of size 2*batchItems+100·k.
				num := uint64(2*batchItems/100 + 1)
				sig := bytes.Clone(entries.Get(storedCheckpointKey(tx, num)))
				sig[len(sig)-3] ^= 1
				return putRawCheckpoint(tx, num, sig)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(batchItems + 7)
	for range 5 {
		var export bytes.Buffer
		if err := db.View(func(tx *bbolt.Tx) error {
			_, err := VerifyWith(tx, opts)
			if ve := (*VerifyError)(nil); !errors.As(err, &ve) || ve.Seq != want {
				t.Fatalf("VerifyWith = %v, want entry %d", err, want)
			}
			return Export(tx, &export)
		}); err != nil {
			t.Fatal(err)
		}
		_, err := VerifyExport(&export, opts)
		if ve := (*VerifyError)(nil); !errors.As(err, &ve) || ve.Seq != want {
			t.Fatalf("VerifyExport = %v, want entry %d", err, want)
		}
	}
}
