package kernel

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestPackPayload: a stored payload is a zstd frame exactly when that is
// smaller than its JSON, every stored form reads back to the same JSON,
// and a damaged frame is an error, never other bytes.
func TestPackPayload(t *testing.T) {
	noise := make([]byte, 2048)
	for i := range noise {
		noise[i] = byte(rand.IntN(256))
	}
	for _, tc := range []struct {
		name   string
		json   string
		packed bool
	}{
		{"small", `{"salt":"00"}`, false},
		{"text below packMin", `{"result":"` + strings.Repeat("a receipt. ", 100) + `"}`, false},
		{"text", `{"result":"` + strings.Repeat("the kernel answers every call with a receipt. ", 100) + `"}`, true},
		{"noise", `{"result":"` + string(noise) + `"}`, false}, // no frame is smaller
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := packPayload([]byte(tc.json))
			if got := bytes.HasPrefix(v, zstdMagic); got != tc.packed {
				t.Fatalf("packed: %v (%d → %d bytes), want %v", got, len(tc.json), len(v), tc.packed)
			}
			if tc.packed && len(v) >= len(tc.json) {
				t.Fatalf("packed to %d bytes from %d", len(v), len(tc.json))
			}
			b, err := unpackPayload(v)
			if err != nil || string(b) != tc.json {
				t.Fatalf("unpack: %q, %v", b, err)
			}
		})
	}
	v := packPayload([]byte(`{"result":"` + strings.Repeat("abc ", 1000) + `"}`))
	for _, bad := range [][]byte{v[:len(v)/2], append(bytes.Clone(v[:len(v)-1]), v[len(v)-1]^1)} {
		if b, err := unpackPayload(bad); err == nil {
			t.Errorf("damaged frame of %d bytes read as %.40q", len(bad), b)
		}
	}
}
