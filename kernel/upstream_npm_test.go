package kernel

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/upstream"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// TestUpstreamDeclaredFilesystem runs @modelcontextprotocol/server-
// filesystem under the shipped declarations: its path arguments are
// resolved like fs.read's, before the upstream is called, and the secret
// and gated-path rules decide on them.
func TestUpstreamDeclaredFilesystem(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := filepath.Join(t.TempDir(), "up")
	var h *harness
	h = newHarness(t, execPolicy(t), func(c *Config) {
		ws := filepath.Join(filepath.Dir(c.DataDir), "ws")
		if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(ws, "sub"), up); err != nil {
			t.Fatal(err)
		}
		c.MCPServers = map[string]upstream.Server{
			"fs": {Command: upstreamtest.ReferenceServer(t, "server-filesystem", ws), Declare: "filesystem"},
			// The same server with its own declarations: one names an
			// argument no call has, one an argument that is a number.
			"fsbad": {Command: upstreamtest.ReferenceServer(t, "server-filesystem", ws), Resources: []upstream.Declaration{
				{Tools: "read_text_file", Args: []upstream.Arg{{Pointer: "/head", Kind: "fs"}}},
				{Tools: "get_file_info", Args: []upstream.Arg{{Pointer: "/file", Kind: "fs"}}},
				{Tools: "*"},
			}},
			// No declaration at all.
			"fsu": {Command: upstreamtest.ReferenceServer(t, "server-filesystem", ws)},
			// A server that sees only ws/sub, as the directory up (a
			// link to it, standing in for a container mount).
			"fsmap": {Command: upstreamtest.ReferenceServer(t, "server-filesystem", up), Declare: "filesystem",
				Paths: []upstream.PathMap{{Root: filepath.Join(ws, "sub"), Upstream: up}}},
		}
		c.ApprovalTimeout = 50 * time.Millisecond
	})
	h.write("notes.txt", "hello")
	h.write(".env", "API_KEY=hunter2")
	h.write("sub/deep.txt", "deep")
	for _, l := range []struct{ name, target string }{{"out", outside}, {"envlink", ".env"}} {
		if err := os.Symlink(l.target, filepath.Join(h.ws, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, tool string
		args       map[string]any
		class      string
		want       string // in the result
	}{
		{"relative path, resolved and sent absolute", "mcp.fs.read_text_file", map[string]any{"path": "notes.txt"}, "", "hello"},
		{"absolute path in the root", "mcp.fs.read_text_file", map[string]any{"path": filepath.Join(h.ws, "sub/deep.txt")}, "", "deep"},
		{"every path of a list", "mcp.fs.read_multiple_files", map[string]any{"paths": []string{"notes.txt", "sub/deep.txt"}}, "", "deep"},
		{"a secret, as for fs.read", "mcp.fs.read_text_file", map[string]any{"path": ".env"}, ErrPolicyDenied, ""},
		{"a secret through a symlink", "mcp.fs.read_text_file", map[string]any{"path": "envlink"}, ErrPolicyDenied, ""},
		{"a secret in a list", "mcp.fs.read_multiple_files", map[string]any{"paths": []string{"notes.txt", ".env"}}, ErrPolicyDenied, ""},
		{"traversal", "mcp.fs.read_text_file", map[string]any{"path": "../" + filepath.Base(outside) + "/secret.txt"}, ErrScopeDenied, ""},
		{"absolute outside", "mcp.fs.read_text_file", map[string]any{"path": filepath.Join(outside, "secret.txt")}, ErrScopeDenied, ""},
		{"symlink out", "mcp.fs.read_text_file", map[string]any{"path": "out/secret.txt"}, ErrScopeDenied, ""},
		{"traversal in a list", "mcp.fs.read_multiple_files", map[string]any{"paths": []string{"notes.txt", "../x"}}, ErrScopeDenied, ""},
		{"move out of the root", "mcp.fs.move_file", map[string]any{"source": "notes.txt", "destination": filepath.Join(outside, "n.txt")}, ErrScopeDenied, ""},
		{"a pointer naming a missing argument", "mcp.fsbad.get_file_info", map[string]any{"path": "notes.txt"}, ErrInvalidArgs, ""},
		{"a declared path that is a number", "mcp.fsbad.read_text_file", map[string]any{"path": "notes.txt", "head": 1}, ErrInvalidArgs, ""},
		{"paths: mapped into the upstream's space", "mcp.fsmap.read_text_file", map[string]any{"path": "sub/deep.txt"}, "", "deep"},
		{"paths: named in the upstream's space", "mcp.fsmap.read_text_file", map[string]any{"path": filepath.Join(up, "deep.txt")}, "", "deep"},
		{"paths: a file the upstream cannot see", "mcp.fsmap.read_text_file", map[string]any{"path": "notes.txt"}, ErrScopeDenied, ""},
		{"undeclared: an opaque effect waits for an approver", "mcp.fsu.read_text_file", map[string]any{"path": "notes.txt"}, ErrApprovalTimeout, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.headSize()
			r := h.invoke(tc.tool, tc.args, key(fmt.Sprint("decl-", i)))
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if !strings.Contains(string(r.Result), tc.want) {
				t.Fatalf("result %s, want it to hold %q", r.Result, tc.want)
			}
			a := h.audits(before)
			if len(a) != 1 || a[0].ErrorClass != tc.class || r.Receipt == nil {
				t.Fatalf("audit %+v", a)
			}
			in := a[0].PolicyInput
			switch {
			case tc.class == ErrScopeDenied || tc.class == ErrInvalidArgs:
				if in != nil {
					t.Fatalf("refused before the policy, yet decided on %+v", in)
				}
			case tc.tool == "mcp.fsu.read_text_file":
				if !in.ResourcesUndeclared || len(in.Resources) != 0 {
					t.Fatalf("policy input %+v", in)
				}
			default:
				if in.ResourcesUndeclared || len(in.Resources) == 0 || in.Resources[0].Kind != "fs" || in.Resources[0].Root != h.ws {
					t.Fatalf("policy input %+v", in)
				}
			}
		})
	}
	// The same secret by fs.read: the same class from the same rule.
	if r := h.invoke("fs.read", map[string]any{"path": ".env"}); errClass(r) != ErrPolicyDenied {
		t.Fatalf("fs.read .env: %+v", r.Error)
	}
	// A write in a read-only root never reaches the upstream.
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"mcp.*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}}})
	if r := h.invoke("mcp.fs.write_file", map[string]any{"path": "notes.txt", "content": "x"}, key("ro")); errClass(r) != ErrScopeDenied {
		t.Fatalf("write in a read-only root: %+v", r.Error)
	}
	if got := h.read("notes.txt"); got != "hello" {
		t.Fatalf("notes.txt is %q", got)
	}
	mustVerify(t, h.k.Inspector())
}

// TestUpstreamBigResult: a result over the cap — and over the SDKs' 16 MiB
// stdio frame — is an audited error naming its size and the cap; the
// connection stays up, so a write sent right after it runs (before the
// framer, the connection broke and such a write came back
// outcome_unknown, its key burnt).
func TestUpstreamBigResult(t *testing.T) {
	h := newHarness(t, execPolicy(t), func(c *Config) {
		ws := filepath.Join(filepath.Dir(c.DataDir), "ws")
		c.MCPServers = map[string]upstream.Server{
			"fs": {Command: upstreamtest.ReferenceServer(t, "server-filesystem", ws), Declare: "filesystem"},
		}
	})
	h.write("big.txt", strings.Repeat("0123456789abcdef", 1<<20)) // 16 MiB, sent twice by the server
	h.write("mid.txt", strings.Repeat("x", 3<<20))
	for _, f := range []string{"big.txt", "mid.txt"} {
		before := h.headSize()
		r := h.invoke("mcp.fs.read_text_file", map[string]any{"path": f})
		if errClass(r) != ErrUpstreamError || !strings.Contains(r.Error.Message, fmt.Sprintf("bytes; the limit is %d bytes", upstream.DefaultMaxResultBytes)) {
			t.Fatalf("%s: %+v", f, r.Error)
		}
		if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != ErrUpstreamError {
			t.Fatalf("audit %+v", a)
		}
		// Right after: a write, on the same connection.
		r = h.invoke("mcp.fs.write_file", map[string]any{"path": "after-" + f, "content": "ok"}, key("after-"+f))
		mustOK(t, r)
		if got := h.read("after-" + f); got != "ok" {
			t.Fatalf("after-%s is %q", f, got)
		}
	}
	mustOK(t, h.invoke("mcp.fs.read_text_file", map[string]any{"path": "after-big.txt"}))
}

// TestUpstreamFaithfulResults: server-everything's images, resource
// links, embedded resources and structured content come through as the
// upstream sent them, with the tool's outputSchema.
func TestUpstreamFaithfulResults(t *testing.T) {
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"ev": {Command: upstreamtest.ReferenceServer(t, "server-everything", "stdio"), Declare: "everything"},
	}))
	e, ok := h.k.Registry().Get("mcp.ev.get_structured_content")
	if !ok || len(e.Def.OutputSchema) == 0 || !e.Def.MCPResult {
		t.Fatalf("get-structured-content: %+v", e)
	}
	tests := []struct {
		tool string
		args map[string]any
		want []string
	}{
		{"mcp.ev.get_tiny_image", nil, []string{`"type":"image"`, `"mimeType":"image/png"`, `"data":"iVBOR`}},
		{"mcp.ev.get_resource_links", map[string]any{"count": 2}, []string{`"type":"resource_link"`, `"uri":"demo://resource/`}},
		{"mcp.ev.get_resource_reference", map[string]any{"resourceType": "Text", "resourceId": 1}, []string{`"type":"resource"`, `"resource":{`}},
		{"mcp.ev.get_structured_content", map[string]any{"location": "Chicago"}, []string{`"structuredContent":{`, `"temperature"`}},
	}
	for _, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			if tc.args == nil {
				tc.args = map[string]any{}
			}
			r := h.invoke(tc.tool, tc.args)
			mustOK(t, r)
			for _, w := range tc.want {
				if !strings.Contains(string(r.Result), w) {
					t.Fatalf("result %.400s lacks %s", r.Result, w)
				}
			}
			var res map[string]json.RawMessage
			if err := json.Unmarshal(r.Result, &res); err != nil || res["content"] == nil || res["structured_content"] != nil {
				t.Fatalf("result shape %.300s (%v)", r.Result, err)
			}
		})
	}
	// get-env is left undeclared: it reveals the server's environment.
	h.k.Close()
	h.open(execPolicy(t), withServers(map[string]upstream.Server{
		"ev": {Command: upstreamtest.ReferenceServer(t, "server-everything", "stdio"), Declare: "everything"},
	}), func(c *Config) { c.ApprovalTimeout = 10 * time.Millisecond })
	if r := h.invoke("mcp.ev.get_env", map[string]any{}, key("env")); errClass(r) != ErrApprovalTimeout || r.AutonomyMode != "soft_gate" {
		t.Fatalf("get-env: %+v %s", r.Error, r.AutonomyMode)
	}
}

// TestUpstreamDeclaredNet: a declared URL is checked against the token's
// net patterns and net.fetch's SSRF rules before server-everything
// fetches it; a declared kv key must be in the token's kv scopes, and
// reaches the policy input.
func TestUpstreamDeclaredNet(t *testing.T) {
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"ev": {Command: upstreamtest.ReferenceServer(t, "server-everything", "stdio"), Declare: "everything", Resources: []upstream.Declaration{
			{Tools: "echo", SideEffect: "NONE", Args: []upstream.Arg{{Pointer: "/message", Kind: "kv"}}}}},
	}), func(c *Config) { c.NetLookup = testLookup })
	tests := []struct {
		name  string
		net   []string
		data  string
		class string
	}{
		{"outside the patterns", []string{"api.example.com"}, "https://evil.example.com/x", ErrScopeDenied},
		{"loopback under a wildcard", []string{"*"}, "http://127.0.0.1:1/x", ErrScopeDenied},
		{"a name resolving to loopback", []string{"*.test"}, "http://internal.test:1/x", ErrScopeDenied},
		{"loopback named explicitly: the upstream fetches", []string{"127.0.0.1:1"}, "http://127.0.0.1:1/x", ErrUpstreamError},
		{"a data URL reaches no host", nil, "data:text/plain;base64,aGVsbG8=", ""},
		{"not a URL", []string{"*"}, "ftp://x/y", ErrInvalidArgs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"mcp.*"}, Net: tc.net})
			before := h.headSize()
			args := map[string]any{"name": "x.gz", "data": tc.data}
			var r *Result
			if tc.class == ErrUpstreamError {
				// A call that reaches a host is not wholly declared (the
				// upstream may follow a redirect elsewhere): an approver
				// decides it (confirmation.undeclared, default prompt).
				a, res := h.gated("mcp.ev.gzip_file_as_resource", args)
				if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleApprover), "allow", "ok"); err != nil {
					t.Fatal(err)
				}
				r = <-res
			} else {
				r = h.invoke("mcp.ev.gzip_file_as_resource", args)
			}
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != tc.class {
				t.Fatalf("audit %+v", a)
			}
		})
	}
	// A declared kv key is bounded by the token's kv scopes, as kv.get's.
	if r := h.invoke("mcp.ev.echo", map[string]any{"message": "progress"}); errClass(r) != ErrScopeDenied {
		t.Fatalf("a key outside the token's kv scopes: %+v", r.Error)
	}
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"mcp.*"}, KV: []captoken.KVScope{{Keys: "prog*", Mode: "r"}}})
	before := h.headSize()
	mustOK(t, h.invoke("mcp.ev.echo", map[string]any{"message": "progress"}))
	if a := h.audits(before); len(a) != 1 || fmt.Sprint(a[0].PolicyInput.Resources) != "[{kv read    [] false false progress  0}]" {
		t.Fatalf("audit %+v", a[0].PolicyInput)
	}
}
