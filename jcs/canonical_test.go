package jcs

import (
	"bytes"
	"testing"
)

// TestCanonical: Canonical gives Canonicalize's bytes or error for every
// input, and the input itself, uncopied, when it is canonical already.
func TestCanonical(t *testing.T) {
	for _, tc := range []struct {
		in   string
		same bool // canonical already: returned as it is
	}{
		{`{"a":1,"b":"x"}`, true},
		{`{"session_id":"s-1","trace":{"id":2}}`, true},
		{`[1,"\u001f",true,null]`, true},
		{`{"b":1,"a":2}`, false},
		{`{"a": 1}`, false},
		{`{"a":1.0}`, false},
		{`{"a":"\u0041"}`, false},
		{`{"a":1,"a":2}`, false},
		{`{"a":`, false},
		{``, false},
	} {
		in := []byte(tc.in)
		got, err := Canonical(in)
		want, wantErr := Canonicalize(in)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Errorf("Canonical(%s) = %s, %v; Canonicalize = %s, %v", tc.in, got, err, want, wantErr)
		}
		if same := err == nil && len(in) > 0 && &got[0] == &in[0]; same != tc.same {
			t.Errorf("Canonical(%s) returned its input: %v, want %v", tc.in, same, tc.same)
		}
	}
}
