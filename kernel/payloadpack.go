package kernel

import (
	"bytes"
	"fmt"

	"github.com/klauspost/compress/zstd"

	"github.com/capkernel/capkernel/internal/jsonpack"
)

// A stored audit payload is its canonical JSON packed (internal/jsonpack:
// member names in one byte, the salt and digests in binary), and that as
// one zstd frame (RFC 8878, without its checksum: the commitments check
// the payload) when it is large enough and the frame is smaller: payloads
// hold what calls read and wrote, text for the most part, which zstd's
// fastest level shrinks by a third or more. Packing
// runs in the caller, off the sequencer. Readers tell the forms apart by
// the first byte: a zstd frame starts with its magic number, a packed
// value with jsonpack.Tag, and a payload stored before either existed
// with the '{' of its JSON (a frame may hold JSON or a packed value).

// packMin is the smallest packed payload compressed. A zstd frame costs
// ~10 µs even for a small payload (setting up its tables;
// BenchmarkPackPayload) and saves nothing on the ~300 bytes of a payload
// without text; from packMin on the payload holds text, and the frame
// of an fs.read of 1 KiB (~940 bytes instead of ~1,240) lets a 4 KiB
// page hold four payloads instead of three (docs/formats.md, "Storage
// encoding"; BenchmarkAuditStorage).
const packMin = 512

// packMaxSize bounds what unpacking one stored payload may produce, so a
// damaged frame cannot claim gigabytes; every payload the kernel stores
// is far smaller (results are capped well below it).
const packMaxSize = 256 << 20

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

var (
	// Literal entropy coding stays on: a payload of 1 KiB of prose has
	// few matches, and without it the fastest level stores its literals
	// raw (no smaller than the packed payload).
	packer, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithLowerEncoderMem(true),
		zstd.WithEncoderCRC(false), zstd.WithAllLitEntropyCompression(true))
	unpacker, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(packMaxSize))
)

// packPayload returns the stored form of the canonical payload b.
func packPayload(b []byte) []byte {
	p := jsonpack.Pack(make([]byte, 0, len(b)), b)
	if len(p) < packMin {
		return p
	}
	z := packer.EncodeAll(p, make([]byte, 0, len(p)*2/3))
	if len(z) >= len(p) {
		return p
	}
	return z
}

// unpackPayload returns the canonical JSON of the stored payload v: every
// reader of bucketPayloads goes through it. A frame or packed value that
// does not decode is an error (the payload was damaged or tampered with).
func unpackPayload(v []byte) ([]byte, error) {
	if bytes.HasPrefix(v, zstdMagic) {
		b, err := unpacker.DecodeAll(v, nil)
		if err != nil {
			return nil, fmt.Errorf("zstd frame of %d bytes: %w", len(v), err)
		}
		v = b
	}
	if !jsonpack.Packed(v) {
		return v, nil
	}
	return jsonpack.Unpack(nil, v)
}
