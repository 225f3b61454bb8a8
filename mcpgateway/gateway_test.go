package mcpgateway

import (
	"encoding/json"
	"testing"
)

func TestTagParams(t *testing.T) {
	cases := []struct {
		name, in string
		id       any
		want     string // the _meta after tagging; "" when params are left alone
	}{
		{"no meta", `{"name":"echo","arguments":{}}`, float64(7), `{"capkernel/request_id":7}`},
		{"client meta kept", `{"name":"echo","_meta":{"capkernel/idempotency_key":"k"}}`, "r1", `{"capkernel/idempotency_key":"k","capkernel/request_id":"r1"}`},
		{"client's request id overwritten", `{"name":"echo","_meta":{"capkernel/request_id":"forged"}}`, "r2", `{"capkernel/request_id":"r2"}`},
		{"transport keys dropped from a client's meta", `{"name":"echo","_meta":{"capkernel/invalid_meta":"x","capkernel/raw_params":"e30="}}`, "r6", `{"capkernel/request_id":"r6"}`},
		{"params not an object", `["echo"]`, "r3", ""},
		{"meta not an object", `{"name":"echo","_meta":5}`, "r4", ""},
		{"not JSON", `{"name":`, "r5", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := tagParams(json.RawMessage(c.in), c.id)
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
			var got, want any
			json.Unmarshal(p.Meta, &got)
			json.Unmarshal([]byte(c.want), &want)
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
