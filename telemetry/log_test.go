package telemetry

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// lockedBuffer is a buffer that a logging goroutine and the test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// take returns what was written and empties the buffer.
func (b *lockedBuffer) take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	b.buf.Reset()
	return s
}

// jsonLog is a JSON logger into a buffer, and a reader of the records
// logged since it last read.
func jsonLog(t *testing.T) (*slog.Logger, func() []map[string]any) {
	var buf lockedBuffer
	log, err := NewLogger(&buf, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	return log, func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.take()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("log line %q is not JSON: %v", line, err)
			}
			out = append(out, m)
		}
		return out
	}
}

func TestCallLog(t *testing.T) {
	log, records := jsonLog(t)
	l := CallLog{Log: log}
	l.CallDone(&kernel.CallReport{OperationID: "op-1", ToolID: "fs.write", AgentID: "a1", Status: kernel.StatusError,
		ErrorClass: kernel.ErrInternal, ErrorMessage: "commit (write and fdatasync) of kernel.db failed: EIO"})
	l.CallDone(&kernel.CallReport{OperationID: "op-2", ToolID: "fs.read", Status: kernel.StatusError, ErrorClass: kernel.ErrPolicyDenied})
	l.CallDone(&kernel.CallReport{OperationID: "op-3", ToolID: "echo", Status: kernel.StatusOK})
	got := records()
	if len(got) != 1 {
		t.Fatalf("%d log lines, want only the internal error's: %v", len(got), got)
	}
	if r := got[0]; r["level"] != "ERROR" || r["msg"] != "call failed" || r["error_class"] != kernel.ErrInternal ||
		!strings.Contains(r["error"].(string), "fdatasync") || r["operation_id"] != "op-1" {
		t.Fatalf("log line %v", r)
	}
}

func TestUpstreamLog(t *testing.T) {
	log, records := jsonLog(t)
	l := &UpstreamLog{Log: log}
	call := func(tool, class string) {
		r := &kernel.CallReport{ToolID: tool, Status: kernel.StatusOK}
		if class != "" {
			r.Status, r.ErrorClass, r.ErrorMessage = kernel.StatusError, class, class+" message"
		}
		l.CallDone(r)
	}
	steps := []struct {
		tool, class string
		want        string // the message logged, "" for none
	}{
		{"mcp.gh.list", "", ""}, // up from the start: nothing to say
		{"mcp.gh.list", kernel.ErrUpstreamUnavailable, "upstream MCP server unavailable"}, // up -> down
		{"mcp.gh.create", kernel.ErrUpstreamUnavailable, ""},                              // still down: said already
		{"mcp.gh.create", kernel.ErrPolicyDenied, ""},                                     // never reached the server
		{"mcp.other.x", kernel.ErrUpstreamUnavailable, "upstream MCP server unavailable"}, // servers are apart
		{"mcp.gh.list", kernel.ErrUpstreamError, "upstream MCP server available again"},   // it answered
		{"mcp.gh.list", "", ""},
		{"fs.read", kernel.ErrUpstreamUnavailable, ""}, // not an upstream tool
	}
	for i, s := range steps {
		call(s.tool, s.class)
		got := records()
		switch {
		case s.want == "" && len(got) != 0:
			t.Errorf("step %d (%s %s): logged %v", i, s.tool, s.class, got)
		case s.want != "" && (len(got) != 1 || got[0]["msg"] != s.want):
			t.Errorf("step %d (%s %s): logged %v, want %q", i, s.tool, s.class, got, s.want)
		case s.want != "" && got[0]["mcp_server"] != strings.Split(s.tool, ".")[1]:
			t.Errorf("step %d: mcp_server %v", i, got[0]["mcp_server"])
		}
	}
}
