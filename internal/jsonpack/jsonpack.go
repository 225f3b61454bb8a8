// Package jsonpack is a lossless compact storage form for JSON text: what
// capkernel keeps in bbolt (ledger records, audit payloads, result
// envelopes) takes about half the bytes, and Unpack gives back the exact
// bytes that were packed. It changes nothing that is hashed, signed or
// exported: those are the unpacked bytes.
//
// A packed value is the byte Tag followed by one JSON value as a stream
// of tokens: no punctuation (the decoder writes the commas and colons),
// one byte for a member name or string in a fixed dictionary, and binary
// forms for strings the kernel writes many of: "blake3:<64 lowercase hex>"
// digests (33 bytes instead of 73), canonical lowercase UUIDs (17 instead
// of 38), RFC 3339 UTC times, lowercase hex strings and integers.
// docs/formats.md ("Storage encoding") specifies the tokens.
//
// Pack stores its input as is when it cannot pack it byte for byte (JSON
// text with whitespace between tokens, anything that is not JSON) or when
// packing does not save bytes; Unpack returns a value that does not start
// with Tag as is. JSON text never starts with Tag (a control character),
// so values stored before packing existed read back unchanged.
package jsonpack

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/capkernel/capkernel/jcs"
)

// Tag is the first byte of a packed value of format version 1 (dictionary
// dictV1).
const Tag byte = 0x01

// Token bytes. In value position, a byte below opShort is dictionary
// string i, a byte in [opShort, opSmall) a string of up to 63 bytes that
// follow, a byte in [opSmall, opStr) an integer 0..31. In member name
// position the dictionary and short string bytes, opStr and opEnd are
// valid.
const (
	maxDict  = 0x80
	opShort  = 0x80 // +n: string of n < 64 bytes (the text between the quotes)
	opSmall  = 0xC0 // +n: integer n < 32
	opStr    = 0xE0 // varint n, n bytes: string
	opUint   = 0xE1 // uvarint v: integer v
	opNeg    = 0xE2 // uvarint v: integer -v
	opNum    = 0xE3 // uvarint n, n bytes: any other number, as written
	opNull   = 0xE4
	opTrue   = 0xE5
	opFalse  = 0xE6
	opObj    = 0xE7 // members (name, value) until opEnd
	opArr    = 0xE8 // values until opEnd
	opEnd    = 0xE9
	opDigest = 0xEA // 32 bytes: "blake3:" and their lowercase hex
	opUUID   = 0xEB // 16 bytes: canonical lowercase UUID text
	opHex    = 0xEC // uvarint n, n bytes: their 2n lowercase hex digits
	opTime   = 0xED // 1 byte d ≤ 9, varint seconds since 1970, uvarint f: RFC 3339 UTC with d fraction digits
	opSuffix = 0xEE // uvarint n, n bytes, 32 bytes: the n bytes, then "blake3:" and the hex of the 32
	opRaw    = 0xEF // right after Tag only: the rest of the value, as is
	opRef    = 0xF0 // uvarint o: the string whose opShort or opStr token is at byte o of the value, again
	shortMax = opSmall - opShort - 1
	smallMax = opStr - opSmall - 1
)

const digestPrefix = "blake3:"

// maxDepth bounds the nesting of packed values: Pack stores deeper ones
// as is, Unpack refuses them (the decoder keeps its containers in the bits
// of a uint64).
const maxDepth = 64

// Pack appends the stored form of src to dst: src packed when it is JSON
// text without whitespace between tokens and the packed form is shorter
// and unpacks to exactly src, else src itself (or, for the src that start
// with Tag, which no JSON text does, Tag, opRaw and src). It never fails.
// It checks its own output by unpacking it, so Unpack(Pack(b)) == b for
// every b.
func Pack(dst, src []byte) []byte { return pack(dst, src, false) }

// PackRefs is Pack, except that a string value of at least refMin bytes
// that repeats an earlier string value is stored as a reference to it
// (opRef). Audit payloads name a call's path up to four times (args,
// policy input, result); entropy coding without match finding cannot
// shorten such repeats, references do.
func PackRefs(dst, src []byte) []byte { return pack(dst, src, true) }

func pack(dst, src []byte, refs bool) []byte {
	if len(src) > 0 && src[0] == Tag {
		return append(append(dst, Tag, opRaw), src...)
	}
	if len(src) == 0 {
		return dst
	}
	start := len(dst)
	e := encoder{src: src, out: append(dst, Tag), start: start, refs: refs}
	if refs {
		sp := seenBufs.Get().(*[]refString)
		e.seen = (*sp)[:0]
		defer func() {
			clear(e.seen) // let go of src
			*sp = e.seen[:0]
			seenBufs.Put(sp)
		}()
	}
	if e.value(0) && e.pos == len(src) && len(e.out)-start < len(src) && unpacksTo(e.out[start:], 1, src) {
		return e.out
	}
	return append(e.out[:start], src...)
}

// scratch holds the buffers Pack and AppendValue unpack their output into
// to check it: the check runs on every value stored, and its unpacked copy
// is thrown away.
var scratch = sync.Pool{New: func() any { return new([]byte) }}

// unpacksTo reports whether the tokens of in from pos (one value, ending
// in) unpack to exactly src.
func unpacksTo(in []byte, pos int, src []byte) bool {
	bp := scratch.Get().(*[]byte)
	d := decoder{in: in, pos: pos, out: (*bp)[:0]}
	ok := d.run() == nil && bytes.Equal(d.out, src)
	if cap(d.out) <= 1<<20 { // a rare huge value's buffer is not kept
		*bp = d.out[:0]
		scratch.Put(bp)
	}
	return ok
}

// Packed reports whether v is a packed value (starts with Tag).
func Packed(v []byte) bool { return len(v) > 0 && v[0] == Tag }

// Unpack appends the JSON text of the stored value v to dst: v itself when
// it does not start with Tag, else its packed value decoded. A packed value
// that does not decode (truncated, an unknown token, bytes after the
// value) is an error naming what is wrong, never a panic; it decodes
// nothing else, so callers still check what they read (a ledger record's
// hash, a payload's commitments).
func Unpack(dst, v []byte) ([]byte, error) {
	if !Packed(v) {
		return append(dst, v...), nil
	}
	if len(v) > 1 && v[1] == opRaw {
		return append(dst, v[2:]...), nil
	}
	d := decoder{in: v, pos: 1, out: slices.Grow(dst, 3*len(v))}
	if err := d.run(); err != nil {
		return dst, fmt.Errorf("jsonpack: packed value of %d bytes, at byte %d: %w", len(v), d.pos, err)
	}
	return d.out, nil
}

// encoder packs src from pos into out.
type encoder struct {
	src   []byte
	pos   int
	out   []byte
	start int // where the value starts in out (its Tag)

	// With refs set, a string value equal to one of seen is stored as
	// opRef; refBytes counts the text references stand for, which must
	// stay within refBudget of the value so far (the decoder enforces it).
	refs     bool
	seen     []refString
	refBytes int
}

// refString is a string value stored as text at byte off of the value.
type refString struct {
	off  int
	text []byte
}

// seenBufs holds the encoder's lists of strings for PackRefs.
var seenBufs = sync.Pool{New: func() any { return new([]refString) }}

// refMin is the shortest string PackRefs stores as a reference (a
// reference takes 2 or 3 bytes); refMax bounds the strings it remembers.
const (
	refMin = 6
	refMax = 64
)

// refBudget bounds the text references stand for: at most refBudget
// times the bytes of the value before the reference. Without a bound a
// damaged value of n bytes could unpack to n² bytes (each 3-byte
// reference repeating the longest string).
const refBudget = 4

// value packs the JSON value at pos; false means src is not JSON this
// encoder packs.
func (e *encoder) value(depth int) bool {
	if e.pos >= len(e.src) {
		return false
	}
	switch c := e.src[e.pos]; {
	case (c == '{' || c == '[') && depth >= maxDepth:
		return false
	case c == '{':
		e.pos++
		e.out = append(e.out, opObj)
		for first := true; ; first = false {
			if e.pos >= len(e.src) {
				return false
			}
			if e.src[e.pos] == '}' {
				e.pos++
				e.out = append(e.out, opEnd)
				return true
			}
			if !first {
				if e.src[e.pos] != ',' {
					return false
				}
				e.pos++
			}
			s, ok := e.str()
			if !ok || e.pos >= len(e.src) || e.src[e.pos] != ':' {
				return false
			}
			e.pos++
			e.name(s)
			if !e.value(depth + 1) {
				return false
			}
		}
	case c == '[':
		e.pos++
		e.out = append(e.out, opArr)
		for first := true; ; first = false {
			if e.pos >= len(e.src) {
				return false
			}
			if e.src[e.pos] == ']' {
				e.pos++
				e.out = append(e.out, opEnd)
				return true
			}
			if !first {
				if e.src[e.pos] != ',' {
					return false
				}
				e.pos++
			}
			if !e.value(depth + 1) {
				return false
			}
		}
	case c == '"':
		s, ok := e.str()
		if ok {
			e.text(s)
		}
		return ok
	case c == 'n':
		return e.literal("null", opNull)
	case c == 't':
		return e.literal("true", opTrue)
	case c == 'f':
		return e.literal("false", opFalse)
	case c == '-' || c >= '0' && c <= '9':
		return e.number()
	}
	return false
}

func (e *encoder) literal(word string, op byte) bool {
	if !bytes.HasPrefix(e.src[e.pos:], []byte(word)) {
		return false
	}
	e.pos += len(word)
	e.out = append(e.out, op)
	return true
}

// str reads the string at pos and returns the bytes between its quotes,
// escapes as written.
func (e *encoder) str() ([]byte, bool) {
	if e.pos >= len(e.src) || e.src[e.pos] != '"' {
		return nil, false
	}
	start := e.pos + 1
	// The closing quote is the first quote after start that no backslash
	// escapes: both are found with IndexByte (text holds a backslash
	// every line, and a byte loop over it was most of packing a payload),
	// the next quote found again only once an escape has passed it.
	q := -1 // a quote at or after i
	for i := start; ; {
		if q < i {
			n := bytes.IndexByte(e.src[i:], '"')
			if n < 0 {
				return nil, false
			}
			q = i + n
		}
		n := bytes.IndexByte(e.src[i:q], '\\')
		if n < 0 {
			e.pos = q + 1
			return e.src[start:q], true
		}
		i += n + 2 // past the escaped byte, which may be the quote at q
	}
}

// name packs a member name.
func (e *encoder) name(s []byte) {
	if i, ok := lookup(s); ok {
		e.out = append(e.out, i)
		return
	}
	e.literalString(s)
}

func (e *encoder) literalString(s []byte) {
	if len(s) <= shortMax {
		e.out = append(e.out, opShort+byte(len(s)))
	} else {
		e.out = append(e.out, opStr)
		e.out = binary.AppendUvarint(e.out, uint64(len(s)))
	}
	e.out = append(e.out, s...)
}

// text packs a string value in its shortest form.
func (e *encoder) text(s []byte) {
	if i, ok := lookup(s); ok {
		e.out = append(e.out, i)
		return
	}
	if len(s) == len(digestPrefix)+64 && bytes.HasPrefix(s, []byte(digestPrefix)) && isHex(s[len(digestPrefix):]) {
		e.out = append(e.out, opDigest)
		e.out, _ = hex.AppendDecode(e.out, s[len(digestPrefix):])
		return
	}
	if u, ok := parseUUID(s); ok {
		e.out = append(e.out, opUUID)
		e.out = append(e.out, u[:]...)
		return
	}
	if d, sec, frac, ok := parseTime(s); ok {
		e.out = append(e.out, opTime, d)
		e.out = binary.AppendVarint(e.out, sec)
		e.out = binary.AppendUvarint(e.out, frac)
		return
	}
	if len(s) >= 8 && len(s)%2 == 0 && isHex(s) {
		e.out = append(e.out, opHex)
		e.out = binary.AppendUvarint(e.out, uint64(len(s)/2))
		e.out, _ = hex.AppendDecode(e.out, s)
		return
	}
	const tail = len(digestPrefix) + 64
	if n := len(s) - tail; n > 0 && bytes.HasPrefix(s[n:], []byte(digestPrefix)) && isHex(s[n+len(digestPrefix):]) {
		e.out = append(e.out, opSuffix)
		e.out = binary.AppendUvarint(e.out, uint64(n))
		e.out = append(e.out, s[:n]...)
		e.out, _ = hex.AppendDecode(e.out, s[n+len(digestPrefix):])
		return
	}
	if e.refs && len(s) >= refMin && e.ref(s) {
		return
	}
	e.literalString(s)
}

// ref stores s as a reference to an earlier string value equal to it and
// reports whether it did; else it remembers where s is about to be stored.
func (e *encoder) ref(s []byte) bool {
	at := len(e.out) - e.start
	for _, r := range e.seen {
		if bytes.Equal(r.text, s) {
			if e.refBytes+len(s) > refBudget*at {
				return false
			}
			e.refBytes += len(s)
			e.out = binary.AppendUvarint(append(e.out, opRef), uint64(r.off))
			return true
		}
	}
	if len(e.seen) < refMax {
		e.seen = append(e.seen, refString{at, s})
	}
	return false
}

// number packs the number at pos: integers without leading zeros in binary,
// anything else as written (Pack's final check rejects what is not JSON).
func (e *encoder) number() bool {
	start := e.pos
	for e.pos < len(e.src) {
		c := e.src[e.pos]
		if !(c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
			break
		}
		e.pos++
	}
	s := e.src[start:e.pos]
	neg := s[0] == '-'
	digits := s
	if neg {
		digits = s[1:]
	}
	if v, ok := parseUint(digits); ok && !(neg && v == 0) {
		switch {
		case neg:
			e.out = append(e.out, opNeg)
			e.out = binary.AppendUvarint(e.out, v)
		case v <= smallMax:
			e.out = append(e.out, opSmall+byte(v))
		default:
			e.out = append(e.out, opUint)
			e.out = binary.AppendUvarint(e.out, v)
		}
		return true
	}
	e.out = append(e.out, opNum)
	e.out = binary.AppendUvarint(e.out, uint64(len(s)))
	e.out = append(e.out, s...)
	return true
}

// parseUint parses decimal digits without a leading zero (but "0") that
// fit in a uint64.
func parseUint(s []byte) (uint64, bool) {
	if len(s) == 0 || len(s) > 19 || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	var v uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// isHex reports whether s is lowercase hex digits only. It tests 16 bytes
// at a time without a branch per byte (a digit maps to its value, anything
// else to 0xff, whose high bits survive the OR), and stops at the first
// block with a non-digit: most text fails in its first.
func isHex(s []byte) bool {
	for len(s) > 0 {
		n := min(len(s), 16)
		var bad byte
		for _, c := range s[:n] {
			bad |= unhex[c]
		}
		if bad > 0x0f {
			return false
		}
		s = s[n:]
	}
	return true
}

// parseUUID parses a canonical lowercase UUID (8-4-4-4-12 hex digits).
func parseUUID(s []byte) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	j := 0
	for i := 0; i < 36; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
			continue
		}
		hi, lo := unhex[s[i]], unhex[s[i+1]]
		if hi|lo > 0x0f {
			return u, false
		}
		u[j] = hi<<4 | lo
		i, j = i+2, j+1
	}
	return u, true
}

// unhex maps lowercase hex digits to their value, other bytes to 0xff.
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()

// parseTime parses "YYYY-MM-DDTHH:MM:SS[.F]Z" (F of 1 to 9 digits), a
// valid time from year 0 to 9999, into its fraction digit count, seconds
// since 1970 and fraction. Packing checks the whole value round trips, so
// this may accept what formatTime would write otherwise.
func parseTime(s []byte) (d byte, sec int64, frac uint64, ok bool) {
	if len(s) < 20 || len(s) > 30 || s[len(s)-1] != 'Z' {
		return 0, 0, 0, false
	}
	if s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return 0, 0, 0, false
	}
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	var f [6]int
	for i, r := range [][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		v, good := num(s[r[0]:r[1]])
		if !good {
			return 0, 0, 0, false
		}
		f[i] = v
	}
	rest := s[19 : len(s)-1]
	if len(rest) > 0 {
		if len(rest) < 2 || rest[0] != '.' {
			return 0, 0, 0, false
		}
		v, good := num(rest[1:])
		if !good {
			return 0, 0, 0, false
		}
		d, frac = byte(len(rest)-1), uint64(v)
	}
	t := time.Date(f[0], time.Month(f[1]), f[2], f[3], f[4], f[5], 0, time.UTC)
	if t.Year() != f[0] || int(t.Month()) != f[1] || t.Day() != f[2] || t.Hour() != f[3] || t.Minute() != f[4] || t.Second() != f[5] {
		return 0, 0, 0, false
	}
	return d, t.Unix(), frac, true
}

// Seconds of 0000-01-01 and of 10000-01-01, the range of four-digit years.
var (
	minSec = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxSec = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
)

var pow10 = [...]uint64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// decoder unpacks in from pos into out.
type decoder struct {
	in  []byte
	pos int
	out []byte
	// depth counts the open containers; bit i of objects is set when
	// the container at depth i+1 is an object. first says whether the
	// innermost one has no element yet.
	depth   int
	objects uint64
	first   bool

	refBytes int // the text opRef tokens stood for so far (refBudget)

	// With check set, the decoder vouches for the RFC 8785 canonical form
	// of what it writes where it can (canonical.go): it sets unsure
	// wherever it cannot, and the caller then checks the output itself.
	check  bool
	unsure bool
	prev   [maxDepth][]byte // the last member name of each open object
	named  uint64           // bit i: prev[i] is set
}

var (
	errTruncated = errors.New("truncated")
	errTrailing  = errors.New("bytes after the value")
)

func (d *decoder) byte() (byte, error) {
	if d.pos >= len(d.in) {
		return 0, errTruncated
	}
	c := d.in[d.pos]
	d.pos++
	return c, nil
}

func (d *decoder) bytes(n uint64) ([]byte, error) {
	if n > uint64(len(d.in)-d.pos) {
		return nil, errTruncated
	}
	b := d.in[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

func (d *decoder) uvarint() (uint64, error) {
	v, n := binary.Uvarint(d.in[d.pos:])
	if n <= 0 {
		return 0, errors.New("malformed varint")
	}
	d.pos += n
	return v, nil
}

// run decodes one value, which must end the input.
func (d *decoder) run() error {
	if err := d.value(); err != nil {
		return err
	}
	return d.done()
}

// value decodes one value and its nested values, iteratively so that no
// input can exhaust the stack.
func (d *decoder) value() error {
	for {
		c, err := d.byte()
		if err != nil {
			return err
		}
		inObj := d.depth > 0 && d.objects&(1<<(d.depth-1)) != 0
		if c == opEnd {
			if d.depth == 0 {
				return errors.New("end token outside a container")
			}
			if inObj {
				d.out = append(d.out, '}')
			} else {
				d.out = append(d.out, ']')
			}
			d.depth--
			d.objects &^= 1 << d.depth
			d.first = false
			if d.depth == 0 {
				return nil
			}
			continue
		}
		if d.depth > 0 && !d.first {
			d.out = append(d.out, ',')
		}
		d.first = false
		if inObj {
			var name []byte
			if c < maxDict && int(c) < len(dictV1) {
				d.out = append(d.out, dictNames[c]...)
				name = dictBytes[c]
			} else if name, err = d.name(c); err != nil {
				return err
			} else {
				d.out = append(d.out, ':')
			}
			if d.check {
				d.checkName(name)
			}
			if c, err = d.byte(); err != nil {
				return err
			}
		}
		if c == opObj || c == opArr {
			if d.depth == maxDepth {
				return fmt.Errorf("nesting deeper than %d", maxDepth)
			}
			if c == opObj {
				d.out = append(d.out, '{')
				d.objects |= 1 << d.depth
				d.named &^= 1 << d.depth
			} else {
				d.out = append(d.out, '[')
			}
			d.depth++
			d.first = true
			continue
		}
		if err := d.scalar(c); err != nil {
			return err
		}
		if d.depth == 0 {
			return nil
		}
	}
}

func (d *decoder) done() error {
	if d.pos != len(d.in) {
		return errTrailing
	}
	return nil
}

// name decodes the member name token c and returns the name's text
// between the quotes.
func (d *decoder) name(c byte) ([]byte, error) {
	switch {
	case c < maxDict:
		if err := d.dict(c); err != nil {
			return nil, err
		}
		return dictBytes[c], nil
	case c >= opShort && c < opSmall, c == opStr:
		return d.strText(c)
	}
	return nil, fmt.Errorf("token %#x is not a member name", c)
}

func (d *decoder) dict(c byte) error {
	if int(c) >= len(dictV1) {
		return fmt.Errorf("dictionary entry %d does not exist", c)
	}
	d.out = append(d.out, dictQuoted[c]...)
	return nil
}

// dictQuoted holds the dictionary's strings in quotes, and dictNames
// each followed by a colon.
var dictQuoted, dictNames = func() (q, n [len(dictV1)]string) {
	for i, s := range dictV1 {
		q[i] = `"` + s + `"`
		n[i] = q[i] + ":"
	}
	return q, n
}()

func (d *decoder) str(c byte) error {
	b, err := d.strText(c)
	if err == nil && d.check && !plain(b) {
		d.unsure = true
	}
	return err
}

// strText decodes the string token c and returns its text between the
// quotes.
func (d *decoder) strText(c byte) ([]byte, error) {
	n := uint64(c - opShort)
	if c == opStr {
		var err error
		if n, err = d.uvarint(); err != nil {
			return nil, err
		}
	}
	b, err := d.bytes(n)
	if err != nil {
		return nil, err
	}
	d.out = append(d.out, '"')
	d.out = append(d.out, b...)
	d.out = append(d.out, '"')
	return b, nil
}

// scalar decodes the value token c (not a container).
func (d *decoder) scalar(c byte) error {
	switch {
	case c < maxDict:
		return d.dict(c)
	case c < opSmall:
		return d.str(c)
	case c < opStr:
		d.out = strconv.AppendUint(d.out, uint64(c-opSmall), 10)
		return nil
	}
	switch c {
	case opStr:
		return d.str(c)
	case opUint, opNeg:
		v, err := d.uvarint()
		if err != nil {
			return err
		}
		if c == opNeg {
			d.out = append(d.out, '-')
		}
		d.out = strconv.AppendUint(d.out, v, 10)
		if d.check && (v > maxExact || c == opNeg && v == 0) {
			d.unsure = true
		}
	case opNum:
		n, err := d.uvarint()
		if err != nil {
			return err
		}
		b, err := d.bytes(n)
		if err != nil {
			return err
		}
		d.out = append(d.out, b...)
		if d.check && (len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') || jcs.CheckCanonical(b) != nil) {
			d.unsure = true
		}
	case opNull:
		d.out = append(d.out, "null"...)
	case opTrue:
		d.out = append(d.out, "true"...)
	case opFalse:
		d.out = append(d.out, "false"...)
	case opDigest:
		b, err := d.bytes(32)
		if err != nil {
			return err
		}
		d.out = appendDigest(d.out, (*[32]byte)(b))
	case opUUID:
		b, err := d.bytes(16)
		if err != nil {
			return err
		}
		d.out = append(d.out, '"')
		d.out = appendHex(d.out, b[:4])
		d.out = append(d.out, '-')
		d.out = appendHex(d.out, b[4:6])
		d.out = append(d.out, '-')
		d.out = appendHex(d.out, b[6:8])
		d.out = append(d.out, '-')
		d.out = appendHex(d.out, b[8:10])
		d.out = append(d.out, '-')
		d.out = appendHex(d.out, b[10:])
		d.out = append(d.out, '"')
	case opHex:
		n, err := d.uvarint()
		if err != nil {
			return err
		}
		b, err := d.bytes(n)
		if err != nil {
			return err
		}
		d.out = append(d.out, '"')
		d.out = appendHex(d.out, b)
		d.out = append(d.out, '"')
	case opSuffix:
		n, err := d.uvarint()
		if err != nil {
			return err
		}
		p, err := d.bytes(n)
		if err != nil {
			return err
		}
		if d.check && !plain(p) {
			d.unsure = true
		}
		b, err := d.bytes(32)
		if err != nil {
			return err
		}
		d.out = append(d.out, '"')
		d.out = append(d.out, p...)
		d.out = append(d.out, digestPrefix...)
		d.out = appendHex(d.out, b)
		d.out = append(d.out, '"')
	case opTime:
		return d.time()
	case opRef:
		return d.ref()
	default:
		return fmt.Errorf("unknown token %#x", c)
	}
	return nil
}

// ref decodes an opRef value: the string token it names must start
// before the reference (so references never chain or loop) and decode
// within the value, and the text of all references must stay within
// refBudget times the bytes before each.
func (d *decoder) ref() error {
	at := d.pos - 1
	o, err := d.uvarint()
	if err != nil {
		return err
	}
	if o == 0 || o >= uint64(at) || d.in[o] < opShort || d.in[o] >= opSmall && d.in[o] != opStr {
		return fmt.Errorf("reference to byte %d: no string token there", o)
	}
	r := decoder{in: d.in[:at], pos: int(o) + 1}
	n := uint64(d.in[o] - opShort)
	if d.in[o] == opStr {
		if n, err = r.uvarint(); err != nil {
			return fmt.Errorf("reference to byte %d: %w", o, err)
		}
	}
	b, err := r.bytes(n)
	if err != nil {
		return fmt.Errorf("reference to byte %d: %w", o, err)
	}
	if d.refBytes += len(b); d.refBytes > refBudget*at {
		return fmt.Errorf("references stand for more than %d times the bytes before them", refBudget)
	}
	if d.check && !plain(b) {
		d.unsure = true
	}
	d.out = append(d.out, '"')
	d.out = append(d.out, b...)
	d.out = append(d.out, '"')
	return nil
}

// time decodes an opTime value.
func (d *decoder) time() error {
	digits, err := d.byte()
	if err != nil {
		return err
	}
	sec, n := binary.Varint(d.in[d.pos:])
	if n <= 0 {
		return errors.New("malformed varint")
	}
	d.pos += n
	frac, err := d.uvarint()
	if err != nil {
		return err
	}
	if digits > 9 || frac >= pow10[digits] || sec < minSec || sec >= maxSec {
		return fmt.Errorf("time out of range (%d fraction digits, %d s, fraction %d)", digits, sec, frac)
	}
	days := (sec - minSec) / 86400 // days since 0000-01-01, ≥ 0
	year, month, day := civil(days + minDays)
	s := sec - minSec - days*86400
	hour, minute, second := s/3600, s/60%60, s%60
	// "YYYY-MM-DDTHH:MM:SS.fffffffffZ" in quotes: at most 32 bytes.
	var t [32]byte
	t[0] = '"'
	put(t[1:5], uint64(year))
	t[5] = '-'
	put(t[6:8], uint64(month))
	t[8] = '-'
	put(t[9:11], uint64(day))
	t[11] = 'T'
	put(t[12:14], uint64(hour))
	t[14] = ':'
	put(t[15:17], uint64(minute))
	t[17] = ':'
	put(t[18:20], uint64(second))
	end := 20
	if digits > 0 {
		t[20] = '.'
		put(t[21:21+digits], frac)
		end = 21 + int(digits)
	}
	t[end], t[end+1] = 'Z', '"'
	d.out = append(d.out, t[:end+2]...)
	return nil
}

// put writes v into b as exactly len(b) decimal digits (v < 10^len(b)).
func put(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
}

// minDays is the day of 0000-01-01 counted from 1970-01-01.
var minDays = minSec / 86400

// civil returns the date of day z counted from 1970-01-01 in the proleptic
// Gregorian calendar, by the days-to-civil algorithm of Howard Hinnant
// ("chrono-Compatible Low-Level Date Algorithms").
func civil(z int64) (year, month, day int64) {
	z += 719468 // days since 0000-03-01
	era := z / 146097
	if z < 0 {
		era = (z - 146096) / 146097
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y := yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if month > 12 {
		month -= 12
	}
	if month <= 2 {
		y++
	}
	return y, month, day
}

// appendDigest appends "blake3:<hex of b>" in quotes.
func appendDigest(dst []byte, b *[32]byte) []byte {
	const n = 1 + len(digestPrefix) + 64 + 1
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	out := (*[n]byte)(dst[at:])
	copy(out[:], `"`+digestPrefix)
	h := (*[64]byte)(out[1+len(digestPrefix):])
	for i, c := range b {
		p := hexPairs[c]
		h[2*i], h[2*i+1] = byte(p), byte(p>>8)
	}
	out[n-1] = '"'
	return dst
}

// appendHex appends the lowercase hex digits of b, two at a time.
func appendHex(dst, b []byte) []byte {
	n := len(dst)
	dst = slices.Grow(dst, 2*len(b))[:n+2*len(b)]
	out := dst[n:]
	for i, c := range b {
		binary.LittleEndian.PutUint16(out[2*i:], hexPairs[c])
	}
	return dst
}

// hexPairs holds the two hex digits of every byte, the first in the low
// byte.
var hexPairs = func() (t [256]uint16) {
	const digits = "0123456789abcdef"
	for i := range t {
		t[i] = uint16(digits[i>>4]) | uint16(digits[i&0x0f])<<8
	}
	return t
}()
