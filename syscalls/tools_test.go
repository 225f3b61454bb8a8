package syscalls_test

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// builtinDefs returns the builtins' definitions, sorted by id.
func builtinDefs(t testing.TB) []syscalls.Definition {
	t.Helper()
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	return r.List()
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// providerName is the tool-name rule of OpenAI and Anthropic.
var providerName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func TestTools(t *testing.T) {
	defs := builtinDefs(t)
	tests := []struct {
		format    string
		toolKeys  []string                         // keys of each tool object, sorted
		fields    func(map[string]any) any         // the object holding name and description
		schema    func(map[string]any) any         // the input schema
		checkTool func(*testing.T, map[string]any) // format-specific checks
	}{
		{
			format:   syscalls.FormatOpenAI,
			toolKeys: []string{"function", "type"},
			fields:   func(m map[string]any) any { return m["function"] },
			schema:   func(m map[string]any) any { return m["function"].(map[string]any)["parameters"] },
			checkTool: func(t *testing.T, m map[string]any) {
				if m["type"] != "function" {
					t.Errorf("type = %v, want function", m["type"])
				}
				f, ok := m["function"].(map[string]any)
				if !ok {
					t.Fatalf("function = %T, want an object", m["function"])
				}
				if got, want := keys(f), []string{"description", "name", "parameters"}; !slices.Equal(got, want) {
					t.Errorf("function keys = %v, want %v", got, want)
				}
			},
		},
		{
			format:   syscalls.FormatAnthropic,
			toolKeys: []string{"description", "input_schema", "name"},
			fields:   func(m map[string]any) any { return m },
			schema:   func(m map[string]any) any { return m["input_schema"] },
		},
		{
			format:   syscalls.FormatMCP,
			toolKeys: []string{"description", "inputSchema", "name"},
			fields:   func(m map[string]any) any { return m },
			schema:   func(m map[string]any) any { return m["inputSchema"] },
		},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			raw, err := syscalls.Tools(defs, tt.format)
			if err != nil {
				t.Fatalf("Tools: %v", err)
			}
			var tools []map[string]any
			if err := json.Unmarshal(raw, &tools); err != nil {
				t.Fatalf("output is not a JSON array of objects: %v\n%s", err, raw)
			}
			if len(tools) != len(defs) {
				t.Fatalf("%d tools, want %d", len(tools), len(defs))
			}
			for i, tool := range tools {
				d := defs[i]
				if got := keys(tool); !slices.Equal(got, tt.toolKeys) {
					t.Errorf("%s: tool keys = %v, want %v", d.ID, got, tt.toolKeys)
				}
				if tt.checkTool != nil {
					tt.checkTool(t, tool)
				}
				f := tt.fields(tool).(map[string]any)
				name, _ := f["name"].(string)
				if name != syscalls.ToolName(d.ID, tt.format) {
					t.Errorf("%s: name = %q, want %q", d.ID, name, syscalls.ToolName(d.ID, tt.format))
				}
				if tt.format != syscalls.FormatMCP && !providerName.MatchString(name) {
					t.Errorf("%s: name %q is not a valid %s tool name", d.ID, name, tt.format)
				}
				if f["description"] != d.Description {
					t.Errorf("%s: description = %v, want %q", d.ID, f["description"], d.Description)
				}
				schema, ok := tt.schema(tool).(map[string]any)
				if !ok {
					t.Fatalf("%s: input schema = %T, want an object", d.ID, tt.schema(tool))
				}
				var want map[string]any
				if err := json.Unmarshal(d.InputSchema, &want); err != nil {
					t.Fatal(err)
				}
				if schema["type"] != "object" || !jsonEqual(t, schema, want) {
					t.Errorf("%s: input schema = %v, want the definition's %v", d.ID, schema, want)
				}
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}

func TestToolsEmpty(t *testing.T) {
	for _, f := range []string{syscalls.FormatOpenAI, syscalls.FormatAnthropic, syscalls.FormatMCP} {
		raw, err := syscalls.Tools(nil, f)
		if err != nil || string(raw) != "[]" {
			t.Errorf("Tools(nil, %s) = %s, %v; want [] and no error", f, raw, err)
		}
	}
}

func TestToolsUnknownFormat(t *testing.T) {
	tests := []struct {
		name   string
		defs   []syscalls.Definition
		format string
	}{
		{"empty format", builtinDefs(t), ""},
		{"misspelled", builtinDefs(t), "openAI"},
		{"other provider", builtinDefs(t), "gemini"},
		// The format is wrong whatever the list holds: a token granting no
		// tools must not hide a caller's bad format.
		{"no definitions", nil, "gemini"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := syscalls.Tools(tt.defs, tt.format)
			if err == nil {
				t.Fatalf("Tools(%q) = %s, want an error", tt.format, raw)
			}
			if !strings.Contains(err.Error(), "unknown format") || !strings.Contains(err.Error(), `"`+tt.format+`"`) {
				t.Errorf("error %q does not name the unknown format %q", err, tt.format)
			}
		})
	}
}

func TestToolNameRoundTrip(t *testing.T) {
	ids := []string{"mcp.git_hub.list_issues", "a_b.c_d", "x", "a.b.c.d", "v2.fs2.read_3"}
	for _, d := range builtinDefs(t) {
		ids = append(ids, d.ID)
	}
	tests := []struct {
		format string
		want   func(id string) string
	}{
		{syscalls.FormatOpenAI, func(id string) string { return strings.ReplaceAll(id, ".", "__") }},
		{syscalls.FormatAnthropic, func(id string) string { return strings.ReplaceAll(id, ".", "__") }},
		{syscalls.FormatMCP, func(id string) string { return id }},
	}
	for _, tt := range tests {
		for _, id := range ids {
			name := syscalls.ToolName(id, tt.format)
			if name != tt.want(id) {
				t.Errorf("ToolName(%q, %s) = %q, want %q", id, tt.format, name, tt.want(id))
			}
			if tt.format != syscalls.FormatMCP && !providerName.MatchString(name) {
				t.Errorf("ToolName(%q, %s) = %q is not a valid provider tool name", id, tt.format, name)
			}
			if back := syscalls.ParseToolName(name, tt.format); back != id {
				t.Errorf("ParseToolName(ToolName(%q, %s)) = %q", id, tt.format, back)
			}
		}
	}
	// Spot checks of the documented mapping.
	if got := syscalls.ToolName("mcp.git_hub.list_issues", syscalls.FormatOpenAI); got != "mcp__git_hub__list_issues" {
		t.Errorf("ToolName(mcp.git_hub.list_issues, openai) = %q", got)
	}
	if got := syscalls.ParseToolName("fs__read", syscalls.FormatAnthropic); got != "fs.read" {
		t.Errorf("ParseToolName(fs__read, anthropic) = %q", got)
	}
}
