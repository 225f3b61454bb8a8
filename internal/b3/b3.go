// Package b3 computes BLAKE3 keyed hashes and key derivations of short
// inputs without allocating.
//
// github.com/zeebo/blake3, which the rest of capkernel uses, keeps an 8 KiB
// buffer in every hasher and offers no way to key an existing one, so each
// keyed hash of a few hundred bytes allocates and clears that buffer. The
// kernel computes several per call (the audit record's commitments), which
// made those buffers most of the bytes a call allocated. This package is
// the BLAKE3 function itself (https://github.com/BLAKE3-team/BLAKE3-specs),
// in portable Go, for any input length; its tests check it against
// zeebo/blake3 on every length up to several chunks. For long inputs
// zeebo/blake3's SIMD code is faster, and callers hand them to it (Small
// says which).
package b3

import (
	"encoding/binary"
	"math/bits"
)

// Key is a BLAKE3 key as eight little-endian words.
type Key [8]uint32

// Domain flags of the BLAKE3 modes this package offers.
const (
	flagKeyedHash         = 1 << 4
	flagDeriveKeyContext  = 1 << 5
	flagDeriveKeyMaterial = 1 << 6

	flagChunkStart = 1 << 0
	flagChunkEnd   = 1 << 1
	flagParent     = 1 << 2
	flagRoot       = 1 << 3

	blockLen = 64
	chunkLen = 1024
)

var iv = Key{0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19}

// SmallMax is the longest input for which this package is the faster
// choice (measured against zeebo/blake3 on amd64 with AVX2: the portable
// compression is slower per block, the allocation it saves costs more up
// to about this length).
const SmallMax = 3 << 10

// Small reports whether n bytes are short enough to hash here.
func Small(n int) bool { return n <= SmallMax }

// KeyOf returns the key of 32 key bytes.
func KeyOf(b *[32]byte) Key {
	var k Key
	for i := range k {
		k[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return k
}

// Bytes returns the 32 bytes of k.
func (k *Key) Bytes() (b [32]byte) {
	for i, w := range k {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return b
}

// Keyed returns BLAKE3's keyed hash (32 bytes) of in under key.
func Keyed(key *Key, in []byte) [32]byte {
	out := hash(key, flagKeyedHash, in)
	return out.Bytes()
}

// ContextKey returns the key BLAKE3's derive_key mode derives from context,
// for DeriveKey.
func ContextKey(context string) Key {
	return hash(&iv, flagDeriveKeyContext, []byte(context))
}

// DeriveKey returns BLAKE3's derive_key (32 bytes) of material in the
// context whose key is ctx (ContextKey).
func DeriveKey(ctx *Key, material []byte) [32]byte {
	out := hash(ctx, flagDeriveKeyMaterial, material)
	return out.Bytes()
}

// hash is BLAKE3 with 32 bytes of output in the mode of key and flags.
func hash(key *Key, flags uint32, in []byte) Key {
	// The chaining values of complete subtrees left of the current chunk,
	// at most one per height: 54 levels cover 2^64 bytes.
	var stack [54]Key
	n := 0
	var chunk uint64
	for len(in) > chunkLen {
		cv := chunkCV(key, flags, in[:chunkLen], chunk)
		in = in[chunkLen:]
		chunk++
		// Merge every subtree the new chunk completes.
		for t := chunk; t&1 == 0; t >>= 1 {
			n--
			cv = parentCV(key, flags, &stack[n], &cv, 0)
		}
		stack[n] = cv
		n++
	}
	// The last chunk: every block but the last is a chaining step, and the
	// last block's compression is the root unless subtrees are left of it.
	cv := *key
	var block [16]uint32
	f := flags | flagChunkStart
	for len(in) > blockLen {
		load(&block, in[:blockLen])
		cv = compressCV(&cv, &block, chunk, blockLen, f)
		in = in[blockLen:]
		f = flags
	}
	var last [blockLen]byte
	copy(last[:], in)
	load(&block, last[:])
	f |= flagChunkEnd
	if n == 0 {
		return compressCV(&cv, &block, chunk, uint32(len(in)), f|flagRoot)
	}
	out := compressCV(&cv, &block, chunk, uint32(len(in)), f)
	for n > 1 {
		n--
		out = parentCV(key, flags, &stack[n], &out, 0)
	}
	return parentCV(key, flags, &stack[0], &out, flagRoot)
}

// chunkCV is the chaining value of the whole chunk in (chunkLen bytes).
func chunkCV(key *Key, flags uint32, in []byte, chunk uint64) Key {
	cv := *key
	var block [16]uint32
	for i := 0; i < chunkLen; i += blockLen {
		f := flags
		if i == 0 {
			f |= flagChunkStart
		}
		if i == chunkLen-blockLen {
			f |= flagChunkEnd
		}
		load(&block, in[i:i+blockLen])
		cv = compressCV(&cv, &block, chunk, blockLen, f)
	}
	return cv
}

// parentCV is the chaining value of the parent node of left and right.
func parentCV(key *Key, flags uint32, left, right *Key, extra uint32) Key {
	var block [16]uint32
	copy(block[:8], left[:])
	copy(block[8:], right[:])
	return compressCV(key, &block, 0, blockLen, flags|flagParent|extra)
}

func load(block *[16]uint32, b []byte) {
	_ = b[blockLen-1]
	for i := range block {
		block[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
}

// compressCV is BLAKE3's compression function truncated to its first eight
// words: the chaining value, or the root hash under flagRoot.
func compressCV(cv *Key, m *[16]uint32, counter uint64, n, flags uint32) Key {
	s0, s1, s2, s3, s4, s5, s6, s7 := cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7]
	s8, s9, s10, s11 := iv[0], iv[1], iv[2], iv[3]
	s12, s13, s14, s15 := uint32(counter), uint32(counter>>32), n, flags
	m0, m1, m2, m3, m4, m5, m6, m7 := m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]
	m8, m9, m10, m11, m12, m13, m14, m15 := m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]
	for r := 0; r < 7; r++ {
		// Columns.
		s0, s4, s8, s12 = g(s0, s4, s8, s12, m0, m1)
		s1, s5, s9, s13 = g(s1, s5, s9, s13, m2, m3)
		s2, s6, s10, s14 = g(s2, s6, s10, s14, m4, m5)
		s3, s7, s11, s15 = g(s3, s7, s11, s15, m6, m7)
		// Diagonals.
		s0, s5, s10, s15 = g(s0, s5, s10, s15, m8, m9)
		s1, s6, s11, s12 = g(s1, s6, s11, s12, m10, m11)
		s2, s7, s8, s13 = g(s2, s7, s8, s13, m12, m13)
		s3, s4, s9, s14 = g(s3, s4, s9, s14, m14, m15)
		// The message permutation 2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8.
		m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 =
			m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8
	}
	return Key{s0 ^ s8, s1 ^ s9, s2 ^ s10, s3 ^ s11, s4 ^ s12, s5 ^ s13, s6 ^ s14, s7 ^ s15}
}

func g(a, b, c, d, mx, my uint32) (uint32, uint32, uint32, uint32) {
	a += b + mx
	d = bits.RotateLeft32(d^a, -16)
	c += d
	b = bits.RotateLeft32(b^c, -12)
	a += b + my
	d = bits.RotateLeft32(d^a, -8)
	c += d
	b = bits.RotateLeft32(b^c, -7)
	return a, b, c, d
}
