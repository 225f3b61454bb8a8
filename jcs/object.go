package jcs

import "unicode/utf8"

// Object appends one JSON object in canonical form, member by member, for
// encoders that write their own data in RFC 8785 form directly instead of
// marshalling it and canonicalizing the text. The caller adds the members
// in sorted order of their names, which must be plain ASCII needing no
// escaping (for those, byte order is RFC 8785's UTF-16 order); values are
// written by the methods or appended to B after Key.
type Object struct {
	B []byte // the bytes so far
	n int    // members added
}

// Key starts a member named name.
func (o *Object) Key(name string) {
	if o.n == 0 {
		o.B = append(o.B, '{')
	} else {
		o.B = append(o.B, ',')
	}
	o.n++
	o.B = append(o.B, '"')
	o.B = append(o.B, name...)
	o.B = append(o.B, '"', ':')
}

// Str adds a string member, written as AppendGoString writes it.
func (o *Object) Str(name, v string) {
	o.Key(name)
	o.B = AppendGoString(o.B, v)
}

// Opt adds a string member unless v is empty (encoding/json's omitempty).
func (o *Object) Opt(name, v string) {
	if v != "" {
		o.Str(name, v)
	}
}

// Raw adds a member whose value v is canonical JSON already.
func (o *Object) Raw(name string, v []byte) {
	o.Key(name)
	o.B = append(o.B, v...)
}

// Int adds a number member of integer value v, as RFC 8785 writes the
// nearest double (exactly v up to 2^53).
func (o *Object) Int(name string, v int64) {
	o.Key(name)
	o.B = AppendNumber(o.B, float64(v))
}

// Bool adds a boolean member.
func (o *Object) Bool(name string, v bool) {
	o.Key(name)
	if v {
		o.B = append(o.B, "true"...)
	} else {
		o.B = append(o.B, "false"...)
	}
}

// End closes the object and returns its bytes.
func (o *Object) End() []byte {
	if o.n == 0 {
		o.B = append(o.B, '{')
	}
	return append(o.B, '}')
}

// Plain reports whether encoding/json's json.Marshal writes the string s
// exactly as RFC 8785 does: s is valid UTF-8 with no HTML character (<,
// >, &) and no U+2028 or U+2029, which json.Marshal escapes and RFC 8785
// does not (both escape quotes, backslashes and control characters alike:
// TestPlain checks it). An object of plain strings, integers up to 2^53
// and booleans, written by Object in sorted order, is then byte for byte
// the json.Marshal of the same struct or map.
func Plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '<', c == '>', c == '&':
			return false
		case c == 0xe2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9):
			return false
		}
	}
	return utf8.ValidString(s)
}
