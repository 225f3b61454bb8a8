package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// The reference below follows RFC 9162 §2.1 literally (recursive MTH, PATH
// and SUBPROOF), with plain zeebo/blake3 calls for the node hash, so that it
// shares no code with the package or with transparency-dev/merkle.

func refNode(l, r [32]byte) [32]byte {
	var nk [32]byte
	blake3.DeriveKey("capkernel ledger v1 node", nil, nk[:])
	h, _ := blake3.NewKeyed(nk[:])
	h.Write(l[:])
	h.Write(r[:])
	return [32]byte(h.Sum(nil))
}

// refSplit returns the largest power of two smaller than n (n > 1).
func refSplit(n int) int { return 1 << (bits.Len(uint(n-1)) - 1) }

func refRoot(leaves [][32]byte) [32]byte {
	switch n := len(leaves); n {
	case 0:
		var nk [32]byte
		blake3.DeriveKey("capkernel ledger v1 node", nil, nk[:])
		h, _ := blake3.NewKeyed(nk[:])
		return [32]byte(h.Sum(nil))
	case 1:
		return leaves[0]
	default:
		k := refSplit(n)
		return refNode(refRoot(leaves[:k]), refRoot(leaves[k:]))
	}
}

func refPath(m int, leaves [][32]byte) [][32]byte {
	n := len(leaves)
	if n <= 1 {
		return nil
	}
	k := refSplit(n)
	if m < k {
		return append(refPath(m, leaves[:k]), refRoot(leaves[k:]))
	}
	return append(refPath(m-k, leaves[k:]), refRoot(leaves[:k]))
}

func refProof(m int, leaves [][32]byte) [][32]byte {
	if m == 0 || m == len(leaves) {
		return nil
	}
	return refSubproof(m, leaves, true)
}

func refSubproof(m int, leaves [][32]byte, complete bool) [][32]byte {
	n := len(leaves)
	if m == n {
		if complete {
			return nil
		}
		return [][32]byte{refRoot(leaves)}
	}
	k := refSplit(n)
	if m <= k {
		return append(refSubproof(m, leaves[:k], complete), refRoot(leaves[k:]))
	}
	return append(refSubproof(m-k, leaves[k:], false), refRoot(leaves[:k]))
}

// appendBatch appends n entries in one transaction and returns their
// hashes.
func appendBatch(tb testing.TB, db *bbolt.DB, n int) [][32]byte {
	tb.Helper()
	var out [][32]byte
	if err := db.Update(func(tx *bbolt.Tx) error {
		for range n {
			h, err := HeadOf(tx)
			if err != nil {
				return err
			}
			e, err := Append(tx, KindAudit, t0, json.RawMessage(`{"i":`+strconv.FormatUint(h.Size, 10)+`}`))
			if err != nil {
				return err
			}
			sum, _ := digest.Parse(e.Hash)
			out = append(out, sum)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func leavesOf(es []Entry) [][32]byte {
	out := make([][32]byte, len(es))
	for i, e := range es {
		out[i], _ = digest.Parse(e.Hash)
	}
	return out
}

// TestProofsMatchRFC9162 builds a 64-entry tree one entry per transaction
// and checks every root, every inclusion proof (every size ≤ 64 and index)
// and every consistency proof (every size1 ≤ size2 ≤ 64) against the
// reference and the verifiers of transparency-dev/merkle.
func TestProofsMatchRFC9162(t *testing.T) {
	const n = 64
	db := newDB(t)
	leaves := leavesOf(appendN(t, db, n))
	if err := db.View(func(tx *bbolt.Tx) error {
		for size := uint64(0); size <= n; size++ {
			root, err := Root(tx, size)
			if err != nil {
				t.Fatal(err)
			}
			if want := refRoot(leaves[:size]); root != want {
				t.Fatalf("Root(%d) = %x, want %x", size, root, want)
			}
			for index := range size {
				p, err := InclusionProof(tx, index, size)
				if err != nil {
					t.Fatal(err)
				}
				if want := refPath(int(index), leaves[:size]); !slices.Equal(p, want) {
					t.Fatalf("InclusionProof(%d, %d) = %x, want %x", index, size, p, want)
				}
				if len(p) > bits.Len64(size-1) {
					t.Errorf("InclusionProof(%d, %d) has %d hashes, more than ceil(log2(size))", index, size, len(p))
				}
				if err := proof.VerifyInclusion(Hasher{}, index, size, leaves[index][:], slices32(p), root[:]); err != nil {
					t.Errorf("proof.VerifyInclusion(%d, %d): %v", index, size, err)
				}
				if err := VerifyInclusion(index, size, leaves[index], p, root); err != nil {
					t.Errorf("VerifyInclusion(%d, %d): %v", index, size, err)
				}
				other := leaves[(index+1)%n]
				if err := VerifyInclusion(index, size, other, p, root); err == nil {
					t.Errorf("VerifyInclusion(%d, %d) accepts the leaf of entry %d", index, size, (index+1)%n)
				}
				if len(p) > 0 {
					bad := slices.Clone(p)
					bad[len(bad)-1][0] ^= 1
					if err := VerifyInclusion(index, size, leaves[index], bad, root); err == nil {
						t.Errorf("VerifyInclusion(%d, %d) accepts a flipped proof", index, size)
					}
				}
			}
			for size1 := range size + 1 {
				p, err := ConsistencyProof(tx, size1, size)
				if err != nil {
					t.Fatal(err)
				}
				if want := refProof(int(size1), leaves[:size]); !slices.Equal(p, want) {
					t.Fatalf("ConsistencyProof(%d, %d) = %x, want %x", size1, size, p, want)
				}
				if len(p) > bits.Len64(size)+1 {
					t.Errorf("ConsistencyProof(%d, %d) has %d hashes", size1, size, len(p))
				}
				root1 := refRoot(leaves[:size1])
				if err := proof.VerifyConsistency(Hasher{}, size1, size, slices32(p), root1[:], root[:]); err != nil {
					t.Errorf("proof.VerifyConsistency(%d, %d): %v", size1, size, err)
				}
				if err := VerifyConsistency(size1, size, p, root1, root); err != nil {
					t.Errorf("VerifyConsistency(%d, %d): %v", size1, size, err)
				}
				if size1 < size {
					// Another old root: for size1 0 the root of one entry.
					wrong := refRoot(append(slices.Clone(leaves[:max(size1, 1)-1]), leaves[size1]))
					if err := VerifyConsistency(size1, size, p, wrong, root); err == nil {
						t.Errorf("VerifyConsistency(%d, %d) accepts another old root", size1, size)
					}
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestTreeIndependentOfBatching: one entry per transaction and all entries
// in one transaction store the same nodes.
func TestTreeIndependentOfBatching(t *testing.T) {
	one, many := newDB(t), newDB(t)
	es := appendN(t, one, 37)
	if err := many.Update(func(tx *bbolt.Tx) error {
		for _, e := range es {
			at, err := time.Parse(TimeLayout, e.Time)
			if err != nil {
				return err
			}
			if _, err := Append(tx, e.Kind, at, e.Body); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a, b := dumpKind(t, one, kindNode), dumpKind(t, many, kindNode)
	if len(a) != 2*37-bits.OnesCount(37) {
		t.Errorf("%d nodes stored for 37 entries, want %d", len(a), 2*37-bits.OnesCount(37))
	}
	if !equalDumps(a, b) {
		t.Error("trees differ")
	}
}

// dumpBucket returns a copy of every key and value of a bucket.
func dumpBucket(tb testing.TB, db *bbolt.DB, name []byte) [][2][]byte {
	tb.Helper()
	var out [][2][]byte
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(name).ForEach(func(k, v []byte) error {
			out = append(out, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
			return nil
		})
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func equalDumps(a, b [][2][]byte) bool {
	return slices.EqualFunc(a, b, func(x, y [2][]byte) bool {
		return bytes.Equal(x[0], y[0]) && bytes.Equal(x[1], y[1])
	})
}

// TestProofsReadOnlyTheirNodes deletes every stored node a proof does not
// name, then asks for the proof: it must still come out right, so the
// proof reads nothing else (and at most 2·log2(n)+1 nodes).
func TestProofsReadOnlyTheirNodes(t *testing.T) {
	const n = 1000
	db := newDB(t)
	leaves := appendBatch(t, db, n)
	errRollback := errors.New("rollback")
	for _, tc := range []struct {
		kind string
		a, b uint64
	}{
		{kind: "inclusion", a: 0, b: n},
		{kind: "inclusion", a: 999, b: n},
		{kind: "inclusion", a: 517, b: 613},
		{kind: "inclusion", a: 511, b: 512},
		{kind: "consistency", a: 1, b: n},
		{kind: "consistency", a: 517, b: 999},
		{kind: "consistency", a: 512, b: 1000},
		{kind: "root", b: 999},
	} {
		var ids []compact.NodeID
		var get func(tx *bbolt.Tx) ([][32]byte, error)
		var want [][32]byte
		switch tc.kind {
		case "inclusion":
			nodes, _ := proof.Inclusion(tc.a, tc.b)
			ids = nodes.IDs
			get = func(tx *bbolt.Tx) ([][32]byte, error) { return InclusionProof(tx, tc.a, tc.b) }
			want = refPath(int(tc.a), leaves[:tc.b])
		case "consistency":
			nodes, _ := proof.Consistency(tc.a, tc.b)
			ids = nodes.IDs
			get = func(tx *bbolt.Tx) ([][32]byte, error) { return ConsistencyProof(tx, tc.a, tc.b) }
			want = refProof(int(tc.a), leaves[:tc.b])
		case "root":
			ids = compact.RangeNodes(0, tc.b, nil)
			get = func(tx *bbolt.Tx) ([][32]byte, error) {
				r, err := Root(tx, tc.b)
				return [][32]byte{r}, err
			}
			want = [][32]byte{refRoot(leaves[:tc.b])}
		}
		if max := 2*bits.Len64(tc.b) + 1; len(ids) > max {
			t.Errorf("%s %d %d: reads %d nodes, more than %d", tc.kind, tc.a, tc.b, len(ids), max)
		}
		keep := map[string]bool{}
		for _, id := range ids {
			keep[string(treeKey(id))] = true
		}
		err := db.Update(func(tx *bbolt.Tx) error {
			tree := tx.Bucket(bucketEntries)
			var drop [][]byte
			c := newKindCursor(tree, kindNode)
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if !keep[string(k)] {
					drop = append(drop, bytes.Clone(k))
				}
			}
			for _, k := range drop {
				if err := tree.Delete(k); err != nil {
					return err
				}
			}
			got, err := get(tx)
			if err != nil {
				t.Errorf("%s %d %d with only its %d nodes stored: %v", tc.kind, tc.a, tc.b, len(ids), err)
			} else if !slices.Equal(got, want) {
				t.Errorf("%s %d %d = %x, want %x", tc.kind, tc.a, tc.b, got, want)
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
	}
}

func TestProofErrors(t *testing.T) {
	db := newDB(t)
	appendBatch(t, db, 10)
	if err := db.Update(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketEntries).Delete(treeKey(compact.NewNodeID(1, 4))); err != nil {
			return err
		}
		return tx.Bucket(bucketEntries).Delete(treeKey(compact.NewNodeID(2, 1)))
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    func(tx *bbolt.Tx) error
		want string
	}{
		{"root beyond the entries", func(tx *bbolt.Tx) error { _, err := Root(tx, 11); return err }, "root of tree size 11: the ledger has 10 entries"},
		{"inclusion of a leaf outside the tree", func(tx *bbolt.Tx) error { _, err := InclusionProof(tx, 5, 5); return err }, "inclusion proof of entry 5 in tree size 5: index 5 out of bounds"},
		{"inclusion in a tree beyond the entries", func(tx *bbolt.Tx) error { _, err := InclusionProof(tx, 1, 11); return err }, "tree size 11: the ledger has 10 entries"},
		{"consistency backwards", func(tx *bbolt.Tx) error { _, err := ConsistencyProof(tx, 5, 4); return err }, "from tree size 5 to 4"},
		{"consistency beyond the entries", func(tx *bbolt.Tx) error { _, err := ConsistencyProof(tx, 5, 11); return err }, "the ledger has 10 entries"},
		{"root over a missing node", func(tx *bbolt.Tx) error { _, err := Root(tx, 10); return err }, "root of tree size 10: tree node (level 1, index 4) missing"},
		{"inclusion over a missing node", func(tx *bbolt.Tx) error { _, err := InclusionProof(tx, 0, 8); return err }, "tree node (level 2, index 1) missing"},
		{"consistency over a missing node", func(tx *bbolt.Tx) error { _, err := ConsistencyProof(tx, 4, 10); return err }, "tree node (level 2, index 1) missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db.View(func(tx *bbolt.Tx) error {
				if err := tc.f(tx); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want one containing %q", err, tc.want)
				}
				return nil
			})
		})
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		// Proofs that avoid the missing node still work.
		_, err := InclusionProof(tx, 9, 10)
		return err
	}); err != nil {
		t.Error(err)
	}
}

// TestVerifyChecksTree tampers with the stored tree of a 13-entry ledger,
// in both key layouts: the completion order Init writes, and the
// level-major one of files not yet rekeyed, which read-only opens verify.
func TestVerifyChecksTree(t *testing.T) {
	id := compact.NewNodeID
	type tamper func(t *testing.T, b *bbolt.Bucket, key func(compact.NodeID) []byte)
	put := func(id compact.NodeID, v []byte) tamper {
		return func(t *testing.T, b *bbolt.Bucket, key func(compact.NodeID) []byte) {
			if err := b.Put(key(id), v); err != nil {
				t.Fatal(err)
			}
		}
	}
	flip := func(id compact.NodeID) tamper {
		return func(t *testing.T, b *bbolt.Bucket, key func(compact.NodeID) []byte) {
			v := bytes.Clone(b.Get(key(id)))
			v[31] ^= 0x80
			put(id, v)(t, b, key)
		}
	}
	del := func(id compact.NodeID) tamper {
		return func(t *testing.T, b *bbolt.Bucket, key func(compact.NodeID) []byte) {
			if err := b.Delete(key(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	raw := func(k []byte) tamper {
		return func(t *testing.T, b *bbolt.Bucket, _ func(compact.NodeID) []byte) {
			if err := b.Put(k, make([]byte, 32)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		tamper tamper
		want   error
		reason string
		// levelMajor, if set, replaces want and reason in a file of
		// layout 1 tampered with, then moved by Init; levelMajorInit is
		// Init's refusal there instead.
		levelMajor       error
		levelMajorReason string
		levelMajorInit   string
	}{
		{name: "leaf flipped", tamper: flip(id(0, 6)), want: &VerifyError{Seq: 6}, reason: "Merkle tree leaf: stored hash"},
		{name: "last leaf flipped", tamper: flip(id(0, 12)), want: &VerifyError{Seq: 12}, reason: "Merkle tree leaf: stored hash"},
		{name: "leaf deleted", tamper: del(id(0, 3)), want: &VerifyError{Seq: 3}, reason: "Merkle tree leaf: missing"},
		{name: "node flipped", tamper: flip(id(2, 1)), want: &NodeError{Level: 2, Index: 1}, reason: "stored hash"},
		{name: "top node flipped", tamper: flip(id(3, 0)), want: &NodeError{Level: 3, Index: 0}, reason: "stored hash"},
		{name: "node deleted", tamper: del(id(1, 5)), want: &NodeError{Level: 1, Index: 5}, reason: "missing"},
		{name: "node truncated", tamper: put(id(1, 2), []byte{1, 2}), want: &NodeError{Level: 1, Index: 2}, reason: "a 2-byte value"},
		{name: "leaf beyond the entries", tamper: put(id(0, 13), make([]byte, 32)), want: &NodeError{Level: 0, Index: 13}, reason: "not part of the tree of 13 entries"},
		{name: "node beyond the entries", tamper: put(id(2, 3), make([]byte, 32)), want: &NodeError{Level: 2, Index: 3}, reason: "not part of the tree of 13 entries"},
		{name: "node of an absent level", tamper: put(id(9, 0), make([]byte, 32)), want: &NodeError{Level: 9, Index: 0}, reason: "not part of the tree"},
		{
			name: "malformed key among nodes", tamper: raw([]byte{0, 0, 0, 0}),
			want: &VerifyError{Seq: 0}, reason: "malformed key 00000000",
			levelMajorInit: "key 00000000 names no tree node",
		},
		{
			name: "malformed key past the nodes", tamper: raw([]byte{1, 0, 0, 0}),
			want: &VerifyError{Seq: 13}, reason: "malformed key 01000000",
			levelMajorInit: "key 01000000 names no tree node",
		},
		{
			name: "key of no node between nodes", tamper: raw([]byte{0, 0, 0, 0, 0, 0, 0, 4, 1}),
			want: &VerifyError{Seq: 5}, reason: "malformed key 000000000000000401",
			levelMajor: &NodeError{Level: 0, Index: 1025}, levelMajorReason: "not part of the tree of 13 entries",
		},
		{
			name: "malformed key after the levels", tamper: raw([]byte{200}),
			want: &VerifyError{Seq: 13}, reason: "malformed key c8",
			levelMajorInit: "key c8 names no tree node",
		},
	} {
		for _, levelMajor := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/levelMajor=%v", tc.name, levelMajor), func(t *testing.T) {
				db := newDB(t)
				appendBatch(t, db, 13)
				b, key, want, reason := bucketEntries, treeKey, tc.want, tc.reason
				if levelMajor {
					toOldLayout(t, db, layoutLevelMajor)
					b, key = bucketTree, levelMajorKey
					if tc.levelMajor != nil {
						want, reason = tc.levelMajor, tc.levelMajorReason
					}
				}
				if err := db.Update(func(tx *bbolt.Tx) error {
					tc.tamper(t, tx.Bucket(b), key)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if levelMajor {
					err := db.Update(Init)
					if tc.levelMajorInit != "" {
						if err == nil || !strings.Contains(err.Error(), tc.levelMajorInit) {
							t.Errorf("Init = %v, want %q", err, tc.levelMajorInit)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				db.View(func(tx *bbolt.Tx) error {
					_, err := Verify(tx)
					checkErr(t, err, want, reason)
					return nil
				})
			})
		}
	}
}

// checkErr checks that err is of want's type, names the same entry, node or
// checkpoints, and mentions reason.
func checkErr(t *testing.T, err, want error, reason string) {
	t.Helper()
	ok := false
	switch w := want.(type) {
	case *VerifyError:
		var e *VerifyError
		ok = errors.As(err, &e) && e.Seq == w.Seq
	case *NodeError:
		var e *NodeError
		ok = errors.As(err, &e) && e.Level == w.Level && e.Index == w.Index
	case *CheckpointError:
		var e *CheckpointError
		ok = errors.As(err, &e) && e.Num == w.Num
	case *ForkError:
		var e *ForkError
		ok = errors.As(err, &e) && e.Size == w.Size && e.First == w.First && e.Second == w.Second
	}
	if !ok || !strings.Contains(err.Error(), reason) {
		t.Errorf("error %v;\nwant %T naming %+v, with %q", err, want, want, reason)
	}
}

// TestRewrittenEntryAndLeaf: an entry rewritten with a recomputed hash and
// a matching leaf breaks the next entry's link and the parent node.
func TestRewrittenEntryAndLeaf(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 5)
	if err := db.Update(func(tx *bbolt.Tx) error {
		e, err := Get(tx, 2)
		if err != nil {
			return err
		}
		e.Body = json.RawMessage(`{"i":0}`)
		if e.Hash, err = EntryHash(e); err != nil {
			return err
		}
		if err := tx.Bucket(bucketEntries).Put(seqKey(2), appendRecord(nil, &e)); err != nil {
			return err
		}
		h, _ := digest.Parse(e.Hash)
		return tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(0, 2)), h[:])
	}); err != nil {
		t.Fatal(err)
	}
	checkVerifyFails(t, db, 3, "prev_hash")
}

func TestCheckTree(t *testing.T) {
	signer := testSigner(t)
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, tx *bbolt.Tx)
		want   string
	}{
		{"intact", func(*testing.T, *bbolt.Tx) {}, ""},
		{"entries after the latest checkpoint", func(t *testing.T, tx *bbolt.Tx) {
			for range 3 {
				if _, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`)); err != nil {
					t.Fatal(err)
				}
			}
		}, ""},
		{"no checkpoint", func(t *testing.T, tx *bbolt.Tx) {
			for _, num := range []uint64{0, 1} {
				if err := tx.Bucket(bucketEntries).Delete(storedCheckpointKey(tx, num)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Bucket(bucketMeta).Delete(keyLastCheckpoint); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"right edge node flipped", func(t *testing.T, tx *bbolt.Tx) {
			b := tx.Bucket(bucketEntries)
			v := bytes.Clone(b.Get(treeKey(compact.NewNodeID(3, 0))))
			v[0] ^= 1
			b.Put(treeKey(compact.NewNodeID(3, 0)), v)
		}, "latest checkpoint #1 has root"},
		{"right edge node missing", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Delete(treeKey(compact.NewNodeID(1, 4)))
		}, "right edge at size 11: tree node (level 1, index 4) missing"},
		{"last leaf differs from the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(0, 10)), make([]byte, 32))
		}, "leaf 10 is blake3:0000"},
		{"leaf beyond the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(0, 11)), make([]byte, 32))
		}, "tree node (level 0, index 11) is stored beyond the head's 11 entries"},
		{"node beyond the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Put(treeKey(compact.NewNodeID(2, 2)), make([]byte, 32))
		}, "tree node (level 2, index 2) is stored beyond the head's 11 entries"},
		{"entry beyond the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Put(seqKey(12), []byte("{}"))
		}, "entry 12 is stored beyond the head's 11 entries"},
		{"attachment beyond the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketAttachments).Put(seqKey(11), []byte("x"))
		}, "the attachment of entry 11 is stored beyond the head's 11 entries"},
		{"attachments' pad holding a value", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketAttachments).Put(attachmentPads[0], []byte("x"))
		}, "the attachments' pad fffffffffffffffe, holding a value, is stored beyond the head's 11 entries"},
		{"malformed key beyond the head", func(t *testing.T, tx *bbolt.Tx) {
			tx.Bucket(bucketEntries).Put([]byte{0, 0, 0, 0, 0, 0, 0, 11, 0x40}, []byte("x"))
		}, "a malformed key 000000000000000b40 is stored beyond the head's 11 entries"},
		{"attachments within the head", func(t *testing.T, tx *bbolt.Tx) {
			for _, seq := range []uint64{0, 6, 10} {
				if err := Attach(tx, seq, []byte("x")); err != nil {
					t.Fatal(err)
				}
			}
		}, ""},
		{"checkpoint of the head's size", func(t *testing.T, tx *bbolt.Tx) {
			// A second checkpoint of size 11, after #1, e.g. by another key.
			root, err := Root(tx, 11)
			if err != nil {
				t.Fatal(err)
			}
			signed, err := SignCheckpoint(otherSigner(t), Checkpoint{Origin: testOrigin, Size: 11, Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if err := putRawCheckpoint(tx, 2, signed); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"checkpoint beyond the entries", func(t *testing.T, tx *bbolt.Tx) {
			signed, err := SignCheckpoint(signer, Checkpoint{Origin: testOrigin, Size: 12})
			if err != nil {
				t.Fatal(err)
			}
			if err := putRawCheckpoint(tx, 2, signed); err != nil {
				t.Fatal(err)
			}
		}, "a checkpoint of size 12 is stored beyond the head's 11 entries"},
		{"checkpoint beyond the entries under the head's size", func(t *testing.T, tx *bbolt.Tx) {
			signed, err := SignCheckpoint(signer, Checkpoint{Origin: testOrigin, Size: 12})
			if err != nil {
				t.Fatal(err)
			}
			if err := putCheckpointAt(tx, 11, 2, signed); err != nil {
				t.Fatal(err)
			}
		}, "latest checkpoint #2 is for 12 entries but the ledger has 11"},
		{"checkpoint with another root", func(t *testing.T, tx *bbolt.Tx) {
			signed, err := SignCheckpoint(signer, Checkpoint{Origin: testOrigin, Size: 11})
			if err != nil {
				t.Fatal(err)
			}
			if err := putRawCheckpoint(tx, 2, signed); err != nil {
				t.Fatal(err)
			}
		}, "latest checkpoint #2 has root blake3:0000000000000000000000000000000000000000000000000000000000000000 for size 11"},
		{"checkpoint of a smaller size stored last", func(t *testing.T, tx *bbolt.Tx) {
			// Sorts before #1 (size 11): the record names one that is
			// not the last stored.
			signed, err := SignCheckpoint(signer, Checkpoint{Origin: testOrigin, Size: 7})
			if err != nil {
				t.Fatal(err)
			}
			if err := putRawCheckpoint(tx, 2, signed); err != nil {
				t.Fatal(err)
			}
		}, "the latest checkpoint's key recorded in the metadata (\"checkpoint_last\") is 0000000000000007c00000000000000002, the last stored checkpoint's is 000000000000000bc00000000000000001"},
		{"stale record of the latest", func(t *testing.T, tx *bbolt.Tx) {
			if err := tx.Bucket(bucketMeta).Put(keyLastCheckpoint, checkpointKey(7, 0)); err != nil {
				t.Fatal(err)
			}
		}, "the last stored checkpoint's is 000000000000000bc00000000000000001"},
		{"record of the latest removed", func(t *testing.T, tx *bbolt.Tx) {
			if err := tx.Bucket(bucketMeta).Delete(keyLastCheckpoint); err != nil {
				t.Fatal(err)
			}
		}, "is , the last stored checkpoint's is 000000000000000bc00000000000000001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := twoCommits(t, signer, 7, 4)
			if err := db.Update(func(tx *bbolt.Tx) error { tc.tamper(t, tx); return nil }); err != nil {
				t.Fatal(err)
			}
			err := db.View(CheckTree)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("CheckTree = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestInitMigratesTreelessLedger removes the tree and checkpoint buckets,
// as in a data dir made before they existed, and lets Init rebuild the
// tree.
func TestInitMigratesTreelessLedger(t *testing.T) {
	db := newDB(t)
	appendN(t, db, 5)
	appendBatch(t, db, 20)
	want, wantAll := dumpKind(t, db, kindNode), dumpAll(t, db)
	toOldLayout(t, db, layoutTreeless)

	// Before Init: verified as a chain; the tree's functions say what to do.
	if err := db.Update(func(tx *bbolt.Tx) error {
		if n, err := Verify(tx); n != 25 || err != nil {
			t.Errorf("Verify of an unmigrated ledger = %d, %v", n, err)
		}
		if _, err := Root(tx, 1); !errors.Is(err, errOldLayout) || !strings.Contains(err.Error(), "Init moves it") {
			t.Errorf("Root without a tree: %v", err)
		}
		if _, err := Append(tx, KindAudit, t0, json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "run Init") {
			t.Errorf("Append without a tree: %v", err)
		}
		if _, err := LatestCheckpoint(tx); !errors.Is(err, errOldLayout) {
			t.Errorf("LatestCheckpoint without a bucket: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := db.Update(Init); err != nil {
		t.Fatal(err)
	}
	if got := dumpKind(t, db, kindNode); !equalDumps(got, want) {
		t.Errorf("migrated tree has %d nodes, differs from the tree built by Append (%d nodes)", len(got), len(want))
	}
	if !equalDumpAll(dumpAll(t, db), wantAll) {
		t.Error("the migrated file differs from the one Append wrote")
	}
	if err := db.View(CheckTree); err != nil {
		t.Error(err)
	}
	if err := db.Update(Init); err != nil { // idempotent
		t.Fatal(err)
	}
	appendN(t, db, 1)
	if _, err := verifyDB(db); err != nil {
		t.Error(err)
	}

	// A file of layout 3 whose tree is gone is reported, not verified as
	// a chain.
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, kv := range dumpKind(t, db, kindNode) {
			if err := tx.Bucket(bucketEntries).Delete(kv[0]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := verifyDB(db)
	checkErr(t, err, &VerifyError{Seq: 0}, "Merkle tree leaf: missing")

	// A file of an older layout with one of the tree and checkpoint
	// buckets is refused, not verified as a chain.
	for _, name := range [][]byte{bucketTree, bucketCheckpoints} {
		old := newDB(t)
		appendN(t, old, 3)
		toOldLayout(t, old, layoutTreeless)
		if err := old.Update(func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucket(name)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := verifyDB(old); !errors.Is(err, errOldLayout) {
			t.Errorf("Verify of a file of layout 1 with only the bucket %q: %v, want errOldLayout", name, err)
		}
	}
}

func TestInitMigrationRefusesBrokenLedger(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(entries, meta *bbolt.Bucket) error
		want   string
	}{
		{"entry missing", func(e, _ *bbolt.Bucket) error { return e.Delete(seqKey(1)) }, "entry 1 missing"},
		{"record undecodable", func(e, _ *bbolt.Bucket) error { return e.Put(seqKey(2), []byte("{")) }, "entry 2: undecodable"},
		{"head counts more", func(_, m *bbolt.Bucket) error { return m.Put(keyHead, encodeHead(9, [32]byte{})) }, "3 entries stored, the head counts 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			appendN(t, db, 3)
			toOldLayout(t, db, layoutTreeless)
			if err := db.Update(func(tx *bbolt.Tx) error {
				return tc.tamper(tx.Bucket(bucketEntries), tx.Bucket(bucketMeta))
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Update(Init); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Init = %v, want %q", err, tc.want)
			}
		})
	}
}

func verifyDB(db *bbolt.DB) (r Report, err error) {
	err = db.View(func(tx *bbolt.Tx) error {
		r, err = VerifyWith(tx, VerifyOptions{})
		return err
	})
	return r, err
}
