package jcs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// CheckCanonical reports whether data is exactly its own RFC 8785 canonical
// form, that is whether Canonicalize(data) would return data unchanged,
// with an error naming the first offset where it is not. It checks in one
// pass and allocates nothing for valid input, so verifiers of records the
// kernel wrote in canonical form need not canonicalize them again.
func CheckCanonical(data []byte) error {
	c := checker{in: data}
	if err := c.value(0); err != nil {
		return err
	}
	if c.pos != len(c.in) {
		return c.errorf("data after the JSON value")
	}
	return nil
}

type checker struct {
	in  []byte
	pos int
}

func (c *checker) errorf(format string, args ...any) error {
	return fmt.Errorf("jcs: not canonical: %s at offset %d", fmt.Sprintf(format, args...), c.pos)
}

func (c *checker) value(depth int) error {
	if c.pos == len(c.in) {
		return c.errorf("unexpected end of input")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		_, _, err := c.str()
		return err
	case b == '-' || b >= '0' && b <= '9':
		return c.number()
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(c.in)-c.pos >= len(lit) && string(c.in[c.pos:c.pos+len(lit)]) == lit {
			c.pos += len(lit)
			return nil
		}
	}
	return c.errorf("invalid character %q", c.in[c.pos])
}

func (c *checker) array(depth int) error {
	if depth > MaxDepth {
		return c.errorf("nesting deeper than %d", MaxDepth)
	}
	c.pos++ // [
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		return nil
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		if c.pos == len(c.in) {
			return c.errorf("unterminated array")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			return nil
		default:
			return c.errorf("expected , or ] in array")
		}
	}
}

func (c *checker) object(depth int) error {
	if depth > MaxDepth {
		return c.errorf("nesting deeper than %d", MaxDepth)
	}
	c.pos++ // {
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		return nil
	}
	var prev []byte // the previous member name, raw (escapes undecoded)
	prevPlain := false
	for i := 0; ; i++ {
		if c.pos == len(c.in) || c.in[c.pos] != '"' {
			return c.errorf("expected a member name")
		}
		at := c.pos
		name, plain, err := c.str()
		if err != nil {
			return err
		}
		if i > 0 {
			var cmp int
			if plain && prevPlain {
				// ASCII without escapes: bytes order as UTF-16 code units.
				cmp = bytes.Compare(prev, name)
			} else {
				cmp = compareRaw(prev, name)
			}
			if cmp == 0 {
				c.pos = at
				return c.errorf("duplicate key")
			} else if cmp > 0 {
				c.pos = at
				return c.errorf("members not in RFC 8785 order")
			}
		}
		prev, prevPlain = name, plain
		if c.pos == len(c.in) || c.in[c.pos] != ':' {
			return c.errorf("expected : after member name")
		}
		c.pos++
		if err := c.value(depth); err != nil {
			return err
		}
		if c.pos == len(c.in) {
			return c.errorf("unterminated object")
		}
		if c.in[c.pos] == '}' {
			c.pos++
			return nil
		}
		if c.in[c.pos] != ',' {
			return c.errorf("expected , or } in object")
		}
		c.pos++
	}
}

// compareRaw compares two member names by the UTF-16 code units of their
// values, given as the raw content of canonical strings. A canonical string
// escapes only '"', '\\' and control characters, so unescaping is needed
// only when a name has a backslash.
func compareRaw(a, b []byte) int {
	if !hasBackslash(a) && !hasBackslash(b) {
		return compareUTF16(unsafe.String(unsafe.SliceData(a), len(a)), unsafe.String(unsafe.SliceData(b), len(b)))
	}
	return compareUTF16(unescape(a), unescape(b))
}

func hasBackslash(s []byte) bool {
	for _, b := range s {
		if b == '\\' {
			return true
		}
	}
	return false
}

// unescape decodes the raw content of a string that str accepted.
func unescape(s []byte) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		i++
		if c, ok := unescaped(s[i]); ok {
			out = append(out, c)
			continue
		}
		// \u00XX: the canonical form escapes only control characters so.
		v, _ := strconv.ParseUint(string(s[i+1:i+5]), 16, 8)
		out = append(out, byte(v))
		i += 4
	}
	return string(out)
}

// str checks a string in canonical form at c.pos and returns its raw
// content: valid UTF-8, no raw control character, and exactly the escapes
// AppendString writes (\" \\ \b \f \n \r \t, \u00xx with lowercase hex for
// the other control characters). plain reports ASCII without escapes.
func (c *checker) str() (raw []byte, plain bool, err error) {
	c.pos++ // "
	start := c.pos
	ascii, escaped := true, false
	for c.pos < len(c.in) {
		// Runs of bytes that stand for themselves, 8 at a time.
		for len(c.in)-c.pos >= 8 && plain8(binary.LittleEndian.Uint64(c.in[c.pos:])) {
			c.pos += 8
		}
		if c.pos == len(c.in) {
			break
		}
		b := c.in[c.pos]
		switch {
		case b == '"':
			s := c.in[start:c.pos]
			if !ascii && !utf8.Valid(s) {
				return nil, false, c.errorf("invalid UTF-8 in string")
			}
			c.pos++
			return s, ascii && !escaped, nil
		case b < 0x20:
			return nil, false, c.errorf("control character in string")
		case b >= 0x80:
			ascii = false
			c.pos++
		case b != '\\':
			c.pos++
		default:
			escaped = true
			if c.pos+1 >= len(c.in) {
				return nil, false, c.errorf("unterminated string")
			}
			switch c.in[c.pos+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				c.pos += 2
			case 'u':
				if !c.controlEscape() {
					return nil, false, c.errorf("escape that RFC 8785 does not write")
				}
				c.pos += 6
			default:
				return nil, false, c.errorf("escape that RFC 8785 does not write")
			}
		}
	}
	return nil, false, c.errorf("unterminated string")
}

// controlEscape reports whether c.pos starts \u00xx (lowercase hex) for a
// control character that has no short escape.
func (c *checker) controlEscape() bool {
	const hexdigits = "0123456789abcdef"
	if len(c.in)-c.pos < 6 || c.in[c.pos+2] != '0' || c.in[c.pos+3] != '0' {
		return false
	}
	hi, lo := c.in[c.pos+4], c.in[c.pos+5]
	if hi != '0' && hi != '1' {
		return false
	}
	v := 0
	for i := range 16 {
		if hexdigits[i] == lo {
			v = int(hi-'0')<<4 | i
			break
		}
		if i == 15 {
			return false
		}
	}
	switch v {
	case '\b', '\f', '\n', '\r', '\t':
		return false
	}
	return true
}

// number checks that the number at c.pos is exactly AppendNumber's form
// of its value.
func (c *checker) number() error {
	start := c.pos
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		if !(b >= '0' && b <= '9' || b == '-' || b == '+' || b == '.' || b == 'e' || b == 'E') {
			break
		}
		c.pos++
	}
	raw := c.in[start:c.pos]
	if shortDecimal(raw) {
		return nil
	}
	f, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(raw), len(raw)), 64)
	if err != nil || math.IsInf(f, 0) {
		c.pos = start
		return c.errorf("number %s is not a finite IEEE-754 double", raw)
	}
	var buf [40]byte
	if want := AppendNumber(buf[:0], f); string(want) != string(raw) {
		c.pos = start
		// string(want): passing want itself would move buf to the heap
		// on every call, not just on this error path.
		return c.errorf("number %s is not in canonical form %s", raw, string(want))
	}
	return nil
}

// shortDecimal reports whether raw is canonical by its form alone, without
// converting it: an integer or a decimal fraction (no exponent, no zero
// before a nonzero integer part or after the last fraction digit, no sign
// on zero) of at most 15 significant digits, whose magnitude ECMAScript
// writes without an exponent (1e-6 ≤ |x| < 1e21). A decimal of at most 15
// significant digits is the only one of that many digits whose double it
// is (DBL_DIG), so they are the shortest digits of that double, which
// RFC 8785 writes at that magnitude just as raw does. False says nothing:
// the number is then converted and compared.
func shortDecimal(raw []byte) bool {
	s := raw
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	integer, frac := s[:i], s[i:]
	if len(integer) == 0 || len(integer) > 1 && integer[0] == '0' {
		return false
	}
	if len(frac) == 0 {
		if integer[0] == '0' {
			return len(raw) == 1 // "-0" is written "0"
		}
		sig := len(bytes.TrimRight(integer, "0"))
		return sig <= 15 && len(integer) <= 21
	}
	if frac[0] != '.' || len(frac) < 2 || frac[len(frac)-1] == '0' {
		return false
	}
	frac = frac[1:]
	for _, d := range frac {
		if d < '0' || d > '9' {
			return false
		}
	}
	if integer[0] != '0' {
		return len(integer)+len(frac) <= 15
	}
	lead := len(frac) - len(bytes.TrimLeft(frac, "0"))
	return lead <= 5 && len(frac)-lead <= 15 // 0.000001 at least
}

// plain8 reports whether the 8 bytes of w are all printable ASCII other
// than '"' and '\\', the bytes a string holds as themselves: none below
// 0x20, none from 0x80 and none equal to either. Each test (a byte below a
// bound, a byte of zero) is exact for the word as a whole: a borrow can
// set the high bit of a byte only above one that matched.
func plain8(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) &^ v }
	return (w|(w-0x20*ones)&^w|zero(w^'"'*ones)|zero(w^'\\'*ones))&highs == 0
}

// unescaped returns the byte that the two-character escape \e stands for
// in a JSON string, and false for any other e (\u begins a longer escape).
func unescaped(e byte) (byte, bool) {
	switch e {
	case '"', '\\', '/':
		return e, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}
