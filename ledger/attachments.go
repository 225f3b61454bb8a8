package ledger

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"
)

// bucketAttachments holds the entries' attachments: records kept beside
// an entry, outside its hash, that can be changed or removed without
// touching a hashed byte (the kernel keeps its audit payloads so). Key =
// the entry's seq (8 bytes big-endian), value = the attachment, opaque to
// the ledger. Its name is the kernel's bucket of payloads, which it was
// before the ledger kept attachments (layout 2), in the same form: there
// is nothing to move.
//
// The attachments keep a bucket of their own, not the entries' (whose
// keys would interleave with theirs): they are most of a call's bytes, up
// to hundreds of KiB, and among small keys they leave pages part empty,
// since bbolt splits a page before a value that does not fit, so that the
// keys before a large value get a page of their own. Measured
// (BenchmarkAuditStorage): an fs.read took 2,135 bytes of kernel.db a
// call interleaved, 1,909 in a bucket of their own; an fs.write of 16 KiB
// 14,053 and 10,848. The cost is a second path of pages a commit (two
// pages at the sizes measured: 9.3 pages a lone fs.read's commit, 7.3
// interleaved).
var bucketAttachments = []byte("audit_payloads")

// attachmentPads are two keys with empty values at the end of the bucket,
// above every seq. bbolt leaves at least three keys on the new page of a
// split (node.splitIndex stops two keys before the end and takes one fewer
// when all fit), so a bucket that grows by one value a transaction at its
// end would leave every page two values short of full; the pads take
// those places.
var attachmentPads = [2][]byte{
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe},
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
}

func isPad(k []byte) bool {
	return bytes.Equal(k, attachmentPads[0]) || bytes.Equal(k, attachmentPads[1])
}

// emptyPad reports whether k and v are a pad as it should be: empty (a
// nested bucket, v nil, is not).
func emptyPad(k, v []byte) bool { return isPad(k) && v != nil && len(v) == 0 }

// initAttachments creates the attachments' bucket and its pads if they
// are missing.
func initAttachments(tx *bbolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(bucketAttachments)
	if err != nil {
		return fmt.Errorf("ledger: create bucket %q: %w", bucketAttachments, err)
	}
	for _, k := range attachmentPads {
		if b.Get(k) == nil {
			if err := b.Put(k, []byte{}); err != nil {
				return fmt.Errorf("ledger: put the attachments' pad %x: %w", k, err)
			}
		}
	}
	return nil
}

// attachments returns the attachments' bucket of a file in the current
// layout.
func attachments(tx *bbolt.Tx) (*bbolt.Bucket, uint64, error) {
	_, meta, err := oneBucket(tx)
	if err != nil {
		return nil, 0, err
	}
	b := tx.Bucket(bucketAttachments)
	if b == nil {
		return nil, 0, fmt.Errorf("ledger: bucket %q missing (Init was not run on this database)", bucketAttachments)
	}
	size, _, err := readHead(meta)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: %w", err)
	}
	return b, size, nil
}

// Attach stores v as the attachment of entry seq, which must be stored,
// in place of any it had. bbolt keeps v until the transaction ends, so it
// must not change.
func Attach(tx *bbolt.Tx, seq uint64, v []byte) error {
	b, size, err := attachments(tx)
	if err != nil {
		return err
	}
	if seq >= size {
		return fmt.Errorf("ledger: attach to entry %d: the ledger has %d entries", seq, size)
	}
	b.FillPercent = 1 // keys grow: see Writer.AppendCanonical
	if err := b.Put(seqKey(seq), v); err != nil {
		return fmt.Errorf("ledger: attach to entry %d: %w", seq, err)
	}
	return nil
}

// Attachment returns the attachment of entry seq, or nil when it has none.
// The value is bbolt's: valid while tx is open, and not to be changed.
func Attachment(tx *bbolt.Tx, seq uint64) ([]byte, error) {
	b, _, err := attachments(tx)
	if err != nil {
		return nil, err
	}
	return b.Get(seqKey(seq)), nil
}

// Detach removes the attachment of entry seq and reports whether it had
// one.
func Detach(tx *bbolt.Tx, seq uint64) (bool, error) {
	b, _, err := attachments(tx)
	if err != nil {
		return false, err
	}
	k := seqKey(seq)
	if b.Get(k) == nil {
		return false, nil
	}
	if err := b.Delete(k); err != nil {
		return false, fmt.Errorf("ledger: detach from entry %d: %w", seq, err)
	}
	return true, nil
}

// Attachments calls fn with every stored attachment of an entry from seq
// from on, in sequence order, and stops at the first error, which it
// returns as is if fn returned it. A pad that holds a value was put there
// by hand: fn gets it under the seq its key reads (above every entry's).
// A key that is no 8-byte seq is an error. fn must not change the bucket
// (collect, then Detach).
func Attachments(tx *bbolt.Tx, from uint64, fn func(seq uint64, v []byte) error) error {
	b, _, err := attachments(tx)
	if err != nil {
		return err
	}
	c := b.Cursor()
	for k, v := c.Seek(seqKey(from)); k != nil; k, v = c.Next() {
		if len(k) != 8 || v == nil {
			return fmt.Errorf("ledger: a malformed key %s among the attachments", keyText(k))
		}
		if emptyPad(k, v) {
			continue
		}
		if err := fn(binary.BigEndian.Uint64(k), v); err != nil {
			return err
		}
	}
	return nil
}

// attachedBeyond describes the first key of the attachments at or past
// seq n but the empty pads — an attachment of an entry the ledger of n
// entries does not hold, or damage — or returns "". It reads from n on
// only (CheckTree, at every open); checkAttachmentKeys reads all.
func attachedBeyond(tx *bbolt.Tx, n uint64) string {
	b := tx.Bucket(bucketAttachments)
	if b == nil {
		return ""
	}
	c := b.Cursor()
	for k, v := c.Seek(seqKey(n)); k != nil; k, v = c.Next() {
		if !emptyPad(k, v) {
			return describeAttachmentKey(k, v)
		}
	}
	return ""
}

// checkAttachmentKeys walks the keys of the attachments (not their
// values, which are the ledger's users'): each is an 8-byte seq of an
// entry below n, or one of the pads, empty.
func checkAttachmentKeys(tx *bbolt.Tx, n uint64) error {
	b := tx.Bucket(bucketAttachments)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) == 8 && binary.BigEndian.Uint64(k) < n && v != nil || emptyPad(k, v) {
			continue
		}
		seq := n
		if len(k) == 8 && !isPad(k) {
			seq = binary.BigEndian.Uint64(k)
		}
		return &VerifyError{Seq: seq, Reason: describeAttachmentKey(k, v) + fmt.Sprintf(" is stored (the ledger has %d entries)", n)}
	}
	return nil
}

func describeAttachmentKey(k, v []byte) string {
	switch {
	case v == nil:
		return fmt.Sprintf("a nested bucket at key %x among the attachments", k)
	case isPad(k):
		return fmt.Sprintf("the attachments' pad %x, holding a value,", k)
	case len(k) != 8:
		return fmt.Sprintf("a malformed key %s among the attachments", keyText(k))
	}
	return fmt.Sprintf("the attachment of entry %d", binary.BigEndian.Uint64(k))
}
