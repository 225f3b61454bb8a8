package kernel

import (
	"context"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
)

// TestLastPolicy: the Inspector names the policy_loaded record of the
// kernel's last start, noted in the start's transaction, and finds the
// same one by reading the ledger back when the note is missing (a file
// an older build wrote).
func TestLastPolicy(t *testing.T) {
	h := newHarness(t)
	for range 20 {
		mustOK(t, h.invoke("echo", map[string]any{"text": "hi"}))
	}
	h.k.Close()
	h.open() // a second start: its record is the last
	mustOK(t, h.invoke("echo", map[string]any{"text": "hi"}))
	want := h.k.PolicyHash()
	var wantSeq uint64
	if err := h.k.View(func(tx *bbolt.Tx) error {
		h, err := ledger.HeadOf(tx)
		if err != nil {
			return err
		}
		for s := h.Size; s > 0; s-- {
			e, err := ledger.Get(tx, s-1)
			if err != nil {
				return err
			}
			if e.Kind == ledger.KindPolicyLoaded {
				wantSeq = e.Seq
				return nil
			}
		}
		return nil
	}); err != nil || wantSeq == 0 {
		t.Fatalf("the second start's record: seq %d, %v", wantSeq, err)
	}
	for _, tc := range []struct {
		name   string
		unnote bool
	}{{"noted", false}, {"not noted", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.unnote {
				if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
					return tx.DeleteBucket(bucketPolicyLoaded)
				}); err != nil {
					t.Fatal(err)
				}
			} else if err := h.k.View(func(tx *bbolt.Tx) error {
				if tx.Bucket(bucketPolicyLoaded) == nil {
					t.Error("the start noted no policy_loaded record")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			hash, seq, found, err := h.k.Inspector().LastPolicy()
			if err != nil || !found || hash != want || seq != wantSeq {
				t.Fatalf("LastPolicy: %q seq %d found %v, %v; want %q seq %d", hash, seq, found, err, want, wantSeq)
			}
		})
	}
}
