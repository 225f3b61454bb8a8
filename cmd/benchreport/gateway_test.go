package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/syscalls"
)

// The gateway comparison sends tools/call as the request the Go SDK's
// client sends for CallTool (mcpCall): the same headers and body on the
// wire, the JSON-RPC id aside, and the same answer.
func TestMCPCallOnTheWire(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := kernel.Init(dir); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "bench", Tools: []string{"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	defs, err := k.Tools(tok.Token, syscalls.FormatMCP)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcpgateway.Config{Invoker: kernelInvoker{k}, Token: tok.Token, TokenID: tok.ID, AgentID: tok.AgentID, PolicyHash: k.PolicyHash()}
	if err := json.Unmarshal(defs, &cfg.Tools); err != nil {
		t.Fatal(err)
	}
	h := mcpgateway.New(cfg).HTTPHandler(mcpgateway.HTTPOptions{})
	// The server records every tools/call it is sent and its answer.
	type exchange struct {
		header       http.Header
		body, answer []byte
	}
	var mu sync.Mutex
	var calls []exchange
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"tools/call"`)) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(w, r)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		mu.Lock()
		calls = append(calls, exchange{r.Header.Clone(), body, rec.Body.Bytes()})
		mu.Unlock()
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "benchreport", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
	if err != nil || res.IsError {
		t.Fatalf("CallTool: %v %+v", err, res)
	}
	const id = 1001
	header, body := mcpCall(cs, id)
	if err := post(srv.Client(), srv.URL, header, body, []byte(`"text":"{\"text\":\"hello\"}"`)); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 {
		t.Fatalf("%d tools/call requests recorded, want the SDK's and mcpCall's", len(calls))
	}
	sdk, raw := calls[0], calls[1]
	var m struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal(sdk.body, &m); err != nil {
		t.Fatal(err)
	}
	_, want := mcpCall(cs, m.ID)
	if !bytes.Equal(sdk.body, want) {
		t.Errorf("the SDK's client sent\n%s\nmcpCall sends\n%s", sdk.body, want)
	}
	sdk.header.Del("Content-Length") // the id's digits
	raw.header.Del("Content-Length")
	if !maps.EqualFunc(sdk.header, raw.header, func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }) {
		t.Errorf("the SDK's client sent headers %v, mcpCall %v", sdk.header, raw.header)
	}
	if !bytes.HasPrefix(raw.answer, []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1001,\"result\":")) {
		t.Errorf("mcpCall's answer: %.300s", raw.answer)
	}
}
