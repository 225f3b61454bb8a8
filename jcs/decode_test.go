package jcs

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// decodeStd is what Decode must match: encoding/json's Decoder with
// UseNumber and nothing after the value (jsonschema.UnmarshalJSON).
func decodeStd(in []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, os.ErrInvalid
	}
	return v, nil
}

var decodeInputs = []string{
	`{}`, `[]`, `{"a":1}`, ` { "a" : [ 1 , -2.5e+3 , true , false , null , "x" ] } `,
	`"\u00e9\ud83d\ude00 \" \\ \/ \b\f\n\r\t"`, `"lone \ud800 surrogate"`, `"\udc00\ud800"`, `"bad \xff utf-8"`,
	`{"a":{"a":{"a":[[[]]]}}}`, `{"k":1,"k":2}`, `0`, `-0`, `1E400`, `"tab	raw"`, `{"a":1,}`, `[1 2]`, `01`, `1.`,
	`{"a":1} x`, `nul`, `"unterminated`, `{"a"}`, `"\x"`, `"\u12"`,
}

func TestDecode(t *testing.T) {
	ins := decodeInputs
	if b, err := os.ReadFile("testdata/objects.txt"); err == nil {
		ins = append(ins, strings.Split(string(b), "\n")...)
	}
	for _, in := range ins {
		checkDecode(t, []byte(in))
	}
}

func checkDecode(t *testing.T, in []byte) {
	t.Helper()
	want, werr := decodeStd(in)
	got, err := Decode(in)
	if (err != nil) != (werr != nil) {
		t.Fatalf("Decode(%q): error %v, encoding/json %v", in, err, werr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(%q) = %#v, encoding/json %#v", in, got, want)
	}
}

func FuzzDecode(f *testing.F) {
	for _, in := range decodeInputs {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkDecode(t, in)
		// The kernel decodes canonical args: those must always agree.
		if c, err := Canonicalize(in); err == nil {
			checkDecode(t, c)
		}
	})
}
