package jsonpack

import (
	"bytes"
	"encoding/binary"
)

// The canonical check of a decoder in check mode is conservative: it
// vouches that the text it wrote is in RFC 8785 canonical form only when
// every member name and literal string is printable ASCII without
// escapes (where UTF-16 order is byte order and nothing needs escaping),
// every object's names strictly increase, every integer token is exact
// (at most 2^53) and every other number is canonical by itself
// (jcs.CheckCanonical). Typed strings (dictionary, digest, UUID, hex,
// time) are printable ASCII by construction. Anything else sets unsure,
// and the caller runs jcs.CheckCanonical over the output: vouching never
// replaces a check that could fail (FuzzCanonicalCheck).

// maxExact is the largest integer every canonical number form writes in
// full: above 2^53 an integer token need not be its double's shortest
// form.
const maxExact = 1 << 53

// plainBytes marks the bytes a canonical string holds as themselves and
// that order names as UTF-16 would: printable ASCII but '"' and '\\'.
var plainBytes = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func plain(b []byte) bool {
	// 8 bytes at a time (jcs.CheckCanonical does the same): each test
	// is exact for the word as a whole.
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for ; len(b) >= 8; b = b[8:] {
		w := binary.LittleEndian.Uint64(b)
		zero := func(v uint64) uint64 { return (v - ones) &^ v }
		if (w|(w-0x20*ones)&^w|zero(w^'"'*ones)|zero(w^'\\'*ones))&highs != 0 {
			return false
		}
	}
	for _, c := range b {
		if !plainBytes[c] {
			return false
		}
	}
	return true
}

// dictBytes holds the dictionary's strings as bytes.
var dictBytes = func() (b [len(dictV1)][]byte) {
	for i, s := range dictV1 {
		b[i] = []byte(s)
		if !plain(b[i]) {
			panic("jsonpack: dictionary entry " + s + " is not plain ASCII")
		}
	}
	return b
}()

// checkName checks the member name just written against the one before
// it in the innermost object.
func (d *decoder) checkName(name []byte) {
	level := d.depth - 1
	switch {
	case !plain(name):
		d.unsure = true
	case d.named&(1<<level) != 0 && bytes.Compare(d.prev[level], name) >= 0:
		d.unsure = true
	}
	d.prev[level] = name
	d.named |= 1 << level
}
