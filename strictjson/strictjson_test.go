package strictjson_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/strictjson"
)

type inner struct {
	A int `json:"a"`
}

type doc struct {
	Name  string            `json:"name"`
	Args  json.RawMessage   `json:"args,omitempty"`
	In    *inner            `json:"in,omitempty"`
	List  []inner           `json:"list,omitempty"`
	M     map[string]any    `json:"m,omitempty"`
	Count int               `json:"count,omitempty"`
	Tags  map[string]string `json:"tags,omitempty"`
}

// The rule set, one document per row: for Unmarshal into doc and for Check.
func TestDocuments(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		kind error // for Unmarshal; nil: accepted
		// check is Check's verdict when it differs from Unmarshal's
		// (Check knows no fields and no types).
		check    error
		checkSet bool
		want     string // substring of the error
	}{
		{"valid", `{"name":"x","args":{"a":[1,{"b":null}]},"in":{"a":1},"list":[{"a":2}]}`, nil, nil, false, ""},
		{"white space around", " \n{\"name\":\"x\"}\t ", nil, nil, false, ""},
		{"unicode escapes", `{"name":"\u00e9\ud83d\ude00"}`, nil, nil, false, ""},
		{"duplicate top level", `{"name":"x","name":"y"}`, strictjson.ErrDuplicateName, nil, false, `duplicate member name "name"`},
		{"duplicate after unescaping", `{"name":"x","n\u0061me":"y"}`, strictjson.ErrDuplicateName, nil, false, `duplicate member name "name"`},
		{"duplicate in raw args", `{"name":"x","args":{"a":1,"a":2}}`, strictjson.ErrDuplicateName, nil, false, `duplicate member name "a" in /args`},
		{"duplicate deep in raw args", `{"name":"x","args":{"b":[0,{"c":{"d":1,"d":2}}]}}`, strictjson.ErrDuplicateName, nil, false, `"d" in /args/b/1/c`},
		{"duplicate in a struct", `{"name":"x","in":{"a":1,"a":2}}`, strictjson.ErrDuplicateName, nil, false, `"a" in /in`},
		{"duplicate in a map", `{"name":"x","tags":{"k":"1","k":"2"}}`, strictjson.ErrDuplicateName, nil, false, `"k" in /tags`},
		{"duplicate in any", `{"name":"x","m":{"k":{"z":1,"z":2}}}`, strictjson.ErrDuplicateName, nil, false, `"z" in /m/k`},
		{"unknown top level", `{"name":"x","bogus":1}`, strictjson.ErrUnknownField, nil, true, `unknown field "bogus"`},
		{"unknown nested", `{"name":"x","in":{"a":1,"b":2}}`, strictjson.ErrUnknownField, nil, true, `unknown field "b" in /in`},
		{"unknown in an array element", `{"name":"x","list":[{"a":1},{"c":2}]}`, strictjson.ErrUnknownField, nil, true, `unknown field "c" in /list/1`},
		{"case-folded name", `{"NAME":"x"}`, strictjson.ErrUnknownField, nil, true, `unknown field "NAME"`},
		{"invalid UTF-8 in a value", "{\"name\":\"\xff\"}", strictjson.ErrInvalidUTF8, nil, false, "invalid UTF-8 in /name"},
		{"invalid UTF-8 in a key", "{\"na\xc3me\":\"x\"}", strictjson.ErrInvalidUTF8, nil, false, "invalid UTF-8"},
		{"invalid UTF-8 in raw args", "{\"args\":{\"k\":\"\xed\xa0\x80\"}}", strictjson.ErrInvalidUTF8, nil, false, "invalid UTF-8 in /args/k"},
		{"lone high surrogate", `{"name":"\ud800"}`, strictjson.ErrInvalidUTF8, nil, false, "surrogate"},
		{"lone low surrogate in args", `{"args":{"k":"\udc00"}}`, strictjson.ErrInvalidUTF8, nil, false, "/args/k"},
		{"lone surrogate in a key", `{"args":{"\ud800":1}}`, strictjson.ErrInvalidUTF8, nil, false, "surrogate"},
		{"trailing value", `{"name":"x"} {}`, strictjson.ErrSyntax, nil, false, "after top-level value"},
		{"trailing garbage", `{"name":"x"}x`, strictjson.ErrSyntax, nil, false, "after top-level value"},
		{"truncated", `{"name":"x"`, strictjson.ErrSyntax, nil, false, "unexpected EOF"},
		{"empty", ``, strictjson.ErrSyntax, nil, false, "unexpected EOF"},
		{"wrong type", `{"name":1}`, strictjson.ErrSyntax, nil, true, "JSON number cannot be a Go string in /name"},
		{"fraction for an int", `{"count":1.5}`, strictjson.ErrSyntax, nil, true, "/count"},
		{"not an object", `[1]`, strictjson.ErrSyntax, nil, true, "JSON array"},
		{"single quotes", `{'name':'x'}`, strictjson.ErrSyntax, nil, false, "invalid character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v doc
			err := strictjson.Unmarshal([]byte(tc.doc), &v)
			expect(t, "Unmarshal", err, tc.kind, tc.want)
			ck, ckWant := tc.kind, tc.want
			if tc.checkSet {
				ck, ckWant = tc.check, ""
			}
			expect(t, "Check", strictjson.Check([]byte(tc.doc)), ck, ckWant)
		})
	}
}

func expect(t *testing.T, what string, err, kind error, want string) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("%s: %v, want accepted", what, err)
		}
		return
	}
	var se *strictjson.Error
	if !errors.As(err, &se) || !errors.Is(err, kind) {
		t.Fatalf("%s: %v (%T), want %v", what, err, err, kind)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %q, want it to contain %q", what, err, want)
	}
}

// A valid document decodes to what encoding/json reads from it.
func TestSameAsEncodingJSON(t *testing.T) {
	src := `{"name":"n\u00e9","args":{"z":1,"a":[true,null,"s"]},"in":{"a":7},"list":[{"a":1},{"a":2}],"m":{"k":{"x":1.5}},"count":3,"tags":{"a":"b"}}`
	var a, b doc
	if err := strictjson.Unmarshal([]byte(src), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(src), &b); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("strictjson read %s, encoding/json %s", ja, jb)
	}
}

// benchDoc is a call envelope of typical size.
var benchDoc = []byte(`{"tool_id":"fs.write","args":{"path":"notes/today.txt","content":"hello, world — a line of text with some length to it","mode":"create"},"agent_id":"agent-1","capability_token":"eyJhbGciOiJFZERTQSIsImtpZCI6ImsxIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhZ2VudC0xIn0.c2lnbmF0dXJl","capability_token_id":"0190a4c2-7b1e-7c3d-9a4f-2b6c8d0e1f23","policy_hash":"blake3:4f2a9c1e0b8d7a6f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e","provenance":{"session_id":"s1","source":"bench"},"idempotency_key":"k-42","precondition_refs":[{"ref":"fs:notes/today.txt","absent":true}]}`)

type benchEnvelope struct {
	ToolID            string            `json:"tool_id"`
	Args              json.RawMessage   `json:"args"`
	AgentID           string            `json:"agent_id"`
	CapabilityToken   string            `json:"capability_token"`
	CapabilityTokenID string            `json:"capability_token_id"`
	PolicyHash        string            `json:"policy_hash"`
	Provenance        json.RawMessage   `json:"provenance,omitempty"`
	IdempotencyKey    string            `json:"idempotency_key,omitempty"`
	PreconditionRefs  []json.RawMessage `json:"precondition_refs,omitempty"`
}

// BenchmarkUnmarshal compares the strict decoder with encoding/json (which
// accepts duplicates, case-folded names and invalid UTF-8) on an envelope.
func BenchmarkUnmarshal(b *testing.B) {
	b.Run("strictjson", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchDoc)))
		for b.Loop() {
			var e benchEnvelope
			if err := strictjson.Unmarshal(benchDoc, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchDoc)))
		for b.Loop() {
			var e benchEnvelope
			if err := json.Unmarshal(benchDoc, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCheck compares Check with encoding/json's Valid (which checks
// syntax only).
func BenchmarkCheck(b *testing.B) {
	b.Run("strictjson", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchDoc)))
		for b.Loop() {
			if err := strictjson.Check(benchDoc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-Valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchDoc)))
		for b.Loop() {
			if !json.Valid(benchDoc) {
				b.Fatal("invalid")
			}
		}
	})
}
