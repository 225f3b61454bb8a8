package ledger

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/b3"
	"github.com/capkernel/capkernel/jcs"
)

// Entry kinds written by the kernel.
const (
	KindAudit        = "audit"
	KindReceipt      = "receipt"
	KindTokenSeen    = "token_first_seen"
	KindRevocation   = "revocation"
	KindPolicyLoaded = "policy_loaded"
)

// Entry is one ledger entry. Its JSON encoding, with keys in this order, is
// the stored record (see the package comment).
type Entry struct {
	Seq      uint64          `json:"seq"`        // 0-based; also the Merkle leaf index
	Kind     string          `json:"kind"`       // [a-z][a-z0-9_]*, e.g. KindAudit
	Time     string          `json:"time"`       // TimeLayout, UTC
	PrevHash string          `json:"prev_hash"`  // entry_hash of entry Seq-1; ZeroHash for entry 0
	Body     json.RawMessage `json:"body"`       // RFC 8785 canonical JSON object
	Hash     string          `json:"entry_hash"` // EntryHash of this entry
}

// Head describes the end of the ledger.
type Head struct {
	Size uint64 // number of entries
	Hash string // entry_hash of the last entry; ZeroHash when Size is 0
}

// ErrNotFound is returned (wrapped) by Get for a sequence number with no
// entry.
var ErrNotFound = errors.New("ledger: no such entry")

var (
	bucketEntries = []byte("ledger")      // seq (8 bytes BE) -> record
	bucketMeta    = []byte("ledger_meta") // keyHead -> head
	keyHead       = []byte("head")        // size (8 bytes BE) || last entry_hash (32 bytes)
)

const headLen = 8 + digest.Size

// Init creates the ledger's buckets if they are missing and moves an older
// file to the current key layout, layoutOneBucket (see onebucket.go), all
// within tx: Move with no bound. A rolled-back or interrupted tx leaves
// the database as it was. It refuses a file whose recorded key layout it
// does not know. A caller with a large file to move runs Move in bounded
// steps first.
func Init(tx *bbolt.Tx) error {
	for _, name := range [][]byte{bucketEntries, bucketMeta} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("ledger: create bucket %q: %w", name, err)
		}
	}
	if _, err := Move(tx, 0); err != nil {
		return err
	}
	return initAttachments(tx)
}

// Append adds an entry after the current head within tx and returns it.
// body must be a JSON object; it is canonicalized (RFC 8785) before it is
// hashed and stored. t is stored in UTC as TimeLayout; the ledger does not
// require times to increase (clocks step back). The returned Entry shares
// no memory with what was handed to bbolt.
//
// Append also stores the leaf and every perfect subtree of the Merkle tree
// that the entry completes (O(1) amortized), in the same transaction.
//
// Append checks everything before it writes, so an error means tx is
// unchanged, except for an error from bbolt's Put itself, after which the
// transaction must be rolled back.
func Append(tx *bbolt.Tx, kind string, t time.Time, body json.RawMessage) (Entry, error) {
	c, err := Canonicalize(body)
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: append %q entry: %w", kind, err)
	}
	return AppendCanonical(tx, kind, t, c)
}

// Body is an entry body in RFC 8785 form, made by Canonicalize or
// Canonical, with what its append needs made beforehand: its stored
// (packed) form, the hash of the record up to its entry_hash, and the
// memory of the record and the stored value.
type Body struct {
	b      []byte
	packed []byte     // packBody(b); nil stores the record as JSON
	prefix *b3.Prefix // recordPrefix of recHead and b; nil when too long for one
	bufs   *bodyBufs
}

// bodyBufs is the memory of a body's record and stored value, made with
// the body, off the store's sequencer, so that an append allocates neither
// there. rec holds recHead and the body, with room for the record's tail;
// val is room for the packed record (storedLen). The first append takes
// them; a later append of the same body (its transaction rolled back and
// run again) makes its own, so a record an append returned is never
// written over.
type bodyBufs struct {
	taken atomic.Bool
	rec   []byte
	val   []byte
}

// tailRoom is the room a Body's record buffer leaves after the body: the
// members AppendCanonical writes after it (entry_hash, kind, prev_hash,
// seq, time) for a kind of up to 32 bytes. An append of a longer kind
// allocates its record.
const tailRoom = len(recHash) + hexDigestLen + len(recKind) + 32 + len(recPrev) + hexDigestLen +
	len(recSeq) + 20 + len(recTime) + timeLen + len(recEnd)

// take returns the record, holding recHead and the body, with room for
// n bytes in all, and room for the stored value: the body's own the first
// time, else new memory.
func (b Body) take(n int) (rec, val []byte) {
	if bb := b.bufs; bb != nil && cap(bb.rec) >= n && bb.taken.CompareAndSwap(false, true) {
		return bb.rec, bb.val
	}
	rec = make([]byte, 0, n)
	return append(append(rec, recHead...), b.b...), make([]byte, 0, storedLen(b))
}

// Canonicalize checks that body is a JSON object and returns its RFC 8785
// form, ready for AppendCanonical, with the packed form the ledger stores.
// It needs no transaction, so callers can do this work before they queue
// for one.
func Canonicalize(body json.RawMessage) (Body, error) {
	c, err := canonicalBody(body)
	if err != nil {
		return Body{}, err
	}
	return newBody(c), nil
}

// Canonical checks that body is a JSON object in RFC 8785 form already
// (jcs.CheckCanonical, one pass) and returns it as a Body, for callers
// that write their bodies in canonical form directly. The Body holds a
// copy: body may be reused once Canonical returns.
func Canonical(body []byte) (Body, error) {
	if err := jcs.CheckCanonical(body); err != nil {
		return Body{}, fmt.Errorf("body: %v", err)
	}
	if len(body) == 0 || body[0] != '{' {
		return Body{}, errors.New("body is not a JSON object")
	}
	return newBody(body), nil
}

// newBody returns the Body of c, a JSON object in RFC 8785 form, copied
// into memory made for its record and stored value.
func newBody(c []byte) Body {
	n := len(recHead) + len(c)
	b := Body{packed: packBody(c)}
	// One allocation holds the record, with room for its tail, and the
	// stored value.
	m := make([]byte, n+tailRoom+storedLen(b))
	rec := append(append(m[:0:n+tailRoom], recHead...), c...)
	b.b, b.prefix = rec[len(recHead):n:n], recordPrefix(rec)
	b.bufs = &bodyBufs{rec: rec, val: m[n+tailRoom : n+tailRoom]}
	return b
}

// AppendCanonical is Append for a body canonicalized beforehand: a
// Writer's append, by a Writer of its own (which reads the tree's edge
// from the stored tree).
func AppendCanonical(tx *bbolt.Tx, kind string, t time.Time, body Body) (Entry, error) {
	a, err := NewWriter().AppendCanonical(tx, kind, t, body)
	return a.Entry, err
}

// HeadOf returns the current head of the ledger.
func HeadOf(tx *bbolt.Tx) (Head, error) {
	_, meta, err := buckets(tx)
	if err != nil {
		return Head{}, err
	}
	size, hash, err := readHead(meta)
	if err != nil {
		return Head{}, fmt.Errorf("ledger: %w", err)
	}
	return Head{Size: size, Hash: digest.Format(hash)}, nil
}

// Get returns the entry with sequence number seq, or an error wrapping
// ErrNotFound. It decodes the record and checks its format, not its hash.
func Get(tx *bbolt.Tx, seq uint64) (Entry, error) {
	entries, _, err := buckets(tx)
	if err != nil {
		return Entry{}, err
	}
	rec := entries.Get(seqKey(seq))
	if rec == nil {
		return Entry{}, fmt.Errorf("%w: seq %d", ErrNotFound, seq)
	}
	var e Entry
	if err := decodeStoredRecord(&e, rec); err != nil {
		return Entry{}, fmt.Errorf("ledger: entry %d: %w", seq, err)
	}
	return e, nil
}

// Scan calls fn for every stored entry with sequence number from or higher,
// in sequence order, and stops at the first error, which it returns as is
// if fn returned it. Like Get, it checks record formats, not hashes.
func Scan(tx *bbolt.Tx, from uint64, fn func(Entry) error) error {
	entries, _, err := buckets(tx)
	if err != nil {
		return err
	}
	c := newKindCursor(entries, kindEntry)
	for k, rec := c.Seek(seqKey(from)); k != nil; k, rec = c.Next() {
		if len(k) != 8 {
			return fmt.Errorf("ledger: malformed key %s", keyText(k))
		}
		var e Entry
		if err := decodeStoredRecord(&e, rec); err != nil {
			return fmt.Errorf("ledger: entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

func buckets(tx *bbolt.Tx) (entries, meta *bbolt.Bucket, err error) {
	entries, meta = tx.Bucket(bucketEntries), tx.Bucket(bucketMeta)
	if entries == nil || meta == nil {
		return nil, nil, errors.New("ledger: buckets missing (Init was not run on this database)")
	}
	return entries, meta, nil
}

// oneBucket is buckets for the readers and writers of what layoutOneBucket
// keeps beside the entries: the tree, the checkpoints, the attachments.
func oneBucket(tx *bbolt.Tx) (entries, meta *bbolt.Bucket, err error) {
	if entries, meta, err = buckets(tx); err != nil {
		return nil, nil, err
	}
	if v := meta.Get(keyTreeLayout); len(v) != 1 || v[0] != layoutOneBucket {
		if _, err := treeLayout(meta); err != nil {
			return nil, nil, fmt.Errorf("ledger: %w", err) // not older: unknown
		}
		return nil, nil, errOldLayout
	}
	return entries, meta, nil
}

// readHead returns the entry count and last entry hash stored in meta; an
// absent head is an empty ledger.
func readHead(meta *bbolt.Bucket) (size uint64, hash [digest.Size]byte, err error) {
	return parseHead(meta.Get(keyHead))
}

// parseHead decodes the stored head v; nil is an empty ledger.
func parseHead(v []byte) (size uint64, hash [digest.Size]byte, err error) {
	if v == nil {
		return 0, hash, nil
	}
	if len(v) != headLen {
		return 0, hash, fmt.Errorf("head metadata is %d bytes, want %d", len(v), headLen)
	}
	copy(hash[:], v[8:])
	return binary.BigEndian.Uint64(v), hash, nil
}

func encodeHead(size uint64, hash [digest.Size]byte) []byte {
	v := make([]byte, headLen)
	binary.BigEndian.PutUint64(v, size)
	copy(v[8:], hash[:])
	return v
}

func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// recordLen returns an upper bound of the length of appendRecord's output
// for e (a seq has at most 20 digits).
func recordLen(e *Entry) int {
	const fixed = len(`{"body":,"entry_hash":"","kind":"","prev_hash":"","seq":,"time":""}`)
	return fixed + len(e.Body) + len(e.Hash) + len(e.Kind) + len(e.PrevHash) + len(e.Time) + 20
}

// Record returns the record of entry seq, its canonical JSON byte for byte
// as hashed and exported (unpacked from its stored form), or an error
// wrapping ErrNotFound, or an error for a stored value that does not
// unpack. It checks nothing else (ParseEntry does).
func Record(tx *bbolt.Tx, seq uint64) ([]byte, error) {
	entries, _, err := buckets(tx)
	if err != nil {
		return nil, err
	}
	v := entries.Get(seqKey(seq))
	if v == nil {
		return nil, fmt.Errorf("%w: seq %d", ErrNotFound, seq)
	}
	rec, err := loadRecord(nil, v)
	if err != nil {
		return nil, fmt.Errorf("ledger: entry %d: %w", seq, err)
	}
	return rec, nil
}

// keyText is a key for an error message: its hex, or for a key over 32
// bytes (a damaged page's size may make one megabytes long) the hex of
// its first 32 and its length.
func keyText(k []byte) string {
	if len(k) <= 32 {
		return hex.EncodeToString(k)
	}
	return fmt.Sprintf("%x… (%d bytes)", k[:32], len(k))
}
