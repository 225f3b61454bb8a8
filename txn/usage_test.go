package txn

import (
	"bytes"
	"encoding/json"
	"maps"
	"testing"
)

// TestUsageEncoding checks that budget records are written as json.Marshal
// writes them and that the direct decoder reads what json.Unmarshal reads,
// leaving anything else to it.
func TestUsageEncoding(t *testing.T) {
	usages := []Usage{{}, {BudgetCalls: 1}, {BudgetCalls: 3, BudgetNetBytes: -2, BudgetCPUMillis: 1 << 62},
		{"<a&b>": 1, "é\u2028": 2, `q"\`: 3, "\xff": 4}, {"a-b.c_D9": 5, "x y": 6}}
	for _, u := range usages {
		want, err := json.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendUsage(nil, u)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("appendUsage(%v) = %s (%v), json.Marshal = %s", u, got, err, want)
		}
	}
	records := []string{`{}`, `{"calls":1}`, `{"calls":1,"net_bytes":-20}`, `{"calls": 1}`, `{"a":1,"a":2}`,
		`{"calls":1.5}`, `{"calls":1,}`, `{"c\"x":1}`, `{"c\u0041":1}`, `{"calls":"1"}`, `[1]`, `{`, `{"calls"}`, `{"calls":}`,
		`{"calls":99999999999999999999}`, `{"a":1,"b":2,"c":3}`}
	for _, r := range records {
		want := Usage{}
		werr := json.Unmarshal([]byte(r), &want)
		got, ok := parseUsage([]byte(r))
		if ok && (werr != nil || !maps.Equal(got, want)) {
			t.Errorf("parseUsage(%s) = %v, json.Unmarshal = %v (%v)", r, got, want, werr)
		}
	}
	for _, r := range []string{`{}`, `{"calls":1}`, `{"calls":1,"net_bytes":-20}`} {
		if _, ok := parseUsage([]byte(r)); !ok {
			t.Errorf("parseUsage(%s) leaves a record adjust writes to json.Unmarshal", r)
		}
	}
}
