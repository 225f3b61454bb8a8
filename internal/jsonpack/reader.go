package jsonpack

import "slices"

// ObjectReader unpacks a packed object member by member, for a caller
// that knows the object's layout and wants some members' values in
// binary as it unpacks (the ledger reads a record's hashes without
// parsing their hex again). Each method unpacks the next token(s) when
// they are what it expects and reports false, consuming nothing, when they
// are not: the caller then unpacks the whole value with Unpack, whose
// output and errors are the reference. What an ObjectReader writes is
// exactly what Unpack writes for the same tokens.
type ObjectReader struct {
	d     decoder
	first bool
}

// NewObjectReader starts reading the packed value v, appending to dst, if
// v is a packed object.
func NewObjectReader(dst, v []byte) (ObjectReader, bool) {
	if len(v) < 2 || v[0] != Tag || v[1] != opObj {
		return ObjectReader{}, false
	}
	return ObjectReader{d: decoder{in: v, pos: 2, out: append(slices.Grow(dst, 3*len(v)), '{')}, first: true}, true
}

// Out returns dst and what has been appended to it.
func (r *ObjectReader) Out() []byte { return r.d.out }

// Name is a member name of the dictionary, for ObjectReader.Member.
type Name struct{ i byte }

// DictName returns the Name of name, or false when name is not in the
// dictionary.
func DictName(name string) (Name, bool) {
	i, ok := lookup(name)
	return Name{i}, ok
}

// Member unpacks the next member's name if it is the dictionary token of
// n: "name": (after a comma unless it is the first member).
func (r *ObjectReader) Member(n Name) bool {
	if r.d.pos >= len(r.d.in) || r.d.in[r.d.pos] != n.i {
		return false
	}
	r.d.pos++
	if !r.first {
		r.d.out = append(r.d.out, ',')
	}
	r.first = false
	r.d.out = append(r.d.out, dictNames[n.i]...)
	return true
}

// Value unpacks the next value, whatever it is.
func (r *ObjectReader) Value() bool {
	pos, n := r.d.pos, len(r.d.out)
	depth, objects, first, refBytes := r.d.depth, r.d.objects, r.d.first, r.d.refBytes
	if err := r.d.value(); err != nil {
		// Consuming nothing: a container the value failed in leaves no
		// level open.
		r.d.pos, r.d.out = pos, r.d.out[:n]
		r.d.depth, r.d.objects, r.d.first, r.d.refBytes = depth, objects, first, refBytes
		return false
	}
	return true
}

// CanonicalValue unpacks the next value, whatever it is, as Value does,
// and reports whether the text written is vouched to be in RFC 8785
// canonical form (canonical.go). canonical false says nothing: the caller
// then checks the text itself (jcs.CheckCanonical).
func (r *ObjectReader) CanonicalValue() (ok, canonical bool) {
	r.d.check, r.d.unsure = true, false
	ok = r.Value()
	r.d.check = false
	return ok, ok && !r.d.unsure
}

// Digest unpacks the next value if it is a digest token, "blake3:<hex>",
// and sets d to its bytes.
func (r *ObjectReader) Digest(d *[32]byte) bool {
	if r.d.pos+33 > len(r.d.in) || r.d.in[r.d.pos] != opDigest {
		return false
	}
	copy(d[:], r.d.in[r.d.pos+1:])
	r.d.out = appendDigest(r.d.out, d)
	r.d.pos += 33
	return true
}

// Time unpacks the next value if it is a time token with digits fraction
// digits: "YYYY-MM-DDTHH:MM:SS.F…Z", a valid time of the years 0 to 9999.
func (r *ObjectReader) Time(digits byte) bool {
	if r.d.pos+2 > len(r.d.in) || r.d.in[r.d.pos] != opTime || r.d.in[r.d.pos+1] != digits {
		return false
	}
	pos, n := r.d.pos, len(r.d.out)
	r.d.pos++
	if err := r.d.time(); err != nil {
		r.d.pos, r.d.out = pos, r.d.out[:n]
		return false
	}
	return true
}

// End unpacks the end of the object, "}", if it is next and ends the
// packed value.
func (r *ObjectReader) End() bool {
	if r.d.pos+1 != len(r.d.in) || r.d.in[r.d.pos] != opEnd {
		return false
	}
	r.d.pos++
	r.d.out = append(r.d.out, '}')
	return true
}
