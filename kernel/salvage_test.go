package kernel

import (
	"strings"
	"testing"
)

// TestSalvage: a refused envelope's audit record names what of its tool,
// agent and token id the bytes hold before the first thing that does not
// decode, by exact member name, never a value of another type.
func TestSalvage(t *testing.T) {
	long := strings.Repeat("x", 100)
	tests := []struct {
		name, data         string
		tool, agent, token string
	}{
		{"whole", `{"tool_id":"echo","agent_id":"a1","capability_token_id":"t1","args":{}}`, "echo", "a1", "t1"},
		{"cut in the args", `{"tool_id":"echo","agent_id":"a1","args":{"text":"` + long, "echo", "a1", ""},
		{"args first, cut", `{"args":{"text":"` + long, "", "", ""},
		{"args first, whole", `{"args":{"text":[1,{"agent_id":"inner"}]},"agent_id":"a1"}`, "", "a1", ""},
		{"cut in a name", `{"tool_id":"echo","agent_i`, "echo", "", ""},
		{"cut in a value", `{"tool_id":"echo","agent_id":"a`, "echo", "", ""},
		{"duplicate member", `{"tool_id":"echo","tool_id":"other","agent_id":"a1"}`, "echo", "", ""},
		{"other case", `{"Tool_ID":"echo","AGENT_ID":"a1"}`, "", "", ""},
		{"not a string", `{"tool_id":5,"agent_id":{"x":"y"},"capability_token_id":"t1"}`, "", "", "t1"},
		{"not an object", `["tool_id","echo"]`, "", "", ""},
		{"empty", ``, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := salvage([]byte(tt.data))
			if e.ToolID != tt.tool || e.AgentID != tt.agent || e.CapabilityTokenID != tt.token {
				t.Fatalf("tool %q agent %q token %q, want %q %q %q", e.ToolID, e.AgentID, e.CapabilityTokenID, tt.tool, tt.agent, tt.token)
			}
		})
	}
}
