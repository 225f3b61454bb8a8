package jcs

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Decode decodes the JSON text in into the values json.Decoder gives with
// UseNumber: map[string]any, []any, json.Number, string, bool and nil. It
// is meant for text checked already (canonical args): it parses valid JSON
// without reflection, in one pass, allocating only the values, and
// refuses anything else with an error naming the offset. Invalid UTF-8 in
// a string is replaced by U+FFFD, as encoding/json does.
func Decode(in []byte) (any, error) {
	d := decoder{in: in}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	if d.space(); d.pos != len(d.in) {
		return nil, d.errorf("data after the top-level value")
	}
	return v, nil
}

type decoder struct {
	in  []byte
	pos int
}

func (d *decoder) errorf(format string, a ...any) error {
	return fmt.Errorf("jcs: decode at offset %d: %s", d.pos, fmt.Sprintf(format, a...))
}

func (d *decoder) space() {
	for d.pos < len(d.in) {
		switch d.in[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, d.errorf("nesting deeper than %d", MaxDepth)
	}
	if d.pos >= len(d.in) {
		return nil, d.errorf("unexpected end of input")
	}
	switch c := d.in[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	for _, lit := range []struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(d.in)-d.pos >= len(lit.text) && string(d.in[d.pos:d.pos+len(lit.text)]) == lit.text {
			d.pos += len(lit.text)
			return lit.v, nil
		}
	}
	return nil, d.errorf("invalid character %q", d.in[d.pos])
}

func (d *decoder) object(depth int) (any, error) {
	d.pos++ // {
	m := map[string]any{}
	d.space()
	if d.pos < len(d.in) && d.in[d.pos] == '}' {
		d.pos++
		return m, nil
	}
	for {
		d.space()
		if d.pos >= len(d.in) || d.in[d.pos] != '"' {
			return nil, d.errorf("expected a member name")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.space()
		if d.pos >= len(d.in) || d.in[d.pos] != ':' {
			return nil, d.errorf("expected ':'")
		}
		d.pos++
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		m[k] = v
		d.space()
		if d.pos >= len(d.in) {
			return nil, d.errorf("unexpected end of input")
		}
		switch d.in[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return m, nil
		default:
			return nil, d.errorf("expected ',' or '}'")
		}
	}
}

func (d *decoder) array(depth int) (any, error) {
	d.pos++ // [
	a := []any{}
	d.space()
	if d.pos < len(d.in) && d.in[d.pos] == ']' {
		d.pos++
		return a, nil
	}
	for {
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		d.space()
		if d.pos >= len(d.in) {
			return nil, d.errorf("unexpected end of input")
		}
		switch d.in[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return a, nil
		default:
			return nil, d.errorf("expected ',' or ']'")
		}
	}
}

func (d *decoder) number() (any, error) {
	start := d.pos
	if d.in[d.pos] == '-' {
		d.pos++
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.in) && d.in[d.pos] >= '0' && d.in[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	intStart := d.pos
	if n := digits(); n == 0 || n > 1 && d.in[intStart] == '0' {
		return nil, d.errorf("invalid number")
	}
	if d.pos < len(d.in) && d.in[d.pos] == '.' {
		d.pos++
		if digits() == 0 {
			return nil, d.errorf("invalid number")
		}
	}
	if d.pos < len(d.in) && (d.in[d.pos] == 'e' || d.in[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.in) && (d.in[d.pos] == '+' || d.in[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return nil, d.errorf("invalid number")
		}
	}
	return json.Number(d.in[start:d.pos]), nil
}

// str decodes the string at d.pos (its opening quote).
func (d *decoder) str() (string, error) {
	d.pos++ // "
	start := d.pos
	// The common case: no escape and valid UTF-8, one allocation.
	for d.pos < len(d.in) {
		c := d.in[d.pos]
		if c == '"' {
			s := d.in[start:d.pos]
			d.pos++
			if utf8.Valid(s) {
				return string(s), nil
			}
			return string(appendValid(nil, s)), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		d.pos++
	}
	b := appendValid(make([]byte, 0, d.pos-start+16), d.in[start:d.pos])
	for d.pos < len(d.in) {
		c := d.in[d.pos]
		switch {
		case c == '"':
			d.pos++
			return string(b), nil
		case c < 0x20:
			return "", d.errorf("control character in a string")
		case c != '\\':
			run := d.pos
			for d.pos < len(d.in) && d.in[d.pos] != '"' && d.in[d.pos] != '\\' && d.in[d.pos] >= 0x20 {
				d.pos++
			}
			b = appendValid(b, d.in[run:d.pos])
			continue
		}
		if d.pos+1 >= len(d.in) {
			return "", d.errorf("unexpected end of input")
		}
		e := d.in[d.pos+1]
		d.pos += 2
		if c, ok := unescaped(e); ok {
			b = append(b, c)
			continue
		}
		if e != 'u' {
			return "", d.errorf("invalid escape \\%c", e)
		}
		r, ok := d.hex4()
		if !ok {
			return "", d.errorf("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			r2 := rune(-1)
			if d.pos+1 < len(d.in) && d.in[d.pos] == '\\' && d.in[d.pos+1] == 'u' {
				save := d.pos
				d.pos += 2
				if r2, ok = d.hex4(); !ok {
					return "", d.errorf("invalid \\u escape")
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					b = utf8.AppendRune(b, dec)
					continue
				}
				d.pos = save // not a pair: the second escape stands alone
			}
			r = utf8.RuneError
		}
		b = utf8.AppendRune(b, r)
	}
	return "", d.errorf("unterminated string")
}

func (d *decoder) hex4() (rune, bool) {
	if d.pos+4 > len(d.in) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d.in[d.pos:d.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	d.pos += 4
	return rune(v), true
}

// appendValid appends s with each byte that does not begin a valid UTF-8
// sequence replaced by U+FFFD.
func appendValid(b, s []byte) []byte {
	if utf8.Valid(s) {
		return append(b, s...)
	}
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[:n]...)
		}
		s = s[n:]
	}
	return b
}
