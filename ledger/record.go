package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/b3"
	"github.com/capkernel/capkernel/jcs"
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
	return appendTailTime(dst, e, unsafe.Slice(unsafe.StringData(e.Time), len(e.Time)))
}

// appendTailTime is appendTail with the time t in place of e.Time.
func appendTailTime(dst []byte, e *Entry, t []byte) []byte {
	dst = append(dst, `,"kind":"`...)
	dst = append(dst, e.Kind...)
	dst = append(dst, `","prev_hash":"`...)
	dst = append(dst, e.PrevHash...)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"time":"`...)
	dst = append(dst, t...)
	return append(dst, `"}`...)
}

// errNotCanonical marks a record that decodes but is not byte for byte the
// canonical encoding of what it decodes to.
var errNotCanonical = errors.New("record is not canonical JSON")

// The fixed parts of a stored record, around the body and the fields.
const (
	recHead      = `{"body":`
	recHash      = `,"entry_hash":"blake3:`
	recKind      = `","kind":"`
	recPrev      = `","prev_hash":"blake3:`
	recSeq       = `","seq":`
	recTime      = `,"time":"`
	recEnd       = `"}`
	timeLen      = len(TimeLayout)
	hexDigestLen = 2 * digest.Size
)

// record is a stored record parsed in place: its slices alias the record.
type record struct {
	body       []byte
	hash, prev [32]byte
	hashHex    []byte // "blake3:<hex>" of entry_hash, in the record
	prevHex    []byte // same for prev_hash
	kind, time []byte
	seq        uint64
	// hashAt is the offset of recHash: the preimage of entry_hash is the
	// record without [hashAt, hashEnd).
	hashAt, hashEnd int
}

// parseRecord reads a stored record by its fixed canonical layout (see
// appendRecord) and checks that it is exactly the canonical encoding of a
// well-formed entry: the body a canonical JSON object, every field in its
// format. It allocates nothing and does not check entry_hash.
//
// The body ends where the last `,"entry_hash":"blake3:` of the record
// starts. Searching the whole record for it costs as much as parsing the
// body, so parseRecord first tries the place the fixed-width tail puts it
// (guessHashAt). A parse from there that succeeds has validated every byte
// after it (hex digits, kind, seq and time characters, fixed strings), and
// none of those can hold another `,"e…`: the guess is then the last
// occurrence, as the search would find. Any failure is reported by the
// parse from the searched place, so errors are those of the search alone.
func parseRecord(r *record, rec []byte) error {
	if !bytes.HasPrefix(rec, []byte(recHead)) || !bytes.HasSuffix(rec, []byte(recEnd)) {
		return notRecord(rec)
	}
	if at := guessHashAt(rec); at >= 0 && parseRecordAt(r, rec, at) == nil {
		return nil
	}
	return parseRecordAt(r, rec, bytes.LastIndex(rec, []byte(recHash)))
}

// guessHashAt returns where the entry_hash member of rec starts if rec has
// the layout of a record, reading the tail backwards over the time, seq,
// prev_hash and kind, or -1. It checks nothing but the lengths it skips.
func guessHashAt(rec []byte) int {
	i := len(rec) - len(recEnd) - timeLen - len(recTime) // start of recTime
	if i < 0 {
		return -1
	}
	for i > 0 && rec[i-1] >= '0' && rec[i-1] <= '9' {
		i--
	}
	i -= len(recSeq) + hexDigestLen + len(recPrev) // end of kind
	if i < 0 {
		return -1
	}
	q := bytes.LastIndexByte(rec[:i], '"') // the last byte of recKind
	return q + 1 - len(recKind) - hexDigestLen - len(recHash)
}

// parseRecordAt is parseRecord with the entry_hash member at offset at.
func parseRecordAt(r *record, rec []byte, at int) error {
	if at < len(recHead) || !bytes.HasPrefix(rec[at:], []byte(recHash)) {
		return notRecord(rec)
	}
	r.body, r.hashAt = rec[len(recHead):at], at
	rest := rec[at+len(recHash):]
	var ok bool
	if rest, ok = hexDigest(&r.hash, rest); !ok {
		return errors.New("entry_hash is not blake3:<64 lowercase hex>")
	}
	r.hashHex = rec[at+len(recHash)-len(digest.Prefix) : at+len(recHash)+hexDigestLen]
	if !bytes.HasPrefix(rest, []byte(recKind)) {
		return notRecord(rec)
	}
	rest = rest[len(recKind):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return notRecord(rec)
	}
	r.kind, rest = rest[:end], rest[end:]
	if err := checkKind(unsafe.String(unsafe.SliceData(r.kind), len(r.kind))); err != nil {
		return err
	}
	if !bytes.HasPrefix(rest, []byte(recPrev)) {
		return notRecord(rec)
	}
	rest = rest[len(recPrev):]
	if rest, ok = hexDigest(&r.prev, rest); !ok {
		return errors.New("prev_hash: not blake3:<64 lowercase hex>")
	}
	r.prevHex = rec[len(rec)-len(rest)-hexDigestLen-len(digest.Prefix) : len(rec)-len(rest)]
	r.hashEnd = at + len(recHash) + hexDigestLen + 1 // up to the comma before "kind"
	if !bytes.HasPrefix(rest, []byte(recSeq)) {
		return notRecord(rec)
	}
	rest = rest[len(recSeq):]
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 16 || n > 1 && rest[0] == '0' {
		return notRecord(rec)
	}
	r.seq = 0
	for _, d := range rest[:n] {
		r.seq = r.seq*10 + uint64(d-'0')
	}
	if r.seq > maxSeq {
		return fmt.Errorf("seq %d exceeds %d", r.seq, uint64(maxSeq))
	}
	rest = rest[n:]
	if !bytes.HasPrefix(rest, []byte(recTime)) || len(rest) != len(recTime)+timeLen+len(recEnd) {
		return notRecord(rec)
	}
	r.time = rest[len(recTime) : len(recTime)+timeLen]
	if !checkTime(r.time) {
		return fmt.Errorf("time %q is not of the form %s", r.time, TimeLayout)
	}
	if err := jcs.CheckCanonical(r.body); err != nil {
		if nr := notRecord(rec); !errors.Is(nr, errNotCanonical) {
			return nr
		}
		return fmt.Errorf("%w (body: %v)", errNotCanonical, err)
	}
	if r.body[0] != '{' {
		return errors.New("body is not a JSON object")
	}
	return nil
}

// notRecord is the error for bytes that are not laid out as a record at
// all.
func notRecord(rec []byte) error {
	var v map[string]json.RawMessage
	if err := json.Unmarshal(rec, &v); err != nil {
		return fmt.Errorf("undecodable record: %v", err)
	}
	return errNotCanonical
}

// hexDigest parses the 64 lowercase hex digits at the start of s (the
// "blake3:" before them already consumed) into d, and returns the rest of
// s.
func hexDigest(d *[32]byte, s []byte) ([]byte, bool) {
	if len(s) < hexDigestLen {
		return s, false
	}
	// One test at the end instead of two branches per byte: a non-digit
	// maps to 0xff, whose high bits survive the OR.
	var bad byte
	for i := range d {
		hi, lo := unhexTable[s[2*i]], unhexTable[s[2*i+1]]
		bad |= hi | lo
		d[i] = hi<<4 | lo&0x0f
	}
	if bad&0xf0 != 0 {
		return s, false
	}
	return s[hexDigestLen:], true
}

// unhexTable maps lowercase hex digits to their value and every other
// byte to 0xff.
var unhexTable = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()

// checkTime reports whether t has the form of TimeLayout and is a valid
// time, as time.Parse would, parsing only the rare days it cannot rule on
// by ranges alone.
func checkTime(t []byte) bool {
	if len(t) != timeLen {
		return false
	}
	for i, c := range t {
		switch i {
		case 4, 7:
			if c != '-' {
				return false
			}
		case 10:
			if c != 'T' {
				return false
			}
		case 13, 16:
			if c != ':' {
				return false
			}
		case 19:
			if c != '.' {
				return false
			}
		case 29:
			if c != 'Z' {
				return false
			}
		default:
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	two := func(i int) int { return int(t[i]-'0')*10 + int(t[i+1]-'0') }
	month, day, hour, minute, sec := two(5), two(8), two(11), two(14), two(17)
	if month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || sec > 59 {
		return false
	}
	if day > 28 {
		s := unsafe.String(unsafe.SliceData(t), len(t))
		if _, err := time.Parse(TimeLayout, s); err != nil {
			return false
		}
	}
	return true
}

// recordPrefix hashes head, the part of an entry's hash preimage that its
// body decides (the record up to its entry_hash member: recHead, then body),
// so that an append, on the store's sequencer, hashes only the tail the
// ledger's head decides (kind, prev_hash, seq, time). It is nil for a body
// too long for a b3.Prefix, which the append then hashes whole.
func recordPrefix(head []byte) *b3.Prefix {
	if len(head) > b3.PrefixMaxLen {
		return nil
	}
	p := b3.NewPrefix(&leafKeyWords)
	if !p.Write(head) {
		return nil
	}
	return &p
}

// hashRecord sets sum to the entry hash of the parsed record r of rec: the
// keyed hash of rec without its entry_hash member, which is exactly the
// preimage appendPreimage writes.
func hashRecord(sum *[32]byte, r *record, rec []byte) {
	h := leafHashers.Get().(*blake3.Hasher)
	hashRecordWith(h, sum, r, rec)
	leafHashers.Put(h)
}

// hashRecordWith is hashRecord with the leaf hasher h.
func hashRecordWith(h *blake3.Hasher, sum *[32]byte, r *record, rec []byte) {
	h.Reset()
	h.Write(rec[:r.hashAt])
	h.Write(rec[r.hashEnd:])
	h.Sum(sum[:0])
}

// decodeRecord decodes a stored record into e, which shares no memory with
// rec, checking that rec is exactly the canonical encoding of e (so no
// byte of it can change unnoticed short of a hash mismatch). It does not
// check entry_hash.
func decodeRecord(e *Entry, rec []byte) error {
	var r record
	if err := parseRecord(&r, rec); err != nil {
		*e = Entry{}
		return err
	}
	*e = Entry{Seq: r.seq, Kind: string(r.kind), Time: string(r.time), PrevHash: string(r.prevHex), Body: bytes.Clone(r.body), Hash: string(r.hashHex)}
	return nil
}

// decodeStoredRecord is decodeRecord for a value of the "ledger" bucket.
func decodeStoredRecord(e *Entry, v []byte) error {
	rec, err := loadRecord(nil, v)
	if err != nil {
		*e = Entry{}
		return err
	}
	return decodeRecord(e, rec)
}

// ParseEntry decodes one stored record (an export's entry line, a receipt
// bundle's entry) and checks it on its own: it must be exactly the
// canonical encoding of a well-formed entry, and its entry_hash must
// recompute. Its place in the chain (seq, prev_hash) is for the caller to
// check.
func ParseEntry(rec []byte) (Entry, error) {
	var e Entry
	if err := decodeRecord(&e, rec); err != nil {
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
