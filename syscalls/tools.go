package syscalls

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Tool formats for Tools.
const (
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
	FormatMCP       = "mcp"
)

// ToolName is the name a syscall id takes in an LLM tool format. OpenAI and
// Anthropic require names matching ^[a-zA-Z0-9_-]{1,64}$, so there each "."
// is written "__" ("fs.read" becomes "fs__read"); MCP keeps the id. The
// mapping is reversible because an id never holds two "_" in a row.
func ToolName(id, format string) string {
	if format == FormatMCP {
		return id
	}
	return strings.ReplaceAll(id, ".", "__")
}

// ParseToolName maps a tool name in format back to the syscall id.
func ParseToolName(name, format string) string {
	if format == FormatMCP {
		return name
	}
	return strings.ReplaceAll(name, "__", ".")
}

// Tools renders defs as an LLM's tool list: "openai" (function tools),
// "anthropic" (name, description, input_schema) or "mcp" (name,
// description, inputSchema, and outputSchema when the syscall has one).
func Tools(defs []Definition, format string) (json.RawMessage, error) {
	switch format {
	case FormatOpenAI, FormatAnthropic, FormatMCP:
	default:
		return nil, fmt.Errorf("tools: unknown format %q (want openai, anthropic or mcp)", format)
	}
	out := make([]any, 0, len(defs))
	for _, d := range defs {
		name := ToolName(d.ID, format)
		switch format {
		case FormatOpenAI:
			out = append(out, map[string]any{"type": "function", "function": map[string]any{
				"name": name, "description": d.Description, "parameters": d.InputSchema}})
		case FormatAnthropic:
			out = append(out, map[string]any{"name": name, "description": d.Description, "input_schema": d.InputSchema})
		case FormatMCP:
			t := map[string]any{"name": name, "description": d.Description, "inputSchema": d.InputSchema}
			if d.OutputSchema != nil {
				t["outputSchema"] = d.OutputSchema
			}
			out = append(out, t)
		}
	}
	return json.Marshal(out)
}
