package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"
)

// The key layouts of bucketTree, in the files of older builds. The layout
// in use is recorded in bucketMeta under keyTreeLayout: absent means
// layoutLevelMajor (files written before the layout was recorded), the
// single byte layoutCompletion means layoutCompletion, layoutOneBucket
// the current layout (onebucket.go); any other value is refused. Init
// rekeys a layoutLevelMajor tree to layoutCompletion, then moves it into
// layoutOneBucket; no other function reads the older layouts.
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
	// layoutMoving: a file of layoutCompletion that Move has moved in
	// part (its tree and checkpoints split between their own buckets and
	// the entries'), recorded as the byte 0x82 so that a build of
	// layoutCompletion, which knows no other value, refuses it by name
	// rather than reading nodes as missing. Move goes on with it; every
	// reader refuses it.
	layoutMoving = 0x82
)

// keyTreeLayout is the meta key recording the tree's key layout.
var keyTreeLayout = []byte("tree_layout")

// storedTree is a bucket holding tree nodes under the keys of
// layoutCompletion: the ledger's (layoutOneBucket), or an older file's
// bucketTree while Init moves it.
type storedTree struct {
	b *bbolt.Bucket
	// moved, if set, is read for a node b lacks: during a bounded move
	// from layout 2 (Move), a node is in ledger_tree or, moved, in the
	// entries' bucket.
	moved *bbolt.Bucket
}

// treeLayout returns the key layout recorded in meta.
func treeLayout(meta *bbolt.Bucket) (int, error) {
	switch v := meta.Get(keyTreeLayout); {
	case v == nil:
		return layoutLevelMajor, nil
	case len(v) == 1 && (v[0] == layoutCompletion || v[0] == layoutOneBucket || v[0] == layoutMoving):
		return int(v[0]), nil
	default:
		return 0, fmt.Errorf("ledger key layout %x (meta key %q) is unknown to this build, which reads layout 3 (recorded as 03) and moves layouts 1 (not recorded) and 2 (recorded as 02) to it", v, keyTreeLayout)
	}
}

// ErrLayoutMismatch is the cause of the error for a tree whose keys are of
// the other layout than the one ledger_meta records (checkOtherLayout).
var ErrLayoutMismatch = errors.New("the Merkle tree's keys and its recorded key layout disagree")

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
	// end+1 is a multiple of 2^level (end+1 wraps to 0 at end = 2^64−1,
	// which every mask passes: the node ending at the last position).
	if level > 0 && (end+1)&(1<<level-1) != 0 {
		return compact.NodeID{}, false
	}
	return compact.NewNodeID(level, (end >> level)), true
}

// rekeyTree rewrites a layoutLevelMajor tree bucket under the keys of
// layoutCompletion, values unchanged, and records layoutCompletion, all in
// tx: bbolt commits the whole of it or nothing, so a crash leaves the old
// layout or the new one. A key that names no node is refused and tx must
// be rolled back; a value that is no hash (damage) is carried over as it
// is, for Verify to report under its new key, as it did under the old.
// Every node is held in memory while the bucket is rewritten, as 72 bytes
// of its own (key, hash and an empty slice, padded) and bbolt's inode.
func rekeyTree(tx *bbolt.Tx, meta *bbolt.Bucket) error {
	type kv struct {
		k   [treeKeyLen]byte
		v   [32]byte
		odd []byte // a value that is not 32 bytes long, copied
	}
	old := tx.Bucket(bucketTree)
	if err := checkOtherLayout(old, meta, true); err != nil {
		return err
	}
	nodes := make([]kv, 0, old.Stats().KeyN) // Stats reads page and element headers only
	c := old.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		id, ok := levelMajorID(k)
		if !ok {
			return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: key %x names no tree node (the database is unchanged; verify it)", layoutCompletion, k)
		}
		if v == nil {
			return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: key %x holds a bucket, not a hash (the database is unchanged; verify it)", layoutCompletion, k)
		}
		var n kv
		setTreeKey(n.k[:], id)
		if len(v) == len(n.v) {
			n.v = [32]byte(v)
		} else {
			n.odd = append([]byte{}, v...) // the old pages are freed below
		}
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
		v := nodes[i].v[:]
		if nodes[i].odd != nil {
			v = nodes[i].odd
		}
		// bbolt keeps both slices until tx ends: nodes is not written again.
		if err := tree.Put(nodes[i].k[:], v); err != nil {
			return fmt.Errorf("ledger: rekey the Merkle tree: %w", err)
		}
	}
	return putLayout(meta, layoutCompletion)
}

// checkOtherLayout refuses a tree bucket whose head leaf is missing under
// the layout meta records (levelMajor says which) but present under the
// other: the records and the keys disagree, which happens when a build
// that keys the tree level-major (before layouts were recorded) wrote to
// a file of layoutCompletion, or when the layout's meta key was removed.
// Rekeying or appending then would only scramble the tree further.
func checkOtherLayout(b, meta *bbolt.Bucket, levelMajor bool) error {
	n, head, err := readHead(meta)
	if err != nil || n == 0 {
		return nil // readHead's callers report its errors
	}
	leaf := compact.NewNodeID(0, n-1)
	recordedKey, otherKey := setTreeKey, setLevelMajorKey
	if levelMajor {
		recordedKey, otherKey = setLevelMajorKey, setTreeKey
	}
	var k [treeKeyLen]byte
	recordedKey(k[:], leaf)
	if b.Get(k[:]) != nil {
		return nil
	}
	// The other layout's key of the leaf may name another node in this
	// one (a lost leaf is not a mix of layouts): only the head's own hash
	// there tells of the other layout.
	otherKey(k[:], leaf)
	if !bytes.Equal(b.Get(k[:]), head[:]) {
		return nil
	}
	recorded, found := "layout 2 (recorded as 02)", "layout 1 (level-major)"
	if levelMajor {
		recorded, found = "layout 1 (no layout recorded)", "layout 2 (completion order)"
	}
	return fmt.Errorf("ledger: %w: the layout is %s in ledger_meta, but the leaf of the head (entry %d) is stored under %s; a build from before layouts were recorded wrote to this file, or the meta key %q was changed (the database is unchanged; restore it from a backup)", ErrLayoutMismatch, recorded, n-1, found, keyTreeLayout)
}

// putLayout records layout in meta.
func putLayout(meta *bbolt.Bucket, layout byte) error {
	if err := meta.Put(keyTreeLayout, []byte{layout}); err != nil {
		return fmt.Errorf("ledger: record the key layout: %w", err)
	}
	return nil
}
