package ledger

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// VerifyError names the first entry at which a ledger fails verification.
type VerifyError struct {
	Seq    uint64 // the first bad or missing entry
	Reason string // what is wrong with it
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("ledger: entry %d: %s", e.Seq, e.Reason)
}

// Verify checks the whole ledger in tx: sequence numbers run from 0 without
// gaps, every record is exactly the canonical JSON of a well-formed entry
// whose seq matches its key, every prev_hash is the entry_hash of the entry
// before (ZeroHash for entry 0), every entry_hash recomputes, and the head
// metadata matches the last entry. It returns the number of entries that
// verified and, at the first failure, a *VerifyError; other errors mean the
// ledger could not be read at all.
//
// A problem with the head metadata is reported at the first sequence number
// where head and entries disagree: the first missing entry when the head
// counts more entries than are stored, the first uncounted entry when it
// counts fewer, and the last entry when only the hash differs.
func Verify(tx *bbolt.Tx) (n uint64, err error) {
	entries, meta, err := buckets(tx)
	if err != nil {
		return 0, err
	}
	var (
		e         Entry
		rec, pre  []byte
		prev, sum [digest.Size]byte
	)
	c := entries.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return n, &VerifyError{n, fmt.Sprintf("malformed key %x after entry %d", k, n)}
		}
		if seq := binary.BigEndian.Uint64(k); seq != n {
			return n, &VerifyError{n, fmt.Sprintf("entry missing (the next stored entry is %d)", seq)}
		}
		if err := decodeRecord(&e, &rec, v); err != nil {
			return n, &VerifyError{n, err.Error()}
		}
		if e.Seq != n {
			return n, &VerifyError{n, fmt.Sprintf("record says seq %d", e.Seq)}
		}
		if p, _ := digest.Parse(e.PrevHash); p != prev {
			return n, &VerifyError{n, fmt.Sprintf("prev_hash %s is not the entry_hash of the entry before (%s)", e.PrevHash, digest.Format(prev))}
		}
		hashEntry(&sum, &pre, &e)
		if h, _ := digest.Parse(e.Hash); h != sum {
			return n, &VerifyError{n, fmt.Sprintf("entry_hash %s does not match the recomputed %s", e.Hash, digest.Format(sum))}
		}
		prev = sum
		n++
	}

	last := n - min(n, 1)
	size, hash, err := readHead(meta)
	switch {
	case err != nil:
		return n, &VerifyError{last, err.Error()}
	case size > n:
		return n, &VerifyError{n, fmt.Sprintf("entry missing (head metadata counts %d entries, %d are stored)", size, n)}
	case size < n:
		return n, &VerifyError{size, fmt.Sprintf("entry not counted by the head metadata (%d entries)", size)}
	case hash != prev:
		return n, &VerifyError{last, fmt.Sprintf("head metadata hash %s differs from the last entry_hash %s", digest.Format(hash), digest.Format(prev))}
	}
	return n, nil
}
