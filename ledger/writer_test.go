package ledger

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// TestWriterProofsFromMemory appends batches of every size from 0 to 9
// through a Writer, one transaction each with a checkpoint, and checks
// every entry's proof from memory against the RFC 9162 reference proof,
// the checkpoint's root and the proof read from the stored tree; the
// stored ledger then verifies as a whole. A rolled-back transaction and
// entries appended without the Writer in between must not confuse it.
func TestWriterProofsFromMemory(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	s := testSigner(t)
	var leaves [][32]byte
	n := 0
	body := func() json.RawMessage { n++; return json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)) }
	errRollback := errors.New("roll back")
	for round, size := range []int{1, 0, 2, 3, 1, 5, 8, 4, 9, 7, 6, 1, 33, 64, 17, 100} {
		var appended []Appended
		var batch *Batch
		var txLeaves [][32]byte
		err := db.Update(func(tx *bbolt.Tx) error {
			txLeaves = txLeaves[:0]
			for i := range size {
				if round == 5 && (i == 0 || i == 2 || i == 4) {
					// Without the Writer: it must read the stored tree.
					e, err := Append(tx, KindAudit, t0, body())
					if err != nil {
						return err
					}
					txLeaves = append(txLeaves, mustParse(t, e.Hash))
					continue
				}
				a, err := w.Append(tx, KindAudit, t0.Add(time.Duration(i)), body())
				if err != nil {
					return err
				}
				appended = append(appended, a)
				txLeaves = append(txLeaves, mustParse(t, a.Hash))
			}
			var err error
			batch, err = w.Checkpoint(tx, s, testOrigin)
			return err
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// A transaction that appends and is rolled back leaves no trace.
		if err := db.Update(func(tx *bbolt.Tx) error {
			if _, err := w.Append(tx, KindAudit, t0, body()); err != nil {
				return err
			}
			return errRollback
		}); !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		leaves = append(leaves, txLeaves...)
		cp := writeCheckpoint(t, db, s) // the latest: the Writer's, re-read
		if cp.Size != uint64(len(leaves)) || cp.Root != refRoot(leaves) {
			t.Fatalf("round %d: checkpoint size %d root %s, want %d %s", round, cp.Size, digest.Format(cp.Root), len(leaves), digest.Format(refRoot(leaves)))
		}
		if size == 0 {
			if batch != nil {
				t.Errorf("round %d: a transaction without appends has batch %+v", round, batch)
			}
			continue
		}
		if string(batch.Signed) != string(cp.Signed) {
			t.Errorf("round %d: batch checkpoint differs from the stored one", round)
		}
		for _, a := range appended {
			if a.Batch != batch {
				t.Fatalf("round %d: entry %d has another batch", round, a.Seq)
			}
			in, err := batch.Prove(a.Seq)
			if err != nil {
				t.Fatalf("round %d: Prove(%d): %v", round, a.Seq, err)
			}
			if err := in.Verify(cp.Root); err != nil {
				t.Errorf("round %d: proof of %d: %v", round, a.Seq, err)
			}
			want := refPath(int(a.Seq), leaves)
			if fmt.Sprint(in.Proof) != fmt.Sprint(formatHashes(want)) {
				t.Errorf("round %d: proof of %d is %v, want %v", round, a.Seq, in.Proof, formatHashes(want))
			}
			if err := db.View(func(tx *bbolt.Tx) error {
				stored, err := ProveInclusion(tx, a.Seq, cp.Size)
				if err == nil && fmt.Sprint(stored) != fmt.Sprint(in) {
					err = fmt.Errorf("stored proof %v, from memory %v", stored, in)
				}
				return err
			}); err != nil {
				t.Errorf("round %d: %v", round, err)
			}
			var rec []byte
			db.View(func(tx *bbolt.Tx) error {
				var err error
				rec, err = Record(tx, a.Seq)
				return err
			})
			if string(rec) != string(a.Record) {
				t.Errorf("round %d: Record of %d is not the stored record", round, a.Seq)
			}
		}
		if _, err := batch.Prove(batch.start + uint64(len(batch.leaves))); err == nil {
			t.Errorf("round %d: Prove of an entry after the batch succeeded", round)
		}
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		r, err := VerifyWith(tx, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin})
		if err == nil && r.Entries != uint64(len(leaves)) {
			err = fmt.Errorf("verified %d entries, want %d", r.Entries, len(leaves))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, h string) [32]byte {
	t.Helper()
	d, err := digest.Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBatchWithoutCheckpoint refuses proofs before the checkpoint.
func TestBatchWithoutCheckpoint(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	var a Appended
	if err := db.Update(func(tx *bbolt.Tx) (err error) {
		a, err = w.Append(tx, KindAudit, t0, json.RawMessage(`{}`))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Batch.Prove(a.Seq); err == nil {
		t.Error("Prove without a checkpoint succeeded")
	}
	// An Appended whose append never ran (its op's step skipped) has no
	// batch: an error, not a panic.
	if _, err := (Appended{}).Batch.Prove(0); err == nil {
		t.Error("Prove of no batch succeeded")
	}
}

// TestFormatTime: FormatTime writes what time.Format(TimeLayout) writes,
// over the years TimeLayout holds and beyond them.
func TestFormatTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	times := []time.Time{
		time.Unix(0, 0), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 26, 12, 0, 0, 5, time.FixedZone("x", -7*3600)),
	}
	for range 10000 {
		times = append(times, time.Unix(rng.Int64N(1<<38)-1<<37, rng.Int64N(1e9)))
	}
	for _, tm := range times {
		if got, want := FormatTime(tm), tm.UTC().Format(TimeLayout); got != want {
			t.Fatalf("FormatTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

// TestCheckpointPresigned: a checkpoint signed ahead (Pending) is stored
// as it is when the ledger did not grow since; a stale one, or a forged
// one, is not: the Writer signs the checkpoint of the ledger as it is.
func TestCheckpointPresigned(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	s := testSigner(t)
	for _, c := range []struct {
		name   string
		before int // entries appended before Pending
		after  int // entries appended after it
		forge  bool
	}{
		{"fresh", 2, 0, false},
		{"stale", 1, 1, false},
		{"forged root", 1, 0, true},
	} {
		var pre Presigned
		var batch *Batch
		err := db.Update(func(tx *bbolt.Tx) error {
			for range c.before {
				if _, err := w.Append(tx, KindAudit, t0, json.RawMessage(`{"n":1}`)); err != nil {
					return err
				}
			}
			cp, ok, err := w.Pending(tx, testOrigin)
			if err != nil || !ok {
				return fmt.Errorf("Pending: %v %v", ok, err)
			}
			if c.forge {
				cp.Root[0] ^= 1
			}
			signed, err := SignCheckpoint(s, cp)
			if err != nil {
				return err
			}
			pre = Presigned{Checkpoint: cp, Signed: signed}
			if c.forge {
				cp.Root[0] ^= 1 // claims the true root, signed over another
				pre.Checkpoint = cp
			}
			for range c.after {
				if _, err := w.Append(tx, KindAudit, t0, json.RawMessage(`{"n":2}`)); err != nil {
					return err
				}
			}
			batch, err = w.CheckpointPresigned(tx, s, testOrigin, pre)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, err := OpenCheckpoint(batch.Signed, testVerifier(t)); err != nil && !c.forge {
			t.Fatalf("%s: stored checkpoint does not verify: %v", c.name, err)
		}
		cp := writeCheckpoint(t, db, s)
		if got, want := string(batch.Signed) == string(pre.Signed), c.name == "fresh"; got != want {
			t.Errorf("%s: presigned note stored %v, want %v", c.name, got, want)
		}
		if cp.Size != batch.Checkpoint.Size || cp.Root != batch.Checkpoint.Root {
			t.Errorf("%s: stored checkpoint %d %x, the batch's %d %x", c.name, cp.Size, cp.Root, batch.Checkpoint.Size, batch.Checkpoint.Root)
		}
	}
}

// TestWriterHeadInTransaction: within one transaction, after every append
// of a Writer, of the package's Append in between and of a second Writer,
// the head read back in the transaction is that of the last entry, and so
// is the committed one; a rolled-back transaction that appended leaves the
// head it found. Fails if the head written once per transaction is not
// updated in place, or if a head stored by another appender is
// overwritten by a stale one.
func TestWriterHeadInTransaction(t *testing.T) {
	db := newDB(t)
	w, other := NewWriter(), NewWriter()
	var last Entry
	check := func(tx *bbolt.Tx, step string, n uint64) {
		t.Helper()
		h, err := HeadOf(tx)
		if err != nil || h.Size != n || h.Hash != last.Hash {
			t.Fatalf("%s: head %+v, %v; want %d entries ending with %s", step, h, err, n, last.Hash)
		}
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		n := uint64(0)
		for i, who := range []string{"w", "w", "w", "package", "w", "other", "other", "w", "w"} {
			body := json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))
			var err error
			switch who {
			case "w":
				var a Appended
				a, err = w.Append(tx, KindAudit, t0, body)
				last = a.Entry
			case "other":
				var a Appended
				a, err = other.Append(tx, KindAudit, t0, body)
				last = a.Entry
			default:
				last, err = Append(tx, KindAudit, t0, body)
			}
			if err != nil {
				return err
			}
			n++
			check(tx, fmt.Sprintf("append %d by %s", i, who), n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bbolt.Tx) error { check(tx, "committed", 9); return nil })
	errRollback := errors.New("roll back")
	if err := db.Update(func(tx *bbolt.Tx) error {
		for i := range 3 {
			if _, err := w.Append(tx, KindAudit, t0, json.RawMessage(fmt.Sprintf(`{"r":%d}`, i))); err != nil {
				return err
			}
		}
		return errRollback
	}); !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	db.View(func(tx *bbolt.Tx) error { check(tx, "after a rollback", 9); return nil })
	if err := db.Update(func(tx *bbolt.Tx) error {
		a, err := w.Append(tx, KindAudit, t0, json.RawMessage(`{"after":1}`))
		last = a.Entry
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		check(tx, "next transaction", 10)
		r, err := Verify(tx)
		if err == nil && r != 10 {
			err = fmt.Errorf("verified %d entries", r)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestWriterRefusesEntriesBeyondHead: a key stored anywhere after the
// head (not only at the next sequence number) that no ledger of the head's
// size holds — an entry, a node, a checkpoint of a larger size — stops a Writer's append in a new transaction before it writes; a
// checkpoint of the head's size does not.
func TestWriterRefusesEntriesBeyondHead(t *testing.T) {
	for _, tc := range []struct {
		name string
		k, v []byte
		want string // "" for an append that goes ahead
	}{
		{"entry", seqKey(7), []byte(`{}`), "entry 7 is stored although the head says 2 entries"},
		{"node", treeKey(compact.NewNodeID(1, 2)), make([]byte, 32), "tree node (level 1, index 2) is stored although the head says 2 entries"},
		{"malformed key", []byte{0, 0, 0, 0, 0, 0, 0, 3, 0x40}, []byte("x"), "a malformed key 000000000000000340 is stored although the head says 2 entries"},
		{"checkpoint of a larger size", checkpointKey(3, 1), []byte("x"), "a checkpoint of size 3 is stored although the head says 2 entries"},
		{"checkpoint of the head's size", checkpointKey(2, 1), []byte("x"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			es := appendN(t, db, 2)
			if err := db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(bucketEntries).Put(tc.k, tc.v)
			}); err != nil {
				t.Fatal(err)
			}
			w := NewWriter()
			for name, f := range map[string]func(tx *bbolt.Tx) error{
				"Writer.Append": func(tx *bbolt.Tx) error {
					_, err := w.Append(tx, KindAudit, t0, json.RawMessage(`{}`))
					return err
				},
				"Append": func(tx *bbolt.Tx) error {
					_, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`))
					return err
				},
			} {
				if err := db.Update(func(tx *bbolt.Tx) error {
					err := f(tx)
					if tc.want == "" {
						if err != nil {
							t.Errorf("%s with %s stored: %v", name, tc.name, err)
						}
						return errRollback
					}
					if err == nil || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("%s with %s stored beyond a head of 2: %v, want %q", name, tc.name, err, tc.want)
					}
					if h, _ := HeadOf(tx); h.Size != 2 || h.Hash != es[1].Hash {
						t.Errorf("head changed: %+v", h)
					}
					return nil
				}); err != nil && !errors.Is(err, errRollback) {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestAppendAllocations bounds the allocations of a Writer's append in a
// transaction that already appended (bbolt's Get and Puts included) and of
// a proof from its batch: the sequencer's and each caller's share of an
// audited call.
func TestAppendAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	db := newDB(t)
	w := NewWriter()
	s := testSigner(t)
	body, err := Canonicalize(body300)
	if err != nil {
		t.Fatal(err)
	}
	var appended []Appended
	var perAppend float64
	if err := db.Update(func(tx *bbolt.Tx) error {
		for range 64 { // bbolt's nodes of the tx, the batch's slices
			a, err := w.AppendCanonical(tx, KindAudit, t0, body)
			if err != nil {
				return err
			}
			appended = append(appended, a)
		}
		perAppend = testing.AllocsPerRun(200, func() {
			a, err := w.AppendCanonical(tx, KindAudit, t0, body)
			if err != nil {
				t.Fatal(err)
			}
			appended = append(appended[:64], a)
		})
		_, err := w.Checkpoint(tx, s, testOrigin)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	a := appended[len(appended)-1]
	if _, err := a.Batch.Prove(a.Seq); err != nil { // builds the batch's nodes
		t.Fatal(err)
	}
	perProof := testing.AllocsPerRun(100, func() {
		if _, err := a.Batch.Prove(a.Seq); err != nil {
			t.Fatal(err)
		}
	})
	// bbolt: a Get of the head (cursor stack), a Put of the entry and
	// about two of tree nodes (key copy, cursor stack of each); the
	// Writer: the record and one buffer for keys and values. (Before the
	// head was written in place: 21 and 5.)
	if perAppend > 12 || perProof > 2 {
		t.Errorf("an append allocates %v times, a proof %v times; want at most 12 and 2", perAppend, perProof)
	}
	t.Logf("allocations: %v per append, %v per proof", perAppend, perProof)
}

// TestWriterFillsPages: the pages of the ledger's bucket (entries, tree
// nodes and checkpoints) that a Writer's appends and checkpoints fill are
// full before they split (keys only grow, and the Writer sets bbolt's
// FillPercent to 1), so the ledger takes about half the pages a default
// fill would.
func TestWriterFillsPages(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	s := testSigner(t)
	body, err := Canonicalize(body300)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := db.Update(func(tx *bbolt.Tx) error {
			for range 100 {
				if _, err := w.AppendCanonical(tx, KindAudit, t0, body); err != nil {
					return err
				}
			}
			_, err := w.Checkpoint(tx, s, testOrigin)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	db.View(func(tx *bbolt.Tx) error {
		// Every key is appended at the bucket's end (a default fill
		// leaves the pages at half).
		st := tx.Bucket(bucketEntries).Stats()
		if fill := float64(st.LeafInuse) / float64(st.LeafAlloc); fill < 0.9 {
			t.Errorf("bucket %s: leaf pages %.0f%% full (%d pages), want at least 90%%", bucketEntries, 100*fill, st.LeafPageN)
		}
		return nil
	})
}

// TestWriterProofsDeep: over 3000 entries appended in batches of random
// sizes, every entry's proof from its batch verifies against the batch's
// checkpoint and equals the proof read from the stored tree (edges of
// many shapes before a batch, trees up to 12 levels).
func TestWriterProofsDeep(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	s := testSigner(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 0; n < 3000; {
		size := 1 + rng.IntN(300)
		var appended []Appended
		var batch *Batch
		if err := db.Update(func(tx *bbolt.Tx) error {
			for i := range size {
				a, err := w.Append(tx, KindAudit, t0, json.RawMessage(fmt.Sprintf(`{"n":%d}`, n+i)))
				if err != nil {
					return err
				}
				appended = append(appended, a)
			}
			var err error
			batch, err = w.Checkpoint(tx, s, testOrigin)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		n += size
		if err := db.View(func(tx *bbolt.Tx) error {
			for _, a := range appended {
				in, err := batch.Prove(a.Seq)
				if err != nil {
					return err
				}
				if err := in.Verify(batch.Checkpoint.Root); err != nil {
					return fmt.Errorf("proof of %d in %d: %w", a.Seq, n, err)
				}
				stored, err := ProveInclusion(tx, a.Seq, batch.Checkpoint.Size)
				if err != nil {
					return err
				}
				if fmt.Sprint(stored) != fmt.Sprint(in) {
					return fmt.Errorf("proof of %d in %d: stored %v, from memory %v", a.Seq, n, stored, in)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAppendHashesRecordPrefix: an append hashes a body's part of the
// record off the sequencer (Body's prefix) and the rest in the append;
// the entry hash is the record's hash either way, for bodies short enough
// for a prefix and for longer ones, which the append hashes whole.
func TestAppendHashesRecordPrefix(t *testing.T) {
	db := newDB(t)
	w := NewWriter()
	for _, n := range []int{0, 10, 900, 1000, 1010, 5000, 31 << 10, 40 << 10} {
		body, err := Canonicalize(json.RawMessage(`{"x":"` + strings.Repeat("a", n) + `"}`))
		if err != nil {
			t.Fatal(err)
		}
		if (body.prefix != nil) != (n < 30<<10) {
			t.Errorf("body of %d bytes: prefix %v", n, body.prefix != nil)
		}
		var a Appended
		if err := db.Update(func(tx *bbolt.Tx) (err error) {
			a, err = w.AppendCanonical(tx, KindAudit, t0, body)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.View(func(tx *bbolt.Tx) error {
			e, err := Get(tx, a.Seq)
			if err != nil {
				return err
			}
			// zeebo/blake3's keyed hash of the preimage, in one piece.
			z, err := blake3.NewKeyed(leafKey[:])
			if err != nil {
				return err
			}
			z.Write(appendPreimage(nil, &e))
			if want := digest.Prefix + hex.EncodeToString(z.Sum(nil)); e.Hash != want {
				t.Errorf("body of %d bytes: entry hash %s, the record's hash %s", n, e.Hash, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := verifyDB(db); err != nil {
		t.Fatal(err)
	}
}
