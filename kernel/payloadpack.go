package kernel

import (
	"bytes"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// A stored audit payload is its canonical JSON, or that JSON as one zstd
// frame (RFC 8878) when it is large and the frame is smaller: payloads
// hold what calls read and wrote, text for the most part, which zstd's
// fastest level shrinks by half or more once there is enough of it.
// Packing runs in the caller, off the sequencer. Readers tell the two
// forms apart by the first bytes: a JSON object starts with '{', a zstd
// frame with its magic number.

// packMin is the smallest payload packed. zstd costs ~15 µs for any frame
// on the reference machine (setting up its tables) and saves a third of
// 1 KiB of text, which bbolt's 4 KiB pages mostly give back as slack;
// from half a page up the saving is whole pages and the cost per byte
// small (docs/formats.md, BenchmarkAuditStorage).
const packMin = 2048

// packMaxSize bounds what unpacking one stored payload may produce, so a
// damaged frame cannot claim gigabytes; every payload the kernel stores
// is far smaller (results are capped well below it).
const packMaxSize = 256 << 20

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

var (
	packer, _   = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithLowerEncoderMem(true))
	unpacker, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(packMaxSize))
)

// packPayload returns the stored form of the canonical payload b.
func packPayload(b []byte) []byte {
	if len(b) < packMin {
		return b
	}
	z := packer.EncodeAll(b, make([]byte, 0, len(b)/2))
	if len(z) >= len(b) {
		return b
	}
	return z
}

// unpackPayload returns the canonical JSON of the stored payload v.
func unpackPayload(v []byte) ([]byte, error) {
	if !bytes.HasPrefix(v, zstdMagic) {
		return v, nil
	}
	b, err := unpacker.DecodeAll(v, nil)
	if err != nil {
		return nil, fmt.Errorf("zstd frame of %d bytes: %w", len(v), err)
	}
	return b, nil
}
