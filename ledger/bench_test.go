package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
)

// body300 is a 300-byte canonical audit-like body.
var body300 = func() json.RawMessage {
	b := `{"agent_id":"agent-1","args_hash":"blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262","operation_id":"0194a0a4-7c00-7000-8000-000000000002","risk_score":0.25,"tool_id":"fs.write","pad":"`
	b += strings.Repeat("x", 300-len(b)-2) + `"}`
	return json.RawMessage(b)
}()

// perEntry starts measuring a benchmark that handles n entries per
// operation; the function it returns reports entries/s (wall clock),
// cpu-ns/entry: the CPU time of the whole process (user and system, every
// core) per entry, which a loaded machine does not inflate as it does wall
// time, and sys-ns/entry, the system part of it (such as page faults on
// bbolt's mmap).
func perEntry(b *testing.B, n int) (report func()) {
	b.ReportAllocs()
	user, sys := cpuTime(b)
	return func() {
		entries := float64(n * b.N)
		user2, sys2 := cpuTime(b)
		b.ReportMetric(entries/b.Elapsed().Seconds(), "entries/s")
		b.ReportMetric(float64(user2-user+sys2-sys)/entries, "cpu-ns/entry")
		b.ReportMetric(float64(sys2-sys)/entries, "sys-ns/entry")
	}
}

// cpuTime returns the user and system CPU time the process has used so
// far.
func cpuTime(b *testing.B) (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// BenchmarkAppend appends 300-byte bodies, 1000 per bbolt transaction as
// under group commit (NoSync: this measures the ledger, not the disk).
func BenchmarkAppend(b *testing.B) {
	db := newDB(b)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		if err := db.Update(func(tx *bbolt.Tx) error {
			for j := 0; j < 1000 && i < b.N; j, i = j+1, i+1 {
				if _, err := Append(tx, KindAudit, now, body300); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkWriterAppend appends 300-byte bodies through one Writer in
// transactions of 32 entries, each ended by a checkpoint, and proves each
// entry from its batch, as the kernel's sequencer and its callers do at
// 32 concurrent calls (NoSync: this measures the ledger, not the disk).
// It reports the sequencer's share as seq-ns/entry: the time of the
// appends and the checkpoint, without the signature (which the kernel
// makes beside the ops' work) and the proofs (made by each caller), and as
// seq-cpu-ns/entry, the CPU time of the same steps (the benchmark's thread,
// locked to it), which other processes on the machine do not inflate.
func BenchmarkWriterAppend(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	threadCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var seqCPU time.Duration
	const perTx = 32
	db := newDB(b)
	w := NewWriter()
	s := testSigner(b)
	body, err := Canonicalize(body300)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	var seq time.Duration
	appended := make([]Appended, 0, perTx)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		appended = appended[:0]
		if err := db.Update(func(tx *bbolt.Tx) error {
			start, cpu := time.Now(), threadCPU()
			for j := 0; j < perTx && i < b.N; j, i = j+1, i+1 {
				a, err := w.AppendCanonical(tx, KindAudit, now, body)
				if err != nil {
					return err
				}
				appended = append(appended, a)
			}
			c, _, err := w.Pending(tx, testOrigin)
			if err != nil {
				return err
			}
			seq, seqCPU = seq+time.Since(start), seqCPU+threadCPU()-cpu
			signed, err := SignCheckpoint(s, c)
			if err != nil {
				return err
			}
			start, cpu = time.Now(), threadCPU()
			_, err = w.CheckpointPresigned(tx, s, testOrigin, Presigned{Checkpoint: c, Signed: signed})
			seq, seqCPU = seq+time.Since(start), seqCPU+threadCPU()-cpu
			return err
		}); err != nil {
			b.Fatal(err)
		}
		for _, a := range appended {
			if _, err := a.Batch.Prove(a.Seq); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(seq.Nanoseconds())/float64(b.N), "seq-ns/entry")
	b.ReportMetric(float64(seqCPU.Nanoseconds())/float64(b.N), "seq-cpu-ns/entry")
}

// BenchmarkVerify verifies a ledger of 100k entries with 300-byte bodies.
func BenchmarkVerify(b *testing.B) {
	const n = 100_000
	db := newDB(b)
	now := time.Now()
	for i := 0; i < n; i += 10_000 {
		if err := db.Update(func(tx *bbolt.Tx) error {
			for range 10_000 {
				if _, err := Append(tx, KindAudit, now, body300); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	report := perEntry(b, n)
	for range b.N {
		if err := db.View(func(tx *bbolt.Tx) error {
			_, err := Verify(tx)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	report()
}

func BenchmarkNodeHash(b *testing.B) {
	var l, r [32]byte
	b.ReportAllocs()
	for b.Loop() {
		l = NodeHash(l, r)
	}
}

// bigLedger builds a ledger of n entries with 300-byte bodies in a bbolt
// file under dir (NoSync), in transactions of 1000 entries with a
// checkpoint after each, as under group commit.
func bigLedger(b *testing.B, n int) *bbolt.DB {
	b.Helper()
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "big.db"), 0o600, &bbolt.Options{NoSync: true, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, InitialMmapSize: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(Init); err != nil {
		b.Fatal(err)
	}
	s := testSigner(b)
	body, err := Canonicalize(body300)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	start := time.Now()
	for i := 0; i < n; i += 1000 {
		if err := db.Update(func(tx *bbolt.Tx) error {
			for range min(1000, n-i) {
				if _, err := AppendCanonical(tx, KindAudit, now, body); err != nil {
					return err
				}
			}
			_, err := WriteCheckpoint(tx, s, testOrigin)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	fi, _ := os.Stat(db.Path())
	b.Logf("built %d entries in %v (%d MiB)", n, time.Since(start).Round(time.Millisecond), fi.Size()>>20)
	// The garbage of building it is collected and its memory returned
	// now, not by the runtime's background sweeper and scavenger while
	// the benchmarks that follow run.
	debug.FreeOSMemory()
	return db
}

// BenchmarkLedger1M measures proofs (time, and size as max-proof-bytes),
// checks, verification and export over a ledger of one million entries,
// and the memory of a fresh process that opens it, serves proofs and
// verifies it (Memory).
func BenchmarkLedger1M(b *testing.B) {
	const n = 1_000_000
	db := bigLedger(b, n)
	rng := rand.New(rand.NewPCG(1, 2))
	view := func(b *testing.B, f func(tx *bbolt.Tx) error) {
		b.Helper()
		if err := db.View(f); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("InclusionProof", func(b *testing.B) {
		longest := 0
		view(b, func(tx *bbolt.Tx) error {
			for b.Loop() {
				p, err := InclusionProof(tx, rng.Uint64N(n), n)
				if err != nil {
					return err
				}
				longest = max(longest, len(p))
			}
			return nil
		})
		b.ReportMetric(float64(32*longest), "max-proof-bytes")
	})
	b.Run("VerifyInclusion", func(b *testing.B) {
		type claim struct {
			index uint64
			leaf  [32]byte
			proof [][32]byte
		}
		claims := make([]claim, 1024)
		var root [32]byte
		view(b, func(tx *bbolt.Tx) (err error) {
			if root, err = Root(tx, n); err != nil {
				return err
			}
			for i := range claims {
				c := &claims[i]
				c.index = rng.Uint64N(n)
				if c.proof, err = InclusionProof(tx, c.index, n); err != nil {
					return err
				}
				node, err := getNode(storedTree{b: tx.Bucket(bucketEntries)}, compact.NewNodeID(0, c.index))
				if err != nil {
					return err
				}
				c.leaf = node
			}
			return nil
		})
		i := 0
		for b.Loop() {
			c := &claims[i%len(claims)]
			if err := VerifyInclusion(c.index, n, c.leaf, c.proof, root); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("ConsistencyProof", func(b *testing.B) {
		view(b, func(tx *bbolt.Tx) error {
			for b.Loop() {
				if _, err := ConsistencyProof(tx, 1+rng.Uint64N(n-1), n); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("Root", func(b *testing.B) {
		view(b, func(tx *bbolt.Tx) error {
			for b.Loop() {
				if _, err := Root(tx, 1+rng.Uint64N(n)); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("CheckTree", func(b *testing.B) {
		view(b, func(tx *bbolt.Tx) error {
			for b.Loop() {
				if err := CheckTree(tx); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("VerifyWith", func(b *testing.B) {
		opts := VerifyOptions{Verifier: testVerifier(b), Origin: testOrigin}
		report := perEntry(b, n)
		for b.Loop() {
			view(b, func(tx *bbolt.Tx) error {
				_, err := VerifyWith(tx, opts)
				return err
			})
		}
		report()
	})
	export := filepath.Join(b.TempDir(), "export.jsonl")
	b.Run("Export", func(b *testing.B) {
		for b.Loop() {
			f, err := os.Create(export)
			if err != nil {
				b.Fatal(err)
			}
			view(b, func(tx *bbolt.Tx) error { return Export(tx, f) })
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
	})
	b.Run("VerifyExport", func(b *testing.B) {
		opts := VerifyOptions{Verifier: testVerifier(b), Origin: testOrigin}
		report := perEntry(b, n)
		for b.Loop() {
			f, err := os.Open(export)
			if err != nil {
				b.Fatal(err)
			}
			r, err := VerifyExport(f, opts)
			f.Close()
			if err != nil || r.Entries != n || r.Checkpoints != n/1000 {
				b.Fatalf("VerifyExport = %+v, %v", r, err)
			}
		}
		report()
	})
	// Last, since it closes the database for the child to open.
	b.Run("Memory", func(b *testing.B) {
		path := db.Path() // empty once closed
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			m := memoryOfChild(b, path)
			for _, k := range memoryMetrics {
				b.ReportMetric(m[k], k)
			}
		}
	})
}

// memoryEnv names the ledger file TestLedgerMemoryChild opens.
const memoryEnv = "CAPK_LEDGER_MEMORY_DB"

// memoryMetrics are the figures TestLedgerMemoryChild reports, in MiB:
// Go heap in use and resident set size (anonymous memory, and file pages of
// the bbolt mmap) right after store.Open, after Init, CheckTree and 10,000
// proofs, and after a full verification as well.
var memoryMetrics = []string{
	"open-heap-MiB", "open-rss-anon-MiB", "open-rss-file-MiB",
	"proofs-heap-MiB", "proofs-rss-anon-MiB", "proofs-rss-file-MiB",
	"verify-heap-MiB", "verify-rss-anon-MiB", "verify-rss-file-MiB",
}

// memoryOfChild runs TestLedgerMemoryChild on the ledger at path in a
// fresh process and returns its figures.
func memoryOfChild(b *testing.B, path string) map[string]float64 {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerMemoryChild$", "-test.v")
	cmd.Env = append(os.Environ(), memoryEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("memory child: %v\n%s", err, out)
	}
	for l := range strings.Lines(string(out)) {
		if js, ok := strings.CutPrefix(l, "MEMORY "); ok {
			m := map[string]float64{}
			if err := json.Unmarshal([]byte(js), &m); err != nil {
				b.Fatal(err)
			}
			return m
		}
	}
	b.Fatalf("memory child printed no figures:\n%s", out)
	return nil
}

// TestLedgerMemoryChild is run by BenchmarkLedger1M/Memory: it opens the
// ledger as the kernel does (store.Open, Init, CheckTree), serves 10,000
// inclusion and 1,000 consistency proofs, each in a read transaction of
// its own, then verifies the whole ledger, and prints its memory figures
// at each of these points.
func TestLedgerMemoryChild(t *testing.T) {
	path := os.Getenv(memoryEnv)
	if path == "" {
		t.Skip("run by BenchmarkLedger1M/Memory")
	}
	d, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m := map[string]float64{}
	measureMemory(t, m, "open")
	if err := d.Update(context.Background(), Init); err != nil {
		t.Fatal(err)
	}
	if err := d.View(CheckTree); err != nil {
		t.Fatal(err)
	}
	var n uint64
	if err := d.View(func(tx *bbolt.Tx) error {
		h, err := HeadOf(tx)
		n = h.Size
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 11_000 {
		if err := d.View(func(tx *bbolt.Tx) error {
			var err error
			if i < 10_000 {
				_, err = InclusionProof(tx, rng.Uint64N(n), n)
			} else {
				_, err = ConsistencyProof(tx, 1+rng.Uint64N(n-1), n)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	measureMemory(t, m, "proofs")
	if err := d.View(func(tx *bbolt.Tx) error {
		_, err := VerifyWith(tx, VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	measureMemory(t, m, "verify")
	js, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("MEMORY %s\n", js)
}

// measureMemory records, under prefix, the Go heap in use after a garbage
// collection and the RssAnon and RssFile lines of /proc/self/status, in
// MiB.
func measureMemory(t *testing.T, m map[string]float64, prefix string) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m[prefix+"-heap-MiB"] = float64(ms.HeapInuse) / (1 << 20)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(status)) {
		for key, name := range map[string]string{"RssAnon:": "-rss-anon-MiB", "RssFile:": "-rss-file-MiB"} {
			if rest, ok := strings.CutPrefix(l, key); ok {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				if err != nil {
					t.Fatalf("/proc/self/status: %q: %v", l, err)
				}
				m[prefix+name] = kb / 1024
			}
		}
	}
}

// baselineAppends bounds the number of appends of a baseline measurement.
const baselineAppends = 500

// BenchmarkDurableAppend measures durable (fsync'd) appends of 300-byte
// bodies through store.DB, with a checkpoint signed per group commit as in
// the kernel, at 1, 32 and 128 concurrent appenders. Right before, it
// measures the baseline: the same appenders each making one bbolt Update
// (one transaction and fsync, no checkpoint) per append, up to
// baselineAppends of them; it reports both rates and their ratio.
func BenchmarkDurableAppend(b *testing.B) {
	body, err := Canonicalize(body300)
	if err != nil {
		b.Fatal(err)
	}
	appendOne := func(tx *bbolt.Tx) error {
		_, err := AppendCanonical(tx, KindAudit, time.Now(), body)
		return err
	}
	for _, par := range []int{1, 32, 128} {
		b.Run(fmt.Sprintf("appenders=%d", par), func(b *testing.B) {
			base := baselineRate(b, par, min(b.N, baselineAppends), appendOne)
			d := openCheckpointed(b, filepath.Join(b.TempDir(), "group.db"), store.Options{})
			defer d.Close()
			b.ResetTimer()
			if err := inParallel(par, b.N, func() error { return d.Update(context.Background(), appendOne) }); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "entries/s")
			b.ReportMetric(base, "baseline-entries/s")
			b.ReportMetric(rate/base, "x-baseline")
		})
	}
}

// baselineRate returns the rate of n appends by par appenders, each append
// in a bbolt Update of its own on a file opened as store.Open opens it.
func baselineRate(b *testing.B, par, n int, appendOne func(*bbolt.Tx) error) float64 {
	b.Helper()
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "baseline.db"), 0o600, &bbolt.Options{
		NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, InitialMmapSize: 1 << 30,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(Init); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := inParallel(par, n, func() error { return db.Update(appendOne) }); err != nil {
		b.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}

// inParallel calls f n times from par goroutines and returns the first
// error.
func inParallel(par, n int, f func() error) error {
	var next atomic.Int64
	errs := make(chan error, par)
	for range par {
		go func() {
			for next.Add(1) <= int64(n) {
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range par {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// BenchmarkWriteCheckpoint measures the per-batch cost of a checkpoint
// (root, Ed25519 signature, put) after one append.
func BenchmarkWriteCheckpoint(b *testing.B) {
	db := newDB(b)
	s := testSigner(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := db.Update(func(tx *bbolt.Tx) error {
			if _, err := Append(tx, KindAudit, t0, body300); err != nil {
				return err
			}
			_, err := WriteCheckpoint(tx, s, testOrigin)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyExport verifies the export of 100k entries (checkpoints
// every 1000) from memory.
func BenchmarkVerifyExport(b *testing.B) {
	const n = 100_000
	db := bigLedger(b, n)
	var buf bytes.Buffer
	if err := db.View(func(tx *bbolt.Tx) error { return Export(tx, &buf) }); err != nil {
		b.Fatal(err)
	}
	opts := VerifyOptions{Verifier: testVerifier(b), Origin: testOrigin}
	b.SetBytes(int64(buf.Len()))
	b.ReportAllocs()
	report := perEntry(b, n)
	for b.Loop() {
		if r, err := VerifyExport(bytes.NewReader(buf.Bytes()), opts); err != nil || r.Entries != n {
			b.Fatalf("VerifyExport = %+v, %v", r, err)
		}
	}
	report()
}
