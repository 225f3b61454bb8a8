package ledger

import (
	"fmt"

	"github.com/transparency-dev/merkle"
	"github.com/transparency-dev/merkle/proof"
	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
)

// Hasher is the ledger's Merkle tree hasher for
// github.com/transparency-dev/merkle (its proof and compact packages). The
// tree has the shape of RFC 9162 §2.1; only the hash functions differ:
//
//   - HashLeaf(preimage) = keyed BLAKE3 (leaf key) over the preimage, which
//     for an entry is its entry_hash (the preimage is what EntryHash
//     covers);
//   - HashChildren(l, r) = keyed BLAKE3 (node key) over l || r, which for
//     32-byte children is NodeHash;
//   - EmptyRoot() = keyed BLAKE3 (node key) over no bytes, the root of the
//     tree of size 0. RFC 9162 uses the hash of the empty string; the node
//     key keeps this value apart from every leaf hash (other key) and every
//     node hash (which always covers exactly 64 bytes).
//
// The zero value is ready to use.
type Hasher struct{}

var _ merkle.LogHasher = Hasher{}

// emptyRoot is Hasher.EmptyRoot, set by the package's init with the keys.
var emptyRoot [32]byte

// EmptyRoot returns the root of the empty tree (a new slice each time).
func (Hasher) EmptyRoot() []byte {
	r := emptyRoot
	return r[:]
}

// HashLeaf returns keyed BLAKE3 (leaf key) over leaf, the entry hash of the
// entry whose preimage leaf is.
func (Hasher) HashLeaf(leaf []byte) []byte {
	h := leafHashers.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(leaf)
	sum := h.Sum(make([]byte, 0, 32))
	leafHashers.Put(h)
	return sum
}

// HashChildren returns keyed BLAKE3 (node key) over exactly l || r; for the
// 32-byte hashes of a tree that is NodeHash(l, r). Children of other
// lengths (a malformed proof) are hashed as given, so they cannot match.
func (Hasher) HashChildren(l, r []byte) []byte {
	h := nodeHashers.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(l)
	h.Write(r)
	sum := h.Sum(make([]byte, 0, 32))
	nodeHashers.Put(h)
	return sum
}

// Size returns 32, the length of every hash of the tree.
func (Hasher) Size() int { return 32 }

// VerifyInclusion checks that leaf, the entry hash of entry index, is in
// the tree of size entries whose root is root, given the inclusion proof
// made by InclusionProof (RFC 9162 §2.1.3.2).
func VerifyInclusion(index, size uint64, leaf [32]byte, p [][32]byte, root [32]byte) error {
	if err := proof.VerifyInclusion(Hasher{}, index, size, leaf[:], slices32(p), root[:]); err != nil {
		return fmt.Errorf("ledger: inclusion proof of entry %d in tree size %d: %w", index, size, err)
	}
	return nil
}

// VerifyConsistency checks that the tree of size1 entries with root root1
// is a prefix of the tree of size2 entries with root root2, given the
// consistency proof made by ConsistencyProof (RFC 9162 §2.1.4.2). From size
// 0 the proof is empty and root1 must be the empty tree's root
// (transparency-dev/merkle alone accepts any root1 there).
func VerifyConsistency(size1, size2 uint64, p [][32]byte, root1, root2 [32]byte) error {
	err := proof.VerifyConsistency(Hasher{}, size1, size2, slices32(p), root1[:], root2[:])
	if err == nil && size1 == 0 && root1 != emptyRoot {
		err = fmt.Errorf("root %s of tree size 0 is not the empty root %s", digest.Format(root1), digest.Format(emptyRoot))
	}
	if err != nil {
		return fmt.Errorf("ledger: consistency proof from tree size %d to %d: %w", size1, size2, err)
	}
	return nil
}

func slices32(p [][32]byte) [][]byte {
	out := make([][]byte, len(p))
	for i := range p {
		out[i] = p[i][:]
	}
	return out
}
