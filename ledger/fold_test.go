package ledger

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/transparency-dev/merkle/compact"
)

// TestFoldMatchesCompactRange checks fold against compact.Range with the
// same hasher: the same root at every size and the same nodes visited, in
// the same order.
func TestFoldMatchesCompactRange(t *testing.T) {
	ref := rangeFactory.NewEmptyRange(0)
	f := fold{}
	for n := range uint64(300) {
		var want, got []string
		refRoot := emptyRoot
		if n > 0 {
			r, err := ref.GetRootHash(nil)
			if err != nil {
				t.Fatal(err)
			}
			refRoot = [32]byte(r)
		}
		if root := f.root(); root != refRoot {
			t.Fatalf("size %d: fold root %x, compact.Range root %x", n, root, refRoot)
		}
		var leaf [32]byte
		binary.BigEndian.PutUint64(leaf[:], n)
		if err := ref.Append(leaf[:], func(id compact.NodeID, h []byte) {
			want = append(want, fmt.Sprintf("%d/%d %x", id.Level, id.Index, h))
		}); err != nil {
			t.Fatal(err)
		}
		f.append(&leaf, func(id compact.NodeID, h *[32]byte) {
			got = append(got, fmt.Sprintf("%d/%d %x", id.Level, id.Index, *h))
		})
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("appending leaf %d: fold visits %v, compact.Range %v", n, got, want)
		}
	}
}
