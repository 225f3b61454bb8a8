package kernel

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// invokeParallelisms are BenchmarkInvoke's: beyond 64 too, since the
// issue 17 goals are at the best concurrency, and with more callers a
// group commit carries more calls (its fsyncs, pages and signature
// shared by more). 512 because throughput still rose from 128 to 256
// (fs.read 17,058 → 18,249 calls/s at 3eb9b26): the sweep must go past
// where it stops rising to have found the best.
var invokeParallelisms = []int{1, 8, 32, 64, 128, 256, 512}

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

// sequencerStats is what the process and the store have done so far.
type sequencerStats struct {
	cpu        time.Duration // user + system CPU of the process
	serial     time.Duration // the kernel's functions on the sequencer (onSequencer)
	bolt       time.Duration // bbolt's commit work on the sequencer: spill and rebalance
	pageWrites int64         // page writes of bbolt commits
	commits    int64         // group commits
	syncs      uint64        // rounds of workspace syncfs (txn.Syncer)
}

func (h *harness) sequencerStats(b *testing.B) sequencerStats {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	s := sequencerStats{
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		serial: time.Duration(h.k.serial.Load()), commits: h.k.commits.Load(), syncs: h.k.syncer.Rounds(),
	}
	h.k.db.View(func(tx *bbolt.Tx) error {
		st := tx.DB().Stats().TxStats
		s.bolt = st.GetSpillTime() + st.GetRebalanceTime()
		s.pageWrites = st.GetWrite()
		return nil
	})
	return s
}

func (s sequencerStats) since(o sequencerStats) sequencerStats {
	return sequencerStats{s.cpu - o.cpu, s.serial - o.serial, s.bolt - o.bolt, s.pageWrites - o.pageWrites, s.commits - o.commits, s.syncs - o.syncs}
}

// report adds per-call metrics: CPU (all goroutines: what a call costs the
// machine, whatever else runs on it), serial time on the sequencer (which
// caps throughput at 1/serial on any number of cores), bbolt page writes,
// fdatasyncs (bbolt syncs twice per commit: the pages, then the meta
// page) and rounds of workspace syncfs.
func (s sequencerStats) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(float64(s.cpu.Microseconds())/n, "cpu-µs/call")
	b.ReportMetric(float64((s.serial+s.bolt).Nanoseconds())/1e3/n, "serial-µs/call")
	b.ReportMetric(float64(s.pageWrites)/n, "pages/call")
	b.ReportMetric(2*float64(s.commits)/n, "fsyncs/call")
	b.ReportMetric(float64(s.syncs)/n, "syncfs/call")
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
	// Text, as calls read and write (benchText): the cost of coding a
	// payload depends on its bytes, and one byte repeated codes unlike
	// any file.
	content := benchText(b, 1024)
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
		for _, p := range invokeParallelisms {
			b.Run(fmt.Sprintf("%s/p=%d", c.name, p), func(b *testing.B) {
				h := newHarness(b)
				h.write("one-kib.txt", content)
				h.write("w/.keep", "")
				envs := make([]*Envelope, b.N+1)
				for i := range envs {
					envs[i] = c.env(h, int64(i))
				}
				b.ReportAllocs()
				before := h.sequencerStats(b)
				runParallel(b, p, func(i int64) {
					if r := h.k.Invoke(context.Background(), envs[i]); r.Status != StatusOK {
						b.Errorf("%s: %+v", c.name, r.Error)
					}
				})
				h.sequencerStats(b).since(before).report(b)
			})
		}
	}
}
