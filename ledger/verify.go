package ledger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime/debug"

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

// Error names the entry and the reason.
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

// Error names the node and the reason.
func (e *NodeError) Error() string {
	return fmt.Sprintf("ledger: %s: %s", nodeName(compact.NewNodeID(e.Level, e.Index)), e.Reason)
}

// CheckpointError names the first checkpoint that fails verification.
type CheckpointError struct {
	Num    uint64 // its position among the checkpoints, from 0
	Reason string
}

// Error names the checkpoint and the reason.
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

// Error names both checkpoints, their size and their roots.
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
	// have verified, in sequence order. The Entry shares memory with the
	// verifier's buffers: it is valid only during the call (copy what is
	// kept). An error from it stops verification
	// and is returned in a *VerifyError for that entry (errors.Is and
	// errors.As reach it). Use it for checks of entry bodies, such as the
	// signatures of receipts.
	OnEntry func(Entry) error
}

// Report is the outcome of a successful verification.
type Report struct {
	Entries     uint64     // number of entries: the tree size
	Root        [32]byte   // Merkle root of all entries (Hasher.EmptyRoot if none)
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
//     root at its size, and no two of one size have different roots; each
//     is stored under its size and number, and ledger_meta's record of the
//     latest names the last;
//   - attachments: each key is the seq of a stored entry, or an empty pad
//     (their values are the ledger's users' to check).
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
// checkpoint bucket, as when opened read-only) is checked as a hash chain;
// one of an older key layout with them (layouts 1 and 2) is refused.
func VerifyWith(tx *bbolt.Tx, opts VerifyOptions) (rep Report, err error) {
	v := newChain(opts)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer guardFaults(&err, func() string { return fmt.Sprintf("verifying after entry %d", v.n) }) // fault.go
	entries, meta, err := buckets(tx)
	if err != nil {
		return Report{}, err
	}
	full, err := readsWhole(tx, meta)
	if err != nil {
		return Report{}, err
	}
	if full {
		v.nodes = &nodeChecker{c: newKindCursor(entries, kindNode)}
	}
	v.misplaced = func(size uint64) string {
		return fmt.Sprintf("is for tree size %d, below the size of a checkpoint stored before it", size)
	}
	src := &dbSource{entries: newKindCursor(entries, kindEntry)}
	src.k, src.rec = src.entries.First()
	if full {
		src.walk.c = newKindCursor(entries, kindCheckpoint)
		src.walk.load(src.walk.c.First())
	}
	if err := v.run(src); err != nil {
		return v.report, err
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
	// The checkpoints left are for sizes beyond the entries.
	v.misplaced = func(size uint64) string {
		return fmt.Sprintf("is for tree size %d but the ledger has %d entries", size, n)
	}
	if full {
		if err := src.walk.checkLatest(meta.Get(keyLastCheckpoint)); err != nil {
			return v.report, err
		}
		if err := checkAttachmentKeys(tx, n); err != nil {
			return v.report, err
		}
	}
	for src.walk.k != nil {
		it := src.walk.next()
		it.prepareGuarded(&v.opts, nil, nil)
		if err := v.consume(&it); err != nil {
			return v.report, err
		}
	}
	return v.finish()
}

// dbSource reads a ledger's entries in key order, with each stored
// checkpoint placed before the first entry beyond its size.
type dbSource struct {
	entries *kindCursor
	k, rec  []byte // the next entry; k is nil at the end
	pos     uint64 // entries read
	walk    checkpointWalk
}

func (s *dbSource) fill(b *batch) (bool, error) {
	for b.room() {
		if s.walk.k != nil && s.walk.size <= s.pos {
			b.put(s.walk.next())
			continue
		}
		if s.k == nil {
			return false, nil
		}
		// The key is checked by prepare, on a worker: reading it here
		// would fetch a page of the mapped file on this goroutine, the
		// only one that does not run in parallel.
		b.put(item{kind: itemEntry, data: s.rec, key: s.k, num: s.pos, stored: true})
		s.pos++
		s.k, s.rec = s.entries.Next()
	}
	return true, nil
}

// checkpointWalk reads the stored checkpoints in key order.
type checkpointWalk struct {
	c     *kindCursor
	k, s  []byte // the next checkpoint's key and signed note; k nil at the end
	err   error  // why its stored value does not unpack (the chain reports it)
	size  uint64 // its size, or 0 if it does not parse (the chain reports it)
	sized bool   // whether it parses, so that size is the one its key must hold
	num   uint64 // its expected number
	last  []byte // the key of the last one walked
}

func (w *checkpointWalk) load(k, v []byte) {
	w.k, w.size, w.sized = k, 0, false
	w.s, w.err = loadCheckpoint(v)
	if k != nil && w.err == nil {
		if c, _, err := parseSigned(w.s); err == nil {
			w.size, w.sized = c.Size, true
		}
	}
}

// next returns the next checkpoint as an item and moves on.
func (w *checkpointWalk) next() item {
	it := item{kind: itemCheckpoint, data: w.s, num: w.num, err: w.err}
	want := checkpointKey(w.size, w.num)
	if !w.sized {
		// Its note does not parse, which the chain reports: its key's
		// size cannot be checked, its number can.
		want = checkpointKey(binary.BigEndian.Uint64(w.k), w.num)
	}
	if it.err == nil && !bytes.Equal(w.k, want) {
		it.err = fmt.Errorf("stored under key %x, want %x", w.k, want)
	}
	w.num++
	w.last = w.k
	w.load(w.c.Next())
	return it
}

// checkLatest compares the latest checkpoint's key that meta records
// (recorded) with the key of the last one stored, once the walk has
// passed every checkpoint of a tree size within the entries.
func (w *checkpointWalk) checkLatest(recorded []byte) error {
	last := w.last
	if w.k != nil {
		// Checkpoints of sizes beyond the entries are left: the chain
		// reports the first of them, unless the record names another.
		last = nil
		for c, k := w.c, w.k; k != nil; k, _ = c.Next() {
			last = k
		}
		w.c.Seek(w.k)
	}
	if !bytes.Equal(recorded, last) {
		return &CheckpointError{Num: w.num - min(w.num, 1), Reason: fmt.Sprintf("the latest checkpoint's key recorded in the metadata (%q) is %x, the last stored checkpoint's is %x", keyLastCheckpoint, recorded, last)}
	}
	return nil
}

// nodeChecker compares the stored Merkle tree with the nodes of the tree
// recomputed from the entries. The stored keys ascend in the order the
// nodes are recomputed (layoutCompletion), so one cursor walks them in
// step.
type nodeChecker struct {
	c       *kindCursor
	started bool
	err     error // the first difference
	want    [treeKeyLen]byte
	last    compact.NodeID // the last node visited
	visited bool
}

// visit is called with every node of the recomputed tree as it completes:
// the leaf, then the parents it completes, bottom up.
func (nc *nodeChecker) visit(id compact.NodeID, hash *[32]byte) {
	if nc.err != nil {
		return
	}
	nc.last, nc.visited = id, true
	k, v := nc.step()
	want := nc.want[:] // the key of id, without allocating
	setTreeKey(want, id)
	switch {
	case bytes.Equal(k, want) && bytes.Equal(v, hash[:]):
	case bytes.Equal(k, want):
		stored := fmt.Sprintf("a %d-byte value", len(v))
		if len(v) == 32 {
			stored = digest.Format([32]byte(v))
		}
		nc.err = nodeDiffers(id, fmt.Sprintf("stored hash %s differs from the recomputed %s", stored, digest.Format(*hash)))
	case k != nil && bytes.Compare(k, want) < 0:
		other, _ := completionID(k)
		nc.err = &NodeError{Level: id.Level, Index: id.Index, Reason: fmt.Sprintf("%s, which is no node of the tree, is stored before it", nodeName(other))}
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

// step returns the next stored node's key and hash.
func (nc *nodeChecker) step() (k, v []byte) {
	if !nc.started {
		nc.started = true
		return nc.c.First()
	}
	return nc.c.Next()
}

// rest reports a stored node beyond the tree of size n, once every node of
// that tree has been visited.
func (nc *nodeChecker) rest(n uint64) error {
	if nc.err != nil {
		return nc.err
	}
	k, _ := nc.step()
	if k == nil {
		return nil
	}
	id, _ := completionID(k)
	return &NodeError{Level: id.Level, Index: id.Index, Reason: fmt.Sprintf("stored, but not part of the tree of %d entries", n)}
}
