package httpapi_test

import (
	"strings"
	"testing"
)

// Request bodies are read by the strictjson rules: approval decisions and
// the admin and token bodies are refused with 400 invalid_args naming the
// member when another reader could read them differently.
func TestBodiesStrictJSON(t *testing.T) {
	f := newFixture(t)
	auth := "Authorization: Bearer " + f.admin
	approver := "Authorization: Bearer " + f.token
	tests := []struct {
		name string
		path string
		body string
		auth string
		want string
	}{
		{"decision: duplicate decision", "/v1/approvals/x", `{"decision":"deny","decision":"allow"}`, approver, `duplicate member name "decision"`},
		{"decision: case-folded name", "/v1/approvals/x", `{"Decision":"allow"}`, approver, `unknown field "Decision"`},
		{"decision: unknown field", "/v1/approvals/x", `{"decision":"allow","as":"admin"}`, approver, `unknown field "as"`},
		{"decision: invalid UTF-8", "/v1/approvals/x", "{\"decision\":\"allow\",\"reason\":\"\xff\"}", approver, `invalid UTF-8 in /reason`},
		{"decision: lone surrogate", "/v1/approvals/x", `{"decision":"allow","reason":"\ud800"}`, approver, `surrogate`},
		{"decision: trailing data", "/v1/approvals/x", `{"decision":"allow"} {"decision":"deny"}`, approver, `after top-level value`},
		{"mint: duplicate agent", "/v1/tokens", `{"agent_id":"a","agent_id":"b","tools":["echo"]}`, auth, `duplicate member name "agent_id"`},
		{"mint: duplicate fs mode", "/v1/tokens", `{"agent_id":"a","tools":["echo"],"fs":[{"path":"/tmp","mode":"r","mode":"rw"}]}`, auth, `duplicate member name "mode" in /fs/0`},
		{"mint: duplicate budget", "/v1/tokens", `{"agent_id":"a","tools":["echo"],"budgets":{"calls":1,"calls":9}}`, auth, `duplicate member name "calls" in /budgets`},
		{"mint: invalid UTF-8 tool", "/v1/tokens", "{\"agent_id\":\"a\",\"tools\":[\"ec\xffho\"]}", auth, `invalid UTF-8 in /tools/0`},
		{"revoke: duplicate reason", "/v1/tokens/" + "j" + "/revoke", `{"reason":"a","reason":"b"}`, auth, `duplicate member name "reason"`},
		{"inspect: duplicate token", "/v1/tokens/inspect", `{"token":"a","token":"b"}`, "", `duplicate member name "token"`},
		{"attenuate: unknown field", "/v1/tokens/attenuate", `{"parent":"x","widen":true}`, "", `unknown field "widen"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			headers := []string{"Content-Type: application/json"}
			if tc.auth != "" {
				headers = append(headers, tc.auth)
			}
			status, out := f.send(t, "POST", tc.path, []byte(tc.body), headers...)
			if status != 400 || !strings.Contains(string(out), `"invalid_args"`) {
				t.Fatalf("status %d %s, want 400 invalid_args", status, out)
			}
			if !strings.Contains(string(out), strings.ReplaceAll(tc.want, `"`, `\"`)) {
				t.Fatalf("answer %s does not name %s", out, tc.want)
			}
		})
	}
}
