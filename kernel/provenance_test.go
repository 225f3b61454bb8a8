package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestPolicyProvenance(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, ``},
		{`{"session_id":"s1"}`, `{"session_id":"s1"}`},
		{`{"session_id":"s1","source":"runner","tool_call_id":"c7"}`, `{"session_id":"s1","source":"runner"}`},
		{`{"session_id":"s1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=b"}`, `{"session_id":"s1"}`},
		{`{"baggage":"k=v","tool_call_id":"c1"}`, ``},
		{`{"note":"\"tool_call_id\" is only a value here"}`, `{"note":"\"tool_call_id\" is only a value here"}`},
		{`{"nested":{"traceparent":"x"},"session_id":"s"}`, `{"nested":{"traceparent":"x"},"session_id":"s"}`},
	} {
		if got := policyProvenance(json.RawMessage(tc.in)); string(got) != tc.want {
			t.Errorf("policyProvenance(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// Calls that differ only in call-scoped provenance (a tool call id, trace
// context) are decided on the same policy input — so the decision cache
// answers the second — while each audit record's context keeps its own.
func TestCallScopedProvenanceLeftOutOfPolicyInput(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "a")
	var inputs [][]byte
	for i, prov := range []string{
		`{"session_id":"s1","source":"runner","tool_call_id":"c1"}`,
		`{"session_id":"s1","source":"runner","tool_call_id":"c2","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
	} {
		r := h.invoke("fs.read", map[string]any{"path": "a.txt"}, func(e *Envelope) { e.Provenance = json.RawMessage(prov) })
		mustOK(t, r)
		_, p := h.entryOf(r)
		if p == nil || bytes.Contains(p.PolicyInput, []byte("tool_call_id")) || bytes.Contains(p.PolicyInput, []byte("traceparent")) ||
			!bytes.Contains(p.PolicyInput, []byte(`"provenance":{"session_id":"s1","source":"runner"}`)) {
			t.Fatalf("call %d: policy input %s", i, p.PolicyInput)
		}
		if !bytes.Contains(p.Context, []byte(`"tool_call_id":"c`)) {
			t.Fatalf("call %d: the audit context lost the provenance: %s", i, p.Context)
		}
		inputs = append(inputs, p.PolicyInput)
	}
	if !bytes.Equal(inputs[0], inputs[1]) {
		t.Fatalf("policy inputs differ:\n%s\n%s", inputs[0], inputs[1])
	}
}

// An envelope whose provenance has ProvenanceRequestState (the MCP
// gateway's retry naming no call waiting for its client) is refused,
// invalid_args, and audited as the verified agent's call; nothing runs.
// Whatever the member holds, null included; a nested one of that name is
// only data.
func TestStaleRequestStateRefused(t *testing.T) {
	h := newHarness(t)
	for i, tc := range []struct {
		prov    string
		refused bool
	}{
		{`{"session_id":"s1","mcp_request_state":"bogus"}`, true},
		{`{"mcp_request_state":null}`, true},
		{`{"mcp_request_state":{"a":1},"source":"mcp"}`, true},
		{`{"session_id":"s1","nested":{"mcp_request_state":"x"}}`, false},
	} {
		path := "stale.txt"
		r := h.k.Invoke(context.Background(), h.env("fs.write", map[string]any{"path": path, "content": "x"}, func(e *Envelope) {
			e.Provenance = json.RawMessage(tc.prov)
		}, key(fmt.Sprint("stale-", i))))
		if !tc.refused {
			if r.Status != StatusOK {
				t.Errorf("%s: %+v", tc.prov, r.Error)
			}
			os.Remove(filepath.Join(h.ws, path))
			continue
		}
		if r.Status == StatusOK || r.Error.Class != ErrInvalidArgs || r.Error.Message != StaleRequestState {
			t.Fatalf("%s: %s %+v", tc.prov, r.Status, r.Error)
		}
		if r.ReceiptID == "" || r.AgentID != h.agent {
			t.Errorf("%s: refusal not audited as the agent's call: receipt %q, agent %q", tc.prov, r.ReceiptID, r.AgentID)
		}
		if _, err := os.Stat(filepath.Join(h.ws, path)); !os.IsNotExist(err) {
			t.Fatalf("%s: the refused call wrote: %v", tc.prov, err)
		}
	}
}
