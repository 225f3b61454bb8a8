package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/internal/jsonpack"
)

// mustRecord returns the record of entry seq (its JSON).
func mustRecord(tb testing.TB, tx *bbolt.Tx, seq uint64) []byte {
	tb.Helper()
	rec, err := Record(tx, seq)
	if err != nil {
		tb.Fatal(err)
	}
	return rec
}

// mustLoad returns the record a stored value holds.
func mustLoad(tb testing.TB, v []byte) []byte {
	tb.Helper()
	rec, err := loadRecord(nil, v)
	if err != nil {
		tb.Fatal(err)
	}
	return rec
}

// packStored returns the packed stored form of the record rec, as Append
// stores it.
func packStored(tb testing.TB, rec []byte) []byte {
	tb.Helper()
	var e Entry
	if err := decodeRecord(&e, rec); err != nil {
		tb.Fatal(err)
	}
	var r record
	if err := parseRecord(&r, rec); err != nil {
		tb.Fatal(err)
	}
	body := packBody(e.Body)
	if body == nil {
		tb.Fatalf("body of %q does not pack", rec)
	}
	v := packRecord(nil, &e, body, &r.hash, &r.prev)
	if back := mustLoad(tb, v); !bytes.Equal(back, rec) {
		tb.Fatalf("packed record unpacks to %q, want %q", back, rec)
	}
	return v
}

// TestRecordsArePacked: Append, the Writer and AppendCanonical store
// records packed, in less than 60% of their JSON, and every reader gets
// the JSON back (Get, Scan, Record, Export, the Writer's Record).
func TestRecordsArePacked(t *testing.T) {
	db := newDB(t)
	entries := appendN(t, db, 3)
	w := NewWriter()
	body, err := Canonicalize(body300)
	if err != nil {
		t.Fatal(err)
	}
	var a Appended
	if err := db.Update(func(tx *bbolt.Tx) (err error) {
		a, err = w.AppendCanonical(tx, KindAudit, time.Now(), body)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	entries = append(entries, a.Entry)
	var lines []string
	if err := db.View(func(tx *bbolt.Tx) error {
		var out bytes.Buffer
		if err := Export(tx, &out); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.HasPrefix(l, checkpointLinePrefix) {
				lines = append(lines, l)
			}
		}
		var scanned []Entry
		if err := Scan(tx, 0, func(e Entry) error { scanned = append(scanned, e); return nil }); err != nil {
			return err
		}
		for i, want := range entries {
			v := tx.Bucket(bucketEntries).Get(seqKey(want.Seq))
			rec := mustRecord(t, tx, want.Seq)
			if !jsonpack.Packed(v) || len(v)*10 > len(rec)*6 {
				t.Errorf("entry %d: stored %d bytes for a %d-byte record (packed %v)", want.Seq, len(v), len(rec), jsonpack.Packed(v))
			}
			if got := string(appendRecord(nil, &want)); string(rec) != got || lines[i] != got {
				t.Errorf("entry %d: Record %q, export line %q, want %q", want.Seq, rec, lines[i], got)
			}
			e, err := Get(tx, want.Seq)
			if err != nil || !equalEntries(e, want) || !equalEntries(scanned[i], want) {
				t.Errorf("entry %d: Get %+v, %v; Scan %+v; want %+v", want.Seq, e, err, scanned[i], want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if string(a.Record) != lines[3] {
		t.Errorf("Writer's Record %q, exported %q", a.Record, lines[3])
	}
}

// TestLedgerOfJSONRecordsVerifies: a ledger whose records are stored as
// JSON (written before packing existed) reads and verifies as before, and
// one that mixes both forms (entries appended after an upgrade) too.
func TestLedgerOfJSONRecordsVerifies(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 6)
	var before Report
	var export []byte
	if err := db.Update(func(tx *bbolt.Tx) error {
		var err error
		if before, err = VerifyWith(tx, VerifyOptions{}); err != nil {
			return err
		}
		var out bytes.Buffer
		if err := Export(tx, &out); err != nil {
			return err
		}
		export = out.Bytes()
		b := tx.Bucket(bucketEntries)
		for seq := range uint64(6) {
			if err := b.Put(seqKey(seq), mustRecord(t, tx, seq)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check := func(n uint64) {
		t.Helper()
		if err := db.View(func(tx *bbolt.Tx) error {
			r, err := VerifyWith(tx, VerifyOptions{})
			if err != nil || r.Entries != n {
				t.Fatalf("VerifyWith = %+v, %v; want %d entries", r, err, n)
			}
			if n == before.Entries && r.Root != before.Root {
				t.Fatalf("root %x, before %x", r.Root, before.Root)
			}
			var out bytes.Buffer
			if err := Export(tx, &out); err != nil {
				return err
			}
			if !bytes.HasPrefix(out.Bytes(), export) {
				t.Fatalf("export changed:\n%s\nbefore:\n%s", out.Bytes(), export)
			}
			_, err = VerifyExport(&out, VerifyOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	check(6)
	if err := db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketEntries).Get(seqKey(3)); jsonpack.Packed(v) {
			t.Fatal("record 3 is still packed")
		}
		e, err := Get(tx, 3)
		if err != nil || !json.Valid(e.Body) {
			t.Fatalf("Get of a JSON record: %+v, %v", e, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	appendN(t, db, 2)
	check(8)
}

// TestUndecodablePackedRecord: a packed record that does not unpack is
// reported as a bad entry by Verify, Get, Scan, Record and Export.
func TestUndecodablePackedRecord(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 5)
	if err := db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		v := bytes.Clone(b.Get(seqKey(2)))
		return b.Put(seqKey(2), v[:len(v)-3])
	}); err != nil {
		t.Fatal(err)
	}
	checkVerifyFails(t, db, 2, "undecodable record")
	if err := db.View(func(tx *bbolt.Tx) error {
		_, getErr := Get(tx, 2)
		_, recErr := Record(tx, 2)
		scanErr := Scan(tx, 0, func(Entry) error { return nil })
		exportErr := Export(tx, &bytes.Buffer{})
		for name, err := range map[string]error{"Get": getErr, "Record": recErr, "Scan": scanErr, "Export": exportErr} {
			if err == nil || !strings.Contains(err.Error(), "undecodable record") {
				t.Errorf("%s: %v, want an undecodable record error", name, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var ve *VerifyError
	if err := db.View(func(tx *bbolt.Tx) error { _, err := Verify(tx); return err }); !errors.As(err, &ve) {
		t.Fatalf("Verify: %v, want a *VerifyError", err)
	}
}

// BenchmarkPrepareRecord measures what verification does per record
// before the chain checks: unpack (for a packed record), parse and hash,
// for the record stored as JSON and packed.
func BenchmarkPrepareRecord(b *testing.B) {
	db := newDB(b)
	body, err := Canonicalize(body300)
	if err != nil {
		b.Fatal(err)
	}
	var v []byte
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := AppendCanonical(tx, KindAudit, time.Now(), body); err != nil {
			return err
		}
		v = bytes.Clone(tx.Bucket(bucketEntries).Get(seqKey(0)))
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for _, form := range []struct {
		name string
		v    []byte
	}{{"json", mustLoad(b, v)}, {"packed", v}} {
		b.Run(form.name, func(b *testing.B) {
			var buf []byte
			leaf := keyedHasher(leafKey)().(*blake3.Hasher)
			for b.Loop() {
				it := item{kind: itemEntry, data: form.v, key: seqKey(0), stored: true}
				buf = buf[:0]
				it.prepare(&VerifyOptions{}, &buf, leaf)
				if it.err != nil || it.prepareError != nil {
					b.Fatal(it.err, it.prepareError)
				}
			}
		})
	}
}

// sameRecord reports whether two parsed records say the same.
func sameRecord(a, b *record) bool {
	return bytes.Equal(a.body, b.body) && a.hash == b.hash && a.prev == b.prev && bytes.Equal(a.hashHex, b.hashHex) &&
		bytes.Equal(a.prevHex, b.prevHex) && bytes.Equal(a.kind, b.kind) && bytes.Equal(a.time, b.time) &&
		a.seq == b.seq && a.hashAt == b.hashAt && a.hashEnd == b.hashEnd
}

// TestUnpackRecordFastPath: the records Append stores take verification's
// fast path, which reads them as the general path does.
func TestUnpackRecordFastPath(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 5)
	if err := db.View(func(tx *bbolt.Tx) error {
		for seq := range uint64(5) {
			v := tx.Bucket(bucketEntries).Get(seqKey(seq))
			var fast, slow record
			_, rec, ok := unpackRecord(&fast, []byte("prefix"), v)
			if !ok {
				t.Fatalf("entry %d: fast path refused %x", seq, v)
			}
			want := mustLoad(t, v)
			if err := parseRecord(&slow, want); err != nil || !bytes.Equal(rec, want) || !sameRecord(&fast, &slow) {
				t.Fatalf("entry %d: fast path %q %+v; general %q %+v, %v", seq, rec, fast, want, slow, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointsArePacked: checkpoints are stored packed in about half
// the bytes of their note and read back as the note; notes stored as is
// (before packing, or with extension lines) read unchanged; a packed
// checkpoint that does not decode fails verification and export.
func TestCheckpointsArePacked(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 3)
	s := testSigner(t)
	cp := writeCheckpoint(t, db, s)
	if err := db.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketEntries).Get(checkpointKey(cp.Size, cp.Num))
		if v[0] != checkpointTag || len(v)+50 > len(cp.Signed) {
			t.Errorf("checkpoint stored in %d bytes for a %d-byte note: %q", len(v), len(cp.Signed), v)
		}
		if back, err := loadCheckpoint(v); err != nil || !bytes.Equal(back, cp.Signed) {
			t.Errorf("stored checkpoint reads as %q, %v; want %q", back, err, cp.Signed)
		}
		latest, err := LatestCheckpoint(tx)
		if err != nil || !bytes.Equal(latest.Signed, cp.Signed) {
			t.Errorf("LatestCheckpoint = %q, %v", latest.Signed, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, note := range []string{
		"origin\n3\n" + strings.Repeat("A", 43) + "=\nextension line\n\n— origin AAAA\n",
		"not a note",
		"",
		"o\n01\nAAAA\n\n— o AAAA\n",
	} {
		if v := packCheckpoint([]byte(note)); string(v) != note {
			t.Errorf("packCheckpoint(%q) = %q, want it stored as is", note, v)
		}
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		v := bytes.Clone(tx.Bucket(bucketEntries).Get(checkpointKey(cp.Size, cp.Num)))
		return putRawCheckpoint(tx, cp.Num, v[:len(v)-1])
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		_, err := VerifyWith(tx, VerifyOptions{})
		var ce *CheckpointError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "undecodable checkpoint") {
			t.Errorf("VerifyWith of a damaged packed checkpoint: %v", err)
		}
		if err := Export(tx, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "undecodable checkpoint") {
			t.Errorf("Export of a damaged packed checkpoint: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// FuzzCheckpointPack: loadCheckpoint(packCheckpoint(b)) == b for every b,
// and loadCheckpoint of any bytes returns a note of at most
// maxUnpackedCheckpoint bytes or an error, never a panic.
func FuzzCheckpointPack(f *testing.F) {
	f.Add([]byte("ck-1\n7\nmuF48J0v7EsmEvBavYHobWzmJ3dJVoHgnimWy08IOEE=\n\n— ck-1 ybj+YkBRkdFuWdBELN6BeHGkUmeN3oYtuiuQF8Q/z7G93pfiAfWc6lXt5F2ZecFeW5KiFvMh84XOJmiRHoI3ghvlDwY=\n"))
	f.Add([]byte("o\n0\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n— a AAAA\n— b AAAA\n"))
	f.Add([]byte{checkpointTag, 1, 'o', 7})
	f.Fuzz(func(t *testing.T, b []byte) {
		v := packCheckpoint(b)
		back, err := loadCheckpoint(v)
		if err != nil || !bytes.Equal(back, b) {
			if len(b) == 0 || b[0] != checkpointTag {
				t.Fatalf("loadCheckpoint(packCheckpoint(%q)) = %q, %v", b, back, err)
			}
		}
		if out, err := loadCheckpoint(b); err == nil && len(b) > 0 && b[0] == checkpointTag && len(out) > maxUnpackedCheckpoint(len(b)) {
			t.Fatalf("loadCheckpoint(%q): %d bytes out of %d", b, len(out), len(b))
		}
	})
}
