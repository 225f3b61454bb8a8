package jsonpack

import (
	"encoding/binary"
)

// The functions below append the tokens of a packed value piece by piece,
// for callers that pack parts of one value at different times: the ledger
// packs an entry's body before its transaction and the fields around it
// (hashes, seq, time) inside. A packed value is Tag followed by the tokens
// of exactly one JSON value; the tokens these functions append unpack to
// the JSON text their documentation names.

// AppendValue appends the tokens of the JSON value src (no Tag) and
// reports whether it could: src must be JSON text without whitespace
// between tokens that its tokens unpack to byte for byte (checked). On
// false dst is returned unchanged.
func AppendValue(dst, src []byte) ([]byte, bool) {
	start := len(dst)
	e := encoder{src: src, out: dst}
	if len(src) == 0 || !e.value(0) || e.pos != len(src) {
		return dst[:start], false
	}
	if !unpacksTo(e.out[start:], 0, src) {
		return dst[:start], false
	}
	return e.out, true
}

// AppendObject appends the start of an object: members (AppendName and a
// value each) follow, then AppendEnd. It unpacks to "{" and the members
// separated by commas.
func AppendObject(dst []byte) []byte { return append(dst, opObj) }

// AppendEnd ends the innermost object: "}".
func AppendEnd(dst []byte) []byte { return append(dst, opEnd) }

// AppendName appends a member name: the JSON string "name" (name is
// written between the quotes as is, so it must need no escaping), then
// ":".
func AppendName(dst []byte, name string) []byte {
	e := encoder{out: dst}
	e.name([]byte(name))
	return e.out
}

// AppendString appends a string value: the JSON string "s", s written as
// is (it must need no escaping).
func AppendString(dst []byte, s string) []byte {
	e := encoder{out: dst}
	e.text([]byte(s))
	return e.out
}

// AppendUint appends the number v in decimal.
func AppendUint(dst []byte, v uint64) []byte {
	if v <= smallMax {
		return append(dst, opSmall+byte(v))
	}
	return binary.AppendUvarint(append(dst, opUint), v)
}

// AppendDigest appends the string "blake3:<lowercase hex of d>".
func AppendDigest(dst []byte, d *[32]byte) []byte {
	return append(append(dst, opDigest), d[:]...)
}
