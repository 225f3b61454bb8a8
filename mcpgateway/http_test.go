package mcpgateway

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
)

func TestCheckOrigin(t *testing.T) {
	allowed := []string{"https://app.example.com", "http://tool.test:8080/"}
	cases := []struct {
		origin string
		ok     bool
	}{
		{"", true},
		{"http://localhost:3000", true},
		{"http://LOCALHOST", true},
		{"https://127.0.0.1:8443", true},
		{"http://127.8.9.1", true},
		{"http://[::1]:6274", true},
		{"https://app.example.com", true},
		{"HTTPS://APP.EXAMPLE.COM", true},
		{"http://tool.test:8080", true},
		{"https://evil.example", false},
		{"http://localhost.evil.example", false},
		{"http://127.0.0.1.nip.io", false},
		{"http://10.0.0.1", false},
		{"null", false},
		{"file://", false},
		{"ftp://localhost", false},
		{"https://app.example.com:444", false},
		{"http://tool.test", false},
	}
	for _, c := range cases {
		if got := CheckOrigin(c.origin, allowed); got != c.ok {
			t.Errorf("CheckOrigin(%q) = %v, want %v", c.origin, got, c.ok)
		}
	}
	for _, o := range []string{"https://a.example", "http://localhost:1/"} {
		if err := ValidOrigin(o); err != nil {
			t.Errorf("ValidOrigin(%q): %v", o, err)
		}
	}
	for _, o := range []string{"a.example", "https://a.example/path", "javascript:x", "https://", "https://u@a.example"} {
		if ValidOrigin(o) == nil {
			t.Errorf("ValidOrigin(%q) accepted it", o)
		}
	}
}

// The streamable HTTP handler answers a foreign Origin 403 before it
// reads anything, serves loopback and --allow-origin ones, and its body
// limit is the documented MaxHTTPBody: a body over the SDK's own 4 MiB
// default but under MaxHTTPBody reaches the kernel (which refuses it by
// its envelope limit, audited, as a result), one over MaxHTTPBody is 413.
func TestHTTPOriginAndBodyLimit(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{AllowedOrigins: []string{"https://app.example.com"}}))
	defer srv.Close()
	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	post := func(origin, body, session string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp, b.String()
	}
	for _, c := range []struct {
		origin string
		status int
	}{
		{"https://evil.example", http.StatusForbidden},
		{"null", http.StatusForbidden},
		{"http://localhost:6274", http.StatusOK},
		{"https://app.example.com", http.StatusOK},
		{"", http.StatusOK},
	} {
		if resp, body := post(c.origin, initBody, ""); resp.StatusCode != c.status {
			t.Errorf("Origin %q: %d %s, want %d", c.origin, resp.StatusCode, body, c.status)
		}
	}

	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	big := strings.Repeat("x", 6<<20)
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": big}})
	if err != nil || !r.IsError || !strings.Contains(r.Content[0].(*mcp.TextContent).Text, "envelope is") || r.Meta[MetaReceiptID] == nil {
		t.Fatalf("a 6 MiB call: want the kernel's audited envelope-limit refusal, got %v %v", r, err)
	}
	// The session still works after it.
	if r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}}); err != nil || r.IsError {
		t.Fatalf("echo after the large call: %v %v", r, err)
	}
	resp, body := post("", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`+strings.Repeat("x", MaxHTTPBody)+`"}}}`, cs.ID())
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over MaxHTTPBody: %d %.200s", resp.StatusCode, body)
	}
}
