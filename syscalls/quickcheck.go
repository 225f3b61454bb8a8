package syscalls

import (
	"encoding/json"
	"strconv"
)

// A quick is an input schema node, or the part of one it models, checked
// without the full validator: most calls' arguments are valid, and the
// full validator allocates a dozen times and more per call on that path.
// A quick only vouches. valid reports true when the instance certainly
// satisfies the schema, and false when it does not, or when the schema
// or the instance holds anything quick does not model; the full
// validator then gives the verdict and the violations. So a quick can
// only ever skip the full validator for arguments it accepts as well
// (TestQuickVouchesOnlyForValid checks it against the full validator).
//
// Modelled: "type" as one name; "properties", "required" and a boolean
// "additionalProperties" on objects; "items" on arrays; "minimum" and
// "maximum" of integer value on numbers; and the annotations
// (description, title, default, examples), which validate nothing. Any
// other keyword of the subset (enum, const, pattern, format, lengths,
// exclusive bounds, uniqueItems, …) leaves the node unmodelled.
type quick struct {
	typ      string            // "" for any type (and then no other keyword)
	props    map[string]*quick // a nil value: the property's schema is not modelled
	required []string
	closed   bool // additionalProperties: false
	items    *quick
	hasItems bool
	min, max *int64
}

// maxQuickDigits bounds the integers quick compares: up to 15 digits they
// are exact in int64 and float64 alike, whatever the validator compares in.
const maxQuickDigits = 15

// compileQuick models the schema node v (as jsonschema.UnmarshalJSON
// decodes it, checked by checkSubset), or returns nil when it cannot.
func compileQuick(v any) *quick {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	q := &quick{}
	for k, x := range obj {
		switch k {
		case "description", "title", "default", "examples":
		case "type":
			s, ok := x.(string)
			if !ok {
				return nil
			}
			switch s {
			case "object", "array", "string", "integer", "number", "boolean", "null":
				q.typ = s
			default:
				return nil
			}
		case "properties":
			m, ok := x.(map[string]any)
			if !ok {
				return nil
			}
			q.props = make(map[string]*quick, len(m))
			for n, p := range m {
				q.props[n] = compileQuick(p)
			}
		case "required":
			list, ok := x.([]any)
			if !ok {
				return nil
			}
			for _, r := range list {
				s, ok := r.(string)
				if !ok {
					return nil
				}
				q.required = append(q.required, s)
			}
		case "additionalProperties":
			b, ok := x.(bool)
			if !ok {
				return nil
			}
			q.closed = !b
		case "items":
			q.items, q.hasItems = compileQuick(x), true
		case "minimum", "maximum":
			n, ok := quickInt(x)
			if !ok {
				return nil
			}
			if k == "minimum" {
				q.min = &n
			} else {
				q.max = &n
			}
		default:
			return nil
		}
	}
	// Keywords apply to instances of their type only: with no type, or
	// another, quick would have to model that; it does not.
	switch {
	case (q.props != nil || q.required != nil || q.closed) && q.typ != "object",
		q.hasItems && q.typ != "array",
		(q.min != nil || q.max != nil) && q.typ != "integer" && q.typ != "number":
		return nil
	}
	return q
}

// quickInt is x as an integer when it is a JSON number written as one of
// at most maxQuickDigits digits.
func quickInt(x any) (int64, bool) {
	n, ok := x.(json.Number)
	if !ok {
		return 0, false
	}
	s := string(n)
	digits := s
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > maxQuickDigits || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// valid reports whether q vouches for the instance v (decoded as
// jcs.Decode or jsonschema.UnmarshalJSON decode: maps, slices, strings,
// json.Number, booleans and nil).
func (q *quick) valid(v any) bool {
	if q == nil {
		return false
	}
	switch q.typ {
	case "":
		return true
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, r := range q.required {
			if _, ok := m[r]; !ok {
				return false
			}
		}
		for k, x := range m {
			p, declared := q.props[k]
			switch {
			case declared && !p.valid(x):
				return false
			case !declared && q.closed:
				return false
			}
		}
		return true
	case "array":
		a, ok := v.([]any)
		if !ok {
			return false
		}
		if q.hasItems {
			for _, x := range a {
				if !q.items.valid(x) {
					return false
				}
			}
		}
		return true
	case "string":
		_, ok := v.(string)
		return ok
	case "integer", "number":
		n, ok := quickInt(v)
		return ok && (q.min == nil || n >= *q.min) && (q.max == nil || n <= *q.max)
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	}
	return false
}
