package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
)

// rawMCP posts JSON-RPC bodies in one MCP session, which the Go SDK's
// client opened, with the headers that client sends.
type rawMCP struct {
	t   *testing.T
	url string
	cs  *mcp.ClientSession
}

func newRawMCP(t *testing.T, g *Gateway) *rawMCP {
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(srv.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return &rawMCP{t: t, url: srv.URL, cs: cs}
}

// post sends body and returns the response (body read) and, for an SSE
// answer, the one message in it.
func (m *rawMCP) post(body string, header ...string) (*http.Response, []byte, map[string]any) {
	m.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", m.cs.ID())
	req.Header.Set("Mcp-Protocol-Version", m.cs.InitializeResult().ProtocolVersion)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var msg map[string]any
	data := b
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		d, ok := bytes.CutPrefix(b, []byte("event: message\ndata: "))
		if !ok || !bytes.HasSuffix(d, []byte("\n\n")) || bytes.Count(d, []byte("\n")) != 2 {
			m.t.Fatalf("SSE answer %q: want one message event", b)
		}
		data = d
	}
	json.Unmarshal(data, &msg)
	return resp, b, msg
}

// lean reports whether resp came from the lean path, which answers in one
// write with a Content-Length, where the SDK flushes its event and ends
// the stream (chunked): the one difference on the wire.
func lean(resp *http.Response) bool { return resp.ContentLength > 0 }

// A plain tools/call is answered on the lean path exactly as the SDK
// answers the same call (forced onto the SDK's path by an empty _meta):
// status, headers, the SSE event, the JSON-RPC response with the result
// and its _meta, for a numeric and a string id, an ok and an error
// result; anything but a plain call goes to the SDK.
func TestLeanAnswersAsTheSDK(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	m := newRawMCP(t, g)
	for _, c := range []struct{ name, id, args string }{
		{"ok, numeric id", `7`, `{"text":"<a&b> é"}`},
		{"ok, string id", `"s<1>"`, `{"text":"hi"}`},
		{"tool error", `9`, `{"text":5}`},
		{"no arguments", `10`, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			params := `"name":"echo"`
			if c.args != "" {
				params += `,"arguments":` + c.args
			}
			// Each call has its own id (and so idempotency key).
			leanID, sdkID := c.id, c.id
			if strings.HasPrefix(c.id, `"`) {
				leanID, sdkID = `"lean-`+c.id[1:], `"sdk-`+c.id[1:]
			} else {
				sdkID = c.id + "00"
			}
			lr, lb, lm := m.post(`{"jsonrpc":"2.0","id":` + leanID + `,"method":"tools/call","params":{` + params + `}}`)
			sr, sb, sm := m.post(`{"jsonrpc":"2.0","id":` + sdkID + `,"method":"tools/call","params":{` + params + `,"_meta":{}}}`)
			if !lean(lr) || lean(sr) {
				t.Fatalf("paths: lean %v (want true), SDK %v (want false)", lean(lr), lean(sr))
			}
			for _, h := range []string{"Content-Type", "Cache-Control", "Connection", "Mcp-Session-Id"} {
				if lr.Header.Get(h) != sr.Header.Get(h) {
					t.Errorf("%s: lean %q, SDK %q", h, lr.Header.Get(h), sr.Header.Get(h))
				}
			}
			if lr.StatusCode != sr.StatusCode || lm == nil || sm == nil {
				t.Fatalf("lean %d %s\nSDK %d %s", lr.StatusCode, lb, sr.StatusCode, sb)
			}
			var wantID, gotID any
			json.Unmarshal([]byte(leanID), &wantID)
			json.Unmarshal([]byte(sdkID), &gotID)
			if lm["id"] != wantID || sm["id"] != gotID {
				t.Fatalf("ids: lean %v, SDK %v", lm["id"], sm["id"])
			}
			// The results are alike but for the call's own receipt.
			lres, sres := lm["result"].(map[string]any), sm["result"].(map[string]any)
			if !slices.Equal(slices.Sorted(maps.Keys(lres)), slices.Sorted(maps.Keys(sres))) ||
				!slices.Equal(slices.Sorted(maps.Keys(lres["_meta"].(map[string]any))), slices.Sorted(maps.Keys(sres["_meta"].(map[string]any)))) {
				t.Fatalf("lean result %v\nSDK result %v", lres, sres)
			}
			if lres["structuredContent"] != nil {
				lres["structuredContent"].(map[string]any)["receipt_id"] = nil
				sres["structuredContent"].(map[string]any)["receipt_id"] = nil
			}
			for _, k := range []string{"content", "isError", "structuredContent"} {
				if string(mustJSON(lres[k])) != string(mustJSON(sres[k])) {
					t.Errorf("%s: lean %s, SDK %s", k, mustJSON(lres[k]), mustJSON(sres[k]))
				}
			}
			if lres["isError"] == true {
				return
			}
			// The request id names the call in its idempotency key as on
			// the SDK's path: the answer under the same id is the replay.
			_, _, again := m.post(`{"jsonrpc":"2.0","id":` + leanID + `,"method":"tools/call","params":{` + params + `}}`)
			if meta := again["result"].(map[string]any)["_meta"].(map[string]any); meta[MetaReplayed] != true || meta[MetaReceiptID] != lres["_meta"].(map[string]any)[MetaReceiptID] {
				t.Errorf("the same id again: %v, want the replay of %v", meta, lres["_meta"])
			}
		})
	}

	// Requests that are not a plain tools/call in a live session go to
	// the SDK, which answers them as ever.
	for _, c := range []struct {
		name, body string
		header     []string
		status     int
	}{
		{"progress token", `{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"progressToken":"p"}}}`, nil, 200},
		{"unknown member", `{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"echo"},"x":1}`, nil, 200},
		{"duplicate member name", `{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"echo","name":"echo","arguments":{"text":"x"}}}`, nil, 200},
		{"fractional id, refused (TestFractionalIDRefused)", `{"jsonrpc":"2.0","id":22.5,"method":"tools/call","params":{"name":"echo"}}`, nil, 400},
		{"unserved tool", `{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"fs.read","arguments":{"path":"a"}}}`, nil, 200},
		{"batch", `[{"jsonrpc":"2.0","id":24,"method":"tools/call","params":{"name":"echo"}}]`, nil, 400},
		{"unknown session", `{"jsonrpc":"2.0","id":25,"method":"tools/call","params":{"name":"echo"}}`, []string{"Mcp-Session-Id", "nope"}, 404},
		{"unsupported protocol version", `{"jsonrpc":"2.0","id":26,"method":"tools/call","params":{"name":"echo"}}`, []string{"Mcp-Protocol-Version", "1999-01-01"}, 400},
		{"foreign Host", `{"jsonrpc":"2.0","id":27,"method":"tools/call","params":{"name":"echo"}}`, []string{"Host", "evil.example"}, 403},
		{"no SSE accepted", `{"jsonrpc":"2.0","id":28,"method":"tools/call","params":{"name":"echo"}}`, []string{"Accept", "application/json"}, 400},
		{"text body", `{"jsonrpc":"2.0","id":29,"method":"tools/call","params":{"name":"echo"}}`, []string{"Content-Type", "text/plain"}, 415},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, b, _ := m.post(c.body, c.header...)
			if lean(resp) && resp.Header.Get("Content-Type") == "text/event-stream" || resp.StatusCode != c.status {
				t.Fatalf("%d %s (lean %v), want the SDK's %d", resp.StatusCode, b, lean(resp), c.status)
			}
		})
	}
}

// gate is an invoker that holds each call until released or cancelled
// and then runs it in the kernel, reporting how its context ended.
type gate struct {
	inner   runner.Invoker
	entered chan struct{}
	release chan struct{}
	ended   chan error // ctx.Err() of each held call when it goes on
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 8), release: make(chan struct{}), ended: make(chan error, 8)}
}

func (g *gate) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	g.ended <- ctx.Err()
	return g.inner.Invoke(ctx, env)
}

func (g *gate) wait(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the kernel")
	}
}

func (g *gate) cancelled(t *testing.T) {
	t.Helper()
	select {
	case err := <-g.ended:
		if err == nil {
			t.Fatal("the call went on uncancelled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not cancelled")
	}
}

// A request id in flight in a session is refused on either path as the
// SDK refuses it (400, invalid request); notifications/cancelled and the
// end of the session cancel a lean call as they cancel the SDK's.
func TestLeanInFlight(t *testing.T) {
	gt := newGate()
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{Invoker: gt})
	gt.inner = kernelInvoker{k}
	m := newRawMCP(t, g)
	first := make(chan *http.Response, 1)
	go func() {
		resp, _, _ := m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}}`)
		first <- resp
	}()
	gt.wait(t, gt.entered)
	want := `{"error":{"code":-32600,"message":"duplicate in-flight request ID 7"},"id":7,"jsonrpc":"2.0"}`
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"b"}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"b"},"_meta":{}}}`,
	} {
		resp, b, msg := m.post(body)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" || string(mustJSON(msg)) != want {
			t.Errorf("a second call with id 7: %d %s, want 400 %s", resp.StatusCode, b, want)
		}
	}
	gt.release <- struct{}{}
	if err := <-gt.ended; err != nil {
		t.Fatalf("the released call: %v", err)
	}
	if resp := <-first; resp.StatusCode != http.StatusOK || !lean(resp) {
		t.Fatalf("the first call: %d (lean %v)", resp.StatusCode, lean(resp))
	}

	// The Go SDK's client sends notifications/cancelled for a call whose
	// context ends, on either path.
	for _, meta := range []mcp.Meta{nil, {"x": 1}} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := m.cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "c"}, Meta: meta})
			done <- err
		}()
		gt.wait(t, gt.entered)
		cancel()
		gt.cancelled(t)
		<-done
	}

	// The session's end cancels its lean calls.
	go m.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d"}}}`)
	gt.wait(t, gt.entered)
	m.cs.Close()
	gt.cancelled(t)
}
