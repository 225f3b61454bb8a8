package ledger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
)

// The key layouts of bucketTree. The layout in use is recorded in
// bucketMeta under keyTreeLayout: absent means layoutLevelMajor (files
// written before the layout was recorded), the single byte
// layoutCompletion means layoutCompletion; any other value is refused.
// Init rekeys a layoutLevelMajor tree to layoutCompletion; read-only
// transactions read either.
const (
	// layoutLevelMajor: level (1 byte) || index (8 bytes big-endian).
	// Each level has a key range of its own, so a batch of appends writes
	// at the tail of every level's range: one page per level.
	layoutLevelMajor = 1
	// layoutCompletion: completion position (8 bytes big-endian: the
	// index of the last leaf the node covers, (index+1)·2^level − 1) ||
	// level (1 byte). Keys ascend in the order appends complete the
	// nodes (a leaf, then the parents it completes, bottom up), so a
	// batch appends its nodes at the tail of the bucket.
	layoutCompletion = 2
)

// keyTreeLayout is the meta key recording the tree's key layout.
var keyTreeLayout = []byte("tree_layout")

// storedTree is the tree bucket read with the key layout of its file.
type storedTree struct {
	b          *bbolt.Bucket
	levelMajor bool // layoutLevelMajor: a file not yet rekeyed, read-only
}

// setKey writes the key of node id into k (treeKeyLen bytes).
func (t storedTree) setKey(k []byte, id compact.NodeID) {
	if t.levelMajor {
		setLevelMajorKey(k, id)
		return
	}
	setTreeKey(k, id)
}

// beyond describes a stored key past the tree of the first n entries, or
// returns "": in layoutCompletion the first key at or after completion
// position n (one Seek), in layoutLevelMajor leaf n.
func (t storedTree) beyond(n uint64) string {
	if t.levelMajor {
		var k [treeKeyLen]byte
		setLevelMajorKey(k[:], compact.NewNodeID(0, n))
		if t.b.Get(k[:]) != nil {
			return nodeName(compact.NewNodeID(0, n))
		}
		return ""
	}
	k, _ := t.b.Cursor().Seek(binary.BigEndian.AppendUint64(make([]byte, 0, 8), n))
	if k == nil {
		return ""
	}
	if id, ok := completionID(k); ok {
		return nodeName(id)
	}
	return fmt.Sprintf("a malformed key %x", k)
}

// treeLayout returns the key layout recorded in meta.
func treeLayout(meta *bbolt.Bucket) (int, error) {
	switch v := meta.Get(keyTreeLayout); {
	case v == nil:
		return layoutLevelMajor, nil
	case len(v) == 1 && v[0] == layoutCompletion:
		return layoutCompletion, nil
	default:
		return 0, fmt.Errorf("Merkle tree key layout %x (meta key %q) is unknown to this build, which reads layouts 1 (not recorded) and 2 (recorded as 02)", v, keyTreeLayout)
	}
}

// openTree returns the tree bucket with the layout meta records.
func openTree(tree, meta *bbolt.Bucket) (storedTree, error) {
	layout, err := treeLayout(meta)
	if err != nil {
		return storedTree{}, fmt.Errorf("ledger: %w", err)
	}
	return storedTree{b: tree, levelMajor: layout == layoutLevelMajor}, nil
}

// setLevelMajorKey writes the layoutLevelMajor key of node id into k.
func setLevelMajorKey(k []byte, id compact.NodeID) {
	k[0] = byte(id.Level)
	binary.BigEndian.PutUint64(k[1:], id.Index)
}

// levelMajorID returns the node a layoutLevelMajor key names, if it is a
// well-formed key of a node whose completion position fits in 8 bytes.
func levelMajorID(k []byte) (compact.NodeID, bool) {
	if len(k) != treeKeyLen || k[0] >= 64 {
		return compact.NodeID{}, false
	}
	level, index := uint(k[0]), binary.BigEndian.Uint64(k[1:])
	if level > 0 && index>>(64-level) != 0 {
		return compact.NodeID{}, false
	}
	return compact.NewNodeID(level, index), true
}

// completionID returns the node a layoutCompletion key names, if it is
// the well-formed key of a node.
func completionID(k []byte) (compact.NodeID, bool) {
	if len(k) != treeKeyLen || k[8] >= 64 {
		return compact.NodeID{}, false
	}
	end, level := binary.BigEndian.Uint64(k), uint(k[8])
	// end+1 is a multiple of 2^level; the node ending at 2^64−1 with
	// level 0 is the only one where end+1 overflows.
	if level > 0 && (end+1)&(1<<level-1) != 0 {
		return compact.NodeID{}, false
	}
	return compact.NewNodeID(level, (end >> level)), true
}

// rekeyTree rewrites a layoutLevelMajor tree bucket under the keys of
// layoutCompletion, values unchanged, and records layoutCompletion, all in
// tx: bbolt commits the whole of it or nothing, so a crash leaves the old
// layout or the new one. A key that names no node, or a value that is no
// hash (Verify reports either on the old file), is refused and tx must be
// rolled back. Every node is held in memory while the bucket is rewritten,
// as 41 bytes of its own (key and hash, no pointers) and bbolt's inode.
func rekeyTree(tx *bbolt.Tx, meta *bbolt.Bucket) error {
	type kv struct {
		k [treeKeyLen]byte
		v [32]byte
	}
	old := tx.Bucket(bucketTree)
	nodes := make([]kv, 0, old.Stats().KeyN) // Stats reads page headers only
	c := old.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		id, ok := levelMajorID(k)
		if !ok {
			return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: key %x names no tree node (the database is unchanged; verify it)", layoutCompletion, k)
		}
		if len(v) != 32 {
			return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: %s is %d bytes, want 32 (the database is unchanged; verify it)", layoutCompletion, nodeName(id), len(v))
		}
		var n kv
		setTreeKey(n.k[:], id)
		n.v = [32]byte(v)
		nodes = append(nodes, n)
	}
	slices.SortFunc(nodes, func(a, b kv) int { return bytes.Compare(a.k[:], b.k[:]) })
	if err := tx.DeleteBucket(bucketTree); err != nil {
		return fmt.Errorf("ledger: rekey the Merkle tree: %w", err)
	}
	tree, err := tx.CreateBucket(bucketTree)
	if err != nil {
		return fmt.Errorf("ledger: rekey the Merkle tree: %w", err)
	}
	tree.FillPercent = 1 // in key order: see Writer.AppendCanonical
	for i := range nodes {
		// bbolt keeps both slices until tx ends: nodes is not written again.
		if err := tree.Put(nodes[i].k[:], nodes[i].v[:]); err != nil {
			return fmt.Errorf("ledger: rekey the Merkle tree: %w", err)
		}
	}
	return putLayout(meta)
}

// putLayout records layoutCompletion in meta.
func putLayout(meta *bbolt.Bucket) error {
	if err := meta.Put(keyTreeLayout, []byte{layoutCompletion}); err != nil {
		return fmt.Errorf("ledger: record the Merkle tree key layout: %w", err)
	}
	return nil
}
