package kernel

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/capkernel/capkernel/jcs"
)

// callScoped are the provenance members that name one call rather than
// describe where it comes from: W3C trace context (traceparent,
// tracestate, baggage) and a runner's or framework's tool_call_id. The
// policy input leaves them out: each is new on every call, so a rule
// cannot meaningfully decide on one, and with them in it every decision
// would be evaluated afresh instead of answered from the decision cache.
// The audit record's context keeps the whole provenance.
var callScoped = []string{"traceparent", "tracestate", "baggage", "tool_call_id"}

// callScopedQuoted are callScoped's names as JSON strings, what
// policyProvenance looks for before it decodes anything.
var callScopedQuoted = func() [][]byte {
	q := make([][]byte, len(callScoped))
	for i, k := range callScoped {
		q[i] = []byte(`"` + k + `"`)
	}
	return q
}()

// policyProvenance returns the provenance object prov (canonical JSON, or
// nil) without its call-scoped members, canonical too; prov itself when
// it has none.
func policyProvenance(prov json.RawMessage) json.RawMessage {
	if !slices.ContainsFunc(callScopedQuoted, func(q []byte) bool { return bytes.Contains(prov, q) }) {
		return prov
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(prov, &m) != nil {
		return prov // checked before; nothing to take out of what is not an object
	}
	n := len(m)
	for _, k := range callScoped {
		delete(m, k)
	}
	if len(m) == n {
		return prov // the name was inside a value
	}
	if len(m) == 0 {
		return nil
	}
	out, err := jcs.Marshal(m)
	if err != nil {
		return prov
	}
	return out
}
