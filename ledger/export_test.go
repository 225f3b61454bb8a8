package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
)

// exportedLedger builds a ledger of 13 entries in batches of 3, 1, 5 and 2
// with a checkpoint after each (and one of the empty ledger), then 2
// entries without one, and returns it with its export as lines (without
// their newlines).
func exportedLedger(t *testing.T) (*bbolt.DB, []string) {
	t.Helper()
	db := newDB(t)
	s := testSigner(t)
	writeCheckpoint(t, db, s)
	for _, n := range []int{3, 1, 5, 2} {
		appendBatch(t, db, n)
		writeCheckpoint(t, db, s)
	}
	appendBatch(t, db, 2)
	return db, exportLines(t, db)
}

func exportLines(t *testing.T, db *bbolt.DB) []string {
	t.Helper()
	var buf bytes.Buffer
	if err := db.View(func(tx *bbolt.Tx) error { return Export(tx, &buf) }); err != nil {
		t.Fatal(err)
	}
	s, ok := strings.CutSuffix(buf.String(), "\n")
	if !ok {
		t.Fatalf("export does not end with a newline: %q", buf.String())
	}
	return strings.Split(s, "\n")
}

func joinLines(lines []string) string { return strings.Join(lines, "\n") + "\n" }

func TestExportRoundTrip(t *testing.T) {
	db, lines := exportedLedger(t)
	// The layout: checkpoint lines right after the entry completing their
	// size; entry lines are the stored records.
	var layout []string
	var n int
	for i, l := range lines {
		if strings.HasPrefix(l, `{"checkpoint":"`) {
			var cl checkpointLine
			if err := json.Unmarshal([]byte(l), &cl); err != nil {
				t.Fatalf("line %d: %v", i+1, err)
			}
			c, err := OpenCheckpoint([]byte(cl.Checkpoint), testVerifier(t))
			if err != nil {
				t.Fatalf("line %d: %v", i+1, err)
			}
			layout = append(layout, fmt.Sprint("c", c.Size))
			continue
		}
		if err := db.View(func(tx *bbolt.Tx) error {
			if rec := mustRecord(t, tx, uint64(n)); string(rec) != l {
				t.Errorf("line %d is not the record of entry %d", i+1, n)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		n++
		layout = append(layout, "e")
	}
	want := "c0 e e e c3 e c4 e e e e e c9 e e c11 e e"
	if got := strings.Join(layout, " "); got != want {
		t.Errorf("export layout %s, want %s", got, want)
	}

	var seqs []uint64
	opts := VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin, OnEntry: func(e Entry) error {
		seqs = append(seqs, e.Seq)
		return nil
	}}
	got, err := VerifyExport(strings.NewReader(joinLines(lines)), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.OnEntry = nil
	want2, err := verifyDBWith(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !reportsEqual(got, want2) || got.Entries != 13 || got.Checkpoints != 5 || got.Latest.Size != 11 || got.Root != rootAt(t, db, 13) {
		t.Errorf("VerifyExport = %+v\nVerifyWith = %+v", got, want2)
	}
	if len(seqs) != 13 || !slices.IsSorted(seqs) || seqs[12] != 12 {
		t.Errorf("OnEntry saw %v", seqs)
	}

	// Without the final newline, and without checkpoints, it still verifies.
	if _, err := VerifyExport(strings.NewReader(strings.Join(lines, "\n")), opts); err != nil {
		t.Errorf("export without the final newline: %v", err)
	}
	var entriesOnly []string
	for _, l := range lines {
		if !strings.HasPrefix(l, checkpointLinePrefix) {
			entriesOnly = append(entriesOnly, l)
		}
	}
	if r, err := VerifyExport(strings.NewReader(joinLines(entriesOnly)), opts); err != nil || r.Checkpoints != 0 || r.Entries != 13 {
		t.Errorf("export of entries only: %+v, %v", r, err)
	}
}

func reportsEqual(a, b Report) bool {
	return a.Entries == b.Entries && a.Root == b.Root && a.Checkpoints == b.Checkpoints &&
		string(a.Latest.Marshal()) == string(b.Latest.Marshal())
}

func TestVerifyExportEmpty(t *testing.T) {
	r, err := VerifyExport(strings.NewReader(""), VerifyOptions{})
	if err != nil || r.Entries != 0 || r.Root != emptyRoot || r.Checkpoints != 0 {
		t.Errorf("VerifyExport of nothing = %+v, %v", r, err)
	}
	db := newDB(t)
	writeCheckpoint(t, db, testSigner(t))
	lines := exportLines(t, db)
	if r, err := VerifyExport(strings.NewReader(joinLines(lines)), VerifyOptions{Verifier: testVerifier(t)}); err != nil || r.Checkpoints != 1 || r.Root != emptyRoot {
		t.Errorf("VerifyExport of an empty ledger's checkpoint = %+v, %v", r, err)
	}
}

// TestVerifyExportNamesFirstBadLine edits the export of exportedLedger,
// whose lines are: 1 c0, 2-4 entries 0-2, 5 c3, 6 entry 3, 7 c4, 8-12
// entries 4-8, 13 c9, 14-15 entries 9-10, 16 c11, 17-18 entries 11-12.
func TestVerifyExportNamesFirstBadLine(t *testing.T) {
	s, other := testSigner(t), otherSigner(t)
	signedLine := func(signer note.Signer, size uint64, root [32]byte) string {
		line, err := marshalCheckpointLine(mustSign(t, signer, Checkpoint{Origin: testOrigin, Size: size, Root: root}))
		if err != nil {
			t.Fatal(err)
		}
		return string(line)
	}
	rejectSeq3 := errors.New("receipt signature invalid")
	for _, tc := range []struct {
		name   string
		edit   func(db *bbolt.DB, l []string) []string
		onSeq3 bool
		line   int
		want   error
		reason string
	}{
		{"body byte flipped", func(_ *bbolt.DB, l []string) []string {
			l[8] = strings.Replace(l[8], `{"i":5}`, `{"i":6}`, 1)
			return l
		}, false, 9, &VerifyError{Seq: 5}, "entry_hash"},
		{"prev_hash byte flipped", func(_ *bbolt.DB, l []string) []string {
			l[8] = flipHexAfter(t, l[8], `"prev_hash":"blake3:`)
			return l
		}, false, 9, &VerifyError{Seq: 5}, "prev_hash blake3:"},
		{"entry_hash byte flipped", func(_ *bbolt.DB, l []string) []string {
			l[8] = flipHexAfter(t, l[8], `"entry_hash":"blake3:`)
			return l
		}, false, 9, &VerifyError{Seq: 5}, "does not match the recomputed"},
		{"entry line deleted", func(_ *bbolt.DB, l []string) []string {
			return slices.Delete(l, 8, 9)
		}, false, 9, &VerifyError{Seq: 5}, "record says seq 6"},
		{"entry lines swapped", func(_ *bbolt.DB, l []string) []string {
			l[8], l[9] = l[9], l[8]
			return l
		}, false, 9, &VerifyError{Seq: 5}, "record says seq 6"},
		{"entry duplicated", func(_ *bbolt.DB, l []string) []string {
			return slices.Insert(l, 9, l[8])
		}, false, 10, &VerifyError{Seq: 6}, "record says seq 5"},
		{"last line truncated", func(_ *bbolt.DB, l []string) []string {
			l[17] = l[17][:len(l[17])-1]
			return l
		}, false, 18, &VerifyError{Seq: 12}, "undecodable"},
		{"empty line", func(_ *bbolt.DB, l []string) []string {
			return slices.Insert(l, 3, "")
		}, false, 4, &VerifyError{Seq: 2}, "undecodable"},
		{"whitespace in a record", func(_ *bbolt.DB, l []string) []string {
			l[5] = strings.Replace(l[5], `,"kind"`, `, "kind"`, 1)
			return l
		}, false, 6, &VerifyError{Seq: 3}, "not canonical"},
		{"entry rejected by OnEntry", func(_ *bbolt.DB, l []string) []string { return l }, true, 6, &VerifyError{Seq: 3}, rejectSeq3.Error()},
		{"checkpoint moved after the next entry", func(_ *bbolt.DB, l []string) []string {
			l[4], l[5] = l[5], l[4]
			return l
		}, false, 6, &CheckpointError{Num: 1}, "is for tree size 3 but follows 4 entries"},
		{"checkpoint moved before its entries", func(_ *bbolt.DB, l []string) []string {
			l[3], l[4] = l[4], l[3]
			return l
		}, false, 4, &CheckpointError{Num: 1}, "is for tree size 3 but follows 2 entries"},
		{"checkpoint signed by another key", func(db *bbolt.DB, l []string) []string {
			l[6] = signedLine(other, 4, rootAt(t, db, 4))
			return l
		}, false, 7, &CheckpointError{Num: 2}, "not signed by key"},
		{"checkpoint with a wrong root", func(db *bbolt.DB, l []string) []string {
			l[6] = signedLine(s, 4, rootAt(t, db, 3))
			return l
		}, false, 8, &CheckpointError{Num: 2}, "root blake3:"},
		{"fork", func(db *bbolt.DB, l []string) []string {
			return slices.Insert(l, 7, signedLine(s, 4, rootAt(t, db, 3)))
		}, false, 8, &ForkError{Size: 4, First: 2, Second: 3}, "checkpoints #2 and #3 are both for tree size 4"},
		{"fork, the forged one first", func(db *bbolt.DB, l []string) []string {
			return slices.Insert(l, 6, signedLine(s, 4, rootAt(t, db, 3)))
		}, false, 8, &ForkError{Size: 4, First: 2, Second: 3}, "checkpoints #2 and #3 are both for tree size 4"},
		{"checkpoint line not canonical", func(_ *bbolt.DB, l []string) []string {
			l[4] = strings.Replace(l[4], `{"checkpoint":`, `{"checkpoint": `, 1)
			return l
		}, false, 5, &CheckpointError{Num: 1}, "not exactly"},
		{"checkpoint line with another member", func(_ *bbolt.DB, l []string) []string {
			l[4] = strings.Replace(l[4], `"}`, `","x":1}`, 1)
			return l
		}, false, 5, &CheckpointError{Num: 1}, "not exactly"},
		{"checkpoint line undecodable", func(_ *bbolt.DB, l []string) []string {
			l[4] = `{"checkpoint":"x`
			return l
		}, false, 5, &CheckpointError{Num: 1}, "undecodable line"},
		{"checkpoint note text edited", func(_ *bbolt.DB, l []string) []string {
			l[4] = strings.Replace(l[4], `\n3\n`, `\n4\n`, 1)
			return l
		}, false, 5, &CheckpointError{Num: 1}, "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, lines := exportedLedger(t)
			edited := tc.edit(db, slices.Clone(lines))
			opts := VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}
			if tc.onSeq3 {
				opts.OnEntry = func(e Entry) error {
					if e.Seq == 3 {
						return rejectSeq3
					}
					return nil
				}
			}
			_, err := VerifyExport(strings.NewReader(joinLines(edited)), opts)
			checkErr(t, err, tc.want, tc.reason)
			if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("line %d:", tc.line)) {
				t.Errorf("error %v does not name line %d", err, tc.line)
			}
			if tc.onSeq3 && !errors.Is(err, rejectSeq3) {
				t.Errorf("error %v does not wrap OnEntry's", err)
			}
		})
	}
}

// flipHexAfter changes the hex digit that follows the first occurrence of
// marker in s into another hex digit, so the hash stays well-formed.
func flipHexAfter(t *testing.T, s, marker string) string {
	t.Helper()
	i := strings.Index(s, marker)
	if i < 0 {
		t.Fatalf("%q not in %s", marker, s)
	}
	i += len(marker)
	d := byte('0')
	if s[i] == '0' {
		d = '1'
	}
	return s[:i] + string(d) + s[i+1:]
}

// TestExportOfDamagedLedger: Export copies a damaged ledger as it is, and
// VerifyExport then reports what VerifyWith reports.
func TestExportOfDamagedLedger(t *testing.T) {
	for _, tc := range []struct {
		name string
		// put returns checkpoint #2, stored under the key of size size.
		size uint64
		put  func(db *bbolt.DB) []byte
		want error
	}{
		{"malformed checkpoint", 6, func(*bbolt.DB) []byte { return []byte("garbage") }, &CheckpointError{Num: 2}},
		{"checkpoint beyond the entries", 99, func(*bbolt.DB) []byte {
			return mustSign(t, testSigner(t), Checkpoint{Origin: testOrigin, Size: 99})
		}, &CheckpointError{Num: 2}},
		// Stored after #1 (size 4): keys sort by size, so a checkpoint of
		// a smaller size stored after it is stored under another size.
		{"checkpoint size going down", 4, func(db *bbolt.DB) []byte {
			return mustSign(t, testSigner(t), Checkpoint{Origin: testOrigin, Size: 1, Root: rootAt(t, db, 1)})
		}, &CheckpointError{Num: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			appendBatch(t, db, 2)
			writeCheckpoint(t, db, testSigner(t))
			appendBatch(t, db, 2)
			writeCheckpoint(t, db, testSigner(t))
			appendBatch(t, db, 2)
			if err := db.Update(func(tx *bbolt.Tx) error {
				return putCheckpointAt(tx, tc.size, 2, tc.put(db))
			}); err != nil {
				t.Fatal(err)
			}
			_, err := verifyDBWith(db, VerifyOptions{})
			checkErr(t, err, tc.want, "")
			lines := exportLines(t, db)
			if len(lines) != 9 {
				t.Errorf("export has %d lines, want 9", len(lines))
			}
			_, err = VerifyExport(strings.NewReader(joinLines(lines)), VerifyOptions{})
			checkErr(t, err, tc.want, "")
		})
	}
}

// TestVerifyExportLongLine: an entry far longer than the reader's buffer.
func TestVerifyExportLongLine(t *testing.T) {
	db := newDB(t)
	appendBatch(t, db, 1)
	big := `{"pad":"` + strings.Repeat("x", 1<<20) + `"}`
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := Append(tx, KindAudit, t0, json.RawMessage(big))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	appendBatch(t, db, 1)
	writeCheckpoint(t, db, testSigner(t))
	lines := exportLines(t, db)
	r, err := VerifyExport(strings.NewReader(joinLines(lines)), VerifyOptions{Verifier: testVerifier(t)})
	if err != nil || r.Entries != 3 || r.Checkpoints != 1 {
		t.Errorf("VerifyExport = %+v, %v", r, err)
	}
	lines[1] = strings.Replace(lines[1], "xxx", "xxy", 1)
	if _, err := VerifyExport(strings.NewReader(joinLines(lines)), VerifyOptions{}); err == nil || !strings.Contains(err.Error(), "line 2: ledger: entry 1: entry_hash") {
		t.Errorf("VerifyExport of a changed long line: %v", err)
	}
}

// errReader fails after its data.
type errReader struct{ data *strings.Reader }

func (r errReader) Read(p []byte) (int, error) {
	if r.data.Len() == 0 {
		return 0, errors.New("disk on fire")
	}
	return r.data.Read(p)
}

func TestVerifyExportReadError(t *testing.T) {
	_, lines := exportedLedger(t)
	_, err := VerifyExport(errReader{strings.NewReader(joinLines(lines[:3]))}, VerifyOptions{})
	if err == nil || !strings.Contains(err.Error(), "read export line 4: disk on fire") {
		t.Errorf("VerifyExport = %v", err)
	}
}
