package ledger

import (
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// Inclusion is the wire form of an inclusion proof (HTTP API, kernelctl,
// receipt bundles): entry LeafIndex, whose entry hash is LeafHash, is in the
// tree of the first TreeSize entries. Hashes are "blake3:<hex>". It proves
// nothing without a root of TreeSize that the verifier trusts, such as a
// signed checkpoint's.
type Inclusion struct {
	LeafIndex uint64   `json:"leaf_index"`
	TreeSize  uint64   `json:"tree_size"`
	LeafHash  string   `json:"leaf_hash"`
	Proof     []string `json:"proof"`
}

// Consistency is the wire form of a consistency proof: the tree of the
// first Size1 entries is a prefix of the tree of the first Size2 entries.
type Consistency struct {
	Size1 uint64   `json:"size1"`
	Size2 uint64   `json:"size2"`
	Proof []string `json:"proof"`
}

// ProveInclusion returns the inclusion proof of entry index in the tree of
// the first size entries, in wire form.
func ProveInclusion(tx *bbolt.Tx, index, size uint64) (Inclusion, error) {
	p, err := InclusionProof(tx, index, size)
	if err != nil {
		return Inclusion{}, err
	}
	tree, _, err := treeAt(tx)
	if err != nil {
		return Inclusion{}, err
	}
	leaf, err := getNode(tree, compact.NewNodeID(0, index))
	if err != nil {
		return Inclusion{}, fmt.Errorf("ledger: inclusion proof of entry %d: %w", index, err)
	}
	return Inclusion{LeafIndex: index, TreeSize: size, LeafHash: digest.Format(leaf), Proof: formatHashes(p)}, nil
}

// ProveConsistency returns the consistency proof from the tree of the first
// size1 entries to that of the first size2, in wire form.
func ProveConsistency(tx *bbolt.Tx, size1, size2 uint64) (Consistency, error) {
	p, err := ConsistencyProof(tx, size1, size2)
	if err != nil {
		return Consistency{}, err
	}
	return Consistency{Size1: size1, Size2: size2, Proof: formatHashes(p)}, nil
}

// Verify checks the proof against root, the trusted root of the tree of
// TreeSize entries. It trusts the proof's own LeafIndex and TreeSize: a
// caller that asked for a given entry or tree size uses VerifyAt, or a
// proof of another entry, under another root, passes.
func (in Inclusion) Verify(root [32]byte) error {
	leaf, err := digest.Parse(in.LeafHash)
	if err != nil {
		return fmt.Errorf("ledger: inclusion proof: leaf_hash: %w", err)
	}
	p, err := parseHashes(in.Proof)
	if err != nil {
		return fmt.Errorf("ledger: inclusion proof of entry %d: %w", in.LeafIndex, err)
	}
	return VerifyInclusion(in.LeafIndex, in.TreeSize, leaf, p, root)
}

// VerifyAt checks that the proof is of entry index in the tree of size
// entries, the ones the caller asked for, and verifies it against root,
// the trusted root of that tree. A proof of another entry or tree size is
// refused, whatever its hashes.
func (in Inclusion) VerifyAt(index, size uint64, root [32]byte) error {
	if in.LeafIndex != index || in.TreeSize != size {
		return fmt.Errorf("ledger: inclusion proof of entry %d in the tree of %d entries asked for, the proof is of entry %d in the tree of %d", index, size, in.LeafIndex, in.TreeSize)
	}
	return in.Verify(root)
}

// Verify checks the proof against root1 and root2, the trusted roots of the
// trees of Size1 and Size2 entries. It trusts the proof's own sizes: a
// caller that holds roots of given sizes uses VerifySizes, or a proof
// between other sizes (read with root1 as an inner node) passes.
func (c Consistency) Verify(root1, root2 [32]byte) error {
	p, err := parseHashes(c.Proof)
	if err != nil {
		return fmt.Errorf("ledger: consistency proof from tree size %d to %d: %w", c.Size1, c.Size2, err)
	}
	return VerifyConsistency(c.Size1, c.Size2, p, root1, root2)
}

// VerifySizes checks that the proof is from the tree of size1 entries to
// that of size2, the sizes whose roots the caller trusts, and verifies it
// against root1 and root2, those roots. A proof between other sizes is
// refused, whatever its hashes: it would prove that root1 is some inner
// node of the tree of root2, not that the tree of size1 entries is a
// prefix of it.
func (c Consistency) VerifySizes(size1, size2 uint64, root1, root2 [32]byte) error {
	if c.Size1 != size1 || c.Size2 != size2 {
		return fmt.Errorf("ledger: consistency proof from tree size %d to %d asked for, the proof is from %d to %d", size1, size2, c.Size1, c.Size2)
	}
	return c.Verify(root1, root2)
}

// maxProofHashes bounds a proof in wire form: no tree below 2^64 entries
// needs more.
const maxProofHashes = 65

func parseHashes(in []string) ([][32]byte, error) {
	if len(in) > maxProofHashes {
		return nil, fmt.Errorf("%d hashes, more than any proof holds", len(in))
	}
	out := make([][32]byte, len(in))
	for i, s := range in {
		h, err := digest.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("proof hash %d: %w", i, err)
		}
		out[i] = h
	}
	return out, nil
}

func formatHashes(p [][32]byte) []string {
	out := make([]string, len(p))
	for i := range p {
		out[i] = digest.Format(p[i])
	}
	return out
}
