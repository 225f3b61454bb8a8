package kernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"

	"github.com/capkernel/capkernel/internal/jsonpack"
)

// A stored audit payload is its canonical JSON packed (internal/jsonpack:
// member names in one byte, the salt and digests in binary, a repeated
// string as a reference), and that
// entropy coded when it is large enough and coding makes it smaller:
// payloads hold what calls read and wrote, text for the most part. Below
// huffMax packed bytes the bytes are Huffman coded on their own (huffTag,
// huff0: the literals coding of zstd, RFC 8878 section 4.2.1, with no
// match finding), with the fixed table payloadTable (tableTag) or, for
// bytes it fits poorly, a table of their own (huffTag); from huffMax on
// they are one zstd frame (RFC 8878,
// without its checksum: the commitments check the payload). Packing runs
// in the caller, off the sequencer. Readers tell the forms apart by the
// first byte: a zstd frame starts with its magic number, a Huffman coded
// payload with tableTag or huffTag, a packed value with jsonpack.Tag, and a payload
// stored before any of them with the '{' of its JSON (a frame or a
// Huffman coded payload may hold JSON or a packed value).

// packMin is the smallest packed payload coded. Coding costs a few µs
// even for a small payload (building its table; BenchmarkPackPayload) and
// saves nothing on the ~300 bytes of a payload without text; from packMin
// on the payload holds text, and coding that of an fs.read of 1 KiB
// (~900 bytes instead of ~1,220) lets a 4 KiB page hold four payloads
// instead of three (docs/formats.md, "Storage encoding";
// BenchmarkAuditStorage).
const packMin = 512

// huffMax is the size from which a packed payload is a zstd frame rather
// than Huffman coded. Below it zstd's matches find little that the packing
// (which stores a repeated path as a reference, jsonpack.PackRefs) left:
// Huffman coding stores from 2.5% fewer to 2.5% more bytes than a frame
// (fs.read and fs.write of 300 B to 1 KiB of docs/kernel.md) for two
// thirds of the CPU (no match finding, whose 256 KiB hash table also
// evicts the call's own data from the cache; BenchmarkPackPayload); above
// it the frame's matches win more (5% at 1.5 KiB, 8% at 2 KiB) and its
// cost is spread over more bytes.
const huffMax = 1280

// packMaxSize bounds what unpacking one stored payload may produce, so a
// damaged frame cannot claim gigabytes; every payload the kernel stores
// is far smaller (results are capped well below it).
const packMaxSize = 256 << 20

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// huffTag is the first byte of a Huffman coded payload: huffTag, the
// uvarint length n of the coded bytes, then huff0's single-stream form of
// them (its table description, then the bit stream to the end of the
// value). JSON text never starts with it, nor does a packed value or a
// zstd frame.
const huffTag = 0x02

var (
	// Literal entropy coding stays on: a payload of 1 KiB of prose has
	// few matches, and without it the fastest level stores its literals
	// raw (no smaller than the packed payload).
	packer, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithLowerEncoderMem(true),
		zstd.WithEncoderCRC(false), zstd.WithAllLitEntropyCompression(true))
	unpacker, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(packMaxSize))
)

// packBufs holds the buffers payloads are packed in before coding (and
// decoded in before unpacking), which leaves the packed form behind.
var packBufs = sync.Pool{New: func() any { return new([]byte) }}

// huffScratch holds huff0's working state (histogram, tables and output
// buffer, ~10 KiB), which every coding and decoding would otherwise
// allocate. Tables are never carried from one payload to the next
// (ReusePolicyNone): each payload holds its own.
var huffScratch = sync.Pool{New: func() any { return &huff0.Scratch{Reuse: huff0.ReusePolicyNone} }}

// putBuf returns b to packBufs unless it is a rare huge payload's.
func putBuf(bp *[]byte, b []byte) {
	if cap(b) <= 1<<20 {
		*bp = b[:0]
		packBufs.Put(bp)
	}
}

// packPayload returns the stored form of the canonical payload b, in
// memory of its own.
func packPayload(b []byte) []byte {
	bp := packBufs.Get().(*[]byte)
	p := jsonpack.PackRefs((*bp)[:0], b)
	defer putBuf(bp, p)
	switch {
	case len(p) < packMin:
	case len(p) < huffMax:
		if v := huffCode(p); v != nil {
			return v
		}
	default:
		if z := packer.EncodeAll(p, make([]byte, 0, len(p)*2/3)); len(z) < len(p) {
			return z
		}
	}
	return bytes.Clone(p)
}

// huffCode returns p Huffman coded, or nil when that is not smaller than
// p: with payloadTable (tableTag) when that saves an eighth of p or more,
// else with a table of its own (ownCode), which codes bytes the fixed
// table fits poorly shorter (one byte repeated) or refuses them (random
// bytes). The fixed table's size is counted from p's histogram, so p is
// coded once.
func huffCode(p []byte) []byte {
	var hist [256]uint32
	for _, b := range p {
		hist[b]++
	}
	if n := payloadCoder.EstimateSize(&hist); n >= 0 && n <= len(p)-len(p)/8 {
		return tableCode(p)
	}
	return ownCode(p)
}

// ownCode returns p Huffman coded with a table of its own (huffTag, its
// length, huff0's single stream: the table, then the bit stream), or nil
// when that is not smaller than p (huff0 refuses bytes whose histogram
// promises no gain).
func ownCode(p []byte) []byte {
	s := huffScratch.Get().(*huff0.Scratch)
	defer huffScratch.Put(s)
	h, _, err := huff0.Compress1X(p, s)
	if err != nil {
		return nil
	}
	return codedForm(huffTag, p, h)
}

// codedForm returns the stored form of p Huffman coded as h: tag, the
// length of p, h; or nil when that is not smaller than p. h may be a
// scratch's buffer: the form is a copy.
func codedForm(tag byte, p, h []byte) []byte {
	if 1+binary.MaxVarintLen64+len(h) >= len(p) {
		return nil
	}
	v := make([]byte, 0, 1+binary.MaxVarintLen64+len(h))
	v = binary.AppendUvarint(append(v, tag), uint64(len(p)))
	return append(v, h...)
}

// huffDecode appends the bytes of the Huffman coded payload v (huffTag:
// with the table it holds; tableTag: with payloadTable) to dst. A
// value whose table or stream does not decode to exactly the length it
// states is an error; so is a length no stream of v's size could hold
// (each byte costs at least one bit), which bounds what a damaged value
// makes the reader allocate to 8 bytes per stored byte.
func huffDecode(dst, v []byte) ([]byte, error) {
	n, k := binary.Uvarint(v[1:])
	if k <= 0 || n == 0 || n > huff0.BlockSizeMax || n > 8*uint64(len(v)) {
		return dst, fmt.Errorf("Huffman coded payload of %d bytes: bad length", len(v))
	}
	dec, stream := tableDecoder, v[1+k:]
	if v[0] == huffTag {
		s := huffScratch.Get().(*huff0.Scratch)
		defer huffScratch.Put(s)
		var err error
		if s, stream, err = huff0.ReadTable(stream, s); err != nil {
			return dst, fmt.Errorf("Huffman coded payload of %d bytes: table: %w", len(v), err)
		}
		dec = s.Decoder()
	}
	start := len(dst)
	dst = slices.Grow(dst, int(n))
	out, err := dec.Decompress1X(dst[start:start:start+int(n)], stream)
	if err == nil && len(out) != int(n) {
		err = fmt.Errorf("%d bytes decoded, %d stated", len(out), n)
	}
	if err != nil {
		return dst, fmt.Errorf("Huffman coded payload of %d bytes: %w", len(v), err)
	}
	return dst[:start+int(n)], nil
}

// errNotPayload is why a Huffman coded payload's bytes are refused when
// they are neither a packed value nor a JSON object.
var errNotPayload = errors.New("decodes to neither a packed value nor a JSON object")

// unpackPayload returns the canonical JSON of the stored payload v: every
// reader of the payloads goes through it. A frame, Huffman coded payload
// or packed value that does not decode is an error (the payload
// was damaged or tampered with).
func unpackPayload(v []byte) ([]byte, error) {
	switch {
	case bytes.HasPrefix(v, zstdMagic):
		b, err := unpacker.DecodeAll(v, nil)
		if err != nil {
			return nil, fmt.Errorf("zstd frame of %d bytes: %w", len(v), err)
		}
		v = b
	case len(v) > 0 && (v[0] == huffTag || v[0] == tableTag):
		bp := packBufs.Get().(*[]byte)
		b, err := huffDecode((*bp)[:0], v)
		defer putBuf(bp, b)
		if err != nil {
			return nil, err
		}
		if !jsonpack.Packed(b) && b[0] != '{' {
			return nil, fmt.Errorf("Huffman coded payload of %d bytes: %w", len(v), errNotPayload)
		}
		return jsonpack.Unpack(nil, b)
	}
	if !jsonpack.Packed(v) {
		return v, nil
	}
	return jsonpack.Unpack(nil, v)
}
