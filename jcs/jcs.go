// Package jcs implements the JSON Canonicalization Scheme of RFC 8785: the
// one byte sequence that every conforming implementation, in any language,
// produces for a given JSON value. capkernel hashes canonical JSON
// (args_hash, result_hash, ledger bodies), so a third party can recompute
// every hash.
//
// The input must be I-JSON (RFC 7493): valid UTF-8, no lone surrogates in
// \u escapes, no duplicate member names (compared after unescaping), and
// numbers that are finite IEEE-754 doubles. Canonicalize refuses anything
// else, and nesting deeper than MaxDepth, with an error naming the offset.
//
// The output: no whitespace; members sorted by the UTF-16 code units of
// their names (RFC 8785 §3.2.3); strings with only the mandatory escapes
// (\" \\ \b \f \n \r \t, other control characters as \u00xx) and all other
// characters literal; numbers as ECMAScript's Number.prototype.toString
// prints them (§3.2.2.3): shortest round-trip digits, exponent form when the
// decimal exponent is at least 21 or at most -7, -0 as 0.
package jcs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds the nesting of arrays and objects.
const MaxDepth = 1000

// Canonicalize returns the RFC 8785 canonical form of the JSON text data.
func Canonicalize(data []byte) ([]byte, error) {
	p := parser{in: data, out: make([]byte, 0, len(data))}
	return p.document()
}

// document canonicalizes p.in, one JSON value with white space around.
func (p *parser) document() ([]byte, error) {
	p.skipSpace()
	if p.pos == len(p.in) {
		return nil, p.errorf("empty input")
	}
	if err := p.value(0); err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return nil, p.errorf("data after the JSON value")
	}
	return p.out, nil
}

// CanonicalizeExact is Canonicalize refusing, besides, a number whose
// decimal value is not that of its canonical form: one with more digits
// than the shortest form of its double keeps (9007199254740993, whose
// form is 9007199254740992; 2^60, 1152921504606846976, a double itself,
// whose form is 1152921504606847000), while 1.0 and 0.10 (forms 1 and
// 0.1) pass. RFC 8785 rewrites such a number, as RFC 7493 (I-JSON)
// allows of input it advises against; where the text is acted on too (a
// syscall's args), the record would hash and audit another decimal than
// the one sent, which an integer reader takes for another number.
func CanonicalizeExact(data []byte) ([]byte, error) {
	p := parser{in: data, out: make([]byte, 0, len(data)), exact: true}
	return p.document()
}

// Marshal encodes v with encoding/json and returns its canonical form.
func Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return Canonicalize(b)
}

type parser struct {
	in    []byte
	pos   int
	out   []byte
	exact bool // refuse numbers that are not the decimal of their canonical form (CanonicalizeExact)
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("jcs: %s at offset %d", fmt.Sprintf(format, args...), p.pos)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) error {
	p.skipSpace()
	if p.pos == len(p.in) {
		return p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return err
		}
		p.out = AppendString(p.out, s)
		return nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
				p.pos += len(lit)
				p.out = append(p.out, lit...)
				return nil
			}
		}
		return p.errorf("invalid character %q", c)
	}
}

func (p *parser) array(depth int) error {
	if depth > MaxDepth {
		return p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // [
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		return nil
	}
	for {
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos == len(p.in) {
			return p.errorf("unterminated array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
			p.out = append(p.out, ',')
		case ']':
			p.pos++
			p.out = append(p.out, ']')
			return nil
		default:
			return p.errorf("expected , or ] in array")
		}
	}
}

// member is one serialized "name":value of an object, at out[start:end].
type member struct {
	name       string
	start, end int
	offset     int // input offset of the name, for errors
}

func (p *parser) object(depth int) error {
	if depth > MaxDepth {
		return p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // {
	p.out = append(p.out, '{')
	base := len(p.out)
	var members []member
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '}')
		return nil
	}
	for {
		p.skipSpace()
		if p.pos == len(p.in) || p.in[p.pos] != '"' {
			return p.errorf("expected a member name")
		}
		m := member{offset: p.pos, start: len(p.out)}
		name, err := p.str()
		if err != nil {
			return err
		}
		m.name = name
		p.skipSpace()
		if p.pos == len(p.in) || p.in[p.pos] != ':' {
			return p.errorf("expected : after member name")
		}
		p.pos++
		p.out = AppendString(p.out, name)
		p.out = append(p.out, ':')
		if err := p.value(depth); err != nil {
			return err
		}
		m.end = len(p.out)
		members = append(members, m)
		p.skipSpace()
		if p.pos == len(p.in) {
			return p.errorf("unterminated object")
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.in[p.pos] != ',' {
			return p.errorf("expected , or } in object")
		}
		p.pos++
	}
	sorted := slices.IsSortedFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	if !sorted {
		slices.SortStableFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	}
	for i := 1; i < len(members); i++ {
		if members[i].name == members[i-1].name {
			return fmt.Errorf("jcs: duplicate key %q at offset %d", members[i].name, max(members[i].offset, members[i-1].offset))
		}
	}
	if sorted {
		p.out = joinMembers(p.out, members, nil)
	} else {
		tmp := slices.Clone(p.out[base:])
		p.out = joinMembers(p.out[:base], members, tmp)
	}
	p.out = append(p.out, '}')
	return nil
}

// joinMembers lays out members, comma-separated, after out. With src nil
// the members are in place and only commas are missing; members were
// written back to back, so insert commas from the end.
func joinMembers(out []byte, members []member, src []byte) []byte {
	if src != nil {
		base := members[0].start
		for _, m := range members {
			base = min(base, m.start)
		}
		for i, m := range members {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, src[m.start-base:m.end-base]...)
		}
		return out
	}
	if len(members) < 2 {
		return out
	}
	out = append(out, make([]byte, len(members)-1)...)
	w := len(out)
	for i := len(members) - 1; i >= 0; i-- {
		m := members[i]
		n := m.end - m.start
		w -= n
		copy(out[w:], out[m.start:m.end])
		if i > 0 {
			w--
			out[w] = ','
		}
	}
	return out
}

// compareUTF16 orders strings by their UTF-16 code units.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := units(ra), units(rb)
			if ua[0] != ub[0] {
				return int(ua[0]) - int(ub[0])
			}
			return int(ua[1]) - int(ub[1])
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

func units(r rune) [2]uint16 {
	if r < 0x10000 {
		return [2]uint16{uint16(r), 0}
	}
	hi, lo := utf16.EncodeRune(r)
	return [2]uint16{uint16(hi), uint16(lo)}
}

// str parses a JSON string at p.pos and returns its value.
func (p *parser) str() (string, error) {
	p.pos++ // "
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		if c == '"' {
			s := p.in[start:p.pos]
			if !utf8.Valid(s) {
				return "", p.errorf("invalid UTF-8 in string")
			}
			p.pos++
			return string(s), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		p.pos++
	}
	buf := append([]byte(nil), p.in[start:p.pos]...)
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			if !utf8.Valid(buf) {
				return "", p.errorf("invalid UTF-8 in string")
			}
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("control character in string")
		case c != '\\':
			buf = append(buf, c)
			p.pos++
			continue
		}
		if p.pos+1 >= len(p.in) {
			break
		}
		e := p.in[p.pos+1]
		p.pos += 2
		if c, ok := unescaped(e); ok {
			buf = append(buf, c)
			continue
		}
		if e != 'u' {
			return "", p.errorf("invalid escape \\%c", e)
		}
		r, err := p.hex4()
		if err != nil {
			return "", err
		}
		if utf16.IsSurrogate(r) {
			if r >= 0xDC00 || p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
				return "", p.errorf("lone surrogate \\u%04x", r)
			}
			p.pos += 2
			lo, err := p.hex4()
			if err != nil {
				return "", err
			}
			if lo < 0xDC00 || lo > 0xDFFF {
				return "", p.errorf("lone surrogate \\u%04x", r)
			}
			r = utf16.DecodeRune(r, lo)
		}
		buf = utf8.AppendRune(buf, r)
	}
	return "", p.errorf("unterminated string")
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(p.in[p.pos:p.pos+4]), 16, 16)
	if err != nil {
		return 0, p.errorf("invalid \\u escape")
	}
	p.pos += 4
	return rune(v), nil
}

// AppendString appends s as a JSON string with RFC 8785's escaping. s
// must be valid UTF-8 (see AppendGoString).
func AppendString(out []byte, s string) []byte {
	out = append(out, '"')
	out = appendEscaped(out, s)
	return append(out, '"')
}

// AppendGoString appends s as json.Marshal followed by Canonicalize writes
// it: as AppendString, except that each byte of s that does not begin a
// valid UTF-8 sequence is written as U+FFFD, as encoding/json replaces it.
// The kernel encodes its own records with it, once, in canonical form.
func AppendGoString(out []byte, s string) []byte {
	if utf8.ValidString(s) {
		return AppendString(out, s)
	}
	out = append(out, '"')
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = appendEscaped(out, s[:n])
		}
		s = s[n:]
	}
	return append(out, '"')
}

// appendEscaped appends s with RFC 8785's escaping, without quotes.
func appendEscaped(out []byte, s string) []byte {
	// Runs of bytes written as they are are copied whole.
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = AppendEscapedByte(append(out, s[start:i]...), c)
		start = i + 1
	}
	return append(out, s[start:]...)
}

// AppendEscapedByte appends RFC 8785's escape of c, a byte a JSON string
// cannot hold as it is (", \ or a control character below 0x20): \", \\,
// the short escapes \b \f \n \r \t, else \u00xx in lowercase hex. These
// are also the bytes encoding/json writes for c.
func AppendEscapedByte(out []byte, c byte) []byte {
	const hex = "0123456789abcdef"
	switch c {
	case '"', '\\':
		return append(out, '\\', c)
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	return append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
}

// number parses a JSON number at p.pos and appends its canonical form.
func (p *parser) number() error {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	intStart := p.pos
	if n := digits(); n == 0 {
		return p.errorf("invalid number")
	} else if n > 1 && p.in[intStart] == '0' {
		return p.errorf("number with a leading zero")
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	in := p.in[start:p.pos]
	f, err := strconv.ParseFloat(string(in), 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("jcs: number %s at offset %d is not a finite IEEE-754 double", in, start)
	}
	n := len(p.out)
	p.out = AppendNumber(p.out, f)
	if out := p.out[n:]; p.exact && !bytes.Equal(out, in) && !sameDecimal(out, in) {
		return fmt.Errorf("jcs: number %s at offset %d is not the decimal its canonical form %s is (it has more digits than a double's shortest form keeps): send it as a string", in, start, out)
	}
	return nil
}

// sameDecimal reports whether the JSON numbers a and b (valid number
// text) have the same decimal value: 1.0, 1e0 and 10e-1 have, while
// 9007199254740993 and the double it is read as, 9007199254740992, have
// not.
func sameDecimal(a, b []byte) bool {
	an, ad, ae := decimal(a)
	bn, bd, be := decimal(b)
	if ad == "" || bd == "" {
		return ad == bd // zero, of either sign
	}
	return an == bn && ad == bd && ae == be
}

// decimal returns the value of the JSON number text s as a sign, its
// significant digits (no leading or trailing zeros; "" for zero) and the
// power of ten of the last of them. The exponent saturates far beyond any
// double's, so that a huge one neither overflows nor equals another.
func decimal(s []byte) (neg bool, digits string, exp int64) {
	if s[0] == '-' {
		neg, s = true, s[1:]
	}
	var d []byte
	i := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		d = append(d, s[i])
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			d = append(d, s[i])
			exp--
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		sign := int64(1)
		if s[i] == '+' || s[i] == '-' {
			if s[i] == '-' {
				sign = -1
			}
			i++
		}
		var e int64
		for ; i < len(s); i++ {
			if e < 1e9 {
				e = e*10 + int64(s[i]-'0')
			}
		}
		exp += sign * e
	}
	for len(d) > 0 && d[0] == '0' {
		d = d[1:]
	}
	for len(d) > 0 && d[len(d)-1] == '0' {
		d, exp = d[:len(d)-1], exp+1
	}
	return neg, string(d), exp
}

// AppendNumber appends f as ECMAScript's Number.prototype.toString prints
// it (RFC 8785 §3.2.2.3). f must be finite.
func AppendNumber(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0')
	}
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	// Shortest round-trip digits d1d2…dk and exponent: f = 0.d1…dk × 10^n.
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	mant, exp, _ := bytes.Cut(e, []byte("e"))
	var dbuf [24]byte
	digits := dbuf[:0]
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	x := 0
	for _, c := range exp[1:] {
		x = x*10 + int(c-'0')
	}
	if exp[0] == '-' {
		x = -x
	}
	n, k := x+1, len(digits)
	switch {
	case k <= n && n <= 21:
		out = append(out, digits...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		out = append(out, digits[:n]...)
		out = append(out, '.')
		out = append(out, digits[n:]...)
	case -6 < n && n <= 0:
		out = append(out, '0', '.')
		for range -n {
			out = append(out, '0')
		}
		out = append(out, digits...)
	default:
		out = append(out, digits[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, digits[1:]...)
		}
		out = append(out, 'e')
		if n-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, int64(n-1), 10)
	}
	return out
}
