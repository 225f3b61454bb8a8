package ledger

import (
	"github.com/transparency-dev/merkle/compact"
	"github.com/zeebo/blake3"
)

// fold is the compact range [0, n) of the Merkle tree of entry hashes, as
// compact.Range computes it with Hasher, without allocating per leaf: the
// roots of the perfect subtrees that cover the leaves so far, largest
// first.
type fold struct {
	n      uint64
	hashes [][32]byte
	node   [32]byte // the node being visited, shared with visit
	// h, if set, is a node hasher of f's own, for a fold that hashes
	// many nodes in a row (the verifier's, about one per leaf); without
	// it, parent takes one from the pool.
	h *blake3.Hasher
}

// parent sets f.node to the hash of the node whose children are left and
// f.node (NodeHash).
func (f *fold) parent(left *[32]byte) {
	if f.h == nil {
		f.node = NodeHash(*left, f.node)
		return
	}
	f.h.Reset()
	f.h.Write(left[:])
	f.h.Write(f.node[:])
	f.h.Sum(f.node[:0])
}

// append adds leaf n and calls visit, if set, with every node that
// completes (the leaf, then the parents it completes, bottom up). The hash
// passed to visit is valid only during the call.
func (f *fold) append(leaf *[32]byte, visit func(id compact.NodeID, hash *[32]byte)) {
	f.node = *leaf
	if visit != nil {
		visit(compact.NewNodeID(0, f.n), &f.node)
	}
	level := uint(0)
	for i := f.n; i&1 == 1; i >>= 1 {
		top := len(f.hashes) - 1
		f.parent(&f.hashes[top])
		f.hashes = f.hashes[:top]
		level++
		if visit != nil {
			visit(compact.NewNodeID(level, i>>1), &f.node)
		}
	}
	f.hashes = append(f.hashes, f.node)
	f.n++
}

// root returns the Merkle tree root of the n leaves so far (emptyRoot for
// none): the subtree roots hashed together from the right.
func (f *fold) root() [32]byte {
	if f.n == 0 {
		return emptyRoot
	}
	h := f.hashes[len(f.hashes)-1]
	for i := len(f.hashes) - 2; i >= 0; i-- {
		h = NodeHash(f.hashes[i], h)
	}
	return h
}
