package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/capkernel/capkernel/digest"
)

// TimeLayout is the format of Entry.Time: RFC 3339 in UTC with exactly nine
// fractional digits, so times are fixed-width and sort as strings.
const TimeLayout = "2006-01-02T15:04:05.000000000Z"

// maxSeq bounds sequence numbers: every seq up to 2^53-1 is an exact JSON
// number in every language (RFC 8785 numbers are IEEE 754 doubles).
const maxSeq = 1<<53 - 1

const maxKindLen = 64

// checkFields reports whether e's fields other than Body and Hash have the
// formats of the package comment. These formats never need JSON escaping,
// which is what lets appendPreimage and appendRecord write canonical JSON
// by concatenation.
func checkFields(e *Entry) error {
	if e.Seq > maxSeq {
		return fmt.Errorf("seq %d exceeds %d", e.Seq, uint64(maxSeq))
	}
	if err := checkKind(e.Kind); err != nil {
		return err
	}
	if t, err := time.Parse(TimeLayout, e.Time); err != nil || t.Format(TimeLayout) != e.Time {
		return fmt.Errorf("time %q is not of the form %s", e.Time, TimeLayout)
	}
	if _, err := digest.Parse(e.PrevHash); err != nil {
		return fmt.Errorf("prev_hash: %v", err)
	}
	return nil
}

func checkKind(kind string) error {
	ok := len(kind) > 0 && len(kind) <= maxKindLen && kind[0] >= 'a' && kind[0] <= 'z'
	for i := 0; ok && i < len(kind); i++ {
		c := kind[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
	}
	if !ok {
		return fmt.Errorf("kind %q does not match [a-z][a-z0-9_]* (at most %d bytes)", kind, maxKindLen)
	}
	return nil
}

// appendPreimage appends the canonical JSON that entry_hash covers. The keys
// are written in RFC 8785 order (sorted by UTF-16 code units).
func appendPreimage(dst []byte, e *Entry) []byte {
	dst = append(dst, `{"body":`...)
	dst = append(dst, e.Body...)
	return appendTail(dst, e)
}

// appendRecord appends the stored form of e: the preimage with entry_hash.
func appendRecord(dst []byte, e *Entry) []byte {
	dst = append(dst, `{"body":`...)
	dst = append(dst, e.Body...)
	dst = append(dst, `,"entry_hash":"`...)
	dst = append(dst, e.Hash...)
	dst = append(dst, '"')
	return appendTail(dst, e)
}

func appendTail(dst []byte, e *Entry) []byte {
	dst = append(dst, `,"kind":"`...)
	dst = append(dst, e.Kind...)
	dst = append(dst, `","prev_hash":"`...)
	dst = append(dst, e.PrevHash...)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"time":"`...)
	dst = append(dst, e.Time...)
	return append(dst, `"}`...)
}

// errNotCanonical marks a record that decodes but is not byte for byte the
// canonical encoding of what it decodes to.
var errNotCanonical = errors.New("record is not canonical JSON")

// decodeRecord decodes a stored record into e and checks that rec is exactly
// the canonical encoding of e (so no byte of it can change unnoticed short
// of a hash mismatch). buf is scratch space kept between calls. It does not
// check entry_hash.
func decodeRecord(e *Entry, buf *[]byte, rec []byte) error {
	*e = Entry{}
	if err := json.Unmarshal(rec, e); err != nil {
		return fmt.Errorf("undecodable record: %v", err)
	}
	if err := checkFields(e); err != nil {
		return err
	}
	if _, err := digest.Parse(e.Hash); err != nil {
		return fmt.Errorf("entry_hash: %v", err)
	}
	body, err := canonicalBody(e.Body)
	if err != nil {
		return err
	}
	*buf = appendRecord((*buf)[:0], e)
	if !bytes.Equal(body, e.Body) || !bytes.Equal(*buf, rec) {
		return errNotCanonical
	}
	return nil
}

// ParseEntry decodes one stored record (an export's entry line, a receipt
// bundle's entry) and checks it on its own: it must be exactly the
// canonical encoding of a well-formed entry, and its entry_hash must
// recompute. Its place in the chain (seq, prev_hash) is for the caller to
// check.
func ParseEntry(rec []byte) (Entry, error) {
	var e Entry
	var buf []byte
	if err := decodeRecord(&e, &buf, rec); err != nil {
		return Entry{}, fmt.Errorf("ledger: entry record: %w", err)
	}
	h, err := EntryHash(e)
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: entry record %d: %w", e.Seq, err)
	}
	if h != e.Hash {
		return Entry{}, fmt.Errorf("ledger: entry record %d: entry_hash is %s but the record hashes to %s", e.Seq, e.Hash, h)
	}
	return e, nil
}
