package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
)

// VerifyError names the first entry at which a ledger fails verification.
type VerifyError struct {
	Seq    uint64 // the first bad or missing entry
	Reason string // what is wrong with it
	Err    error  // the error of VerifyOptions.OnEntry, if that is the reason
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("ledger: entry %d: %s", e.Seq, e.Reason)
}

// Unwrap returns the error of VerifyOptions.OnEntry that rejected the
// entry, or nil.
func (e *VerifyError) Unwrap() error { return e.Err }

// NodeError names a stored Merkle tree node (above the leaves, or a stray
// key) that is missing, malformed or not the one recomputed from the
// entries. A bad leaf is reported as a *VerifyError for its entry.
type NodeError struct {
	Level  uint   // 0 for leaves
	Index  uint64 // the node covers entries [Index·2^Level, (Index+1)·2^Level)
	Reason string
}

func (e *NodeError) Error() string {
	return fmt.Sprintf("ledger: %s: %s", nodeName(compact.NewNodeID(e.Level, e.Index)), e.Reason)
}

// CheckpointError names the first checkpoint that fails verification.
type CheckpointError struct {
	Num    uint64 // its position among the checkpoints, from 0
	Reason string
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("ledger: checkpoint #%d: %s", e.Num, e.Reason)
}

// ForkError reports two checkpoints for the same tree size with different
// roots: if both are signed, the key holder signed two different histories.
type ForkError struct {
	Size                  uint64   // the tree size of both
	First, Second         uint64   // their positions among the checkpoints
	FirstRoot, SecondRoot [32]byte // their roots
}

func (e *ForkError) Error() string {
	return fmt.Sprintf("ledger: fork: checkpoints #%d and #%d are both for tree size %d but have roots %s and %s",
		e.First, e.Second, e.Size, digest.Format(e.FirstRoot), digest.Format(e.SecondRoot))
}

// VerifyOptions tunes VerifyWith and VerifyExport. The zero value checks
// everything except checkpoint signatures and origins.
type VerifyOptions struct {
	// Verifier, if set, must have signed every checkpoint (see
	// NewCheckpointVerifier). Without it checkpoints are checked against the
	// recomputed roots but their signatures are not checked.
	Verifier note.Verifier
	// Origin, if set, is the origin every checkpoint must carry.
	Origin string
	// OnEntry, if set, is called with each entry once its hashes and links
	// have verified, in sequence order. An error from it stops verification
	// and is returned in a *VerifyError for that entry (errors.Is and
	// errors.As reach it). Use it for checks of entry bodies, such as the
	// signatures of receipts.
	OnEntry func(Entry) error
}

// Report is the outcome of a successful verification.
type Report struct {
	Entries     uint64     // number of entries: the tree size
	Root        [32]byte   // Merkle root of all entries (EmptyRoot if none)
	Checkpoints uint64     // number of checkpoints verified
	Latest      Checkpoint // the last checkpoint, if Checkpoints > 0
}

// Verify checks the whole ledger in tx, as VerifyWith with no options, and
// returns the number of entries that verified.
func Verify(tx *bbolt.Tx) (n uint64, err error) {
	r, err := VerifyWith(tx, VerifyOptions{})
	return r.Entries, err
}

// VerifyWith checks the whole ledger in tx:
//
//   - entries: sequence numbers run from 0 without gaps, every record is
//     exactly the canonical JSON of a well-formed entry whose seq matches its
//     key, every prev_hash is the entry_hash of the entry before (ZeroHash
//     for entry 0), every entry_hash recomputes, and the head metadata
//     matches the last entry;
//   - the Merkle tree: every stored node is the one recomputed from the
//     entry hashes, none is missing and there are no others;
//   - checkpoints: each is a well-formed signed note (signed by
//     opts.Verifier, if set, with origin opts.Origin, if set), sizes do not
//     decrease, no size exceeds the entries, each root is the recomputed
//     root at its size, and no two of one size have different roots.
//
// At the first failure it returns a *VerifyError (an entry, including a
// tree leaf that differs from its entry's hash), a *NodeError, a
// *CheckpointError or a *ForkError; other errors mean the ledger could not
// be read at all. Report.Entries counts the entries verified before a
// failure.
//
// A problem with the head metadata is reported at the first sequence number
// where head and entries disagree: the first missing entry when the head
// counts more entries than are stored, the first uncounted entry when it
// counts fewer, and the last entry when only the hash differs.
//
// A ledger that Init has not yet migrated (it has neither the tree nor the
// checkpoint bucket, as when opened read-only) is checked as a hash chain.
func VerifyWith(tx *bbolt.Tx, opts VerifyOptions) (Report, error) {
	entries, meta, err := buckets(tx)
	if err != nil {
		return Report{}, err
	}
	tree, cps := tx.Bucket(bucketTree), tx.Bucket(bucketCheckpoints)
	if (tree == nil) != (cps == nil) {
		return Report{}, errors.New("ledger: one of the Merkle tree and checkpoint buckets is missing")
	}
	v := newChain(opts)
	if tree != nil {
		v.nodes = &nodeChecker{tree: tree}
	}
	v.misplaced = func(size uint64) string {
		return fmt.Sprintf("is for tree size %d, below the size of a checkpoint stored before it", size)
	}
	walk := checkpointWalk{v: v}
	if cps != nil {
		walk.c = cps.Cursor()
		walk.load(walk.c.First())
	}

	c := entries.Cursor()
	for k, rec := c.First(); k != nil; k, rec = c.Next() {
		if err := walk.feed(); err != nil {
			return v.report, err
		}
		n := v.n
		if len(k) != 8 {
			return v.report, &VerifyError{Seq: n, Reason: fmt.Sprintf("malformed key %x after entry %d", k, n)}
		}
		if seq := binary.BigEndian.Uint64(k); seq != n {
			return v.report, &VerifyError{Seq: n, Reason: fmt.Sprintf("entry missing (the next stored entry is %d)", seq)}
		}
		if err := v.entry(rec); err != nil {
			return v.report, err
		}
	}

	n := v.n
	last := n - min(n, 1)
	size, hash, err := readHead(meta)
	switch {
	case err != nil:
		return v.report, &VerifyError{Seq: last, Reason: err.Error()}
	case size > n:
		return v.report, &VerifyError{Seq: n, Reason: fmt.Sprintf("entry missing (head metadata counts %d entries, %d are stored)", size, n)}
	case size < n:
		return v.report, &VerifyError{Seq: size, Reason: fmt.Sprintf("entry not counted by the head metadata (%d entries)", size)}
	case hash != v.prev:
		return v.report, &VerifyError{Seq: last, Reason: fmt.Sprintf("head metadata hash %s differs from the last entry_hash %s", digest.Format(hash), digest.Format(v.prev))}
	}
	if v.nodes != nil {
		if err := v.nodes.rest(n); err != nil {
			return v.report, err
		}
	}
	if err := walk.feed(); err != nil {
		return v.report, err
	}
	v.misplaced = func(size uint64) string {
		return fmt.Sprintf("is for tree size %d but the ledger has %d entries", size, n)
	}
	for walk.k != nil {
		if err := walk.next(); err != nil {
			return v.report, err
		}
	}
	return v.finish()
}

// checkpointWalk feeds stored checkpoints to a chain in step with the
// entries: each once the entries of its size have been verified.
type checkpointWalk struct {
	v    *chain
	c    *bbolt.Cursor
	k, s []byte // the next checkpoint's key and signed note; k nil at the end
	size uint64 // its size, or 0 if it does not parse (the chain reports it)
	num  uint64 // its expected number
}

func (w *checkpointWalk) load(k, s []byte) {
	w.k, w.s, w.size = k, s, 0
	if k != nil {
		if c, _, err := parseSigned(s); err == nil {
			w.size = c.Size
		}
	}
}

// feed verifies the checkpoints due before the next entry.
func (w *checkpointWalk) feed() error {
	for w.k != nil && w.size <= w.v.n {
		if err := w.next(); err != nil {
			return err
		}
	}
	return nil
}

func (w *checkpointWalk) next() error {
	if !bytes.Equal(w.k, seqKey(w.num)) {
		return &CheckpointError{Num: w.num, Reason: fmt.Sprintf("stored under key %x, want %x", w.k, seqKey(w.num))}
	}
	if err := w.v.checkpoint(w.num, w.s); err != nil {
		return err
	}
	w.num++
	w.load(w.c.Next())
	return nil
}

// nodeChecker compares the stored Merkle tree with the nodes of the tree
// recomputed from the entries, walking one cursor per level in step.
type nodeChecker struct {
	tree    *bbolt.Bucket
	cursors []*bbolt.Cursor // by level
	err     error           // the first difference
}

// visit is a compact.VisitFn: it is called with every node of the
// recomputed tree as it completes, in index order on each level.
func (nc *nodeChecker) visit(id compact.NodeID, hash []byte) {
	if nc.err != nil {
		return
	}
	k, v := nc.step(id.Level)
	want := treeKey(id)
	switch {
	case bytes.Equal(k, want) && bytes.Equal(v, hash):
	case bytes.Equal(k, want):
		stored := fmt.Sprintf("a %d-byte value", len(v))
		if len(v) == 32 {
			stored = digest.Format([32]byte(v))
		}
		nc.err = nodeDiffers(id, fmt.Sprintf("stored hash %s differs from the recomputed %s", stored, digest.Format([32]byte(hash))))
	case k != nil && bytes.Compare(k, want) < 0:
		nc.err = &NodeError{Level: id.Level, Index: id.Index, Reason: fmt.Sprintf("malformed key %x stored before it", k)}
	default:
		nc.err = nodeDiffers(id, "missing from the stored tree")
	}
}

func nodeDiffers(id compact.NodeID, reason string) error {
	if id.Level == 0 {
		return &VerifyError{Seq: id.Index, Reason: "Merkle tree leaf: " + reason}
	}
	return &NodeError{Level: id.Level, Index: id.Index, Reason: reason}
}

// step returns the next stored key at level (or after it).
func (nc *nodeChecker) step(level uint) (k, v []byte) {
	for uint(len(nc.cursors)) <= level {
		nc.cursors = append(nc.cursors, nil)
	}
	if c := nc.cursors[level]; c != nil {
		return c.Next()
	}
	c := nc.tree.Cursor()
	nc.cursors[level] = c
	return c.Seek([]byte{byte(level)})
}

// rest reports a stored node beyond the tree of size n, once every node of
// that tree has been visited.
func (nc *nodeChecker) rest(n uint64) error {
	if nc.err != nil {
		return nc.err
	}
	for level := range uint(64) {
		k, _ := nc.step(level)
		if k == nil || k[0] != byte(level) {
			continue
		}
		if len(k) != treeKeyLen {
			return &NodeError{Level: level, Reason: fmt.Sprintf("malformed key %x in the stored tree", k)}
		}
		return &NodeError{Level: level, Index: binary.BigEndian.Uint64(k[1:]), Reason: fmt.Sprintf("stored, but not part of the tree of %d entries", n)}
	}
	if k, _ := nc.tree.Cursor().Seek([]byte{64}); k != nil {
		return &NodeError{Level: uint(k[0]), Reason: fmt.Sprintf("malformed key %x in the stored tree", k)}
	}
	return nil
}

// chain verifies a stream of entry records and signed checkpoints, each
// checkpoint placed after the entries of its size. It is the common core of
// VerifyWith and VerifyExport.
type chain struct {
	opts VerifyOptions
	n    uint64   // entries verified
	prev [32]byte // entry_hash of entry n-1
	rng  *compact.Range
	// nodes, if set, sees every node of the recomputed tree.
	nodes *nodeChecker
	// misplaced explains a checkpoint whose size is not n.
	misplaced func(size uint64) string
	// The checkpoints at size n seen so far: the first one's number and
	// root. Its root is compared with the recomputed one when the next
	// entry arrives or at the end, so that a fork at this size is reported
	// as such whichever of the two comes first.
	pending   bool
	firstNum  uint64
	firstRoot [32]byte

	e        Entry
	rec, pre []byte
	report   Report
}

func newChain(opts VerifyOptions) *chain {
	return &chain{opts: opts, rng: rangeFactory.NewEmptyRange(0)}
}

// entry verifies the record of entry n.
func (v *chain) entry(rec []byte) error {
	if err := v.settle(); err != nil {
		return err
	}
	n := v.n
	if err := decodeRecord(&v.e, &v.rec, rec); err != nil {
		return &VerifyError{Seq: n, Reason: err.Error()}
	}
	if v.e.Seq != n {
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("record says seq %d", v.e.Seq)}
	}
	if p, _ := digest.Parse(v.e.PrevHash); p != v.prev {
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("prev_hash %s is not the entry_hash of the entry before (%s)", v.e.PrevHash, digest.Format(v.prev))}
	}
	var sum [32]byte
	hashEntry(&sum, &v.pre, &v.e)
	if h, _ := digest.Parse(v.e.Hash); h != sum {
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("entry_hash %s does not match the recomputed %s", v.e.Hash, digest.Format(sum))}
	}
	if v.opts.OnEntry != nil {
		if err := v.opts.OnEntry(v.e); err != nil {
			return &VerifyError{Seq: n, Reason: err.Error(), Err: err}
		}
	}
	leaf := sum // the range keeps the slice
	var visit compact.VisitFn
	if v.nodes != nil {
		visit = v.nodes.visit
	}
	if err := v.rng.Append(leaf[:], visit); err != nil {
		return fmt.Errorf("ledger: entry %d: %w", n, err)
	}
	if v.nodes != nil && v.nodes.err != nil {
		return v.nodes.err
	}
	v.prev = sum
	v.n++
	v.report.Entries = v.n
	return nil
}

// checkpoint verifies a signed checkpoint numbered num that stands after
// the n entries verified so far.
func (v *chain) checkpoint(num uint64, signed []byte) error {
	var c Checkpoint
	var err error
	if v.opts.Verifier != nil {
		c, err = OpenCheckpoint(signed, v.opts.Verifier)
	} else {
		c, _, err = parseSigned(signed)
	}
	if err != nil {
		return &CheckpointError{Num: num, Reason: strings.TrimPrefix(err.Error(), "ledger: ")}
	}
	if v.opts.Origin != "" && c.Origin != v.opts.Origin {
		return &CheckpointError{Num: num, Reason: fmt.Sprintf("origin %q, want %q", c.Origin, v.opts.Origin)}
	}
	if c.Size != v.n {
		return &CheckpointError{Num: num, Reason: v.misplaced(c.Size)}
	}
	switch {
	case !v.pending:
		v.pending, v.firstNum, v.firstRoot = true, num, c.Root
	case c.Root != v.firstRoot:
		return &ForkError{Size: c.Size, First: v.firstNum, Second: num, FirstRoot: v.firstRoot, SecondRoot: c.Root}
	}
	v.report.Checkpoints++
	v.report.Latest = c
	return nil
}

// settle compares the root of the checkpoints at size n with the
// recomputed root.
func (v *chain) settle() error {
	if !v.pending {
		return nil
	}
	v.pending = false
	root, err := v.root()
	if err != nil {
		return err
	}
	if root != v.firstRoot {
		return &CheckpointError{Num: v.firstNum, Reason: fmt.Sprintf("root %s for tree size %d differs from the root %s recomputed from the entries",
			digest.Format(v.firstRoot), v.n, digest.Format(root))}
	}
	return nil
}

func (v *chain) root() ([32]byte, error) {
	if v.n == 0 {
		return EmptyRoot, nil
	}
	r, err := v.rng.GetRootHash(nil)
	if err != nil {
		return [32]byte{}, fmt.Errorf("ledger: root of tree size %d: %w", v.n, err)
	}
	return [32]byte(r), nil
}

// finish settles the last checkpoints and completes the report.
func (v *chain) finish() (Report, error) {
	if err := v.settle(); err != nil {
		return v.report, err
	}
	root, err := v.root()
	if err != nil {
		return v.report, err
	}
	v.report.Root = root
	return v.report, nil
}
