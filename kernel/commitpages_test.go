package kernel

import (
	"context"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// TestLoneCommitPages: a lone fs.read's group commit writes at most 10
// pages (docs/kernel.md, "A lone call's commit": the ledger's path, the
// payloads', the operations', the root bucket's leaf and the meta page),
// where four buckets for the ledger's records, tree, checkpoints and
// payloads wrote 12.3 at this size (17 after 3,000 calls). On this disk a lone call's
// latency is mostly its commit, whose cost grows with every page it writes
// at a place of its own.
func TestLoneCommitPages(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.NoSync = true })
	h.write("one-kib.txt", strings.Repeat("x", 1024))
	read := func() {
		if r := h.k.Invoke(context.Background(), h.env("fs.read", map[string]any{"path": "one-kib.txt"})); r.Status != StatusOK {
			t.Fatal(r.Error)
		}
	}
	for range 600 {
		read() // past the first pages' splits: buckets of depth 2 and more
	}
	writes := func() (n int64) {
		h.k.db.View(func(tx *bbolt.Tx) error {
			st := tx.DB().Stats().TxStats
			n = st.GetWrite()
			return nil
		})
		return n
	}
	w0, c0 := writes(), h.k.commits.Load()
	for range 200 {
		read()
	}
	pages, commits := writes()-w0, h.k.commits.Load()-c0
	if commits != 200 {
		t.Fatalf("%d commits for 200 lone calls", commits)
	}
	per := float64(pages) / float64(commits)
	t.Logf("%.1f pages a lone commit", per)
	if per > 10 {
		t.Fatalf("a lone fs.read's commit wrote %.1f pages, want at most 10", per)
	}
}
