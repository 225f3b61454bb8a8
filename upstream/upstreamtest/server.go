// Package upstreamtest is a small upstream MCP server for the tests of
// the kernel's upstream support: real MCP over stdio or streamable HTTP,
// with tools that add, fail, block until released, and exit the process,
// and a count of the calls each tool received.
package upstreamtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Server is the test server and its call counts.
type Server struct {
	MCP *mcp.Server

	mu      sync.Mutex
	calls   map[string]int
	started chan string              // the id of every slow call that started
	release map[string]chan struct{} // slow calls waiting, by id
}

// New makes the server with its tools:
//
//   - add {a, b integers}: their sum, as text and as structured content
//   - fail {}: an isError result with the text "boom"
//   - slow {id string}: blocks until Release(id) or the call is cancelled
//   - list-items {}: a name with a dash (the syscall is list_items)
//   - exit {}: ends the process (for a server over stdio)
//   - big {n integer}: a text of n bytes
//   - wide {}: a schema outside the kernel's subset (anyOf)
//   - number {text string}: structured content {"n": N}, N the number
//     text as given (so a test can send 9007199254740993, which a double
//     cannot hold)
func New() *Server {
	s := &Server{
		MCP:     mcp.NewServer(&mcp.Implementation{Name: "upstreamtest", Version: "1"}, nil),
		calls:   map[string]int{},
		started: make(chan string, 16),
		release: map[string]chan struct{}{},
	}
	s.MCP.AddTool(&mcp.Tool{Name: "add", Description: "adds a and b",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.count("add")
		var in struct{ A, B int }
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(in.A + in.B)}},
			StructuredContent: map[string]int{"sum": in.A + in.B},
		}, nil
	})
	s.MCP.AddTool(&mcp.Tool{Name: "number",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.count("number")
		var in struct{ Text string }
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}},
			StructuredContent: json.RawMessage(`{"n":` + in.Text + `}`)}, nil
	})
	s.MCP.AddTool(&mcp.Tool{Name: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.count("fail")
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "boom"}}}, nil
		})
	s.AddSlow("slow")
	s.MCP.AddTool(&mcp.Tool{Name: "list-items", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.count("list-items")
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a\nb"}}}, nil
		})
	s.MCP.AddTool(&mcp.Tool{Name: "exit", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			os.Exit(3)
			return nil, nil
		})
	s.MCP.AddTool(&mcp.Tool{Name: "big",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.count("big")
		var in struct{ N int }
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.N)}}}, nil
	})
	s.MCP.AddTool(&mcp.Tool{Name: "wide",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"v":{"anyOf":[{"type":"string"},{"type":"integer"}]}}}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.count("wide")
		return &mcp.CallToolResult{Content: []mcp.Content{}}, nil
	})
	return s
}

// AddSlow adds (or replaces) a tool named name that blocks until
// Release(id) or until the call is cancelled; its answer is the text
// "<name> <id> done".
func (s *Server) AddSlow(name string) {
	s.MCP.AddTool(&mcp.Tool{Name: name,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.count(name)
		var in struct{ ID string }
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		ch := s.gate(in.ID)
		s.started <- in.ID
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " " + in.ID + " done"}}}, nil
	})
}

func (s *Server) gate(id string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release[id] == nil {
		s.release[id] = make(chan struct{})
	}
	return s.release[id]
}

// Started delivers the id of each slow call once it has started.
func (s *Server) Started() <-chan string { return s.started }

// Release lets the slow call id finish.
func (s *Server) Release(id string) { close(s.gate(id)) }

func (s *Server) count(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[tool]++
}

// Calls returns how many calls tool has received.
func (s *Server) Calls(tool string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[tool]
}
