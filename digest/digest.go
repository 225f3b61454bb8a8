// Package digest names content by its BLAKE3-256 hash in the textual form
// "blake3:<64 lowercase hex digits>" used throughout capkernel's wire formats.
//
// Sum is plain (unkeyed) BLAKE3, so anyone can recompute a digest with any
// BLAKE3 implementation (for example `b3sum`). JSON hashes the RFC 8785
// canonical form of a JSON text, which is how args_hash and result_hash are
// defined.
package digest

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/jcs"
)

// Prefix starts every digest string.
const Prefix = "blake3:"

// Size is the length in bytes of a BLAKE3-256 digest.
const Size = 32

// Sum returns the digest string of b.
func Sum(b []byte) string {
	s := blake3.Sum256(b)
	return Format(s)
}

// Format renders raw digest bytes as a digest string.
func Format(sum [Size]byte) string {
	var buf [len(Prefix) + 2*Size]byte
	copy(buf[:], Prefix)
	hex.Encode(buf[len(Prefix):], sum[:])
	return string(buf[:])
}

// JSON returns the digest of the RFC 8785 canonical form of the JSON text raw.
// It fails if raw is not valid I-JSON (for example, duplicate object keys).
func JSON(raw []byte) (string, error) {
	c, err := jcs.Canonicalize(raw)
	if err != nil {
		return "", err
	}
	return Sum(c), nil
}

// Parse returns the raw bytes of a digest string, or an error naming s if it
// is not of the form "blake3:<64 lowercase hex digits>".
func Parse(s string) ([Size]byte, error) {
	var out [Size]byte
	h, ok := strings.CutPrefix(s, Prefix)
	if !ok || len(h) != 2*Size || strings.ToLower(h) != h {
		return out, fmt.Errorf("digest: %q is not of the form blake3:<64 lowercase hex>", s)
	}
	if _, err := hex.Decode(out[:], []byte(h)); err != nil {
		return out, fmt.Errorf("digest: %q: %v", s, err)
	}
	return out, nil
}
