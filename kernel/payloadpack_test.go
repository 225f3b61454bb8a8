package kernel

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/klauspost/compress/zstd"

	"github.com/capkernel/capkernel/internal/jsonpack"
	"github.com/capkernel/capkernel/internal/tailpad"
)

// TestPackPayload: a stored payload is packed, and a zstd frame of that
// exactly when it is at least packMin bytes and the frame is smaller;
// every stored form, and the JSON of payloads stored before packing, reads
// back to the same JSON, and a damaged frame or packed value is an error,
// never other bytes.
func TestPackPayload(t *testing.T) {
	noise := make([]byte, 2048)
	for i := range noise {
		noise[i] = byte(rand.IntN(256))
	}
	for _, tc := range []struct {
		name         string
		json         string
		packed, zstd bool
	}{
		{"small", `{"salt":"00"}`, true, false},
		{"no text", `{"args":{"path":"f.txt"},"salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`, true, false},
		{"text", `{"result":"` + strings.Repeat("a receipt. ", 100) + `"}`, true, true},
		{"noise", `{"result":"` + string(noise) + `"}`, false, false}, // neither is smaller
		{"whitespace", `{"result": "` + strings.Repeat("a receipt. ", 100) + `"}`, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := packPayload([]byte(tc.json))
			if got := bytes.HasPrefix(v, zstdMagic); got != tc.zstd {
				t.Fatalf("zstd: %v (%d → %d bytes), want %v", got, len(tc.json), len(v), tc.zstd)
			}
			inner := v
			if tc.zstd {
				var err error
				if inner, err = unpacker.DecodeAll(v, nil); err != nil {
					t.Fatal(err)
				}
			}
			if jsonpack.Packed(inner) != tc.packed {
				t.Fatalf("packed: %v, want %v", jsonpack.Packed(inner), tc.packed)
			}
			if len(v) > len(tc.json) {
				t.Fatalf("stored in %d bytes from %d", len(v), len(tc.json))
			}
			for _, stored := range [][]byte{v, []byte(tc.json)} {
				b, err := unpackPayload(stored)
				if err != nil || string(b) != tc.json {
					t.Fatalf("unpack: %q, %v", b, err)
				}
			}
		})
	}
	v := packPayload([]byte(`{"result":"` + strings.Repeat("abc ", 1000) + `"}`))
	small := packPayload([]byte(`{"args":{"path":"f.txt"},"salt":"00"}`))
	for _, bad := range [][]byte{v[:len(v)/2], append(bytes.Clone(v[:len(v)-1]), v[len(v)-1]^1), small[:len(small)-1], append(bytes.Clone(small), 0)} {
		if b, err := unpackPayload(bad); err == nil {
			t.Errorf("damaged payload of %d bytes read as %.40q", len(bad), b)
		}
	}
}

// BenchmarkPackPayload measures storing the payload of an fs.read of
// 1 KiB of text (packing and compressing it) and reading it back.
func BenchmarkPackPayload(b *testing.B) {
	payload := []byte(`{"args":{"path":"f.txt"},"context":{"risk_basis":["read in scope"]},"policy_input":{"agent_id":"agent-1","resources":[{"exists":true,"kind":"fs","op":"read","path":"f.txt","real_path":"f.txt","root":"/tmp/ws"}],"side_effect":"READ","task_class":"test","tool_id":"fs.read"},"policy_input_shares_args":true,"result":{"result":{"bytes_returned":1024,"content":` +
		strings.TrimSuffix(string(must(canonicalPart(benchText(b, 1024)))), "\n") + `,"offset":0,"path":"f.txt","size":1024,"truncated":false},"status":"ok"},"salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`)
	v := packPayload(payload)
	b.Run("pack", func(b *testing.B) {
		for b.Loop() {
			packPayload(payload)
		}
		b.ReportMetric(float64(len(v)), "stored-bytes")
		b.ReportMetric(float64(len(payload)), "json-bytes")
	})
	b.Run("unpack", func(b *testing.B) {
		for b.Loop() {
			if _, err := unpackPayload(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestPayloadFramesOfEveryVersion: a frame with a checksum (as stored
// before packing) of JSON, or of a packed payload, reads.
func TestPayloadFramesOfEveryVersion(t *testing.T) {
	old, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	text := `{"result":"` + strings.Repeat("the kernel answers every call with a receipt. ", 100) + `"}`
	for _, inner := range [][]byte{[]byte(text), jsonpack.Pack(nil, []byte(text))} {
		b, err := unpackPayload(old.EncodeAll(inner, nil))
		if err != nil || string(b) != text {
			t.Fatalf("frame without a dictionary: %.40q, %v", b, err)
		}
	}
}

// TestPayloadPads: the payload bucket ends with the two empty pad keys,
// which verification and retention pass over; a pad that holds a value
// was put there by hand and fails verification.
func TestPayloadPads(t *testing.T) {
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.Now = clk.now })
	h.write("f.txt", "text")
	for range 3 {
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "f.txt"}))
	}
	if err := h.k.View(func(tx *bbolt.Tx) error {
		k, _ := tx.Bucket(bucketPayloads).Cursor().Last()
		if !tailpad.Is(k) {
			t.Fatalf("last payload key %x, want a pad", k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, h.k.Inspector())
	pad := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPayloads).Put(pad, []byte(`{"salt":"00"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if c, err := h.k.Inspector().Verify(nil); err != nil || c.Intact || !strings.Contains(c.Reason, "tampered") {
		t.Fatalf("verify with a filled pad: %+v %v", c, err)
	}
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPayloads).Put(pad, []byte{})
	}); err != nil {
		t.Fatal(err)
	}
	h.k.audit.retention = []retention{{RetentionRule: RetentionRule{OlderThan: "1h"}, age: time.Hour}}
	clk.add(2 * time.Hour)
	if n, err := h.k.Retain(context.Background()); err != nil || n != 3 {
		t.Fatalf("Retain erased %d payloads, %v; want 3", n, err)
	}
	mustVerify(t, h.k.Inspector())
}
