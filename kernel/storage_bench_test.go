package kernel

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
)

// dbUse returns the size of k's bbolt file as its transactions see it
// (the high-water mark the file grows to) and the bytes of free pages in
// it (space the next commits reuse before growing the file).
func dbUse(t testing.TB, k *Kernel) (size, free int64) {
	t.Helper()
	err := k.View(func(tx *bbolt.Tx) error {
		size = tx.Size()
		st := tx.DB().Stats()
		free = int64(st.FreePageN+st.PendingPageN) * int64(tx.DB().Info().PageSize)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return size, free
}

// calls runs n calls of tool, 8 at a time (so commits are grouped as
// under load), each with fresh args; fs.write writes content (1 KiB of
// text when "").
func (h *harness) calls(tb testing.TB, tool string, n int, content ...string) {
	text := benchText(tb, 1024)
	if len(content) > 0 {
		text = content[0]
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var r *Result
			switch tool {
			case "fs.read":
				r = h.invoke("fs.read", map[string]any{"path": "f.txt"})
			case "fs.write":
				id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), i)
				r = h.invoke("fs.write", map[string]any{"path": "w-" + id + ".txt", "content": text}, key(id))
			}
			if r.Status != StatusOK {
				tb.Errorf("%s: %+v", tool, r.Error)
			}
		})
	}
	wg.Wait()
}

// benchText is n bytes of this repository's prose (docs/kernel.md), the
// content read and written: large payloads are stored compressed, and a
// run of one repeated byte would compress to nothing.
func benchText(tb testing.TB, n int) string {
	b, err := os.ReadFile("../docs/kernel.md")
	if err != nil || len(b) < n {
		tb.Fatalf("docs/kernel.md: %d bytes (want %d), %v", len(b), n, err)
	}
	return string(b[:n])
}

// BenchmarkAuditStorage reports the bytes kernel.db grows by per audited
// fs.read and fs.write of 1 KiB of text, and fs.write of 16 KiB, at steady
// state (after a warm-up), with payloads kept (depth full) and with
// commitments only, and the live bytes per call (file growth less the
// free pages it holds).
//
//	go test -run - -bench AuditStorage -benchtime 4000x ./kernel
func BenchmarkAuditStorage(b *testing.B) {
	for _, call := range []struct {
		name, tool string
		size       int
	}{{"fs.read", "fs.read", 1024}, {"fs.write", "fs.write", 1024}, {"fs.write-16KiB", "fs.write", 16 << 10}} {
		for _, depth := range []string{DepthFull, DepthCommitmentsOnly} {
			b.Run(call.name+"/"+depth, func(b *testing.B) {
				h := newHarness(b, func(c *Config) {
					c.NoSync = true
					c.Audit = &AuditConfig{Depth: map[string]string{"*": depth}}
				})
				text := benchText(b, call.size)
				h.write("f.txt", text)
				h.calls(b, call.tool, 1000, text)
				size0, free0 := dbUse(b, h.k)
				b.ResetTimer()
				h.calls(b, call.tool, b.N, text)
				b.StopTimer()
				size1, free1 := dbUse(b, h.k)
				b.ReportMetric(float64(size1-size0)/float64(b.N), "db-bytes/call")
				b.ReportMetric(float64((size1-free1)-(size0-free0))/float64(b.N), "live-bytes/call")
				b.Logf("%s %s: bytes per call by bucket (allocated pages over all %d calls): %s", call.name, depth, b.N+1000, bucketBytes(b, h.k, b.N+1000))
			})
		}
	}
}

// TestErasedSpaceIsReused: once retention erases payloads, bbolt reuses
// their pages: the next calls grow the file less than the same number of
// calls did before.
func TestErasedSpaceIsReused(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a few thousand calls")
	}
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.NoSync = true; c.Now = clk.now })
	h.write("f.txt", benchText(t, 4096))
	const n = 1500
	h.calls(t, "fs.read", n) // warm-up
	s0, _ := dbUse(t, h.k)
	h.calls(t, "fs.read", n)
	s1, _ := dbUse(t, h.k)
	grew := s1 - s0
	// Erase every payload so far.
	h.k.audit.retention = []retention{{RetentionRule: RetentionRule{OlderThan: "1h"}, age: time.Hour}}
	clk.add(2 * time.Hour)
	erased, err := h.k.Retain(context.Background())
	if err != nil || erased < 2*n {
		t.Fatalf("erased %d, %v", erased, err)
	}
	_, free := dbUse(t, h.k)
	s2, _ := dbUse(t, h.k)
	tok, cl, err := h.k.MintToken(captoken.Claims{Subject: h.agent, IssuedAt: clk.now(), NotBefore: clk.now(), Expiry: clk.now().Add(time.Hour),
		Cap: captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	h.token, h.jti = tok, cl.ID
	h.calls(t, "fs.read", n)
	s3, _ := dbUse(t, h.k)
	t.Logf("%d fs.read calls grew kernel.db by %d bytes before erasure; erasing %d payloads freed %d bytes; the next %d calls grew it by %d",
		n, grew, erased, free, n, s3-s2)
	if s3-s2 >= grew/2 {
		t.Fatalf("after erasure %d calls grew the file by %d bytes, before by %d: freed pages not reused", n, s3-s2, grew)
	}
}

// bucketBytes lists, per top-level bucket, its allocated page bytes
// divided by calls.
func bucketBytes(t testing.TB, k *Kernel, calls int) string {
	t.Helper()
	var out []string
	err := k.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			st := b.Stats()
			if n := st.LeafAlloc + st.BranchAlloc; n > 0 {
				out = append(out, fmt.Sprintf("%s=%d", name, n/calls))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, " ")
}
