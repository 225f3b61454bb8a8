package kernel

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// The benchmarks report calls/s; the baseline is one bbolt Update with one
// Put per operation (fsync each), measured in the same run, so the ratio of
// the two holds on any machine.
//
//	make bench BENCH='Invoke|Baseline'

var parallelisms = []int{1, 8, 32, 64}

// runParallel runs op b.N times spread over p goroutines and reports calls/s.
func runParallel(b *testing.B, p int, op func(i int64)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				op(i)
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}

func BenchmarkBaselineBoltPut(b *testing.B) {
	for _, p := range parallelisms {
		b.Run(fmt.Sprintf("p=%d", p), func(b *testing.B) {
			db, err := bbolt.Open(filepath.Join(b.TempDir(), "base.db"), 0o600, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err })
			val := []byte(strings.Repeat("v", 1024))
			b.ReportAllocs()
			runParallel(b, p, func(i int64) {
				var k [8]byte
				binary.BigEndian.PutUint64(k[:], uint64(i))
				if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("b")).Put(k[:], val) }); err != nil {
					b.Error(err)
				}
			})
		})
	}
}

func BenchmarkInvoke(b *testing.B) {
	content := strings.Repeat("x", 1024)
	cases := []struct {
		name string
		env  func(h *harness, i int64) *Envelope
	}{
		{"echo", func(h *harness, i int64) *Envelope { return h.env("echo", map[string]any{"text": "hello"}) }},
		{"fs.read-1KiB", func(h *harness, i int64) *Envelope { return h.env("fs.read", map[string]any{"path": "one-kib.txt"}) }},
		{"fs.write-1KiB", func(h *harness, i int64) *Envelope {
			return h.env("fs.write", map[string]any{"path": fmt.Sprintf("w/%d.txt", i%512), "content": content}, key(fmt.Sprint("bench-", i)))
		}},
	}
	for _, c := range cases {
		for _, p := range parallelisms {
			b.Run(fmt.Sprintf("%s/p=%d", c.name, p), func(b *testing.B) {
				h := newHarness(b)
				h.write("one-kib.txt", content)
				h.write("w/.keep", "")
				envs := make([]*Envelope, b.N+1)
				for i := range envs {
					envs[i] = c.env(h, int64(i))
				}
				b.ReportAllocs()
				runParallel(b, p, func(i int64) {
					if r := h.k.Invoke(context.Background(), envs[i]); r.Status != StatusOK {
						b.Errorf("%s: %+v", c.name, r.Error)
					}
				})
			})
		}
	}
}
