package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// TestMCPGatewayUpstream: server-filesystem behind a served kernel,
// called by the SDK's client through kernelctl mcp: the upstream's result
// reaches the client as it came (the file's text once as text, its
// structuredContent, the tool's outputSchema), a secret is refused, and a
// result over the cap is an error result after which the connection
// still works.
func TestMCPGatewayUpstream(t *testing.T) {
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if _, stderr, code := run(t, "init", "--data", data); code != 0 {
		t.Fatal(stderr)
	}
	os.MkdirAll(ws, 0o755)
	mid := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	os.WriteFile(filepath.Join(ws, "mid.txt"), []byte(mid), 0o644)
	os.WriteFile(filepath.Join(ws, "big.txt"), []byte(strings.Repeat("x", 3<<20)), 0o644)
	os.WriteFile(filepath.Join(ws, ".env"), []byte("API_KEY=hunter2"), 0o644)
	cfgPath := filepath.Join(data, kernel.ConfigFile)
	var cfg map[string]any
	b, _ := os.ReadFile(cfgPath)
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["mcp_servers"] = map[string]any{"fs": map[string]any{"command": upstreamtest.ReferenceServer(t, "server-filesystem", ws), "declare": "filesystem"}}
	b, _ = json.Marshal(cfg)
	os.WriteFile(cfgPath, b, 0o600)
	admin, err := readSecret(filepath.Join(data, kernel.AdminFile))
	if err != nil {
		t.Fatal(err)
	}
	srv := startServerArgs(t, data)
	tok := mintCLI(t, srv, admin, "--agent", "mcp-up", "--tools", "mcp.fs.*", "--fs", ws+":r")
	cs := mcpSession(t, false, "--server", srv.url, "--token", tok.file)
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var read *mcp.Tool
	for _, tl := range tools.Tools {
		if tl.Name == "mcp.fs.read_text_file" {
			read = tl
		}
	}
	if read == nil || read.OutputSchema == nil {
		t.Fatalf("mcp.fs.read_text_file without its outputSchema: %+v", read)
	}
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp.fs.read_text_file", Arguments: map[string]any{"path": "mid.txt"}})
	if err != nil || r.IsError {
		t.Fatalf("read: %v %+v", err, r)
	}
	sc, _ := r.StructuredContent.(map[string]any)
	if len(r.Content) != 1 || text(r) != mid || sc["content"] != mid || resultMeta(r, "capkernel/receipt_id") == "" {
		t.Fatalf("result: %d items, text of %d bytes, structured %T, meta %v", len(r.Content), len(text(r)), r.StructuredContent, r.Meta)
	}
	for _, c := range []struct{ path, want string }{
		{".env", "policy_denied"},
		{"../data/admin.token", "scope_denied"},
		{"big.txt", "the limit is 4194304 bytes"},
	} {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp.fs.read_text_file", Arguments: map[string]any{"path": c.path}})
		if err != nil || !r.IsError || !strings.Contains(text(r), c.want) {
			t.Fatalf("%s: %v %s", c.path, err, text(r))
		}
		// The tool declares an outputSchema, which clients hold an
		// error's structured content to as well (the TypeScript SDK's
		// callTool threw on each of these refusals): none; its receipt
		// is in _meta.
		if r.StructuredContent != nil || r.Meta[mcpgateway.MetaReceiptID] == nil {
			t.Errorf("%s: structured content %v, receipt %v in _meta", c.path, r.StructuredContent, r.Meta[mcpgateway.MetaReceiptID])
		}
	}
	if r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp.fs.read_text_file", Arguments: map[string]any{"path": "mid.txt", "head": 1}}); err != nil || r.IsError {
		t.Fatalf("after the refusals: %v %s", err, text(r))
	}
}
