package kernel

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// burst makes n concurrent echo calls, so that the sequencer groups them.
func (h *harness) burst(n int) {
	h.t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { mustOK(h.t, h.invoke("echo", map[string]any{"text": fmt.Sprint(i)})) })
	}
	wg.Wait()
}

func (h *harness) checkpoints() []ledger.StoredCheckpoint {
	h.t.Helper()
	var out []ledger.StoredCheckpoint
	if err := h.k.View(func(tx *bbolt.Tx) error {
		return ledger.Checkpoints(tx, 0, func(c ledger.StoredCheckpoint) error {
			out = append(out, c)
			return nil
		})
	}); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// Every group commit that appends leaves a signed checkpoint of the whole
// ledger, so the newest one always covers every acknowledged call.
func TestCheckpointPerGroupCommit(t *testing.T) {
	h := newHarness(t)
	h.burst(64)
	cps := h.checkpoints()
	if len(cps) < 2 {
		t.Fatalf("%d checkpoints after a burst", len(cps))
	}
	v, err := ledger.NewCheckpointVerifier(h.k.ID(), h.k.ReceiptKey())
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cps {
		got, err := ledger.OpenCheckpoint(c.Signed, v)
		if err != nil {
			t.Fatalf("checkpoint #%d: %v", i, err)
		}
		if got.Origin != h.k.ID() || (i > 0 && c.Size <= cps[i-1].Size) {
			t.Fatalf("checkpoint #%d: origin %s size %d after %d", i, got.Origin, c.Size, cps[i-1].Size)
		}
	}
	if last := cps[len(cps)-1]; last.Size != h.headSize() {
		t.Fatalf("the newest checkpoint has %d entries, the ledger %d", last.Size, h.headSize())
	}
	// A call is covered as soon as it is answered.
	r := h.invoke("echo", map[string]any{"text": "covered"})
	cp, err := h.k.Inspector().Checkpoint(false)
	if err != nil || cp.Size <= r.LedgerSeq {
		t.Fatalf("latest checkpoint %+v does not cover seq %d: %v", cp, r.LedgerSeq, err)
	}
	mustVerify(t, h.k.Inspector())
}

func TestStableCheckpoint(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.StableCheckpointInterval = 20 * time.Millisecond })
	first, err := h.k.Inspector().Checkpoint(true)
	if err != nil {
		t.Fatalf("no stable checkpoint after Open: %v", err)
	}
	h.burst(8)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := h.k.Inspector().Checkpoint(true)
		latest, err2 := h.k.Inspector().Checkpoint(false)
		if err != nil || err2 != nil {
			t.Fatal(err, err2)
		}
		if st.Size > first.Size && st.Number == latest.Number {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stable checkpoint stuck at %+v, latest %+v", st, latest)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// With nothing new, no new mark: the stable checkpoint stays put; each
	// mark names a newer checkpoint than the one before.
	marks := func() (nums []uint64) {
		h.k.View(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketStable).ForEach(func(_, v []byte) error {
				nums = append(nums, binary.BigEndian.Uint64(v))
				return nil
			})
		})
		return nums
	}
	st1, m1 := h.k.Inspector().Checkpoint(true)
	before := marks()
	time.Sleep(100 * time.Millisecond)
	st2, _ := h.k.Inspector().Checkpoint(true)
	after := marks()
	if m1 != nil || st1 != st2 || len(after) != len(before) {
		t.Fatalf("idle kernel moved its stable checkpoint: %+v -> %+v, marks %v -> %v", st1, st2, before, after)
	}
	for i := 1; i < len(after); i++ {
		if after[i] <= after[i-1] {
			t.Fatalf("stable marks %v do not name ever newer checkpoints", after)
		}
	}
}

// TestStableMarkOfOlderBuilds: a stable mark holding the checkpoint's
// number alone, as builds before the size was kept wrote it, still names
// its checkpoint; marks of other lengths are refused.
func TestStableMarkOfOlderBuilds(t *testing.T) {
	h := newHarness(t)
	h.burst(6)
	var cps []ledger.StoredCheckpoint
	h.k.View(func(tx *bbolt.Tx) error {
		return ledger.Checkpoints(tx, 0, func(c ledger.StoredCheckpoint) error {
			cps = append(cps, c)
			return nil
		})
	})
	if len(cps) < 3 {
		t.Fatalf("%d checkpoints, want 3 or more", len(cps))
	}
	want := cps[1]
	for _, tc := range []struct {
		mark    []byte
		wantErr string
	}{
		{binary8(want.Num), ""},
		{append(binary8(want.Num), binary8(want.Size)...), ""},
		{append(binary8(want.Num), binary8(want.Size+1)...), "is not stored"},
		{binary8(want.Num)[:7], "is 7 bytes"},
	} {
		if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
			b := tx.Bucket(bucketStable)
			n, _ := b.NextSequence()
			return b.Put(binary8(n-1), tc.mark)
		}); err != nil {
			t.Fatal(err)
		}
		var got ledger.StoredCheckpoint
		var err error
		h.k.View(func(tx *bbolt.Tx) error { got, err = latestStable(tx); return nil })
		switch {
		case tc.wantErr == "" && (err != nil || got.Num != want.Num || got.Size != want.Size):
			t.Errorf("mark %x: checkpoint #%d of size %d, %v; want #%d of size %d", tc.mark, got.Num, got.Size, err, want.Num, want.Size)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("mark %x: %v, want an error saying %q", tc.mark, err, tc.wantErr)
		}
	}
}

// Open rebuilds the tree's right edge and refuses a ledger that does not
// match its newest checkpoint: cut short, or forked.
func TestOpenChecksTreeAgainstCheckpoint(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, tx *bbolt.Tx, key ed25519.PrivateKey, origin string)
	}{
		{"forked checkpoint of the same size", func(t *testing.T, tx *bbolt.Tx, key ed25519.PrivateKey, origin string) {
			last, err := ledger.LatestCheckpoint(tx)
			if err != nil {
				t.Fatal(err)
			}
			forged := last.Checkpoint
			forged.Root[0] ^= 1
			s, _ := ledger.NewCheckpointSigner(origin, key)
			signed, _ := ledger.SignCheckpoint(s, forged)
			k := checkpointKey(forged.Size, last.Num+1)
			if err := tx.Bucket(bucketLedger).Put(k, signed); err != nil {
				t.Fatal(err)
			}
			if err := tx.Bucket([]byte("ledger_meta")).Put([]byte("checkpoint_last"), k); err != nil {
				t.Fatal(err)
			}
		}},
		{"entries cut off after the checkpoint", func(t *testing.T, tx *bbolt.Tx, _ ed25519.PrivateKey, _ string) {
			hd, _ := ledger.HeadOf(tx)
			prev, _ := ledger.Get(tx, hd.Size-2)
			h, _ := digest.Parse(prev.Hash)
			tx.Bucket([]byte("ledger")).Delete(binary8(hd.Size - 1))
			tx.Bucket(bucketLedger).Delete(append(binary8(hd.Size-1), 0)) // the leaf's key: completion position, level
			tx.Bucket([]byte("ledger_meta")).Put([]byte("head"), append(binary8(hd.Size-1), h[:]...))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.burst(5)
			key, err := LoadKey(filepath.Join(h.data, ReceiptKeyFile))
			if err != nil {
				t.Fatal(err)
			}
			id := h.k.ID()
			h.k.Close()
			db, err := bbolt.Open(filepath.Join(h.data, DBFile), 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bbolt.Tx) error { tc.damage(t, tx, key, id); return nil }); err != nil {
				t.Fatal(err)
			}
			db.Close()
			k, err := Open(context.Background(), Config{DataDir: h.data})
			if err == nil {
				k.Close()
				t.Fatal("Open accepted a ledger that does not match its checkpoint")
			}
			if !strings.Contains(err.Error(), "does not match its last checkpoint") {
				t.Fatalf("Open: %v", err)
			}
		})
	}
}

func binary8(n uint64) []byte {
	b := make([]byte, 8)
	for i := range 8 {
		b[7-i] = byte(n >> (8 * i))
	}
	return b
}

// Every entry proves into the newest checkpoint, every older checkpoint
// proves consistent with it, and proofs outside the ledger are refused.
func TestProofsAgainstCheckpoints(t *testing.T) {
	h := newHarness(t)
	h.burst(20)
	in := h.k.Inspector()
	cp, err := in.Checkpoint(false)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := ledger.NewCheckpointVerifier(h.k.ID(), h.k.ReceiptKey())
	signed, err := ledger.OpenCheckpoint([]byte(cp.Note), v)
	if err != nil {
		t.Fatal(err)
	}
	for seq := range cp.Size {
		p, err := in.ProveInclusion(seq, 0)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		if p.Checkpoint == nil || p.Checkpoint.Note != cp.Note || p.Root != digest.Format(signed.Root) {
			t.Fatalf("seq %d: proof not against the newest checkpoint: %+v", seq, p)
		}
		if err := p.Inclusion.Verify(signed.Root); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		wrong := p.Inclusion
		wrong.LeafIndex = (seq + 1) % cp.Size
		if wrong.Verify(signed.Root) == nil {
			t.Fatalf("seq %d: proof verified for another index", seq)
		}
	}
	for _, c := range h.checkpoints() {
		p, err := in.ProveConsistency(c.Size, cp.Size)
		if err != nil {
			t.Fatal(err)
		}
		if p.Root1 != digest.Format(c.Root) {
			t.Fatalf("root of size %d: %s, checkpoint says %s", c.Size, p.Root1, digest.Format(c.Root))
		}
		if err := p.Consistency.Verify(c.Root, signed.Root); err != nil {
			t.Fatalf("checkpoint #%d (size %d): %v", c.Num, c.Size, err)
		}
	}
	hd := h.headSize()
	for _, bad := range []struct{ seq, size uint64 }{{hd, 0}, {0, hd + 1}, {5, 5}} {
		if _, err := in.ProveInclusion(bad.seq, bad.size); !errors.Is(err, ErrRange) {
			t.Fatalf("inclusion of %d in %d: %v, want ErrRange", bad.seq, bad.size, err)
		}
	}
	for _, bad := range []struct{ from, to uint64 }{{3, 2}, {0, hd + 1}} {
		if _, err := in.ProveConsistency(bad.from, bad.to); !errors.Is(err, ErrRange) {
			t.Fatalf("consistency %d..%d: %v, want ErrRange", bad.from, bad.to, err)
		}
	}
}

// A receipt verifies with the JWKS alone, and every part of it is bound:
// a change anywhere is refused.
func TestBundle(t *testing.T) {
	h := newHarness(t)
	r := h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "hello"}, key("b1"))
	mustOK(t, r)
	h.burst(20)
	b, err := h.k.Inspector().Bundle(r.ReceiptID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Entry != r.Receipt.Entry || b.Inclusion.LeafIndex != r.LedgerSeq || b.Inclusion.TreeSize <= r.Receipt.Inclusion.TreeSize {
		t.Fatalf("bundle %+v is not the call's receipt %+v under a later checkpoint", b, r.Receipt)
	}
	jwks, _ := h.k.JWKS()
	raw, _ := json.Marshal(b)
	c, err := VerifyBundle(raw, jwks)
	if err != nil {
		t.Fatal(err)
	}
	if c.Receipt.ReceiptID != r.ReceiptID || c.Receipt.LedgerSeq != r.LedgerSeq || c.Checkpoint.Size <= r.LedgerSeq {
		t.Fatalf("verified %+v", c)
	}

	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	otherJWKS, _ := receipts.JWKS(otherKey.Public().(ed25519.PublicKey))
	otherSigner, _ := ledger.NewCheckpointSigner(h.k.ID(), otherKey)
	otherSigned, _ := ledger.SignCheckpoint(otherSigner, c.Checkpoint)
	neighbour, _ := h.k.Inspector().Bundle(h.k.Inspector().mustReceiptAt(t, r.LedgerSeq+10))

	tests := []struct {
		name   string
		mutate func(b *receipts.Logged) []byte
		jwks   []byte
	}{
		{"another kernel's JWKS", nil, otherJWKS},
		{"entry body changed", func(b *receipts.Logged) []byte {
			b.Entry = strings.Replace(b.Entry, `"tool_id":"fs.write"`, `"tool_id":"fs.read"`, 1)
			return nil
		}, jwks},
		{"entry of another call", func(b *receipts.Logged) []byte { b.Entry = neighbour.Entry; return nil }, jwks},
		{"checkpoint signed by another key", func(b *receipts.Logged) []byte { b.Checkpoint = string(otherSigned); return nil }, jwks},
		{"checkpoint root changed", func(b *receipts.Logged) []byte {
			cp := c.Checkpoint
			cp.Root[3] ^= 1
			b.Checkpoint = strings.Replace(b.Checkpoint, base64.StdEncoding.EncodeToString(c.Checkpoint.Root[:]), base64.StdEncoding.EncodeToString(cp.Root[:]), 1)
			return nil
		}, jwks},
		{"proof hash changed", func(b *receipts.Logged) []byte {
			b.Inclusion.Proof[0] = digest.Sum([]byte("x"))
			return nil
		}, jwks},
		{"proof of another entry", func(b *receipts.Logged) []byte { b.Inclusion = neighbour.Inclusion; return nil }, jwks},
		{"proof for another tree size", func(b *receipts.Logged) []byte { b.Inclusion.TreeSize--; return nil }, jwks},
		{"proof with a hash too many", func(b *receipts.Logged) []byte {
			b.Inclusion.Proof = append(b.Inclusion.Proof, b.Inclusion.Proof[0])
			return nil
		}, jwks},
		{"unknown format", func(b *receipts.Logged) []byte { b.Format = "capkernel-receipt/v0"; return nil }, jwks},
		{"unknown field", func(b *receipts.Logged) []byte {
			out, _ := json.Marshal(b)
			return append(out[:len(out)-1], []byte(`,"extra":1}`)...)
		}, jwks},
		{"duplicate field", func(b *receipts.Logged) []byte {
			out, _ := json.Marshal(b)
			return append([]byte(`{"entry":"{}",`), out[1:]...)
		}, jwks},
		{"not JSON", func(*receipts.Logged) []byte { return []byte("receipt") }, jwks},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m receipts.Logged
			mustJSON(t, raw, &m)
			in := raw
			if tc.mutate != nil {
				if out := tc.mutate(&m); out != nil {
					in = out
				} else {
					in, _ = json.Marshal(&m)
				}
			}
			if _, err := VerifyBundle(in, tc.jwks); err == nil {
				t.Fatal("a damaged receipt verified")
			}
		})
	}
}

// A bundle of format v1 (a JWS receipt with its entry, checkpoint and
// proof), as kernels that signed every receipt made them, still verifies;
// a changed JWS does not.
func TestBundleV1(t *testing.T) {
	h := newHarness(t)
	r := h.invoke("echo", map[string]any{"text": "hi"})
	mustOK(t, r)
	key, err := LoadKey(filepath.Join(h.data, ReceiptKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	rc := verifyReceipt(t, h.k, r)
	rc.ReceiptID = "0194a0a4-7c00-7000-8000-000000000003"
	jws, err := receipts.NewSigner(key).Sign(rc)
	if err != nil {
		t.Fatal(err)
	}
	b := Bundle{Format: BundleFormat, Receipt: jws, Entry: r.Receipt.Entry, Checkpoint: r.Receipt.Checkpoint, Inclusion: r.Receipt.Inclusion}
	raw, _ := json.Marshal(b)
	jwks, _ := h.k.JWKS()
	if c, err := VerifyBundle(raw, jwks); err != nil || c.Receipt.ReceiptID != rc.ReceiptID {
		t.Fatalf("VerifyBundle(v1) = %+v, %v", c, err)
	}
	b.Receipt = flipLast(b.Receipt)
	raw, _ = json.Marshal(b)
	if _, err := VerifyBundle(raw, jwks); err == nil {
		t.Fatal("a v1 bundle with a damaged JWS verified")
	}
}

func (i *Inspector) mustReceiptAt(t *testing.T, from uint64) string {
	t.Helper()
	rs, err := i.Receipts(ReceiptFilter{After: from, Limit: 1})
	if err != nil || len(rs) == 0 {
		t.Fatalf("no receipt after seq %d: %v", from, err)
	}
	return rs[0].ReceiptID
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// flipLast changes a character of the JWS signature well before its end
// (the last base64url character of a 64-byte signature carries unused
// bits, so changing it may leave the bytes as they were).
func flipLast(s string) string {
	b := []byte(s)
	i := len(b) - 10
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
