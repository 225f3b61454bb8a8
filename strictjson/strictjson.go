// Package strictjson is the one rule set for every JSON document the kernel
// accepts from outside: call envelopes and their args, token claims,
// approval decisions, configuration files and MCP _meta objects.
//
// A document is accepted only when every reader would read the same thing
// from it, so no other verifier can see a different document than the one
// the kernel enforces:
//
//   - exactly one JSON value (surrounding white space allowed, nothing else);
//   - no duplicate member names in any object at any depth, compared after
//     unescaping ("a" and "\u0061" are the same name);
//   - valid UTF-8 everywhere, member names included, and no \u escape of a
//     lone surrogate (\ud800);
//   - when decoding into a Go struct, no member the struct (or a struct
//     below it) has no field for, and names match the field's JSON name
//     exactly (encoding/json would also take "TOOL_ID" for "tool_id").
//
// Decoding is one pass of encoding/json/v2 (GOEXPERIMENT=jsonv2, which the
// build already needs), whose defaults are these rules; this package fixes
// the options in one place and turns its errors into Error values that name
// the member at fault.
package strictjson

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
)

// Sentinel errors a refusal wraps (test them with errors.Is).
var (
	// ErrDuplicateName: an object has two members of the same name.
	ErrDuplicateName = errors.New("duplicate member name")
	// ErrUnknownField: an object member the target type has no field for.
	ErrUnknownField = errors.New("unknown field")
	// ErrInvalidUTF8: invalid UTF-8, or a \u escape of a lone surrogate.
	ErrInvalidUTF8 = errors.New("invalid UTF-8")
	// ErrSyntax: anything else that is not one well-formed JSON value
	// (trailing data, truncation, bad tokens) or does not fit the target
	// type.
	ErrSyntax = errors.New("malformed JSON")
)

// Error is a refused document: what is wrong and where.
type Error struct {
	// Path is the JSON Pointer (RFC 6901) of the object holding the
	// offending member (for duplicate and unknown names) or of the value at
	// fault; "" is the document itself.
	Path string
	// Name is the duplicate or unknown member name ("" for other errors).
	Name string
	// Offset is the byte offset of the error in the document, when known.
	Offset int64
	// Kind is one of the sentinel errors above.
	Kind error
	// Detail is the decoder's own description, for ErrSyntax and
	// ErrInvalidUTF8.
	Detail string
}

// Error reads like `duplicate member name "a" in /args/b` or
// `invalid UTF-8 in /agent_id at byte 14`.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Name != "" {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(e.Name))
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Path != "" {
		b.WriteString(" in ")
		b.WriteString(e.Path)
	}
	if e.Offset > 0 && e.Name == "" {
		fmt.Fprintf(&b, " at byte %d", e.Offset)
	}
	return b.String()
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// options are the rules, built once (the defaults of encoding/json/v2 for
// names and UTF-8, spelled out so a change of defaults cannot loosen them).
var options = jsonv2.JoinOptions(
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
	jsonv2.RejectUnknownMembers(true),
	jsonv2.MatchCaseInsensitiveNames(false),
)

// Unmarshal decodes data, which must be exactly one JSON value obeying the
// package's rules, into v (a non-nil pointer). Members v's struct types do
// not declare are refused at every depth; values held as json.RawMessage,
// maps or interfaces are checked for duplicate names and UTF-8 at every
// depth too. On a refusal the error is an *Error and v may be partly
// filled.
func Unmarshal(data []byte, v any) error {
	if err := jsonv2.Unmarshal(data, v, options); err != nil {
		return convert(err)
	}
	return nil
}

// Check reports whether data is exactly one JSON value obeying the
// package's rules (duplicate names, UTF-8); it decodes nothing and
// allocates nothing for a valid document.
func Check(data []byte) error {
	if jsontext.Value(data).IsValid(options) {
		return nil
	}
	// The slow path, for the error: decode into a value that accepts any
	// JSON so the decoder says what and where.
	var v jsontext.Value
	if err := jsonv2.Unmarshal(data, &v, options); err != nil {
		return convert(err)
	}
	return &Error{Kind: ErrSyntax, Detail: "not a single JSON value"}
}

// convert turns an encoding/json/v2 error into an *Error.
func convert(err error) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		ptr := se.JSONPointer
		e := &Error{Path: string(ptr), Offset: se.ByteOffset, Kind: ErrSyntax}
		switch {
		case errors.Is(se.Err, jsontext.ErrDuplicateName):
			e.Kind, e.Name, e.Path, e.Offset = ErrDuplicateName, ptr.LastToken(), string(ptr.Parent()), 0
		case se.Err != nil && (strings.Contains(se.Err.Error(), "UTF-8") || strings.Contains(se.Err.Error(), "surrogate")):
			e.Kind, e.Detail = ErrInvalidUTF8, se.Err.Error()
			if e.Detail == ErrInvalidUTF8.Error() {
				e.Detail = ""
			}
		case se.Err != nil:
			e.Detail = se.Err.Error()
		default:
			e.Detail = se.Error()
		}
		return e
	}
	var me *jsonv2.SemanticError
	if errors.As(err, &me) {
		ptr := me.JSONPointer
		if errors.Is(me.Err, jsonv2.ErrUnknownName) {
			return &Error{Kind: ErrUnknownField, Name: ptr.LastToken(), Path: string(ptr.Parent()), Offset: me.ByteOffset}
		}
		detail := me.Error()
		if me.Err != nil {
			detail = me.Err.Error()
		}
		if me.GoType != nil && me.JSONKind != 0 {
			detail = fmt.Sprintf("a JSON %s cannot be a Go %v", kindName(me.JSONKind), me.GoType)
			if me.Err != nil {
				detail += ": " + me.Err.Error()
			}
		}
		return &Error{Kind: ErrSyntax, Path: string(ptr), Offset: me.ByteOffset, Detail: detail}
	}
	return &Error{Kind: ErrSyntax, Detail: err.Error()}
}

func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "boolean"
	case '"':
		return "string"
	case '0':
		return "number"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "value"
}
