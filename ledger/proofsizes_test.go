package ledger

import (
	"strings"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// TestProofsVerifiedAtTrustedSizes: a proof in wire form verified with the
// sizes the caller trusts passes when it is the proof asked for and is
// refused when its own sizes (or entry) differ, even where its hashes
// verify under its own sizes: the consistency proof of sizes 1 → 2, [X],
// "proves" R1 a prefix of NodeHash(R1, X) for any R1, which no tree of 3
// entries under a tree of 10 is (review rev-verify F1).
func TestProofsVerifiedAtTrustedSizes(t *testing.T) {
	db := newDB(t)
	appendBatch(t, db, 10)
	var root3, root10 [32]byte
	var cons struct {
		c  Consistency
		in Inclusion
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		var err error
		if root3, err = Root(tx, 3); err != nil {
			return err
		}
		if root10, err = Root(tx, 10); err != nil {
			return err
		}
		if cons.c, err = ProveConsistency(tx, 3, 10); err != nil {
			return err
		}
		cons.in, err = ProveInclusion(tx, 2, 10)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	x := root10 // any hash will do as the forged sibling
	forged := NodeHash(root3, x)
	other := Consistency{Size1: 1, Size2: 2, Proof: []string{digest.Format(x)}}
	if err := other.Verify(root3, forged); err != nil {
		t.Fatalf("the proof of sizes 1 → 2 does not verify under its own sizes (the test's premise): %v", err)
	}
	leaf, _ := digest.Parse(cons.in.LeafHash)
	for _, tc := range []struct {
		name string
		f    func() error
		want string // "" for ok
	}{
		{"consistency asked for", func() error { return cons.c.VerifySizes(3, 10, root3, root10) }, ""},
		{"consistency of sizes 1 → 2 for 3 → 10", func() error { return other.VerifySizes(3, 10, root3, forged) }, "from tree size 3 to 10 asked for, the proof is from 1 to 2"},
		{"consistency of sizes 10 → 10 for 2 → 10", func() error {
			return Consistency{Size1: 10, Size2: 10, Proof: []string{}}.VerifySizes(2, 10, root10, root10)
		}, "from tree size 2 to 10 asked for, the proof is from 10 to 10"},
		{"consistency asked for, another root", func() error { return cons.c.VerifySizes(3, 10, leaf, root10) }, "consistency"},
		{"inclusion asked for", func() error { return cons.in.VerifyAt(2, 10, root10) }, ""},
		{"inclusion of another entry", func() error { return cons.in.VerifyAt(3, 10, root10) }, "entry 3 in the tree of 10 entries asked for, the proof is of entry 2 in the tree of 10"},
		{"inclusion in another tree size", func() error { return cons.in.VerifyAt(2, 9, root10) }, "entry 2 in the tree of 9 entries asked for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
