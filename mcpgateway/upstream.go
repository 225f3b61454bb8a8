package mcpgateway

import (
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
)

// upstreamResult is the MCP result of a successful call of an upstream MCP
// tool (a syscall mcp.<server>.<tool>, whose kernel result is the
// upstream's CallToolResult): the upstream's content, structuredContent
// and _meta as they came, encoded once, with the kernel's _meta keys
// added. False for any other syscall.
func upstreamResult(res *kernel.Result) (*mcp.CallToolResult, bool) {
	if !strings.HasPrefix(res.ToolID, "mcp.") {
		return nil, false
	}
	var r mcp.CallToolResult
	if err := json.Unmarshal(res.Result, &r); err != nil {
		return nil, false
	}
	if r.Content == nil {
		r.Content = []mcp.Content{}
	}
	if r.Meta == nil {
		r.Meta = mcp.Meta{}
	}
	for k, v := range meta(res) {
		r.Meta[k] = v
	}
	return &r, true
}

// outputSchema is s for mcp.Tool.OutputSchema: nil when absent (a nil
// json.RawMessage in the interface would not be).
func outputSchema(s json.RawMessage) any {
	if len(s) == 0 {
		return nil
	}
	return s
}
