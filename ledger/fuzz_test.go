package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/jsonpack"
)

// The fuzz targets below take their seed corpora from the golden vectors
// (testdata/vectors.json, testdata/merkle_vectors.json); run one with
// go test -run='^$' -fuzz='^FuzzDecodeRecord$' ./ledger/ (see make fuzz).

// errRollback makes bbolt roll back a write transaction a test only looks
// through.
var errRollback = errors.New("rollback")

// loadMerkleVectors reads the golden file of the tree, proofs, checkpoint
// and export.
func loadMerkleVectors(tb testing.TB) merkleVectors {
	tb.Helper()
	b, err := os.ReadFile(merkleVectorsFile)
	if err != nil {
		tb.Fatal(err)
	}
	var v merkleVectors
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// goldenRecords returns every stored record of the two golden files.
func goldenRecords(tb testing.TB) [][]byte {
	tb.Helper()
	b, err := os.ReadFile(vectorsFile)
	if err != nil {
		tb.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for _, e := range v.Entries {
		out = append(out, []byte(e.Record))
	}
	for _, e := range loadMerkleVectors(tb).Entries {
		out = append(out, []byte(e.Record))
	}
	return out
}

// goldenLeaves returns the entry hashes of the golden Merkle tree.
func goldenLeaves(tb testing.TB, v merkleVectors) [][32]byte {
	tb.Helper()
	out := make([][32]byte, len(v.Entries))
	for i, e := range v.Entries {
		h, err := digest.Parse(e.EntryHash)
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = h
	}
	return out
}

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder along its
// three paths: decodeRecord itself, Get (the bytes stored as entry 0) and
// an export of one line. They must never panic and must agree; a record
// they accept is exactly the canonical encoding of a well-formed entry, and
// VerifyExport accepts it as the whole export exactly when it is a valid
// entry 0.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range goldenRecords(f) {
		f.Add(rec)
		f.Add(packStored(f, rec))
	}
	f.Add([]byte(`{"body":{},"entry_hash":"blake3:00","kind":"a","prev_hash":"blake3:00","seq":0,"time":"x"}`))
	f.Add([]byte(`{"checkpoint":"x"}`))
	f.Add([]byte(`null`))
	// A body holding the entry_hash member's text as a nested member.
	f.Add([]byte(`{"body":{"a":{"b":1,"entry_hash":"blake3:00"}},"entry_hash":"blake3:` + strings.Repeat("0", 64) + `","kind":"a","prev_hash":"blake3:` + strings.Repeat("0", 64) + `","seq":0,"time":"2025-01-01T00:00:00.000000000Z"}`))
	db := newDB(f)
	f.Fuzz(func(t *testing.T, rec []byte) {
		var e Entry
		err := decodeRecord(&e, rec)
		ref, refErr := referenceDecode(rec)
		if (err == nil) != (refErr == nil) || err == nil && !entriesEqual(ref, e) {
			t.Fatalf("decodeRecord(%q) = %+v, %v; the generic JSON decoder says %+v, %v", rec, e, err, ref, refErr)
		}
		// parseRecord's shortcut finds the entry_hash member where the
		// search would, whenever the record is accepted.
		if at := bytes.LastIndex(rec, []byte(recHash)); err == nil && guessHashAt(rec) != at {
			t.Fatalf("accepted %q: guessHashAt = %d, the last entry_hash member is at %d", rec, guessHashAt(rec), at)
		}

		var got Entry
		var getErr error
		if err := db.Update(func(tx *bbolt.Tx) error {
			if err := tx.Bucket(bucketEntries).Put(seqKey(0), rec); err != nil {
				return err
			}
			got, getErr = Get(tx, 0)
			return errRollback
		}); !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		// Verification's fast path for packed records accepts only what
		// the general path accepts, and reads the same record.
		var fast, slow record
		if _, frec, ok := unpackRecord(&fast, []byte("dst"), rec); ok {
			loaded, err := loadRecord(nil, rec)
			if err == nil {
				err = parseRecord(&slow, loaded)
			}
			if err != nil || !bytes.Equal(frec, loaded) || !sameRecord(&fast, &slow) {
				t.Fatalf("packed %q: fast path read %q as %+v; general path %q, %+v, %v", rec, frec, fast, loaded, slow, err)
			}
		}

		// Get reads the stored value through loadRecord: the record
		// itself, or the one a packed value unpacks to.
		var stored Entry
		storedErr := decodeStoredRecord(&stored, rec)
		if (storedErr == nil) != (getErr == nil) || getErr == nil && !entriesEqual(got, stored) {
			t.Fatalf("stored value %q: decodeStoredRecord = %+v, %v; Get = %+v, %v", rec, stored, storedErr, got, getErr)
		}
		if !jsonpack.Packed(rec) && (err == nil) != (getErr == nil) {
			t.Fatalf("decodeRecord: %v; Get: %v", err, getErr)
		}

		valid := false
		if err == nil {
			if !entriesEqual(got, e) {
				t.Fatalf("Get = %+v, decodeRecord = %+v", got, e)
			}
			if enc := appendRecord(nil, &e); !bytes.Equal(enc, rec) {
				t.Fatalf("accepted %q, which encodes as %q", rec, enc)
			}
			h, err := EntryHash(e)
			if err != nil {
				t.Fatalf("accepted %q, but EntryHash fails: %v", rec, err)
			}
			valid = e.Seq == 0 && e.PrevHash == ZeroHash && h == e.Hash
		}

		r, err := VerifyExport(bytes.NewReader(append(slices.Clip(rec), '\n')), VerifyOptions{})
		switch {
		case valid && (err != nil || r.Entries != 1 || digest.Format(r.Root) != e.Hash):
			t.Fatalf("VerifyExport of the valid entry 0 %q = %+v, %v", rec, r, err)
		case !valid && err == nil:
			t.Fatalf("VerifyExport accepted %q as an export: %+v", rec, r)
		case err != nil && !strings.HasPrefix(err.Error(), "ledger export line 1: "):
			t.Fatalf("VerifyExport error %v does not name line 1", err)
		}
	})
}

// referenceDecode is the decoder parseRecord replaced, kept as the
// reference it must agree with: generic JSON decoding, then a canonical
// re-encoding compared with the record.
func referenceDecode(rec []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(rec, &e); err != nil {
		return Entry{}, err
	}
	if err := checkFields(&e); err != nil {
		return Entry{}, err
	}
	if _, err := digest.Parse(e.Hash); err != nil {
		return Entry{}, err
	}
	body, err := canonicalBody(e.Body)
	if err != nil {
		return Entry{}, err
	}
	if !bytes.Equal(body, e.Body) || !bytes.Equal(appendRecord(nil, &e), rec) {
		return Entry{}, errNotCanonical
	}
	return e, nil
}

func entriesEqual(a, b Entry) bool {
	return a.Seq == b.Seq && a.Kind == b.Kind && a.Time == b.Time && a.PrevHash == b.PrevHash &&
		bytes.Equal(a.Body, b.Body) && a.Hash == b.Hash
}

// FuzzVerifyExport feeds arbitrary exports, checkpoints signed by the test
// key among them, to VerifyExport. It must never panic, must name the line
// of every failure (a bytes.Reader cannot fail), and anything it accepts
// must be, byte for byte, what Export writes for the ledger it describes
// (rebuilt here from the entries' kinds, times and bodies, with its
// checkpoints put back), up to the final newline.
func FuzzVerifyExport(f *testing.F) {
	v := loadMerkleVectors(f)
	export := strings.Join(v.Export, "\n") + "\n"
	// Short seeds too: the fuzzer minimizes every new input it finds, which
	// takes long from the whole export.
	f.Add([]byte(export))
	f.Add([]byte(strings.Join(v.Export[:8], "\n")))
	f.Add([]byte(strings.Join(v.Export[:2], "\n") + "\n"))
	f.Add([]byte(v.Export[7] + "\n"))
	f.Add([]byte(""))
	db := newDB(f)
	opts := VerifyOptions{Verifier: testVerifier(f), Origin: testOrigin}
	f.Fuzz(func(t *testing.T, data []byte) {
		var entries []Entry
		opts := opts
		opts.OnEntry = func(e Entry) error { entries = append(entries, e); return nil }
		r, err := VerifyExport(bytes.NewReader(data), opts)
		if err != nil {
			var ve *VerifyError
			var ce *CheckpointError
			var fe *ForkError
			if !errors.As(err, &ve) && !errors.As(err, &ce) && !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), "ledger export line ") {
				t.Fatalf("VerifyExport error %v names no line and no entry or checkpoint", err)
			}
			return
		}
		if r.Entries != uint64(len(entries)) {
			t.Fatalf("report %+v after %d entries", r, len(entries))
		}
		var signed [][]byte
		for l := range bytes.Lines(data) {
			if bytes.HasPrefix(l, []byte(checkpointLinePrefix)) {
				var cl checkpointLine
				if err := json.Unmarshal(bytes.TrimSuffix(l, []byte("\n")), &cl); err != nil {
					t.Fatalf("accepted checkpoint line %q: %v", l, err)
				}
				signed = append(signed, []byte(cl.Checkpoint))
			}
		}
		if r.Checkpoints != uint64(len(signed)) {
			t.Fatalf("report %+v, %d checkpoint lines", r, len(signed))
		}

		var want bytes.Buffer
		if err := db.Update(func(tx *bbolt.Tx) error {
			for _, e := range entries {
				at, err := time.Parse(TimeLayout, e.Time)
				if err != nil {
					t.Fatalf("accepted entry %d with time %q: %v", e.Seq, e.Time, err)
				}
				again, err := Append(tx, e.Kind, at, e.Body)
				if err != nil {
					t.Fatalf("accepted entry %d cannot be appended again: %v", e.Seq, err)
				}
				if !entriesEqual(again, e) {
					t.Fatalf("accepted entry %+v, appended again as %+v", e, again)
				}
			}
			for _, s := range signed {
				if _, err := PutCheckpoint(tx, s); err != nil {
					t.Fatalf("accepted checkpoint %q cannot be put back: %v", s, err)
				}
			}
			if root, err := Root(tx, r.Entries); err != nil || root != r.Root {
				t.Fatalf("report root %x, ledger root %x, %v", r.Root, root, err)
			}
			if err := Export(tx, &want); err != nil {
				return err
			}
			return errRollback
		}); !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		if got := data; !bytes.Equal(got, want.Bytes()) && !bytes.Equal(append(slices.Clip(got), '\n'), want.Bytes()) {
			t.Fatalf("accepted export\n%q\nbut Export writes\n%q", got, want.Bytes())
		}
	})
}

// proofHashes splits b into 32-byte hashes, ignoring a shorter tail.
func proofHashes(b []byte) [][32]byte {
	out := make([][32]byte, len(b)/32)
	for i := range out {
		out[i] = [32]byte(b[32*i:])
	}
	return out
}

// hash32 returns b as a hash if it is 32 bytes long, or else def.
func hash32(b []byte, def [32]byte) [32]byte {
	if len(b) == 32 {
		return [32]byte(b)
	}
	return def
}

// proofBytes concatenates a vector proof's hashes, the form the proof
// fuzz targets take.
func proofBytes(f *testing.F, hashes []string) []byte {
	var p []byte
	for _, h := range hashes {
		sum, err := digest.Parse(h)
		if err != nil {
			f.Fatal(err)
		}
		p = append(p, sum[:]...)
	}
	return p
}

// FuzzVerifyInclusion checks inclusion proofs against the golden tree of 17
// entries: VerifyInclusion must never panic, and given the true root of a
// tree size within the tree it must accept nothing but the true leaf and
// its RFC 9162 path. The leaf and root default to the true ones unless the
// input gives 32 bytes; the proof is the input cut into 32-byte hashes.
func FuzzVerifyInclusion(f *testing.F) {
	v := loadMerkleVectors(f)
	leaves := goldenLeaves(f, v)
	for _, c := range v.Inclusion {
		p := proofBytes(f, c.Proof)
		f.Add(c.Index, c.Size, []byte(nil), p, []byte(nil))
		f.Add(c.Index, c.Size+1, []byte(nil), p, []byte(nil))
		f.Add(c.Index^1, c.Size, []byte(nil), p, []byte(nil))
		f.Add(c.Index, c.Size, leaves[(c.Index+1)%uint64(len(leaves))][:], p, []byte(nil))
	}
	f.Add(uint64(0), uint64(1), []byte(nil), []byte(nil), leaves[0][:])
	f.Add(uint64(1<<63), uint64(1<<64-1), []byte(nil), make([]byte, 64*32), []byte(nil))
	n := uint64(len(leaves))
	f.Fuzz(func(t *testing.T, index, size uint64, leafIn, proofIn, rootIn []byte) {
		var trueLeaf, trueRoot [32]byte
		known := size <= n && index < size
		if known {
			trueLeaf, trueRoot = leaves[index], refRoot(leaves[:size])
		}
		leaf, root, p := hash32(leafIn, trueLeaf), hash32(rootIn, trueRoot), proofHashes(proofIn)
		err := VerifyInclusion(index, size, leaf, p, root)
		if !known || root != trueRoot {
			return // another tree, as for a leaf of size 1 that is its root
		}
		truth := refPath(int(index), leaves[:size])
		isTrue := leaf == trueLeaf && slices.Equal(p, truth)
		if err == nil && !isTrue {
			t.Fatalf("VerifyInclusion(%d, %d) accepts leaf %x, proof %x, root %x; the true ones are %x, %x, %x", index, size, leaf, p, root, trueLeaf, truth, trueRoot)
		}
		if err != nil && isTrue {
			t.Fatalf("VerifyInclusion(%d, %d) rejects the true proof: %v", index, size, err)
		}
	})
}

// FuzzVerifyConsistency checks consistency proofs against the golden tree
// of 17 entries: VerifyConsistency must never panic, and for sizes within
// the tree, given the true new root, it must accept nothing but the true
// old root and the RFC 9162 proof between them; from size 0 (whose root is
// the empty root) and between equal sizes (equal roots) the proof is empty
// and the new root is not constrained. Roots default to the true ones
// unless the input gives 32 bytes.
func FuzzVerifyConsistency(f *testing.F) {
	v := loadMerkleVectors(f)
	leaves := goldenLeaves(f, v)
	for _, c := range v.Consistency {
		p := proofBytes(f, c.Proof)
		f.Add(c.Size1, c.Size2, p, []byte(nil), []byte(nil))
		f.Add(c.Size1+1, c.Size2, p, []byte(nil), []byte(nil))
		f.Add(c.Size1, c.Size2, p, leaves[0][:], []byte(nil))
	}
	f.Add(uint64(0), uint64(0), []byte(nil), leaves[0][:], leaves[0][:])
	f.Add(uint64(1<<63+1), uint64(1<<64-1), make([]byte, 64*32), []byte(nil), []byte(nil))
	n := uint64(len(leaves))
	f.Fuzz(func(t *testing.T, size1, size2 uint64, proofIn, root1In, root2In []byte) {
		var true1, true2 [32]byte
		known := size1 <= size2 && size2 <= n
		if known {
			true1, true2 = refRoot(leaves[:size1]), refRoot(leaves[:size2])
		}
		root1, root2, p := hash32(root1In, true1), hash32(root2In, true2), proofHashes(proofIn)
		err := VerifyConsistency(size1, size2, p, root1, root2)
		if !known {
			return
		}
		truth := refProof(int(size1), leaves[:size2])
		var ok bool // what may be accepted
		switch {
		case size1 == 0:
			ok = root1 == emptyRoot && len(p) == 0 && (size2 > 0 || root2 == emptyRoot)
		case size1 == size2:
			ok = root1 == root2 && len(p) == 0
		case root2 != true2:
			return // another tree
		default:
			ok = root1 == true1 && slices.Equal(p, truth)
		}
		if err == nil && !ok {
			t.Fatalf("VerifyConsistency(%d, %d) accepts roots %x, %x and proof %x; the true ones are %x, %x, %x", size1, size2, root1, root2, p, true1, true2, truth)
		}
		if err != nil && ok {
			t.Fatalf("VerifyConsistency(%d, %d) rejects roots %x, %x with proof %x: %v", size1, size2, root1, root2, p, err)
		}
	})
}

// FuzzCheckpointNote feeds arbitrary bytes to the checkpoint parsers:
// ParseCheckpoint (note text), parseSigned (a signed note, signatures not
// checked, as VerifyWith without a verifier reads them) and OpenCheckpoint
// (a signed note checked against the test key). None may panic. Text that
// ParseCheckpoint accepts marshals back to the same bytes and signs and
// opens to the same checkpoint; a note either of the others accepts starts
// with its checkpoint's text, and one OpenCheckpoint accepts carries the
// test key's signature line of exactly that text.
func FuzzCheckpointNote(f *testing.F) {
	v := loadMerkleVectors(f)
	f.Add([]byte(v.Checkpoint.Text))
	f.Add([]byte(v.Checkpoint.Signed))
	for _, l := range v.Export {
		var cl checkpointLine
		if strings.HasPrefix(l, checkpointLinePrefix) && json.Unmarshal([]byte(l), &cl) == nil {
			f.Add([]byte(cl.Checkpoint))
		}
	}
	s, verifier := testSigner(f), testVerifier(f)
	witness := mustSign(f, otherSigner(f), Checkpoint{Origin: "witness", Size: 1})
	f.Add(append([]byte(v.Checkpoint.Signed), witness[bytes.Index(witness, []byte("\n\n"))+2:]...))
	f.Add(mustSign(f, s, Checkpoint{Origin: testOrigin, Size: 3, Extensions: []string{"ext", "— x"}}))
	f.Add([]byte("o\n5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if c, err := ParseCheckpoint(data); err == nil {
			if m := c.Marshal(); !bytes.Equal(m, data) {
				t.Fatalf("ParseCheckpoint accepted %q, which marshals as %q", data, m)
			}
			signed, err := SignCheckpoint(s, c)
			if err != nil {
				t.Fatalf("ParseCheckpoint accepted %q, which does not sign: %v", data, err)
			}
			again, err := OpenCheckpoint(signed, verifier)
			if err != nil || !bytes.Equal(again.Marshal(), data) {
				t.Fatalf("ParseCheckpoint accepted %q, which signs as %q and opens as %+v, %v", data, signed, again, err)
			}
		}
		if c, n, err := parseSigned(data); err == nil {
			if m := c.Marshal(); string(m) != n.Text || !bytes.HasPrefix(data, append(m, '\n')) {
				t.Fatalf("parseSigned accepted %q with text %q, which marshals as %q", data, n.Text, m)
			}
		}
		c, err := OpenCheckpoint(data, verifier)
		if err != nil {
			return
		}
		m := c.Marshal()
		signed, err := SignCheckpoint(s, c)
		if err != nil {
			t.Fatalf("OpenCheckpoint accepted %q, whose checkpoint does not sign: %v", data, err)
		}
		sigLine := signed[len(m)+1:]
		if !bytes.HasPrefix(data, append(m, '\n')) || !bytes.Contains(data, sigLine) {
			t.Fatalf("OpenCheckpoint accepted %q as %q, signed %q", data, m, sigLine)
		}
		if c2, _, err := parseSigned(data); err != nil || fmt.Sprint(c2) != fmt.Sprint(c) {
			t.Fatalf("OpenCheckpoint accepted %q as %+v, parseSigned reads %+v, %v", data, c, c2, err)
		}
	})
}
