package upstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream"
)

// TestToolNames: upstream names become syscall ids (a dash turns into an
// underscore); a name that two upstream tools map to, a name no id can
// hold and a schema outside the subset are left out; $schema is dropped;
// classes come from the config, EXECUTE by default.
func TestToolNames(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "names", Version: "1"}, nil)
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	obj := json.RawMessage(`{"type":"object"}`)
	for _, name := range []string{"get-item", "a-b", "a_b", "CamelCase", "dotted.name", "read"} {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: obj}, noop)
	}
	s.AddTool(&mcp.Tool{Name: "dialect", InputSchema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`)}, noop)
	s.AddTool(&mcp.Tool{Name: "ref", InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"string"}}}`)}, noop)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)

	reg := syscalls.NewRegistry()
	set, err := upstream.Start(context.Background(), reg, map[string]upstream.Server{
		"up": {URL: srv.URL, Tools: map[string]syscalls.SideEffect{"read": syscalls.Read}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	var got []string
	for _, d := range reg.List() {
		got = append(got, d.ID+" "+string(d.SideEffect))
	}
	want := []string{"mcp.up.dialect EXECUTE", "mcp.up.get_item EXECUTE", "mcp.up.read READ"}
	if !slices.Equal(got, want) {
		t.Fatalf("table %v, want %v", got, want)
	}
	for _, d := range reg.List() {
		if e, _ := reg.Get(d.ID); e.Def.External != d.SideEffect.Mutating() {
			t.Errorf("%s: External %v for class %s", d.ID, e.Def.External, d.SideEffect)
		}
	}
	// An entry resolved before the upstream dropped its tool: the
	// upstream refuses the call, and the refusal is upstream_error.
	held, _ := reg.Get("mcp.up.get_item")
	s.RemoveTools("get-item")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := reg.Get("mcp.up.get_item"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the table never dropped mcp.up.get_item")
		}
	}
	_, err = held.New().Execute(context.Background(), &syscalls.Call{Args: json.RawMessage(`{}`)})
	var f *syscalls.Failure
	if !errors.As(err, &f) || f.Class != syscalls.FailUpstreamError || !strings.Contains(f.Message, "get-item") {
		t.Fatalf("call of a tool the upstream dropped: %v", err)
	}
	if err := set.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(reg.List()); n != 0 {
		t.Fatalf("%d tools left after Close", n)
	}
}
