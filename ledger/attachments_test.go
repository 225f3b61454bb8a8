package ledger

import (
	"errors"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// TestVerifyChecksAttachmentKeys: Verify reads the attachments' keys, not
// their values: an attachment of an entry past the head, a key that is no
// 8-byte seq, a pad that holds a value are reported; attachments of
// stored entries, whatever they hold, and the empty pads are not. Each is
// what an attachment put by hand leaves.
func TestVerifyChecksAttachmentKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		k, v    []byte
		seq     uint64
		reason  string
		changes bool // whether verification fails
	}{
		{"attachment of a stored entry", seqKey(3), []byte("anything"), 0, "", false},
		{"attachment past the head", seqKey(9), []byte("x"), 9, "the attachment of entry 9 is stored (the ledger has 9 entries)", true},
		{"key of no seq", []byte{0, 0, 3}, []byte("x"), 9, "a malformed key 000003 among the attachments", true},
		{"pad holding a value", attachmentPads[1], []byte("x"), 9, "the attachments' pad ffffffffffffffff, holding a value,", true},
		{"empty pad put again", attachmentPads[0], []byte{}, 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			appendN(t, db, 9)
			if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketAttachments).Put(tc.k, tc.v) }); err != nil {
				t.Fatal(err)
			}
			_, err := verifyDB(db)
			if !tc.changes {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			var ve *VerifyError
			if !errors.As(err, &ve) || ve.Seq != tc.seq || !strings.Contains(ve.Reason, tc.reason) {
				t.Fatalf("Verify = %v, want entry %d: %q", err, tc.seq, tc.reason)
			}
		})
	}
}
