package ledger

import (
	"errors"
	"fmt"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/b3"
	"github.com/capkernel/capkernel/jcs"
)

// Key-derivation contexts. Distinct keys for leaves and interior nodes give
// the Merkle tree the domain separation RFC 9162 gets from its 0x00/0x01
// prefixes.
const (
	leafContext = "capkernel ledger v1 leaf"
	nodeContext = "capkernel ledger v1 node"
)

// ZeroHash is the prev_hash of entry 0 and the head hash of an empty ledger.
const ZeroHash = digest.Prefix + "0000000000000000000000000000000000000000000000000000000000000000"

var (
	leafKey, nodeKey [32]byte
	leafKeyWords     b3.Key // leafKey, for record prefixes (recordPrefix)
	// A blake3.Hasher carries an 8 KiB buffer; pooling keyed hashers keeps
	// hashing allocation-free.
	leafHashers, nodeHashers sync.Pool
)

func init() {
	blake3.DeriveKey(leafContext, nil, leafKey[:])
	blake3.DeriveKey(nodeContext, nil, nodeKey[:])
	leafKeyWords = b3.KeyOf(&leafKey)
	leafHashers.New = keyedHasher(leafKey)
	nodeHashers.New = keyedHasher(nodeKey)
	nodeHashers.New().(*blake3.Hasher).Sum(emptyRoot[:0])
}

func keyedHasher(key [32]byte) func() any {
	return func() any {
		h, err := blake3.NewKeyed(key[:])
		if err != nil {
			// NewKeyed fails only for keys that are not 32 bytes long.
			panic("ledger: " + err.Error())
		}
		return h
	}
}

// EntryHash returns the entry_hash of e: keyed BLAKE3 (leaf key) over the
// RFC 8785 canonical JSON of e without its entry_hash. e.Hash is ignored.
// e.Body is canonicalized first; it must be a JSON object, and the other
// fields must have the formats described in the package comment.
func EntryHash(e Entry) (string, error) {
	body, err := canonicalBody(e.Body)
	if err != nil {
		return "", fmt.Errorf("ledger: entry hash: %w", err)
	}
	e.Body = body
	if err := checkFields(&e); err != nil {
		return "", fmt.Errorf("ledger: entry hash: %w", err)
	}
	var sum [32]byte
	hashEntry(&sum, &e)
	return digest.Format(sum), nil
}

// hashEntry sets sum to the entry hash of e, whose fields must already be
// checked and whose body must be canonical.
func hashEntry(sum *[32]byte, e *Entry) {
	buf := appendPreimage(nil, e)
	h := leafHashers.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(buf)
	h.Sum(sum[:0])
	leafHashers.Put(h)
}

// NodeHash returns the hash of a Merkle tree node: keyed BLAKE3 (node key)
// over exactly the 64 bytes left || right.
func NodeHash(left, right [32]byte) [32]byte {
	h := nodeHashers.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(left[:])
	h.Write(right[:])
	var sum [32]byte
	h.Sum(sum[:0])
	nodeHashers.Put(h)
	return sum
}

// canonicalBody returns the RFC 8785 form of body, which must be a JSON
// object.
func canonicalBody(body []byte) ([]byte, error) {
	c, err := jcs.Canonicalize(body)
	if err != nil {
		return nil, fmt.Errorf("body: %v", err)
	}
	if len(c) == 0 || c[0] != '{' {
		return nil, errors.New("body is not a JSON object")
	}
	return c, nil
}
