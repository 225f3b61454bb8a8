package mcpgateway

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"io"
)

// The gateway's decisions that depend on a JSON-RPC message's method
// (tagging a tools/call, tracking the calls in flight, cancelling one,
// the lean path) read the message as the SDK does: member names exact
// (case-sensitive) after unescaping, values decoded. "tools\/call" and
// "tools\u002fcall" are the method tools/call to the SDK, so they are to
// the gateway too; no byte search stands in for the decoding.

// rpcMessage is the top-level members of one JSON-RPC message the
// gateway reads: each as the message's own bytes, nil when absent.
type rpcMessage struct {
	method, id, params jsontext.Value
	paramsAt           int // params' offset in the message
}

// readMessage reads body as a single JSON object (the last of members of
// one name, as the SDK keeps, when opts allow duplicates). ok is false
// for anything else: a batch, bytes that are no JSON, trailing data, or
// what opts forbid (by default a duplicate member name or invalid UTF-8).
func readMessage(body []byte, opts ...jsontext.Options) (m rpcMessage, ok bool) {
	ok = readObject(body, func(name string, v jsontext.Value, at int) {
		switch name {
		case "method":
			m.method = v
		case "id":
			m.id = v
		case "params":
			m.params, m.paramsAt = v, at
		}
	}, opts...)
	return m, ok
}

// readObject calls member for each member of the JSON object obj, in
// order, with its unescaped name, its value as obj's bytes and the
// value's offset in obj. It reports whether obj is one object and nothing
// else, by the rules of opts.
func readObject(obj []byte, member func(name string, v jsontext.Value, at int), opts ...jsontext.Options) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(obj), opts...)
	if t, err := dec.ReadToken(); err != nil || t.Kind() != '{' {
		return false
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return false
		}
		n := name.String() // before the next read, which reuses the buffer
		v, err := dec.ReadValue()
		if err != nil {
			return false
		}
		// v is the decoder's until its next read: keep obj's bytes.
		end := int(dec.InputOffset())
		member(n, jsontext.Value(obj[end-len(v):end]), end-len(v))
	}
	if _, err := dec.ReadToken(); err != nil {
		return false
	}
	_, err := dec.ReadToken()
	return err == io.EOF
}

// isString reports whether v, one JSON value, is the string s. A JSON
// string with no backslash in it is its own decoding (when its bytes are
// valid UTF-8, which s's are), so those are compared as they are; any
// other is decoded, so that every escaped spelling of s is s.
func isString(v jsontext.Value, s string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1:len(v)-1]) == s
	}
	var got string
	return json.Unmarshal(v, &got) == nil && got == s
}
