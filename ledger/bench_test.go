package ledger

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// body300 is a 300-byte canonical audit-like body.
var body300 = func() json.RawMessage {
	b := `{"agent_id":"agent-1","args_hash":"blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262","operation_id":"0194a0a4-7c00-7000-8000-000000000002","risk_score":0.25,"tool_id":"fs.write","pad":"`
	b += strings.Repeat("x", 300-len(b)-2) + `"}`
	return json.RawMessage(b)
}()

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
	for range b.N {
		if err := db.View(func(tx *bbolt.Tx) error {
			_, err := Verify(tx)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
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
	return db
}

// BenchmarkLedger1M measures proofs, checks, verification and export over
// a ledger of one million entries.
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
		view(b, func(tx *bbolt.Tx) error {
			for b.Loop() {
				if _, err := InclusionProof(tx, rng.Uint64N(n), n); err != nil {
					return err
				}
			}
			return nil
		})
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
		for b.Loop() {
			view(b, func(tx *bbolt.Tx) error {
				_, err := VerifyWith(tx, opts)
				return err
			})
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
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
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
	})
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
	for b.Loop() {
		if r, err := VerifyExport(bytes.NewReader(buf.Bytes()), opts); err != nil || r.Entries != n {
			b.Fatalf("VerifyExport = %+v, %v", r, err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
}
