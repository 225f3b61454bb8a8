// Package mcpgateway serves the syscalls a capability token may call as
// the tools of an MCP server (github.com/modelcontextprotocol/go-sdk),
// over stdio or streamable HTTP. Every tools/call becomes a call envelope
// under the token, governed, audited and receipted by the kernel; the
// MCP result carries the call's result or error class and its receipt.
// `kernelctl mcp` is the command; docs/mcp.md the reference.
package mcpgateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
)

// Keys of the gateway in MCP _meta objects.
const (
	// MetaIdempotencyKey, in a tools/call's _meta, is the client's own
	// idempotency key for the call (a string).
	MetaIdempotencyKey = "capkernel/idempotency_key"
	// MetaRequestID is the JSON-RPC id of the tools/call, which the
	// gateway's transports copy into the call's _meta (overwriting any
	// the client put there), under MetaSeal, for the handler to derive
	// the key from.
	MetaRequestID = "capkernel/request_id"
	// MetaReceiptID, MetaOperationID and MetaLedgerSeq name the call's
	// receipt, operation and audit entry in a result's _meta.
	MetaReceiptID   = "capkernel/receipt_id"
	MetaOperationID = "capkernel/operation_id"
	MetaLedgerSeq   = "capkernel/ledger_seq"
	// MetaReceipt is the call's receipt itself (docs/formats.md,
	// capkernel-receipt/v2): its audit entry proven under a signed
	// checkpoint, verifiable offline with the kernel's JWKS.
	MetaReceipt = "capkernel/receipt"
	// MetaInvalid is set by the gateway's transports, in the _meta of a
	// tools/call whose JSON-RPC message breaks the strictjson rules
	// (duplicate member names, invalid UTF-8, anywhere in it), to the
	// refusal's message; the call is refused.
	MetaInvalid = "capkernel/invalid_meta"
	// MetaRawMessage goes with MetaInvalid: the client's JSON-RPC message
	// exactly as it came (base64), which the gateway hands to the kernel
	// to refuse and audit. Both are the transports' alone, under
	// MetaSeal: the gateway drops them from a client's _meta, and its
	// handler ignores them unless sealed.
	MetaRawMessage = "capkernel/raw_message"
	// MetaReplayed, in a result's _meta, is true when the result is the
	// recorded outcome of an earlier call with the same idempotency key,
	// answered without running the call again.
	MetaReplayed = "capkernel/replayed"
	// MetaAuditSalt is the salt of the call's audit record
	// (kernel.Result.AuditSalt): with it the client, which holds the
	// call's arguments and result, can check that the record commits to
	// exactly them (docs/formats.md); no one else is given it.
	MetaAuditSalt = "capkernel/audit_salt"
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
	typed                   map[string]bool // the served tools that declare an outputSchema
	progressEvery           time.Duration
	confirmer               Confirmer
	pending                 pendingCalls    // calls that asked their client (confirm.go)
	inflight                inflight        // tools/calls in flight over HTTP (lean.go)
	stdioCtx                context.Context // serveIO's: its end ends the stdio session's calls; set before serving
	handles                 *handleMode     // nil unless the token is in handle mode
	seals                   *sealer         // seals the transports' marks (seal.go)
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
	// ProgressInterval is how often a call that is still waiting (for an
	// approval, or running long) sends notifications/progress to a client
	// that gave a progress token; 0 means DefaultProgressInterval.
	ProgressInterval time.Duration
	// Confirmer, when set, lets the gateway ask the user of a client that
	// declares elicitation to decide a call the policy lets the session
	// confirm (see Confirmer); nil leaves every approval to approvers.
	Confirmer Confirmer
	// Handles, set for a token in handle mode, makes each MCP session
	// list the tools by its own handles (tools named HandleToolPrefix +
	// the handle's random part) instead of the syscall ids in Tools, which
	// are then not served: a call by syscall id is answered by the kernel
	// exactly as an unknown tool. A session's handles end with it.
	Handles runner.HandleSource
}

// DefaultProgressInterval keeps well inside the official SDKs' default
// request timeout (60 s), which a client resets on each progress
// notification when it asks to (resetTimeoutOnProgress in the TypeScript
// SDK), even if a few notifications are late.
const DefaultProgressInterval = 10 * time.Second

// New makes the gateway's MCP server.
func New(c Config) *Gateway {
	g := &Gateway{
		invoker: newWarmInvoker(c.Invoker), token: c.Token, tokenID: c.TokenID, agentID: c.AgentID, policyHash: c.PolicyHash,
		session: c.StdioSession, served: map[string]bool{}, typed: map[string]bool{}, progressEvery: c.ProgressInterval, confirmer: c.Confirmer,
		pending: pendingCalls{by: map[string]*pendingCall{}}, seals: newSealer(),
		server: mcp.NewServer(&mcp.Implementation{Name: "capkernel", Version: c.Version},
			&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}}),
	}
	if g.progressEvery <= 0 {
		g.progressEvery = DefaultProgressInterval
	}
	if c.Handles != nil {
		g.handles = &handleMode{src: c.Handles, seen: map[string]bool{}, stdio: c.StdioSession}
	} else {
		for _, t := range c.Tools {
			g.served[t.Name] = true
			g.typed[t.Name] = outputSchema(t.OutputSchema) != nil
			g.server.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: outputSchema(t.OutputSchema)}, g.handle)
		}
	}
	// A call of a tool the gateway does not serve still reaches the
	// kernel, which refuses and audits it: no call goes unrecorded. In
	// handle mode every call goes that way, and tools/list is the
	// session's handles.
	g.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if ct, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" && !g.served[ct.Params.Name] {
				return g.handle(ctx, ct)
			}
			if lt, ok := req.(*mcp.ListToolsRequest); ok && method == "tools/list" && g.handles != nil {
				return g.handles.list(ctx, lt.Session, g.sessionOf(lt.Session))
			}
			return next(ctx, method, req)
		}
	})
	return g
}

// derivedKeyPrefix starts the idempotency keys the gateway derives from a
// session and a JSON-RPC id; no client key goes to the kernel with it.
const derivedKeyPrefix = "mcp:"

// sessionOf is the session id of ss: the MCP session's, or the stdio
// server's own.
func (g *Gateway) sessionOf(ss *mcp.ServerSession) string {
	if ss != nil && ss.ID() != "" {
		return ss.ID()
	}
	return g.session
}

// ServeStdio serves one client on stdin and stdout until it disconnects
// (ends stdin, or closes stdout: a write fails with EPIPE, when SIGPIPE is
// ignored, which is no error) or ctx is done (no error either: the
// session's calls still running or waiting are cancelled, audited).
func (g *Gateway) ServeStdio(ctx context.Context) error {
	err := g.serveIO(ctx, os.Stdin, os.Stdout)
	if errors.Is(err, syscall.EPIPE) {
		return nil // the client went away, as at the end of stdin
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // stopped, as asked
	}
	return err
}

// serveIO serves one client reading newline-delimited JSON-RPC messages
// from in and writing answers to out, until in ends or ctx is done.
func (g *Gateway) serveIO(ctx context.Context, in io.Reader, out io.Writer) error {
	// The end of serving (kernelctl mcp's SIGTERM) ends the session's
	// calls, cancelled and audited, as its client's input can no longer
	// carry an answer: the SDK's close waits for its handlers without
	// cancelling them, so a call waiting for an approver held serving
	// until one decided, and then ran.
	g.stdioCtx = ctx
	defer context.AfterFunc(ctx, func() { g.pending.endInput(g.session) })()
	// At the end of input, a call whose question is open can have no
	// answer: it ends cancelled, while the others are waited for.
	err := g.server.Run(ctx, lineTransport{in: in, out: nopCloser{out}, seals: g.seals,
		ended: func() { g.pending.endInput(g.session) }})
	if g.handles != nil {
		g.handles.end(g.session)
	}
	return err
}

// handle runs one tools/call the SDK serves through the kernel, with the
// marks its _meta holds under a seal that verifies (a client's own are
// ignored: whatever path its message took, no client sets them).
func (g *Gateway) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if req.Session != nil && req.Session.ID() != "" {
		// Over HTTP: the client's DELETE of the session ends the call
		// (tagHTTP), as it ends a lean one.
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		defer g.inflight.running(req.Session.ID(), cancel)()
		ctx = c
	} else if g.stdioCtx != nil {
		// Over stdio: the end of serving ends the call (serveIO).
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(g.stdioCtx, cancel)()
		ctx = c
	}
	return g.call(ctx, req, g.seals.marksOf(req.Params.Meta))
}

// call runs one tools/call through the kernel, with the transports' marks
// mk. Every call, a malformed one included, goes to the kernel, which
// refuses what it must and audits it: the gateway refuses nothing on its
// own, so no call goes unrecorded.
func (g *Gateway) call(ctx context.Context, req *mcp.CallToolRequest, mk marks) (*mcp.CallToolResult, error) {
	p := req.Params
	session := g.sessionOf(req.Session)
	if p.RequestState != "" {
		if pc := g.pending.take(p.RequestState, session); pc != nil {
			return g.resume(ctx, req, pc)
		}
	}
	tool := p.Name
	if g.handles != nil {
		tool = kernelTool(p.Name)
	}
	reqID := mk.requestID
	// The provenance is part of the policy input, so it holds nothing
	// that differs from call to call (the JSON-RPC id is in the derived
	// idempotency key): the kernel's decision cache answers a session's
	// repeated question without evaluating the policy again.
	prov := map[string]any{"session_id": session, "source": "mcp"}
	if p.RequestState != "" {
		// A retry naming no call of this session that waits for its
		// answer: the kernel refuses it (kernel.ProvenanceRequestState)
		// and audits the refusal; nothing runs.
		prov[kernel.ProvenanceRequestState] = p.RequestState
	}
	args := json.RawMessage(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	// W3C trace context in _meta (as MCP clients send it) goes into the
	// provenance, where the kernel's trace of the call continues it.
	for _, k := range []string{"traceparent", "tracestate"} {
		if v, ok := p.Meta[k].(string); ok {
			prov[k] = v
		}
	}
	e := kernel.Envelope{
		ToolID: tool, Args: args, AgentID: g.agentID, CapabilityToken: g.token, CapabilityTokenID: g.tokenID,
		PolicyHash: g.policyHash,
	}
	var env []byte
	var err error
	switch key := p.Meta[MetaIdempotencyKey].(type) {
	case string:
		e.IdempotencyKey = key
		if strings.HasPrefix(key, derivedKeyPrefix) {
			// The gateway's namespace: a key derived for another
			// session (whose id the audit records show) is not the
			// client's to take.
			e.IdempotencyKey = "client:" + key
		}
	case nil:
		if reqID != "" {
			e.IdempotencyKey = derivedKeyPrefix + session + ":" + reqID
		}
	default:
		// Not a string: the envelope carries the client's value as it
		// is, which the kernel refuses (invalid_args naming
		// /idempotency_key) and audits.
		e.Provenance = mustMarshal(prov)
		env, err = withMember(e, "idempotency_key", mustMarshal(key))
	}
	if why := mk.invalid; why != "" && env == nil {
		// The client's message breaks the strictjson rules: the envelope
		// carries it byte for byte in provenance.mcp_message, where the
		// kernel finds the same fault, refuses and audits the call. A
		// message that cannot be had (never from the transports) is sent
		// as the reason, which is no JSON: refused all the same.
		msg, derr := base64.StdEncoding.DecodeString(mk.raw)
		if derr != nil || mk.raw == "" {
			msg = []byte(why)
		}
		pb := mustMarshal(prov)
		pb = append(append(append(pb[:len(pb)-1:len(pb)-1], `,"mcp_message":`...), msg...), '}')
		env, err = withMember(e, "provenance", pb)
	}
	if env == nil {
		if g.confirmable(req) && p.RequestState == "" {
			e.OperationID = newOperationID()
		}
		e.Provenance = mustMarshal(prov)
		env, err = json.Marshal(e)
	}
	if err != nil {
		return errorResult(kernel.ErrInvalidArgs, "the call's arguments are not JSON: "+err.Error(), nil), nil
	}
	stop := g.progress(ctx, req)
	defer stop()
	if e.OperationID != "" {
		res, err, ask := g.invokeConfirmable(ctx, req, session, e.OperationID, tool, env)
		if ask != nil {
			return ask, nil
		}
		return result(res, err, tool, p.Name, g.typed[p.Name]), nil
	}
	res, err := g.invoker.Invoke(ctx, env)
	return result(res, err, tool, p.Name, g.typed[p.Name]), nil
}

// result is the MCP result of a call of tool, which the client named
// name, from the kernel's result or the invoker's error; typed: the tool
// declares an outputSchema, which clients hold an error's structured
// content to as well (the TypeScript SDK throws when it does not match),
// so its errors have none: the class, message and receipt are in the text
// and _meta.
func result(res *kernel.Result, err error, tool, name string, typed bool) *mcp.CallToolResult {
	if err != nil {
		res = &kernel.Result{Status: kernel.StatusError, Error: &kernel.Error{Class: kernel.ErrInternal, Message: "the kernel did not answer: " + err.Error()}}
	}
	if res.Status != kernel.StatusOK {
		class, msg := kernel.ErrInternal, "result envelope without an error"
		if res.Error != nil {
			class, msg = res.Error.Class, res.Error.Message
		}
		if class == kernel.ErrToolNotFound && tool != name {
			// The kernel names the handle it was given; the client named
			// the tool: answer as for any unknown tool name.
			msg = strings.ReplaceAll(msg, strconv.Quote(tool), strconv.Quote(name))
		}
		r := errorResult(class, msg, res)
		if typed {
			r.StructuredContent = nil
		}
		return r
	}
	return okResult(res)
}

// withMember encodes e with one more top-level member, name, whose value
// is raw bytes that no encoder may normalize (the kernel must see the
// client's fault as the client sent it). e must not set that member.
func withMember(e kernel.Envelope, name string, raw []byte) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	out := append(b[:len(b)-1:len(b)-1], `,"`...)
	out = append(append(append(out, name...), `":`...), raw...)
	return append(out, '}'), nil
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte("null")
	}
	return b
}

// progress sends notifications/progress for req every g.progressEvery
// until the returned stop is called, when the client gave a progress
// token: a call waiting for an approval, or running long, would otherwise
// look dead to a client whose request timeout runs. progress is the
// seconds waited so far, so it grows with every notification as the
// protocol requires.
func (g *Gateway) progress(ctx context.Context, req *mcp.CallToolRequest) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		start := time.Now()
		tick := time.NewTicker(g.progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if ctx.Err() != nil {
					return // the select took the tick over the call's end
				}
				waited := now.Sub(start).Round(time.Second)
				// A failed notification (the client is gone) is not the
				// call's failure: the call goes on and is audited.
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token, Progress: now.Sub(start).Seconds(),
					Message: fmt.Sprintf("%s: still running or waiting for an approval after %s", req.Params.Name, waited),
				})
			}
		}
	}()
	// stop waits for the sender, so no notification follows the result.
	return func() { close(done); <-exited }
}

// okResult is the MCP result of a call with status ok, its result encoded
// once on the wire. An upstream tool's result passes through
// (upstreamResult). Any other result object is one text item holding its
// JSON, which every client shows its model; it is not repeated as
// structuredContent (the kernel's syscalls declare no output schema), so a
// large result is not sent twice.
func okResult(res *kernel.Result) *mcp.CallToolResult {
	if r, ok := upstreamResult(res); ok {
		return r
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(res.Result)}}, Meta: meta(res)}
}

// errorResult is a tool error (isError), which a model can read: the
// class and message as text and, for programs, as structured content
// (small, so the repetition costs nothing).
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
	m := mcp.Meta{MetaReceiptID: res.ReceiptID, MetaOperationID: res.OperationID, MetaLedgerSeq: res.LedgerSeq, MetaReplayed: res.Replayed}
	if res.Receipt != nil {
		m[MetaReceipt] = res.Receipt
	}
	if res.AuditSalt != "" {
		m[MetaAuditSalt] = res.AuditSalt
	}
	return m
}

// tagParams returns tools/call params with _meta[MetaRequestID] = id,
// sealed (MetaSeal); params that are not an object are left for the SDK
// to refuse. The transports call it only on messages that obey the
// strictjson rules (prepare); the marks only they may set are dropped
// from the client's _meta.
func tagParams(s *sealer, params json.RawMessage, id any) json.RawMessage {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(params, &p); err != nil || p == nil {
		return params
	}
	var m map[string]any
	if raw, ok := p["_meta"]; ok {
		if err := json.Unmarshal(raw, &m); err != nil {
			return params
		}
		delete(m, MetaInvalid)
		delete(m, MetaRawMessage)
	}
	if m == nil {
		m = map[string]any{}
	}
	m[MetaRequestID] = id
	m[MetaSeal] = s.seal(marks{requestID: idJSON(id)})
	b, err := jsonNoHTML(m)
	if err != nil {
		return params
	}
	p["_meta"] = b
	out, err := jsonNoHTML(p) // see tagFull
	if err != nil {
		return params
	}
	return out
}

// nopCloser is a writer whose Close does nothing: the gateway never
// closes its stdout.
type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
