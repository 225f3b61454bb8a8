package ledger

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
)

// Writer appends entries and signs checkpoints with the right edge of the
// Merkle tree kept in memory (the compact range of all entries: at most
// log2(n)+1 hashes), so that an append reads no stored tree node and the
// inclusion proof of every entry a transaction appended comes from memory
// (Batch.Prove) instead of from bbolt.
//
// The stored ledger stays the authority: at the first append of each
// transaction the Writer compares its edge with the stored head and, if
// they differ (another writer appended, or a transaction it took part in
// was rolled back), rebuilds the edge from the stored tree. The edge a
// transaction built becomes the Writer's only when that transaction
// commits (bbolt's OnCommit). A Writer is safe for concurrent use, though
// bbolt runs one write transaction at a time anyway.
type Writer struct {
	mu        sync.Mutex
	committed edge      // as of the last commit the Writer saw
	tx        *bbolt.Tx // the transaction pending and batch belong to
	pending   edge
	batch     *Batch
}

// edge is the right edge of the tree of the first size entries.
type edge struct {
	size uint64
	last [32]byte // entry_hash of entry size-1; zero for an empty ledger
	rng  *compact.Range
}

func (e edge) clone() edge {
	if e.rng == nil {
		return e
	}
	hashes := slices.Clone(e.rng.Hashes())
	r, _ := rangeFactory.NewRange(0, e.size, hashes) // hashes came from a valid range
	return edge{size: e.size, last: e.last, rng: r}
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
	tree := tx.Bucket(bucketTree)
	if tree == nil {
		return Appended{}, errors.New("ledger: append: Merkle tree bucket missing (run Init)")
	}
	if err := w.begin(tx, meta, tree); err != nil {
		return Appended{}, fmt.Errorf("ledger: append: %w", err)
	}
	p := &w.pending
	prev := p.last
	e := Entry{
		Seq:      p.size,
		Kind:     kind,
		Time:     FormatTime(t),
		PrevHash: digest.Format(p.last),
		Body:     body.b,
	}
	// The fields checkFields checks, but for the time and prev_hash this
	// function wrote itself in their forms.
	if e.Seq > maxSeq {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: seq exceeds %d", kind, e.Seq, uint64(maxSeq))
	}
	if err := checkKind(kind); err != nil {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: %w", kind, e.Seq, err)
	}
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: time %q is not of the form %s", kind, e.Seq, e.Time, TimeLayout)
	}
	// Keys only ever grow (on each level of the tree), so pages can be
	// filled completely before they split.
	entries.FillPercent, tree.FillPercent = 1, 1
	key := seqKey(e.Seq)
	if entries.Get(key) != nil {
		return Appended{}, fmt.Errorf("ledger: append: entry %d already exists although the head says %d entries (run Verify)", e.Seq, e.Seq)
	}
	var sum [32]byte
	buf := scratch.Get().(*[]byte)
	hashEntry(&sum, buf, &e)
	if cap(*buf) <= maxScratch {
		scratch.Put(buf)
	}
	e.Hash = digest.Format(sum)
	rec := appendRecord(make([]byte, 0, recordLen(&e)), &e)
	if len(rec) > bbolt.MaxValueSize {
		return Appended{}, fmt.Errorf("ledger: append %q entry %d: record of %d bytes exceeds bbolt's limit", kind, e.Seq, len(rec))
	}
	// Writes from here on: a failure leaves tx half written, and the
	// caller must roll it back (the pending edge is dropped with it).
	var nodes []node
	if err := p.rng.Append(bytes.Clone(sum[:]), func(id compact.NodeID, h []byte) {
		nodes = append(nodes, node{id, [32]byte(h)})
	}); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: Merkle tree: %w", e.Seq, err)
	}
	p.size, p.last = e.Seq+1, sum
	w.batch.leaves = append(w.batch.leaves, sum)
	if err := entries.Put(key, storedRecord(&e, body, &sum, &prev, rec)); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: %w", e.Seq, err)
	}
	if err := meta.Put(keyHead, encodeHead(p.size, sum)); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: update head: %w", e.Seq, err)
	}
	if err := putNodes(tree, nodes); err != nil {
		return Appended{}, fmt.Errorf("ledger: append entry %d: %w", e.Seq, err)
	}
	return Appended{Entry: e, Record: rec, Batch: w.batch}, nil
}

// begin makes pending the edge of tx's ledger: at tx's first append the
// committed edge when it matches the stored head, else one rebuilt from
// the stored tree; at later ones, the pending edge unless entries were
// appended without w since (their leaves then join the batch).
func (w *Writer) begin(tx *bbolt.Tx, meta, tree *bbolt.Bucket) error {
	size, last, err := readHead(meta)
	if err != nil {
		return err
	}
	if w.tx == tx {
		if size == w.pending.size {
			return nil
		}
		if w.pending, err = loadEdge(tree, size, last); err != nil {
			return err
		}
		b := w.batch
		for i := b.start + uint64(len(b.leaves)); i < size; i++ {
			h, err := getNode(tree, compact.NewNodeID(0, i))
			if err != nil {
				return err
			}
			b.leaves = append(b.leaves, h)
		}
		return nil
	}
	c := w.committed
	if c.rng != nil && c.size == size && c.last == last {
		w.pending = c.clone()
	} else if w.pending, err = loadEdge(tree, size, last); err != nil {
		return err
	}
	w.tx = tx
	w.batch = &Batch{start: size, left: slices.Clone(w.pending.rng.Hashes())}
	tx.OnCommit(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.tx == tx {
			w.committed, w.tx, w.batch = w.pending, nil, nil
			w.pending = edge{}
		}
	})
	return nil
}

// loadEdge reads the right edge of the tree of size entries from the
// stored tree.
func loadEdge(tree *bbolt.Bucket, size uint64, last [32]byte) (edge, error) {
	hashes, err := getNodes(tree, compact.RangeNodes(0, size, nil))
	if err != nil {
		return edge{}, fmt.Errorf("right edge of the Merkle tree at size %d: %w (run Verify)", size, err)
	}
	r, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return edge{}, fmt.Errorf("right edge of the Merkle tree at size %d: %w", size, err)
	}
	return edge{size: size, last: last, rng: r}, nil
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
	if err := w.begin(tx, tx.Bucket(bucketMeta), tx.Bucket(bucketTree)); err != nil {
		return Checkpoint{}, false, fmt.Errorf("ledger: checkpoint: %w", err)
	}
	root, err := w.pending.root()
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("ledger: checkpoint of size %d: %w", w.pending.size, err)
	}
	return Checkpoint{Origin: origin, Size: w.pending.size, Root: root}, true, nil
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
	if err := w.begin(tx, tx.Bucket(bucketMeta), tx.Bucket(bucketTree)); err != nil {
		return nil, fmt.Errorf("ledger: checkpoint: %w", err)
	}
	n := w.pending.size
	root, err := w.pending.root()
	if err != nil {
		return nil, fmt.Errorf("ledger: checkpoint of size %d: %w", n, err)
	}
	c := Checkpoint{Origin: origin, Size: n, Root: root}
	signed := pre.Signed
	// The note must be of c: its text is c's, then a blank line and the
	// signature (by s, which the caller vouches for).
	if signed == nil || !pre.Checkpoint.same(c) || !bytes.HasPrefix(signed, append(c.Marshal(), '\n')) {
		if signed, err = SignCheckpoint(s, c); err != nil {
			return nil, err
		}
	}
	b, err := checkpointsBucket(tx)
	if err != nil {
		return nil, err
	}
	var num uint64
	if k, _ := b.Cursor().Last(); k != nil {
		if len(k) != 8 {
			return nil, fmt.Errorf("ledger: checkpoint: malformed checkpoint key %x", k)
		}
		num = binary.BigEndian.Uint64(k) + 1
	}
	if err := storeCheckpoint(b, num, signed); err != nil {
		return nil, err
	}
	w.batch.Signed, w.batch.Checkpoint, w.batch.note = signed, c, string(signed)
	return w.batch, nil
}

func (e *edge) root() ([32]byte, error) {
	if e.size == 0 {
		return emptyRoot, nil
	}
	r, err := e.rng.GetRootHash(nil)
	if err != nil {
		return [32]byte{}, err
	}
	return [32]byte(r), nil
}

// Batch is the run of entries one transaction appended through a Writer,
// and the checkpoint that ends it.
type Batch struct {
	start  uint64     // seq of its first entry
	left   [][]byte   // the tree's edge before it: the compact range [0, start)
	leaves [][32]byte // its entry hashes

	// Signed is the signed checkpoint note the transaction ended with
	// (empty until Writer.Checkpoint), and Checkpoint what it says.
	Signed     []byte
	Checkpoint Checkpoint
	note       string // Signed, converted once for every receipt of the batch

	once  sync.Once
	nodes map[compact.NodeID][]byte
	err   error
}

// Prove returns the inclusion proof of entry seq, which the batch
// appended, in the tree of its checkpoint. Call it once the transaction
// has committed; it needs no transaction. The first call builds the
// batch's nodes (O(batch) hashes), later ones only look them up.
func (b *Batch) Prove(seq uint64) (Inclusion, error) {
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
	ns, err := proof.Inclusion(seq, size)
	if err != nil {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %w", seq, size, err)
	}
	hashes := make([][]byte, len(ns.IDs))
	for i, id := range ns.IDs {
		h, ok := b.nodes[id]
		if !ok {
			return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %s not in the batch's edge", seq, size, nodeName(id))
		}
		hashes[i] = h
	}
	if hashes, err = ns.Rehash(hashes, Hasher{}.HashChildren); err != nil {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %w", seq, size, err)
	}
	// The leaf hash and the proof's hashes, formatted into one string
	// that they are cut from: one allocation, not one per hash.
	const n = len(digest.Prefix) + 2*digest.Size
	buf := make([]byte, 0, n*(1+len(hashes)))
	buf = appendDigest(buf, b.leaves[seq-b.start][:])
	for _, h := range hashes {
		buf = appendDigest(buf, h)
	}
	all := string(buf)
	p := make([]string, len(hashes))
	for i := range p {
		p[i] = all[n*(i+1) : n*(i+2)]
	}
	return Inclusion{LeafIndex: seq, TreeSize: size, LeafHash: all[:n], Proof: p}, nil
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
	b.nodes = make(map[compact.NodeID][]byte, len(b.left)+2*len(b.leaves))
	for i, id := range compact.RangeNodes(0, b.start, nil) {
		b.nodes[id] = b.left[i]
	}
	r, err := rangeFactory.NewRange(0, b.start, slices.Clone(b.left))
	if err != nil {
		b.err = fmt.Errorf("ledger: batch edge: %w", err)
		return
	}
	visit := func(id compact.NodeID, h []byte) { b.nodes[id] = h }
	for i := range b.leaves {
		if err := r.Append(b.leaves[i][:], visit); err != nil {
			b.err = fmt.Errorf("ledger: batch edge: %w", err)
			return
		}
	}
}

// FormatTime returns t.UTC().Format(TimeLayout), written directly for the
// years 0 to 9999 (the only ones TimeLayout holds) without time.Format's
// layout interpretation.
func FormatTime(t time.Time) string {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Format(TimeLayout)
	}
	hour, minute, sec := t.Clock()
	var b [len(TimeLayout)]byte
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
	return string(b[:])
}

// same reports whether c and o say the same (extensions included).
func (c Checkpoint) same(o Checkpoint) bool {
	return c.Origin == o.Origin && c.Size == o.Size && c.Root == o.Root && slices.Equal(c.Extensions, o.Extensions)
}
