package ledger

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
)

// Writer appends entries and signs checkpoints with the right edge of the
// Merkle tree kept in memory (the roots of the perfect subtrees that cover
// all entries: at most log2(n)+1 hashes), so that an append reads no stored
// tree node and the inclusion proof of every entry a transaction appended
// comes from memory (Batch.Prove) instead of from bbolt.
//
// The stored ledger stays the authority: at every append the Writer reads
// the stored head and compares it with its edge; if they differ (another
// writer appended, or a transaction it took part in was rolled back), it
// rebuilds the edge from the stored tree. The edge a transaction built
// becomes the Writer's only when that transaction commits (bbolt's
// OnCommit). A Writer is safe for concurrent use, though bbolt runs one
// write transaction at a time anyway.
//
// Within one transaction the Writer stores the head once and then updates
// the stored value in place at each append (bbolt keeps the value a Put was
// given, not a copy, until the transaction commits), so that every reader
// of the transaction, and the commit, see the head of the last append, at
// the cost of no further Put. It checks that the head bbolt returns is
// still that value before each update; one stored by anything else is
// replaced by a Put, as before.
type Writer struct {
	mu        sync.Mutex
	committed edge      // as of the last commit the Writer saw
	tx        *bbolt.Tx // the transaction pending, batch and head belong to
	pending   edge
	batch     *Batch
	head      []byte // the head value stored in tx by the Writer, if any
	nodes     []node // scratch for the tree nodes an append completes
}

// edge is the right edge of the tree of the first size entries.
type edge struct {
	size    uint64
	last    [32]byte // entry_hash of entry size-1; zero for an empty ledger
	lastHex string   // digest.Format(last): the next entry's prev_hash
	tree    fold     // tree.n == size
	// checked says that no entry is stored at or after size (at the
	// moment the edge was established in its transaction).
	checked bool
}

func (e edge) clone() edge {
	e.tree.hashes = slices.Clone(e.tree.hashes)
	e.tree.h = nil
	return e
}

// NewWriter returns a Writer for one database. It loads its edge at its
// first append.
func NewWriter() *Writer { return &Writer{} }

// Appended is an entry a Writer appended.
type Appended struct {
	Entry
	// Record is the record (the canonical JSON of the entry, which bbolt
	// holds packed): it must not be modified.
	Record []byte
	// Batch is every entry the transaction appended through the Writer;
	// once the transaction has committed with a checkpoint (Checkpoint),
	// it proves the entry's inclusion under it.
	Batch *Batch
}

// RecordText returns Record as a string that shares its memory (Record is
// never written again): a receipt's copy of the record without a copy.
func (a Appended) RecordText() string { return alias(a.Record) }

// Append is AppendCanonical for a body not yet canonicalized.
func (w *Writer) Append(tx *bbolt.Tx, kind string, t time.Time, body json.RawMessage) (Appended, error) {
	c, err := Canonicalize(body)
	if err != nil {
		return Appended{}, fmt.Errorf("ledger: append %q entry: %w", kind, err)
	}
	return w.AppendCanonical(tx, kind, t, c)
}

// AppendCanonical adds an entry after the current head within tx: its
// record, the new head and the tree nodes it completes, taking the
// previous entry hash and the tree's edge from memory. It checks
// everything before it writes, so an error means tx is unchanged, except
// for an error from bbolt's Put itself, after which the transaction must
// be rolled back.
//
// The returned Entry's Hash and Time share memory with Record.
func (w *Writer) AppendCanonical(tx *bbolt.Tx, kind string, t time.Time, body Body) (Appended, error) {
	if body.b == nil {
		return Appended{}, errors.New("ledger: append: empty body (use Canonicalize)")
	}
	if !tx.Writable() {
		return Appended{}, errors.New("ledger: append: transaction is read-only")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	entries, meta, err := buckets(tx)
	if err != nil {
		return Appended{}, err
	}
	head, err := w.begin(tx, meta, entries)
	if err != nil {
		return Appended{}, fmt.Errorf("ledger: append: %w", err)
	}
	p := &w.pending
	e := Entry{
		Seq:      p.size,
		Kind:     kind,
		PrevHash: p.lastHex,
		Body:     body.b,
	}
	// The fields checkFields checks, but for the time and prev_hash this
	// function writes itself in their forms.
	if e.Seq > maxSeq {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: seq exceeds %d", kind, e.Seq, uint64(maxSeq))
	}
	if err := checkKind(kind); err != nil {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: %w", kind, e.Seq, err)
	}
	var tb [len(TimeLayout)]byte
	if !putTime(&tb, t) {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: time %q is not of the form %s", kind, e.Seq, FormatTime(t), TimeLayout)
	}
	// Keys only ever grow (layoutOneBucket), so pages can be filled
	// completely before they split.
	entries.FillPercent = 1
	if !p.checked {
		// Once per edge established in tx: nothing but checkpoints of its
		// size may be stored at or after the head, which every later
		// append of tx then extends.
		if what := beyondHead(entries, e.Seq); what != "" {
			return Appended{}, fmt.Errorf("ledger: append: %s is stored although the head says %d entries (run Verify)", what, e.Seq)
		}
		p.checked = true
	}
	// The record, with the entry hash written in last: the preimage is
	// the record without its entry_hash member (hashRecord).
	rec, val := body.take(recordLen(&e) + len(digest.Prefix) + hexDigestLen + timeLen) // e.Hash and e.Time are not set yet
	hashAt := len(rec)
	rec = append(rec, recHash...)
	hexAt := len(rec)
	rec = append(rec, zeroHex[:]...)
	rec = append(rec, '"')
	hashEnd := len(rec)
	rec = appendTailTime(rec, &e, tb[:])
	e.Time = alias(rec[len(rec)-len(recEnd)-timeLen : len(rec)-len(recEnd)])
	if len(rec) > bbolt.MaxValueSize {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: record of %d bytes exceeds bbolt's limit", kind, e.Seq, len(rec))
	}
	var sum [32]byte
	ok := false
	if body.prefix != nil {
		sum, ok = body.prefix.Sum(rec[hashEnd:]) // rec[:hashAt] is the prefix
	}
	if !ok {
		hashRecord(&sum, &record{hashAt: hashAt, hashEnd: hashEnd}, rec)
	}
	hex.Encode(rec[hexAt:], sum[:])
	e.Hash = alias(rec[hexAt-len(digest.Prefix) : hexAt+hexDigestLen])
	// Writes from here on: a failure leaves tx half written, and the
	// caller must roll it back (the pending edge is dropped with it).
	prev := p.last
	w.nodes = w.nodes[:0]
	p.tree.append(&sum, func(id compact.NodeID, h *[32]byte) {
		w.nodes = append(w.nodes, node{id, *h})
	})
	p.size, p.last, p.lastHex = e.Seq+1, sum, e.Hash
	w.batch.leaves = append(w.batch.leaves, sum)
	// One allocation holds the entry's key and the nodes' keys and
	// values: bbolt keeps them until tx ends.
	nodesLen := len(w.nodes) * (treeKeyLen + len(node{}.hash))
	buf := make([]byte, 8+nodesLen)
	key := buf[:8:8]
	binary.BigEndian.PutUint64(key, e.Seq)
	value := storedRecord(val, &e, body, &sum, &prev, rec)
	if err := entries.Put(key, value); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: %w", e.Seq, err)
	}
	if err := w.putHead(meta, head); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: update head: %w", e.Seq, err)
	}
	if err := putNodes(entries, buf[8:8+nodesLen], w.nodes); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: %w", e.Seq, err)
	}
	return Appended{Entry: e, Record: rec, Batch: w.batch}, nil
}

// zeroHex holds the place of an entry hash's hex digits in a record until
// they are known.
var zeroHex [hexDigestLen]byte

// putHead stores the head of the pending edge: in place when the stored
// head is the value the Writer stored in this transaction (stored, which
// begin read), else by a Put of a value of its own.
//
// In place relies on bbolt (v1.5) keeping the value slice a Put was given
// until the commit writes it (node.put stores it, Get returns it, spill
// copies it into a page); its documentation only promises that the value
// stays valid for the transaction. The pointer check above notices a copy
// on Put, on Get or on a remap; a bbolt that read the value at Put time
// while still returning the caller's slice would commit a stale head, which
// the next append refuses and Verify reports. TestWriterHeadInTransaction
// checks the behaviour on every bbolt upgrade.
func (w *Writer) putHead(meta *bbolt.Bucket, stored []byte) error {
	p := &w.pending
	if len(w.head) == headLen && len(stored) == headLen && &stored[0] == &w.head[0] {
		binary.BigEndian.PutUint64(w.head, p.size)
		copy(w.head[8:], p.last[:])
		return nil
	}
	w.head = encodeHead(p.size, p.last)
	return meta.Put(keyHead, w.head)
}

// begin makes pending the edge of tx's ledger, and returns the stored head
// value: at tx's first append the committed edge when it matches the
// stored head, else one rebuilt from the stored tree; at later ones, the
// pending edge unless entries were appended without w since (their
// leaves then join the batch).
func (w *Writer) begin(tx *bbolt.Tx, meta, b *bbolt.Bucket) ([]byte, error) {
	tree := storedTree{b: b}
	v := meta.Get(keyHead)
	size, last, err := parseHead(v)
	if err != nil {
		return nil, err
	}
	if w.tx == tx {
		if size == w.pending.size && last == w.pending.last {
			return v, nil
		}
		if w.pending, err = loadEdge(tree, size, last); err != nil {
			return nil, err
		}
		b := w.batch
		for i := b.start + uint64(len(b.leaves)); i < size; i++ {
			h, err := getNode(tree, compact.NewNodeID(0, i))
			if err != nil {
				return nil, err
			}
			b.leaves = append(b.leaves, h)
		}
		return v, nil
	}
	// Once per transaction: the Writer writes layoutOneBucket only,
	// which must be the file's (Init moves an older one to it).
	if layout, err := treeLayout(meta); err != nil {
		return nil, err
	} else if layout != layoutOneBucket {
		return nil, fmt.Errorf("the ledger is stored in key layout %d, this Writer writes layout %d (run Init, which moves it)", layout, layoutOneBucket)
	}
	c := w.committed
	if c.lastHex != "" && c.size == size && c.last == last {
		w.pending = c.clone()
		w.pending.checked = false
	} else if w.pending, err = loadEdge(tree, size, last); err != nil {
		return nil, err
	}
	w.tx, w.head = tx, nil
	w.batch = &Batch{start: size, left: slices.Clone(w.pending.tree.hashes)}
	tx.OnCommit(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.tx == tx {
			w.committed, w.tx, w.batch, w.head = w.pending, nil, nil, nil
			w.pending = edge{}
		}
	})
	return v, nil
}

// loadEdge reads the right edge of the tree of size entries from the
// stored tree.
func loadEdge(tree storedTree, size uint64, last [32]byte) (edge, error) {
	hashes, err := getNodes(tree, compact.RangeNodes(0, size, nil))
	if err != nil {
		return edge{}, fmt.Errorf("right edge of the Merkle tree at size %d: %w (run Verify)", size, err)
	}
	f := fold{n: size, hashes: make([][32]byte, len(hashes), len(hashes)+1)}
	for i, h := range hashes {
		f.hashes[i] = [32]byte(h)
	}
	return edge{size: size, last: last, lastHex: digest.Format(last), tree: f}, nil
}

// Checkpoint signs a checkpoint of the whole ledger (origin, size, root)
// with s and stores it after the others, unless tx appended nothing and the
// latest stored checkpoint is already of this size and origin and signed
// by s's key. Run it at the end of each group-commit transaction. It
// returns the batch of entries tx appended through w, sealed with the
// checkpoint, or nil when w appended nothing in tx.
//
// Entries appended in tx without w (by the package's Append) are covered
// too: the edge and the batch are then read back from the stored tree.
func (w *Writer) Checkpoint(tx *bbolt.Tx, s note.Signer, origin string) (*Batch, error) {
	return w.CheckpointPresigned(tx, s, origin, Presigned{})
}

// Presigned is a checkpoint signed while its transaction went on
// (Writer.Pending), and its signed note.
type Presigned struct {
	Checkpoint Checkpoint
	Signed     []byte
}

// Pending returns the checkpoint Checkpoint would sign for tx as it stands
// now, so that it can be signed outside the transaction while the
// transaction goes on (store.Options.BatchWork); ok is false when w
// appended nothing in tx.
func (w *Writer) Pending(tx *bbolt.Tx, origin string) (c Checkpoint, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tx != tx {
		return Checkpoint{}, false, nil
	}
	if _, err := w.begin(tx, tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)); err != nil {
		return Checkpoint{}, false, fmt.Errorf("ledger: checkpoint: %w", err)
	}
	return Checkpoint{Origin: origin, Size: w.pending.size, Root: w.pending.tree.root()}, true, nil
}

// CheckpointPresigned is Checkpoint, storing pre's signed note when pre is
// the checkpoint to sign (tx appended nothing since Pending) and its note
// holds that checkpoint's text, instead of signing it again; pre must have
// been signed by s.
func (w *Writer) CheckpointPresigned(tx *bbolt.Tx, s note.Signer, origin string, pre Presigned) (*Batch, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tx != tx {
		_, err := WriteCheckpoint(tx, s, origin)
		return nil, err
	}
	if _, err := w.begin(tx, tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)); err != nil {
		return nil, fmt.Errorf("ledger: checkpoint: %w", err)
	}
	c := Checkpoint{Origin: origin, Size: w.pending.size, Root: w.pending.tree.root()}
	signed := pre.Signed
	// The note must be of c: its text is c's, then a blank line and the
	// signature (by s, which the caller vouches for).
	if signed == nil || !pre.Checkpoint.same(c) || !bytes.HasPrefix(signed, append(c.Marshal(), '\n')) {
		var err error
		if signed, err = SignCheckpoint(s, c); err != nil {
			return nil, err
		}
	}
	var num uint64
	if k := tx.Bucket(bucketMeta).Get(keyLastCheckpoint); k != nil {
		_, last, ok := parseCheckpointKey(k)
		if !ok {
			return nil, fmt.Errorf("ledger: checkpoint: the latest checkpoint's key %x (meta key %q) is malformed (run Verify)", k, keyLastCheckpoint)
		}
		num = last + 1
	}
	if err := storeCheckpoint(tx, c.Size, num, signed); err != nil {
		return nil, err
	}
	w.batch.Signed, w.batch.Checkpoint, w.batch.note = signed, c, string(signed)
	return w.batch, nil
}

// Batch is the run of entries one transaction appended through a Writer,
// and the checkpoint that ends it.
type Batch struct {
	start  uint64     // seq of its first entry
	left   [][32]byte // the tree's edge before it: the roots of [0, start), largest first
	leaves [][32]byte // its entry hashes

	// Signed is the signed checkpoint note the transaction ended with
	// (empty until Writer.Checkpoint), and Checkpoint what it says.
	Signed     []byte
	Checkpoint Checkpoint
	note       string // Signed, converted once for every receipt of the batch

	once sync.Once
	// levels[l] holds the nodes of level l a proof of the batch's entries
	// can need, those of indices base[l], base[l]+1, …: the edge's node of
	// that level, if any, then every node the batch's entries complete,
	// which follow it.
	levels [][][32]byte
	base   []uint64
	err    error
}

// Prove returns the inclusion proof of entry seq, which the batch
// appended, in the tree of its checkpoint. Call it once the transaction
// has committed; it needs no transaction. The first call builds the
// batch's nodes (O(batch) hashes), later ones only look them up and hash
// the few nodes of the tree's right edge above them (RFC 9162 §2.1.3.1).
// A nil Batch (an Appended whose append never ran) is an error.
func (b *Batch) Prove(seq uint64) (Inclusion, error) {
	if b == nil {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d: no batch appended it", seq)
	}
	size := b.Checkpoint.Size
	if len(b.Signed) == 0 {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d: the batch has no checkpoint", seq)
	}
	if seq < b.start || seq >= b.start+uint64(len(b.leaves)) || size != b.start+uint64(len(b.leaves)) {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d: not in the batch of entries [%d, %d)", seq, b.start, b.start+uint64(len(b.leaves)))
	}
	b.once.Do(b.build)
	if b.err != nil {
		return Inclusion{}, b.err
	}
	// PATH(seq, D[lo:hi]) of RFC 9162, from the root down: the sibling
	// of each subtree that holds seq, split at the largest power of two
	// below its size.
	var path [64][32]byte
	n := 0
	for lo, hi := uint64(0), size; hi-lo > 1; n++ {
		k := uint64(1) << (bits.Len64(hi-lo-1) - 1)
		var ok bool
		if seq < lo+k {
			path[n], ok = b.subtree(lo+k, hi)
			hi = lo + k
		} else {
			path[n], ok = b.node(uint(bits.TrailingZeros64(k)), lo/k)
			lo += k
		}
		if !ok {
			return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: a node is not in the batch's edge", seq, size)
		}
	}
	// The leaf hash and the proof's hashes, bottom up, formatted into one
	// string that they are cut from: one allocation, not one per hash.
	const w = len(digest.Prefix) + 2*digest.Size
	buf := make([]byte, 0, w*(1+n))
	buf = appendDigest(buf, b.leaves[seq-b.start][:])
	for i := n - 1; i >= 0; i-- {
		buf = appendDigest(buf, path[i][:])
	}
	all := unsafe.String(unsafe.SliceData(buf), len(buf)) // buf is not written again
	p := make([]string, n)
	for i := range p {
		p[i] = all[w*(i+1) : w*(i+2)]
	}
	return Inclusion{LeafIndex: seq, TreeSize: size, LeafHash: all[:w], Proof: p}, nil
}

// node returns the hash of node (level, index) if the batch holds it.
func (b *Batch) node(level uint, index uint64) ([32]byte, bool) {
	if level >= uint(len(b.levels)) || index < b.base[level] || index-b.base[level] >= uint64(len(b.levels[level])) {
		return [32]byte{}, false
	}
	return b.levels[level][index-b.base[level]], true
}

// subtree returns the root of the leaves [lo, hi), where lo is a multiple
// of a power of two at least hi-lo: the roots of its perfect subtrees,
// largest first, hashed together from the right.
func (b *Batch) subtree(lo, hi uint64) ([32]byte, bool) {
	var roots [64][32]byte
	n := 0
	for at, rest := lo, hi-lo; rest > 0; n++ {
		l := uint(bits.Len64(rest) - 1)
		var ok bool
		if roots[n], ok = b.node(l, at>>l); !ok {
			return [32]byte{}, false
		}
		at += 1 << l
		rest -= 1 << l
	}
	h := roots[n-1]
	for i := n - 2; i >= 0; i-- {
		h = NodeHash(roots[i], h)
	}
	return h, true
}

// SignedNote returns Signed as a string.
func (b *Batch) SignedNote() string { return b.note }

// appendDigest appends the digest string (digest.Format) of the hash h.
func appendDigest(b []byte, h []byte) []byte {
	b = append(b, digest.Prefix...)
	return hex.AppendEncode(b, h)
}

// build collects every node a proof of the batch's entries can need: the
// edge before it and every node its entries complete.
func (b *Batch) build() {
	put := func(id compact.NodeID, h *[32]byte) {
		for uint(len(b.levels)) <= id.Level {
			b.levels, b.base = append(b.levels, nil), append(b.base, 0)
		}
		l := id.Level
		if len(b.levels[l]) == 0 {
			b.base[l] = id.Index
		}
		if id.Index != b.base[l]+uint64(len(b.levels[l])) && b.err == nil {
			b.err = fmt.Errorf("ledger: batch edge: %s does not follow the nodes of its level", nodeName(id))
		}
		b.levels[l] = append(b.levels[l], *h)
	}
	for i, id := range compact.RangeNodes(0, b.start, nil) {
		put(id, &b.left[i])
	}
	f := fold{n: b.start, hashes: slices.Clone(b.left)}
	for i := range b.leaves {
		f.append(&b.leaves[i], put)
	}
}

// FormatTime returns t.UTC().Format(TimeLayout), written directly for the
// years 0 to 9999 (the only ones TimeLayout holds) without time.Format's
// layout interpretation.
func FormatTime(t time.Time) string {
	var b [len(TimeLayout)]byte
	if !putTime(&b, t) {
		return t.UTC().Format(TimeLayout)
	}
	return string(b[:])
}

// putTime writes t.UTC().Format(TimeLayout) into b, or reports false for a
// year outside 0 to 9999.
func putTime(b *[len(TimeLayout)]byte, t time.Time) bool {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return false
	}
	hour, minute, sec := t.Clock()
	put := func(at, v, width int) {
		for i := at + width - 1; i >= at; i-- {
			b[i] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, year, 4)
	b[4] = '-'
	put(5, int(month), 2)
	b[7] = '-'
	put(8, day, 2)
	b[10] = 'T'
	put(11, hour, 2)
	b[13] = ':'
	put(14, minute, 2)
	b[16] = ':'
	put(17, sec, 2)
	b[19] = '.'
	put(20, t.Nanosecond(), 9)
	b[29] = 'Z'
	return true
}

// same reports whether c and o say the same (extensions included).
func (c Checkpoint) same(o Checkpoint) bool {
	return c.Origin == o.Origin && c.Size == o.Size && c.Root == o.Root && slices.Equal(c.Extensions, o.Extensions)
}
