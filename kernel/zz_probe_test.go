package kernel

import (
	"context"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

func bucketStats(h *harness) map[string]bbolt.BucketStats {
	m := map[string]bbolt.BucketStats{}
	h.k.db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			m[string(name)] = b.Stats()
			return nil
		})
	})
	return m
}

func TestZZProbePages(t *testing.T) {
	h := newHarness(t)
	h.write("one-kib.txt", strings.Repeat("x", 1024))
	for _, tool := range []string{"fs.read", "echo", "fs.write"} {
		mk := func(i int) *Envelope {
			switch tool {
			case "echo":
				return h.env("echo", map[string]any{"text": "hello"})
			case "fs.write":
				return h.env("fs.write", map[string]any{"path": "w.txt", "content": "abc"}, key(strings.Repeat("k", 5)+string(rune('a'+i%26))+strings.Repeat("z", i%7)+string(rune('A'+i/26%26))+string(rune('0'+i/676%10))))
			}
			return h.env("fs.read", map[string]any{"path": "one-kib.txt"})
		}
		for i := 0; i < 3000; i++ {
			mk(i)
			if r := h.k.Invoke(context.Background(), mk(i)); r.Status != StatusOK {
				t.Fatal(r.Error)
			}
		}
		before := bucketStats(h)
		var w0 int64
		h.k.db.View(func(tx *bbolt.Tx) error { st := tx.DB().Stats().TxStats; w0 = st.GetWrite(); return nil })
		c0 := h.k.commits.Load()
		if r := h.k.Invoke(context.Background(), mk(4000)); r.Status != StatusOK {
			t.Fatal(r.Error)
		}
		var w1 int64
		h.k.db.View(func(tx *bbolt.Tx) error { st := tx.DB().Stats().TxStats; w1 = st.GetWrite(); return nil })
		after := bucketStats(h)
		t.Logf("%s: commits %d page writes %d", tool, h.k.commits.Load()-c0, w1-w0)
		for n, a := range after {
			b := before[n]
			if a.KeyN != b.KeyN || a.LeafInuse != b.LeafInuse {
				t.Logf("  %-22s keys %d->%d depth %d leafpages %d", n, b.KeyN, a.KeyN, a.Depth, a.LeafPageN)
			}
		}
	}
}
