package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The lean path serves a plain tools/call POSTed in a live session itself,
// on the HTTP connection's goroutine, instead of handing it to the SDK's
// streamable handler: the SDK decodes a message four times (each with a
// fresh 32 KiB buffer), hands it through two goroutines and encodes the
// result twice, which cost more CPU than the rest of the gateway together
// (docs/mcp.md "Cost"). It answers exactly as the SDK does (status,
// headers, the SSE event, the JSON-RPC response) and takes only requests
// for which that answer is the plain one; every other request goes to the
// SDK unchanged.

// leanProtocolLimit is the first protocol version the lean path leaves to
// the SDK: from it on, requests carry their protocol in _meta and results
// a resultType.
const leanProtocolLimit = "2026-07-28"

// leanCall is a tools/call the lean path may serve.
type leanCall struct {
	id   any    // string or int64, as the SDK reads it
	key  string // the id's JSON, the key of the call among those in flight
	name string
	args json.RawMessage // nil when the client sent none
}

// serveLean serves r, whose body has been read, when it is a plain
// tools/call (see leanRequest) in ss, r's live session of g's server (nil
// for none), when ss negotiated a protocol version before
// leanProtocolLimit, to a client that
// declared no elicitation (a call that may ask its client goes to the
// SDK, whose stream carries the question), for a tool g serves. It reports
// whether it answered; when not, it has written nothing.
func (g *Gateway) serveLean(w http.ResponseWriter, r *http.Request, ss *mcp.ServerSession, body []byte) bool {
	if ss == nil || g.handles != nil || !leanHeaders(r) {
		return false // no live session: the SDK answers 404
	}
	c, ok := leanRequest(body)
	if !ok || !g.served[c.name] {
		return false
	}
	ip := ss.InitializeParams()
	if ip == nil || ip.ProtocolVersion >= leanProtocolLimit || r.Header.Get(protocolVersionHeader) != ip.ProtocolVersion {
		return false
	}
	req := &mcp.CallToolRequest{Session: ss, Params: &mcp.CallToolParamsRaw{Name: c.name, Arguments: c.args}}
	if g.confirmable(req) {
		return false
	}
	// As under the SDK, the call outlives its POST (a client that drops
	// the connection does not cancel it); notifications/cancelled for it,
	// or the end of its session, do.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	if !g.inflight.start(ss.ID(), c.key, cancel) {
		writeDuplicate(w, c.key)
		return true
	}
	defer g.inflight.done(ss.ID(), c.key)
	g.inflight.watch(ss)
	// The lean path is a transport: it gives call the call's id itself.
	res, _ := g.call(ctx, req, marks{requestID: idJSON(c.id)}) // call answers every call with a result
	msg, err := leanResponse(c, res)
	if err != nil {
		// Never for the gateway's own results; the SDK would answer a
		// JSON-RPC internal error.
		text, _ := jsonNoHTML("encoding the result: " + err.Error())
		msg = []byte(`{"jsonrpc":"2.0","id":` + c.key + `,"error":{"code":-32603,"message":` + string(text) + `}}`)
	}
	w.Header().Set("Cache-Control", "no-cache, no-transform")
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Connection", "keep-alive")
	out := make([]byte, 0, len(msg)+len("event: message\ndata: \n\n"))
	out = append(append(append(out, "event: message\ndata: "...), msg...), "\n\n"...)
	// The whole answer in one write, not chunked.
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
	return true
}

// Headers of the streamable HTTP transport.
const (
	sessionIDHeader       = "Mcp-Session-Id"
	protocolVersionHeader = "Mcp-Protocol-Version"
)

// leanHeaders reports whether r's headers are those of a plain call the
// SDK would take as they are: a loopback Host where the server listens on
// loopback (else the SDK's DNS-rebinding check answers 403), a JSON body,
// an Accept of both JSON and SSE, a session and a protocol version, and
// none of the headers the SDK checks against the body or resumes a stream
// by (Mcp-Method, Mcp-Name, Mcp-Param-*, Last-Event-ID).
func leanHeaders(r *http.Request) bool {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a != nil && isLoopback(a.String()) && !isLoopback(r.Host) {
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return false
	}
	if !acceptsJSONAndSSE(r.Header.Values("Accept")) {
		return false
	}
	if r.Header.Get(sessionIDHeader) == "" || r.Header.Get(protocolVersionHeader) == "" {
		return false
	}
	for k := range r.Header {
		if k == "Mcp-Method" || k == "Mcp-Name" || strings.HasPrefix(k, "Mcp-Param-") || k == "Last-Event-Id" {
			return false
		}
	}
	return true
}

// isLoopback is the SDK's test of a host[:port]: localhost or a loopback IP.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// acceptsJSONAndSSE is the SDK's reading of Accept headers for a POST.
func acceptsJSONAndSSE(values []string) bool {
	var jsonOK, streamOK bool
	for _, v := range values {
		for _, raw := range strings.Split(v, ",") {
			base, _, _ := strings.Cut(strings.TrimSpace(raw), ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				jsonOK = true
			case "text/event-stream", "text/*":
				streamOK = true
			case "*/*":
				jsonOK, streamOK = true, true
			}
		}
	}
	return jsonOK && streamOK
}

// leanRequest reads body as a plain tools/call: one JSON object with
// exactly the members jsonrpc ("2.0"), id (a string, or an integer of at
// most 2^53 in magnitude written as one), method ("tools/call", in any
// spelling: isString) and
// params, which has a name (a string) and may have arguments (an object),
// nothing else (no _meta: no progress token, idempotency key or trace
// context), no duplicate member name or invalid UTF-8 anywhere, nothing
// after it. ok is false for any other body.
func leanRequest(body []byte) (c leanCall, ok bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	if t, err := dec.ReadToken(); err != nil || t.Kind() != '{' {
		return c, false
	}
	var version, method, rawID, name jsontext.Value
	for dec.PeekKind() != '}' {
		t, err := dec.ReadToken()
		if err != nil {
			return c, false
		}
		member := t.String()
		if member == "params" {
			if name, c.args, ok = leanParams(dec, body); !ok {
				return c, false
			}
			continue
		}
		v, err := dec.ReadValue()
		if err != nil {
			return c, false
		}
		// v is the decoder's until its next read: keep body's bytes.
		end := int(dec.InputOffset())
		v = jsontext.Value(body[end-len(v) : end])
		switch member {
		case "jsonrpc":
			version = v
		case "method":
			method = v
		case "id":
			rawID = v
		default:
			return c, false
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return c, false
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return c, false
	}
	if string(version) != `"2.0"` || !isString(method, "tools/call") || name == nil {
		return c, false
	}
	switch rawID.Kind() {
	case '"':
		var s string
		if json.Unmarshal(rawID, &s) != nil {
			return c, false
		}
		c.id = s
	case '0':
		var n int64
		// An integer literal only (no fraction or exponent), which the SDK
		// and this package read alike.
		if bytes.ContainsAny(rawID, ".eE") || json.Unmarshal(rawID, &n) != nil || n > 1<<53 || n < -(1<<53) {
			return c, false
		}
		c.id = n
	default:
		return c, false
	}
	if json.Unmarshal(name, &c.name) != nil {
		return c, false
	}
	key, err := jsonNoHTML(c.id)
	if err != nil {
		return c, false
	}
	c.key = string(key)
	return c, true
}

// leanParams reads the params object of a plain tools/call from dec: its
// name and its arguments, if any (both body's bytes).
func leanParams(dec *jsontext.Decoder, body []byte) (name jsontext.Value, args json.RawMessage, ok bool) {
	if t, err := dec.ReadToken(); err != nil || t.Kind() != '{' {
		return nil, nil, false
	}
	for dec.PeekKind() != '}' {
		t, err := dec.ReadToken()
		if err != nil {
			return nil, nil, false
		}
		member := t.String()
		v, err := dec.ReadValue()
		if err != nil {
			return nil, nil, false
		}
		end := int(dec.InputOffset())
		v = jsontext.Value(body[end-len(v) : end])
		switch {
		case member == "name" && v.Kind() == '"':
			name = v
		case member == "arguments" && v.Kind() == '{':
			args = json.RawMessage(v)
		default:
			return nil, nil, false
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, nil, false
	}
	return name, args, name != nil
}

// leanResponse is the JSON-RPC response to c with result res, encoded as
// the SDK encodes it (no HTML escaping).
func leanResponse(c leanCall, res *mcp.CallToolResult) ([]byte, error) {
	rb, err := jsonNoHTML(res)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(rb)+len(c.key)+40)
	out = append(append(append(out, `{"jsonrpc":"2.0","id":`...), c.key...), `,"result":`...)
	return append(append(out, rb...), '}'), nil
}

// writeDuplicate answers a call whose id (key, its JSON) is in flight in
// its session as the SDK does: 400 with a JSON-RPC invalid-request error.
func writeDuplicate(w http.ResponseWriter, key string) {
	var id any
	json.Unmarshal([]byte(key), &id)
	if f, ok := id.(float64); ok {
		id = int64(f)
	}
	text, _ := jsonNoHTML(fmt.Sprintf("duplicate in-flight request ID %v", id))
	msg := []byte(`{"jsonrpc":"2.0","id":` + key + `,"error":{"code":-32600,"message":` + string(text) + `}}`)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	w.Write(msg)
}

// jsonNoHTML encodes v as the SDK's JSON-RPC layer does.
func jsonNoHTML(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// inflight are the tools/calls in flight per MCP session, by JSON id: the
// lean path's (with their cancel functions) and, while their POSTs are
// served, the SDK's, so that an id reused while its call runs is refused
// on either path as the SDK refuses it.
type inflight struct {
	mu      sync.Mutex
	by      map[string]map[string]context.CancelFunc // session → id → cancel (nil: the SDK's call)
	watched map[*mcp.ServerSession]bool
	sdk     map[string]map[*context.CancelFunc]bool // session → the SDK's calls running (running)
}

// start records call id of session, reporting false when one with that id
// is in flight.
func (f *inflight) start(session, id string, cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[string]map[string]context.CancelFunc{}
	}
	calls := f.by[session]
	if _, dup := calls[id]; dup {
		return false
	}
	if calls == nil {
		calls = map[string]context.CancelFunc{}
		f.by[session] = calls
	}
	calls[id] = cancel
	return true
}

// done forgets call id of session.
func (f *inflight) done(session, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.by[session], id)
	if len(f.by[session]) == 0 {
		delete(f.by, session)
	}
}

// running records a call the SDK serves in session (Gateway.handle),
// with the cancel that ends it with its session (endSession), until the
// returned release: as long as the call runs, whether or not its POST is
// still open, and whatever its id (the SDK's own end of a session waits
// for the calls it serves instead).
func (f *inflight) running(session string, cancel context.CancelFunc) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sdk == nil {
		f.sdk = map[string]map[*context.CancelFunc]bool{}
	}
	if f.sdk[session] == nil {
		f.sdk[session] = map[*context.CancelFunc]bool{}
	}
	p := &cancel
	f.sdk[session][p] = true
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.sdk[session], p)
		if len(f.sdk[session]) == 0 {
			delete(f.sdk, session)
		}
	}
}

// endSession cancels every call of session in flight, on either path (its
// client ended it: DELETE).
func (f *inflight) endSession(session string) {
	f.mu.Lock()
	var cancels []context.CancelFunc
	for _, c := range f.by[session] {
		if c != nil {
			cancels = append(cancels, c)
		}
	}
	for p := range f.sdk[session] {
		cancels = append(cancels, *p)
	}
	f.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

// busy reports whether a call of session is in flight, on either path.
func (f *inflight) busy(session string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.by[session]) > 0 || len(f.sdk[session]) > 0
}

// any reports whether a call of any session is in flight, on either path.
func (f *inflight) any() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.by) > 0 || len(f.sdk) > 0
}

// cancel cancels lean call id of session, if it is in flight.
func (f *inflight) cancel(session, id string) {
	f.mu.Lock()
	cancel := f.by[session][id]
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// watch makes the end of ss cancel its lean calls, as the end of a
// session cancels the calls the SDK serves in it.
func (f *inflight) watch(ss *mcp.ServerSession) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watched == nil {
		f.watched = map[*mcp.ServerSession]bool{}
	}
	if f.watched[ss] {
		return
	}
	f.watched[ss] = true
	go func() {
		_ = ss.Wait()
		f.mu.Lock()
		delete(f.watched, ss)
		calls := f.by[ss.ID()]
		var cancels []context.CancelFunc
		for _, c := range calls {
			if c != nil {
				cancels = append(cancels, c)
			}
		}
		f.mu.Unlock()
		for _, c := range cancels {
			c()
		}
	}()
}
