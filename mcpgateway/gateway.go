// Package mcpgateway serves the syscalls a capability token may call as
// the tools of an MCP server (github.com/modelcontextprotocol/go-sdk),
// over stdio or streamable HTTP. Every tools/call becomes a call envelope
// under the token, governed, audited and receipted by the kernel; the
// MCP result carries the call's result or error class and its receipt.
// `kernelctl mcp` is the command; docs/mcp.md the reference.
package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
	"github.com/capkernel/capkernel/strictjson"
)

// Keys of the gateway in MCP _meta objects.
const (
	// MetaIdempotencyKey, in a tools/call's _meta, is the client's own
	// idempotency key for the call (a string).
	MetaIdempotencyKey = "capkernel/idempotency_key"
	// MetaRequestID is the JSON-RPC id of the tools/call, which the
	// gateway's transports copy into the call's _meta (overwriting any
	// the client put there) for the handler to derive the key from.
	MetaRequestID = "capkernel/request_id"
	// MetaReceiptID, MetaOperationID and MetaLedgerSeq name the call's
	// receipt, operation and audit entry in a result's _meta.
	MetaReceiptID   = "capkernel/receipt_id"
	MetaOperationID = "capkernel/operation_id"
	MetaLedgerSeq   = "capkernel/ledger_seq"
	// MetaInvalid is set by the gateway's transports, in place of a
	// client's _meta that breaks the strictjson rules (duplicate names,
	// invalid UTF-8), to the refusal's message; the call is refused.
	MetaInvalid = "capkernel/invalid_meta"
)

// Tool is a syscall as the gateway serves it: the MCP tool definition the
// kernel gives for the token (syscalls.Tools, format "mcp").
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	// OutputSchema is an upstream MCP tool's outputSchema, when it has one.
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
}

// Gateway is one token's MCP server.
type Gateway struct {
	invoker                 runner.Invoker
	token, tokenID, agentID string
	policyHash              string
	session                 string // the session of a stdio server, which has one client
	server                  *mcp.Server
	served                  map[string]bool
}

// Config is what a gateway needs: a way to run envelopes, the token and
// its ids, the kernel's policy hash, the tools the token may call, and
// the session id of a stdio server.
type Config struct {
	Invoker                 runner.Invoker
	Token, TokenID, AgentID string
	PolicyHash              string
	Tools                   []Tool
	StdioSession            string
	Version                 string
}

// New makes the gateway's MCP server.
func New(c Config) *Gateway {
	g := &Gateway{
		invoker: c.Invoker, token: c.Token, tokenID: c.TokenID, agentID: c.AgentID, policyHash: c.PolicyHash,
		session: c.StdioSession, served: map[string]bool{},
		server: mcp.NewServer(&mcp.Implementation{Name: "capkernel", Version: c.Version}, nil),
	}
	for _, t := range c.Tools {
		g.served[t.Name] = true
		g.server.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: outputSchema(t.OutputSchema)}, g.handle)
	}
	// A call of a tool the gateway does not serve still reaches the
	// kernel, which refuses and audits it: no call goes unrecorded.
	g.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if ct, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" && !g.served[ct.Params.Name] {
				return g.handle(ctx, ct)
			}
			return next(ctx, method, req)
		}
	})
	return g
}

// ServeStdio serves one client on stdin and stdout until it disconnects
// or ctx is done.
func (g *Gateway) ServeStdio(ctx context.Context) error {
	return g.server.Run(ctx, idTransport{&mcp.StdioTransport{}})
}

// HTTPHandler serves streamable HTTP clients, each in its own MCP session.
func (g *Gateway) HTTPHandler() http.Handler {
	return tagHTTP(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, nil))
}

// handle runs one tools/call through the kernel.
func (g *Gateway) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	p := req.Params
	if msg, ok := p.Meta[MetaInvalid].(string); ok {
		return errorResult(kernel.ErrInvalidArgs, msg, nil), nil
	}
	session := g.session
	if req.Session != nil && req.Session.ID() != "" {
		session = req.Session.ID()
	}
	reqID := ""
	if v, ok := p.Meta[MetaRequestID]; ok {
		b, _ := json.Marshal(v)
		reqID = string(b)
	}
	key := ""
	switch v := p.Meta[MetaIdempotencyKey].(type) {
	case string:
		key = v
	case nil:
		if reqID != "" {
			key = "mcp:" + session + ":" + reqID
		}
	default:
		return errorResult(kernel.ErrInvalidArgs, fmt.Sprintf("_meta[%q] must be a string", MetaIdempotencyKey), nil), nil
	}
	args := json.RawMessage(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	prov, _ := json.Marshal(map[string]string{"session_id": session, "mcp_request_id": reqID, "source": "mcp"})
	env, err := json.Marshal(kernel.Envelope{
		ToolID: p.Name, Args: args, AgentID: g.agentID, CapabilityToken: g.token, CapabilityTokenID: g.tokenID,
		PolicyHash: g.policyHash, IdempotencyKey: key, Provenance: prov,
	})
	if err != nil {
		return errorResult(kernel.ErrInvalidArgs, "the call's arguments are not JSON: "+err.Error(), nil), nil
	}
	res, err := g.invoker.Invoke(ctx, env)
	if err != nil {
		return errorResult(kernel.ErrInternal, "the kernel did not answer: "+err.Error(), nil), nil
	}
	if res.Status != kernel.StatusOK {
		class, msg := kernel.ErrInternal, "result envelope without an error"
		if res.Error != nil {
			class, msg = res.Error.Class, res.Error.Message
		}
		return errorResult(class, msg, res), nil
	}
	if r, ok := upstreamResult(res); ok {
		return r, nil
	}
	r := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(res.Result)}},
		StructuredContent: res.Result,
		Meta:              meta(res),
	}
	return r, nil
}

// errorResult is a tool error (isError), which a model can read: the
// class and message as text and as structured content.
func errorResult(class, msg string, res *kernel.Result) *mcp.CallToolResult {
	sc := map[string]any{"error": map[string]string{"class": class, "message": msg}}
	if res != nil && res.ReceiptID != "" {
		sc["receipt_id"] = res.ReceiptID
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: class + ": " + msg}},
		StructuredContent: sc,
		Meta:              meta(res),
	}
}

func meta(res *kernel.Result) mcp.Meta {
	if res == nil || res.ReceiptID == "" {
		return nil
	}
	return mcp.Meta{MetaReceiptID: res.ReceiptID, MetaOperationID: res.OperationID, MetaLedgerSeq: res.LedgerSeq}
}

// idTransport copies each tools/call's JSON-RPC id into its _meta (see
// MetaRequestID), which the SDK does not hand to tool handlers.
type idTransport struct{ mcp.Transport }

func (t idTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return idConn{c}, nil
}

type idConn struct{ mcp.Connection }

func (c idConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if r, ok := m.(*jsonrpc.Request); ok && err == nil && r.Method == "tools/call" && r.ID.IsValid() {
		r.Params = tagParams(r.Params, r.ID.Raw())
	}
	return m, err
}

// tagParams returns tools/call params with _meta[MetaRequestID] = id;
// params that are not an object are left for the SDK to refuse. A _meta
// that breaks the strictjson rules becomes {MetaInvalid: why}.
func tagParams(params json.RawMessage, id any) json.RawMessage {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(params, &p); err != nil || p == nil {
		return params
	}
	var m map[string]any
	if why := invalidMeta(params); why != "" {
		m = map[string]any{MetaInvalid: why}
	} else if raw, ok := p["_meta"]; ok {
		if err := json.Unmarshal(raw, &m); err != nil {
			return params
		}
	}
	if m == nil {
		m = map[string]any{}
	}
	m[MetaRequestID] = id
	b, err := json.Marshal(m)
	if err != nil {
		return params
	}
	p["_meta"] = b
	out, err := json.Marshal(p)
	if err != nil {
		return params
	}
	return out
}

// invalidMeta says why the _meta of params breaks the strictjson rules (a
// duplicate or non-UTF-8 name or value in it, or two _meta members), or ""
// when it does not. Other faults of params are left to the SDK and the
// kernel, which audits the call.
func invalidMeta(params json.RawMessage) string {
	var e *strictjson.Error
	if !errors.As(strictjson.Check(params), &e) {
		return ""
	}
	if e.Path == "/_meta" || strings.HasPrefix(e.Path, "/_meta/") || (e.Path == "" && e.Name == "_meta") {
		return "_meta: " + e.Error()
	}
	return ""
}
