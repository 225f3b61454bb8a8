package kernel

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// Envelopes are read by the strictjson rules: one an other parser would
// read differently (which of two tool_ids, a case-folded name, bytes that
// are not UTF-8, anywhere in args or provenance) is an audited invalid_args
// that names the member, and changes nothing.
func TestEnvelopeStrictJSON(t *testing.T) {
	h := newHarness(t)
	h.write("keep.txt", "keep")
	m := map[string]any{
		"tool_id": "fs.write", "args": map[string]any{"path": "keep.txt", "content": "changed", "mode": "overwrite"},
		"agent_id": h.agent, "capability_token": h.token, "capability_token_id": h.jti,
		"policy_hash": h.k.PolicyHash(), "idempotency_key": "strict",
		"provenance":        map[string]any{"session_id": "s1", "source": "test"},
		"precondition_refs": []any{map[string]any{"ref": "fs:keep.txt", "hash": "blake3:" + strings.Repeat("0", 64)}},
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	valid := string(b)
	edit := func(old, new string) []byte {
		t.Helper()
		if strings.Count(valid, old) != 1 {
			t.Fatalf("%q is not once in %s", old, valid)
		}
		return []byte(strings.Replace(valid, old, new, 1))
	}
	tests := []struct {
		name string
		raw  []byte
		want string // in the error message
	}{
		{"duplicate tool_id", edit(`"tool_id":"fs.write"`, `"tool_id":"echo","tool_id":"fs.write"`), `duplicate member name "tool_id"`},
		{"duplicate agent_id, escaped", edit(`"agent_id":`, `"agent_id":"other","agent\u005fid":`), `duplicate member name "agent_id"`},
		{"duplicate arg", edit(`"content":"changed"`, `"content":"changed","content":"twice"`), `duplicate member name "content" in /args`},
		{"duplicate deep in args", edit(`"mode":"overwrite"`, `"mode":"overwrite","x":{"y":[{"z":1,"z":2}]}`), `duplicate member name "z" in /args/x/y/0`},
		{"duplicate in provenance", edit(`"session_id":"s1"`, `"session_id":"s1","session_id":"s2"`), `duplicate member name "session_id" in /provenance`},
		{"duplicate in a precondition", edit(`"ref":"fs:keep.txt"`, `"ref":"fs:other.txt","ref":"fs:keep.txt"`), `duplicate member name "ref" in /precondition_refs/0`},
		{"unknown field", edit(`"tool_id"`, `"sudo":true,"tool_id"`), `unknown field "sudo"`},
		{"unknown precondition field", edit(`"ref":"fs:keep.txt"`, `"ref":"fs:keep.txt","force":true`), `unknown field "force" in /precondition_refs/0`},
		{"case-folded name", edit(`"tool_id"`, `"TOOL_ID"`), `unknown field "TOOL_ID"`},
		{"invalid UTF-8 in agent_id", edit(`"agent_id":"agent-1"`, "\"agent_id\":\"agent-1\xff\""), `invalid UTF-8 in /agent_id`},
		{"invalid UTF-8 in an arg", edit(`"content":"changed"`, "\"content\":\"chan\xc3ged\""), `invalid UTF-8 in /args/content`},
		{"invalid UTF-8 in an arg name", edit(`"content":"changed"`, "\"cont\xffent\":\"changed\""), `invalid UTF-8`},
		{"lone surrogate in an arg", edit(`"content":"changed"`, `"content":"\ud800"`), `surrogate`},
		{"lone surrogate in a provenance name", edit(`"source":"test"`, `"\udc00":"test"`), `surrogate`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.headSize()
			r := h.k.InvokeJSON(context.Background(), tc.raw)
			if errClass(r) != ErrInvalidArgs || r.TxOutcome != NoOp {
				t.Fatalf("got %q %s, want invalid_args no_op (%+v)", errClass(r), r.TxOutcome, r.Error)
			}
			if !strings.Contains(r.Error.Message, tc.want) {
				t.Fatalf("message %q does not name %q", r.Error.Message, tc.want)
			}
			if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != ErrInvalidArgs {
				t.Fatalf("audit records %+v, want one invalid_args", a)
			}
			if got := h.read("keep.txt"); got != "keep" {
				t.Fatalf("workspace changed: %q", got)
			}
		})
	}
	// The Go API holds args and provenance as raw JSON: the same documents
	// are refused there.
	for _, tc := range []struct {
		name string
		args string
		prov string
	}{
		{"Invoke: duplicate arg", `{"path":"keep.txt","content":"a","content":"b"}`, ""},
		{"Invoke: invalid UTF-8 in an arg", "{\"path\":\"keep.txt\",\"content\":\"\xff\"}", ""},
		{"Invoke: lone surrogate in an arg", `{"path":"keep.txt","content":"\ud800"}`, ""},
		{"Invoke: duplicate in provenance", `{"path":"keep.txt","content":"a"}`, `{"s":1,"s":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.k.Invoke(context.Background(), h.env("fs.write", nil, key("go-"+tc.name), func(e *Envelope) {
				e.Args = json.RawMessage(tc.args)
				if tc.prov != "" {
					e.Provenance = json.RawMessage(tc.prov)
				}
			}))
			if errClass(r) != ErrInvalidArgs {
				t.Fatalf("got %q, want invalid_args (%+v)", errClass(r), r.Error)
			}
			if got := h.read("keep.txt"); got != "keep" {
				t.Fatalf("workspace changed: %q", got)
			}
		})
	}
	mustVerify(t, h.k.Inspector())
}

// kernel.json is read by the strictjson rules: Open refuses a config file
// that another reader could read differently, naming the file and member.
func TestConfigStrictJSON(t *testing.T) {
	h := newHarness(t)
	h.k.Close()
	path := filepath.Join(h.data, ConfigFile)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s settings
	if err := json.Unmarshal(orig, &s); err != nil {
		t.Fatal(err)
	}
	valid, _ := json.Marshal(struct {
		settings
		MCPServers map[string]any `json:"mcp_servers"`
	}{s, map[string]any{"up": map[string]any{"command": []string{"true"}, "timeout": "5s", "side_effect": syscalls.Read}}})
	edit := func(old, new string) []byte {
		t.Helper()
		if strings.Count(string(valid), old) != 1 {
			t.Fatalf("%q is not once in %s", old, valid)
		}
		return []byte(strings.Replace(string(valid), old, new, 1))
	}
	tests := []struct {
		name string
		doc  []byte
		want string
	}{
		{"duplicate kernel_id", edit(`"kernel_id":`, `"kernel_id":"other","kernel_id":`), `duplicate member name "kernel_id"`},
		{"duplicate admin hash", edit(`"admin_credential_hash":`, `"admin_credential_hash":"blake3:00","admin_credential_hash":`), `duplicate member name "admin_credential_hash"`},
		{"duplicate in an MCP server", edit(`"timeout":"5s"`, `"timeout":"5s","timeout":"1h"`), `duplicate member name "timeout" in /mcp_servers/up`},
		{"unknown field", edit(`"kernel_id":`, `"debug":true,"kernel_id":`), `unknown field "debug"`},
		{"unknown MCP server field", edit(`"timeout":"5s"`, `"timeout":"5s","sudo":true`), `unknown field "sudo" in /mcp_servers/up`},
		{"case-folded name", edit(`"issuer":`, `"ISSUER":`), `unknown field "ISSUER"`},
		{"invalid UTF-8", edit(`"timeout":"5s"`, "\"timeout\":\"5s\xff\""), `invalid UTF-8 in /mcp_servers/up/timeout`},
		{"lone surrogate", edit(`"command":["true"]`, `"command":["\ud800"]`), `surrogate`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, tc.doc, 0o600); err != nil {
				t.Fatal(err)
			}
			k, err := Open(context.Background(), Config{DataDir: h.data})
			if err == nil {
				k.Close()
				t.Fatal("Open accepted the config file")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ConfigFile) {
				t.Fatalf("error %q does not name %s and %q", err, ConfigFile, tc.want)
			}
		})
	}
}
