package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// bucketTree held the hash of every perfect subtree of the Merkle tree in
// files of layouts 1 and 2, which Init moves into bucketEntries
// (layoutOneBucket) under the keys of layoutCompletion: completion
// position (8 bytes big-endian) || level (1 byte), value = 32 raw bytes.
// Level 0 holds the leaves (entry hashes); node (l, i) covers entries
// [i·2^l, (i+1)·2^l), and its completion position is the last of them,
// (i+1)·2^l − 1: the entry whose append completes it.
var bucketTree = []byte("ledger_tree")

const treeKeyLen = 9

// rangeFactory builds compact ranges with the ledger's node hash.
var rangeFactory = &compact.RangeFactory{Hash: Hasher{}.HashChildren}

// treeKey returns the layoutCompletion key of node id.
func treeKey(id compact.NodeID) []byte {
	k := make([]byte, treeKeyLen)
	setTreeKey(k, id)
	return k
}

// setTreeKey writes the layoutCompletion key of node id into k
// (treeKeyLen bytes).
func setTreeKey(k []byte, id compact.NodeID) {
	binary.BigEndian.PutUint64(k, (id.Index+1)<<id.Level-1)
	k[8] = byte(id.Level)
}

func nodeName(id compact.NodeID) string {
	return fmt.Sprintf("tree node (level %d, index %d)", id.Level, id.Index)
}

type node struct {
	id   compact.NodeID
	hash [32]byte
}

// completedNodes returns the nodes that the leaf with the given index and
// hash completes: the leaf itself and, while the node is a right child, its
// parent (hashed with its left sibling: prev, the leaf before, on level 0;
// a stored node above). Over n appends this reads fewer than n/2 and
// returns fewer than 2n nodes: O(1) amortized.
func completedNodes(tree storedTree, index uint64, leaf, prev [32]byte) ([]node, error) {
	out := append(make([]node, 0, 4), node{compact.NewNodeID(0, index), leaf})
	for n := out[0]; n.id.Index&1 == 1; {
		left := prev
		if n.id.Level > 0 {
			var err error
			if left, err = getNode(tree, n.id.Sibling()); err != nil {
				return nil, err
			}
		}
		n = node{n.id.Parent(), NodeHash(left, n.hash)}
		out = append(out, n)
	}
	return out, nil
}

// putNodes stores nodes, their keys and values written into buf (of
// len(nodes)*(treeKeyLen+32) bytes, which bbolt keeps until the
// transaction ends: it must not be reused).
func putNodes(tree *bbolt.Bucket, buf []byte, nodes []node) error {
	for _, n := range nodes {
		k := buf[:treeKeyLen:treeKeyLen]
		setTreeKey(k, n.id)
		v := buf[treeKeyLen : treeKeyLen+len(n.hash) : treeKeyLen+len(n.hash)]
		copy(v, n.hash[:])
		buf = buf[treeKeyLen+len(n.hash):]
		if err := tree.Put(k, v); err != nil {
			return fmt.Errorf("store %s: %w", nodeName(n.id), err)
		}
	}
	return nil
}

func getNode(tree storedTree, id compact.NodeID) (h [32]byte, err error) {
	var k [treeKeyLen]byte
	setTreeKey(k[:], id)
	v := tree.b.Get(k[:])
	if v == nil && tree.moved != nil {
		v = tree.moved.Get(k[:])
	}
	if v == nil {
		return h, fmt.Errorf("%s missing", nodeName(id))
	}
	if len(v) != len(h) {
		return h, fmt.Errorf("%s is %d bytes, want %d", nodeName(id), len(v), len(h))
	}
	copy(h[:], v)
	return h, nil
}

// getNodes reads the stored hashes of ids, in order.
func getNodes(tree storedTree, ids []compact.NodeID) ([][]byte, error) {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		h, err := getNode(tree, id)
		if err != nil {
			return nil, err
		}
		out[i] = h[:]
	}
	return out, nil
}

// treeAt returns the stored tree and the number of entries in the ledger.
func treeAt(tx *bbolt.Tx) (storedTree, uint64, error) {
	entries, meta, err := oneBucket(tx)
	if err != nil {
		return storedTree{}, 0, err
	}
	size, _, err := readHead(meta)
	if err != nil {
		return storedTree{}, 0, fmt.Errorf("ledger: %w", err)
	}
	return storedTree{b: entries}, size, nil
}

// rootOf computes the root of the tree of the first size leaves from the
// stored roots of its compact range (at most log2(size)+1 nodes).
func rootOf(tree storedTree, size uint64) ([32]byte, error) {
	if size == 0 {
		return emptyRoot, nil
	}
	hashes, err := getNodes(tree, compact.RangeNodes(0, size, nil))
	if err != nil {
		return [32]byte{}, err
	}
	r, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return [32]byte{}, err
	}
	root, err := r.GetRootHash(nil)
	if err != nil {
		return [32]byte{}, err
	}
	return [32]byte(root), nil
}

// Root returns the Merkle root of the tree of the first size entries
// (Hasher.EmptyRoot for size 0). size must not exceed the number of entries. It
// reads at most log2(size)+1 stored nodes.
func Root(tx *bbolt.Tx, size uint64) ([32]byte, error) {
	tree, n, err := treeAt(tx)
	if err != nil {
		return [32]byte{}, err
	}
	if size > n {
		return [32]byte{}, fmt.Errorf("ledger: root of tree size %d: the ledger has %d entries", size, n)
	}
	root, err := rootOf(tree, size)
	if err != nil {
		return root, fmt.Errorf("ledger: root of tree size %d: %w", size, err)
	}
	return root, nil
}

// InclusionProof returns the RFC 9162 inclusion proof (audit path) of entry
// index in the tree of the first size entries: the sibling hashes from the
// leaf up to the root, as VerifyInclusion expects them. index must be below
// size and size must not exceed the number of entries. It reads at most
// 2·log2(size) stored nodes and never scans.
func InclusionProof(tx *bbolt.Tx, index, size uint64) ([][32]byte, error) {
	nodes, err := proof.Inclusion(index, size)
	if err != nil {
		return nil, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %w", index, size, err)
	}
	p, err := readProof(tx, nodes, size)
	if err != nil {
		return nil, fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %w", index, size, err)
	}
	return p, nil
}

// ConsistencyProof returns the RFC 9162 consistency proof between the trees
// of the first size1 and the first size2 entries, as VerifyConsistency
// expects it (empty when size1 is 0 or equals size2). size1 must not
// exceed size2, nor size2 the number of entries. It reads at most
// 2·log2(size2)+1 stored nodes and never scans.
func ConsistencyProof(tx *bbolt.Tx, size1, size2 uint64) ([][32]byte, error) {
	nodes, err := proof.Consistency(size1, size2)
	if err != nil {
		return nil, fmt.Errorf("ledger: consistency proof from tree size %d to %d: %w", size1, size2, err)
	}
	p, err := readProof(tx, nodes, size2)
	if err != nil {
		return nil, fmt.Errorf("ledger: consistency proof from tree size %d to %d: %w", size1, size2, err)
	}
	return p, nil
}

// readProof reads the stored nodes of a proof in a tree of size entries and
// folds the nodes that make up its ephemeral node, if any.
func readProof(tx *bbolt.Tx, nodes proof.Nodes, size uint64) ([][32]byte, error) {
	tree, n, err := treeAt(tx)
	if err != nil {
		return nil, err
	}
	if size > n {
		return nil, fmt.Errorf("the ledger has %d entries", n)
	}
	hashes, err := getNodes(tree, nodes.IDs)
	if err != nil {
		return nil, err
	}
	hashes, err = nodes.Rehash(hashes, Hasher{}.HashChildren)
	if err != nil {
		return nil, err
	}
	out := make([][32]byte, len(hashes))
	for i, h := range hashes {
		out[i] = [32]byte(h)
	}
	return out, nil
}

// CheckTree is the check to run when the database is opened. It rebuilds
// the right edge of the Merkle tree (the compact range of all entries, from
// the stored perfect subtrees), checks that the tree's last leaf is the
// head's entry hash and that no leaf lies beyond it, and compares the root
// at the size of the latest stored checkpoint with that checkpoint's root.
// It reads O(log n) nodes. It does not check the checkpoint's signature
// (Verify does, given a verifier) and it does not recompute entry hashes.
func CheckTree(tx *bbolt.Tx) error {
	tree, n, err := treeAt(tx)
	if err != nil {
		return err
	}
	_, head, _ := readHead(tx.Bucket(bucketMeta)) // treeAt read it
	if what := beyondHead(tree.b, n); what != "" {
		return fmt.Errorf("ledger: tree check: %s is stored beyond the head's %d entries", what, n)
	}
	if what := attachedBeyond(tx, n); what != "" {
		return fmt.Errorf("ledger: tree check: %s is stored beyond the head's %d entries", what, n)
	}
	if err := checkLatestRecord(tree.b, tx.Bucket(bucketMeta)); err != nil {
		return fmt.Errorf("ledger: tree check: %w", err)
	}
	cp, err := LatestCheckpoint(tx)
	switch {
	case errors.Is(err, ErrNoCheckpoint):
		err = checkEdge(tree, n, head, nil)
	case err == nil:
		err = checkEdge(tree, n, head, &cp)
	}
	if err != nil {
		return fmt.Errorf("ledger: tree check: %w", err)
	}
	return nil
}

// checkEdge checks a tree of n entries against its head and its latest
// checkpoint (nil when none is stored): the head's leaf is the head's
// entry hash, the right edge rebuilds from the stored nodes, and the root
// at the checkpoint's size, which the tree must reach, is the
// checkpoint's. CheckTree makes it at every open, CheckMove before a move.
func checkEdge(tree storedTree, n uint64, head [32]byte, cp *StoredCheckpoint) error {
	if n > 0 {
		leaf, err := getNode(tree, compact.NewNodeID(0, n-1))
		if err != nil {
			return err
		}
		if leaf != head {
			return fmt.Errorf("leaf %d is %s but the head's entry hash is %s", n-1, digest.Format(leaf), digest.Format(head))
		}
	}
	root, err := rootOf(tree, n)
	if err != nil {
		return fmt.Errorf("right edge at size %d: %w", n, err)
	}
	if cp == nil {
		return nil
	}
	if cp.Size > n {
		return fmt.Errorf("latest checkpoint #%d is for %d entries but the ledger has %d", cp.Num, cp.Size, n)
	}
	if cp.Size < n {
		if root, err = rootOf(tree, cp.Size); err != nil {
			return fmt.Errorf("root at size %d: %w", cp.Size, err)
		}
	}
	if root != cp.Root {
		return fmt.Errorf("latest checkpoint #%d has root %s for size %d, the tree's root is %s", cp.Num, digest.Format(cp.Root), cp.Size, digest.Format(root))
	}
	return nil
}

// migrateTree builds the tree bucket of a ledger made before the tree
// existed, from the entry_hash stored in each record (Verify later checks
// them against the recomputed hashes).
func migrateTree(tx *bbolt.Tx) error {
	entries, meta, err := buckets(tx)
	if err != nil {
		return err
	}
	tree := storedTree{b: tx.Bucket(bucketTree)}
	tree.b.FillPercent = 1 // see Writer.AppendCanonical
	size, _, err := readHead(meta)
	if err != nil {
		return fmt.Errorf("ledger: build Merkle tree: %w", err)
	}
	var (
		n    uint64
		e    Entry
		prev [32]byte // the leaf before
	)
	c := entries.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 || binary.BigEndian.Uint64(k) != n {
			return fmt.Errorf("ledger: build Merkle tree: entry %d missing (found key %x; run Verify)", n, k)
		}
		if err := decodeStoredRecord(&e, v); err != nil {
			return fmt.Errorf("ledger: build Merkle tree: entry %d: %w", n, err)
		}
		leaf, _ := digest.Parse(e.Hash)
		nodes, err := completedNodes(tree, n, leaf, prev)
		if err == nil {
			err = putNodes(tree.b, make([]byte, len(nodes)*(treeKeyLen+len(node{}.hash))), nodes)
		}
		if err != nil {
			return fmt.Errorf("ledger: build Merkle tree: entry %d: %w", n, err)
		}
		prev = leaf
		n++
	}
	if n != size {
		return fmt.Errorf("ledger: build Merkle tree: %d entries stored, the head counts %d (run Verify)", n, size)
	}
	return putLayout(meta, layoutCompletion)
}
