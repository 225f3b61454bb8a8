package mcpgateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tagParams sets the call's id, sealed, in its _meta, and drops every
// mark a client set.
func TestTagParams(t *testing.T) {
	s := newSealer()
	cases := []struct {
		name, in string
		id       any
		want     string // the _meta after tagging; "" when params are left alone
	}{
		{"no meta", `{"name":"echo","arguments":{}}`, float64(7), `{"capkernel/request_id":7}`},
		{"client meta kept", `{"name":"echo","_meta":{"capkernel/idempotency_key":"k"}}`, "r1", `{"capkernel/idempotency_key":"k","capkernel/request_id":"r1"}`},
		{"client's request id overwritten", `{"name":"echo","_meta":{"capkernel/request_id":"forged"}}`, "r2", `{"capkernel/request_id":"r2"}`},
		{"transport keys dropped from a client's meta", `{"name":"echo","_meta":{"capkernel/invalid_meta":"x","capkernel/raw_message":"e30="}}`, "r6", `{"capkernel/request_id":"r6"}`},
		{"client's seal overwritten", `{"name":"echo","_meta":{"capkernel/seal":"forged","capkernel/invalid_meta":"x"}}`, "r7", `{"capkernel/request_id":"r7"}`},
		{"params not an object", `["echo"]`, "r3", ""},
		{"meta not an object", `{"name":"echo","_meta":5}`, "r4", ""},
		{"not JSON", `{"name":`, "r5", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := tagParams(s, json.RawMessage(c.in), c.id)
			if c.want == "" {
				if string(out) != c.in {
					t.Fatalf("tagParams changed %s to %s", c.in, out)
				}
				return
			}
			var p struct {
				Meta json.RawMessage `json:"_meta"`
				Name string          `json:"name"`
			}
			if err := json.Unmarshal(out, &p); err != nil || p.Name != "echo" {
				t.Fatalf("tagged params %s: %v", out, err)
			}
			var got mcp.Meta
			var want any
			json.Unmarshal(p.Meta, &got)
			json.Unmarshal([]byte(c.want), &want)
			if mk := s.marksOf(got); mk != (marks{requestID: idJSON(c.id)}) {
				t.Fatalf("_meta %s: marks %+v under its seal, want request id %s only", p.Meta, mk, idJSON(c.id))
			}
			delete(got, MetaSeal)
			if g, _ := json.Marshal(got); string(g) != string(mustJSON(want)) {
				t.Fatalf("_meta = %s, want %s", p.Meta, c.want)
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// spliceRequestID tags the common tools/call as the full way does, to
// the byte after decoding, and declines every other body.
func TestSpliceRequestID(t *testing.T) {
	cases := []struct {
		name, body string
		ok         bool
	}{
		{"numeric id", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"<hi>"}}}`, true},
		{"string id, spaces", ` { "jsonrpc" : "2.0" , "method" : "tools/call" , "params" : { "name" : "echo" } , "id" : "a<b" } `, true},
		{"empty params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`, true},
		{"params last, nested", `{"id":2,"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"_meta":{"x":1}},"name":"echo"}}`, true},
		{"integral float id", `{"jsonrpc":"2.0","id":3.0,"method":"tools/call","params":{"name":"echo"}}`, true},
		{"params with _meta", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","_meta":{"progressToken":1}}}`, false},
		{"escaped _meta name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","\u005fmeta":{}}}`, false},
		{"duplicate member", `{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"echo"}}`, false},
		{"duplicate in params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"x"}}`, false},
		{"notification", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}`, false},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"echo"}}`, false},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}]`, false},
		{"trailing data", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}} {}`, false},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["echo"]}`, false},
		{"other method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"tools/call"}}`, false},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"\xff\"}}", false},
		{"escaped method", `{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo"}}`, true},
		{"escaped member names", `{"jsonrpc":"2.0","i\u0064":1,"m\u0065thod":"tools\u002fcall","p\u0061rams":{"name":"echo"}}`, true},
		{"method in other case", `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"echo"}}`, false},
	}
	s := newSealer()
	// splice is tagBody's splicing way alone.
	splice := func(body []byte) ([]byte, bool) {
		m, ok := readMessage(body)
		if !ok || !isString(m.method, "tools/call") {
			return nil, false
		}
		id, ok := requestID(json.RawMessage(m.id))
		if !ok {
			return nil, false
		}
		return spliceRequestID(s, body, m, id)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, ok := splice([]byte(c.body))
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v (%s)", ok, c.ok, out)
			}
			if !ok {
				return
			}
			var got, want any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("spliced %s: %v", out, err)
			}
			m, _ := readMessage([]byte(c.body))
			id, _ := requestID(json.RawMessage(m.id))
			json.Unmarshal(tagFull(s, []byte(c.body), id), &want)
			if g, w := mustJSON(got), mustJSON(want); string(g) != string(w) {
				t.Fatalf("spliced %s\nfull way %s", g, w)
			}
			if !strings.Contains(string(out), `"_meta":{"capkernel/request_id":`) {
				t.Fatalf("spliced %s: no request id", out)
			}
		})
	}
}
