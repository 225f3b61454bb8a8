package ledger

import (
	"encoding/json"
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
