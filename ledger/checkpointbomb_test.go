package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// packedNote returns a packed checkpoint value with the given origin and
// one signature of sigLen zero bytes per name ("" stands for the origin).
func packedNote(origin string, names []string, sigLen int) []byte {
	v := []byte{checkpointTag}
	v = appendField(v, origin)
	v = binary.AppendUvarint(v, 3)
	v = append(v, make([]byte, 32)...)
	v = binary.AppendUvarint(v, uint64(len(names)))
	for _, n := range names {
		v = appendField(v, n)
		v = appendField(v, string(make([]byte, sigLen)))
	}
	return v
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestCheckpointUnpackBounded: a packed checkpoint value unpacks to at
// most maxUnpackedCheckpoint of its length, or is refused as damaged
// before it is expanded: a signature with an empty name stands for the
// whole origin, and 2 bytes per such signature made a 20 KB value unpack
// to 50 MB (review rev-verify F5). The notes the kernel writes, and notes
// with up to 100 signatures under other names, still read back.
func TestCheckpointUnpackBounded(t *testing.T) {
	long := strings.Repeat("o", 10000)
	for _, tc := range []struct {
		name string
		v    []byte
		want string // "" when it reads back
	}{
		{"the kernel's note", packedNote("ck-00000000-0000-4000-8000-000000000001", []string{""}, 64), ""},
		{"a long origin signed under its name three times", packedNote(long, repeat("", 3), 64), ""},
		{"100 witnesses", packedNote("ck-1", repeat("witness.example", 100), 64), ""},
		{"100 signatures under a short origin", packedNote("ck-1", repeat("", 100), 64), ""},
		{"5000 empty signatures under a 10,000-byte origin", packedNote(long, repeat("", 5000), 0), "5000 signatures, more than a note holds (100)"},
		{"101 signatures", packedNote("ck-1", repeat("w", 101), 64), "101 signatures"},
		{"100 empty signatures under a 10,000-byte origin", packedNote(long, repeat("", 100), 0), "unpacks to more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := loadCheckpoint(tc.v)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if len(out) > maxUnpackedCheckpoint(len(tc.v)) {
					t.Fatalf("%d bytes out of %d", len(out), len(tc.v))
				}
				if back := packCheckpoint(out); !bytes.Equal(back, tc.v) {
					t.Fatalf("packs back to %q, want %q", back, tc.v)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%d bytes out of %d, error %v; want one containing %q", len(out), len(tc.v), err, tc.want)
			}
		})
	}
	// Stored in a ledger, the bomb is a damaged checkpoint to verification
	// and export.
	db := newDB(t)
	appendN(t, db, 3)
	writeCheckpoint(t, db, testSigner(t))
	if err := db.Update(func(tx *bbolt.Tx) error {
		return putRawCheckpoint(tx, 0, packedNote(long, repeat("", 100), 0))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		_, err := VerifyWith(tx, VerifyOptions{Verifier: testVerifier(t)})
		var ce *CheckpointError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "undecodable checkpoint") {
			t.Errorf("VerifyWith: %v, want an undecodable checkpoint", err)
		}
		if err := Export(tx, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "undecodable checkpoint") {
			t.Errorf("Export: %v, want an undecodable checkpoint", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
