package mcpgateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxHTTPBody bounds the body of a request to the HTTP server: a longer
// one is answered 413 before it is read further. It is the limit of both
// the gateway's own reading and the SDK's handler behind it.
const MaxHTTPBody = 8 << 20

// HTTPOptions configure the streamable HTTP handler.
type HTTPOptions struct {
	// AllowedOrigins are the browser origins ("https://app.example.com",
	// scheme://host[:port], compared case-insensitively) allowed besides
	// the loopback ones. A request with any other Origin header is
	// answered 403, as the MCP transport specification requires, so that
	// no web page a user visits can drive the gateway.
	AllowedOrigins []string
	// SessionIdle, if not zero, ends a session once it has been idle
	// that long: no request of it served (a GET holding its stream open
	// counts as one being served), no call of it running or waiting to
	// be resumed. Its calls and handles end with it, as with its
	// client's DELETE; the client's next request is answered 404, and
	// it must connect again for a new session (the SDK clients do not
	// on their own). Zero keeps every session until its client
	// ends it or the gateway stops.
	SessionIdle time.Duration
	// MaxSessions bounds the sessions live at once (DefaultMaxSessions
	// when zero). A request that would make one more
	// (a POST without Mcp-Session-Id: initialize) is answered 503 with a
	// JSON-RPC error (CodeSessionsFull) while the gateway holds that many;
	// each session holds ~24 KiB of the process for as long as it lives.
	MaxSessions int

	freshIdle time.Duration // FreshSessionIdle when zero; tests set it shorter
}

// DefaultMaxSessions is the default of HTTPOptions.MaxSessions.
const DefaultMaxSessions = 1024

// FreshSessionIdle is how long a session lives, when idle sessions end
// (HTTPOptions.SessionIdle set), with no request after the initialize
// that made it (a client initializes, then at once sends
// notifications/initialized and opens its stream): unless SessionIdle is
// shorter, such a session ends after FreshSessionIdle rather than
// SessionIdle, so that sessions made and dropped do not keep their places
// under MaxSessions for the idle hour.
const FreshSessionIdle = time.Minute

// CodeSessionsFull is the JSON-RPC error code of a new session refused
// because the gateway holds HTTPOptions.MaxSessions (an implementation-
// defined server error of JSON-RPC 2.0).
const CodeSessionsFull = -32000

// CheckOrigin reports whether an Origin header value is allowed: absent
// (not a browser), a loopback origin (http or https on localhost,
// 127.0.0.0/8 or ::1, any port), or one of allowed. "null" (an opaque
// origin: a sandboxed frame, a file: page) is not.
func CheckOrigin(origin string, allowed []string) bool {
	if origin == "" {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(strings.TrimSuffix(a, "/"), origin) {
			return true
		}
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" || u.User != nil {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ValidOrigin checks an --allow-origin value: scheme://host[:port] of
// http or https, nothing more.
func ValidOrigin(o string) error {
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("origin %q is not scheme://host[:port] with scheme http or https", o)
	}
	return nil
}

// HTTPHandler serves streamable HTTP clients, each in its own MCP session.
func (g *Gateway) HTTPHandler(o HTTPOptions) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server },
		// tagHTTP bounds the client's body at MaxHTTPBody; the body it
		// passes on may be larger by the tags (the raw params of a
		// refused _meta, in base64), which the SDK must not refuse.
		&mcp.StreamableHTTPOptions{MaxRequestBodyBytes: 3 * MaxHTTPBody})
	var idle *idleSessions
	if o.SessionIdle > 0 {
		fresh := cmp.Or(o.freshIdle, FreshSessionIdle)
		idle = newIdleSessions(o.SessionIdle, min(fresh, o.SessionIdle), g.busy, g.endSession)
	}
	gate := &sessionGate{max: cmp.Or(o.MaxSessions, DefaultMaxSessions), live: g.liveSessions}
	return checkOrigins(o.AllowedOrigins, g.tagHTTP(h, idle, gate))
}

// sessionGate bounds the live HTTP sessions: a request that may make one
// (no Mcp-Session-Id) is let through while the sessions live and those
// being made are fewer than max. A session is counted twice while its
// initialize is served (live, and being made), so at the bound a
// concurrent initialize may be refused one session early, never let
// through one late.
type sessionGate struct {
	max  int
	live func() int // the sessions the SDK holds

	mu     sync.Mutex
	making int // requests let through that may make a session, not yet served
}

// enter reports whether a request that may make a session is let
// through; if so, done must be called once it was served (a session it
// made is then live).
func (s *sessionGate) enter() (done func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live()+s.making >= s.max {
		return nil, false
	}
	s.making++
	return func() {
		s.mu.Lock()
		s.making--
		s.mu.Unlock()
	}, true
}

// writeSessionsFull answers a POST that would make a session past max:
// 503, with a JSON-RPC error answering the request's id (null when it
// has none that can be read).
func writeSessionsFull(w http.ResponseWriter, body []byte, max int) {
	id := "null"
	if m, ok := readMessage(body); ok && (m.id.Kind() == '"' || m.id.Kind() == '0') {
		id = string(m.id)
	}
	text, _ := jsonNoHTML(fmt.Sprintf("the gateway holds %d MCP sessions, the most it may: no new session until one ends (its client's DELETE, or idle)", max))
	msg := []byte(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":` + strconv.Itoa(CodeSessionsFull) + `,"message":` + string(text) + `}}`)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(msg)))
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(msg)
}

// checkOrigins answers 403 to a request whose Origin is not allowed (see
// CheckOrigin), before anything of it is read.
func checkOrigins(allowed []string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); !CheckOrigin(o, allowed) {
			http.Error(w, "origin "+strconv.Quote(o)+" is not allowed: only loopback origins and those given by --allow-origin may use this gateway", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// tagHTTP bounds the body of each POST, serves a plain tools/call on the
// lean path (lean.go) and reads every other body as the stdio transport
// reads a line (prepare: the strictjson rules, and each tools/call's
// JSON-RPC id copied into its _meta) before h serves it; a body prepare
// rejects is answered 400 with its JSON-RPC error. A POST that may make a
// session passes gate first. With idle set, every request of a live
// session is one of its activity, and a session the SDK makes is tracked
// from its first answer.
func (g *Gateway) tagHTTP(h http.Handler, idle *idleSessions, gate *sessionGate) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The request's session, looked up once (the lookup scans the
		// server's sessions).
		sid := r.Header.Get(sessionIDHeader)
		var ss *mcp.ServerSession
		if sid != "" {
			ss = g.sessionByID(sid)
		}
		if idle != nil && ss != nil {
			defer idle.begin(sid)()
		} else if idle != nil && sid == "" {
			defer func() {
				if sid := w.Header().Get(sessionIDHeader); sid != "" {
					idle.track(sid)
				}
			}()
		}
		if r.Method == http.MethodDelete {
			// The client ends its session: its calls end with it (the
			// SDK's close would wait for those it serves; a gated one
			// would wait for an approver, then act).
			if deleteTaken(r, ss) {
				g.inflight.endSession(sid)
				g.pending.endSession(sid)
				if idle != nil {
					defer func() {
						// Only once the SDK has ended it: a DELETE it
						// refuses (a bad protocol header) leaves the
						// session live, counted as any other.
						if g.sessionByID(sid) == nil {
							idle.ended(sid)
						}
					}()
				}
			}
		}
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxHTTPBody+1))
		r.Body.Close()
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > MaxHTTPBody {
			http.Error(w, "request body over "+strconv.Itoa(MaxHTTPBody)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		if sid == "" {
			// The SDK makes a session for a POST without one (and
			// drops it again unless it was initialized).
			done, ok := gate.enter()
			if !ok {
				writeSessionsFull(w, body, gate.max)
				return
			}
			defer done()
		}
		if g.serveLean(w, r, ss, body) {
			return
		}
		// The lean path takes only bodies that obey the strictjson rules;
		// any other is read by them here (prepare).
		body, reject := prepare(g.seals, body)
		if reject != nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(reject)))
			w.WriteHeader(http.StatusBadRequest)
			w.Write(reject)
			return
		}
		for _, msg := range messages(body) {
			m, key, ok := messageID(msg)
			if !ok || sid == "" {
				continue
			}
			switch m {
			case "tools/call":
				// In flight while the SDK serves its POST: the same id
				// on the lean path meanwhile is a duplicate.
				if ss != nil {
					if !g.inflight.start(sid, key, nil) {
						writeDuplicate(w, key)
						return
					}
					defer g.inflight.done(sid, key)
				}
			case "notifications/cancelled":
				// The SDK cancels the calls it serves; a lean one is the
				// gateway's to cancel.
				g.inflight.cancel(sid, key)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	})
}

// tagBody returns a POSTed JSON-RPC message with a tools/call request's
// id copied into its params' _meta (tagParams); any other body as it came.
// The method is read by its decoded value (readMessage), so every
// spelling of tools/call is tagged. The common call, whose params have no
// _meta, is tagged by splicing (spliceRequestID); any other goes the full
// way, which decodes only the envelope's members, leaving params and the
// rest as raw bytes. Either way the SDK decodes the message again, so
// tagging must cost little.
func tagBody(s *sealer, body []byte) []byte {
	m, ok := readMessage(body)
	if !ok || !isString(m.method, "tools/call") {
		return body
	}
	id, ok := requestID(json.RawMessage(m.id))
	if !ok {
		return body
	}
	if out, ok := spliceRequestID(s, body, m, id); ok {
		return out
	}
	return tagFull(s, body, id)
}

// tagFull tags tools/call request body, of JSON-RPC id id, by decoding
// its members.
func tagFull(s *sealer, body []byte, id any) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	m["params"] = tagParams(s, m["params"], id)
	// Without HTML escaping, as the client sent it: each <, > or &
	// escaped would grow the message sixfold, past what the SDK reads.
	out, err := jsonNoHTML(m)
	if err != nil {
		return body
	}
	return out
}

// requestID is the id of a JSON-RPC request as the SDK reads it (a
// string, or an integer as int64); ok is false for a notification (no id)
// or a value that is no id, which the SDK answers.
func requestID(raw json.RawMessage) (id any, ok bool) {
	if json.Unmarshal(raw, &id) != nil {
		return nil, false
	}
	switch v := id.(type) {
	case string:
		return v, true
	case float64:
		if v != float64(int64(v)) {
			return nil, false
		}
		return int64(v), true
	}
	return nil, false
}

// spliceRequestID tags m, tools/call request body of JSON-RPC id id
// (read by readMessage), when its params are an object with no _meta
// member, by inserting "_meta":{MetaRequestID: id, MetaSeal: its seal} as
// the params' first member, every other byte as it came: the same message, to the SDK, as
// the full way makes. ok is false for any other params, which the full
// way tags or leaves as they came.
func spliceRequestID(s *sealer, body []byte, m rpcMessage, id any) (out []byte, ok bool) {
	if m.params.Kind() != '{' {
		return nil, false
	}
	members, hasMeta := false, false
	if !readObject(m.params, func(name string, _ jsontext.Value, _ int) {
		members = true
		hasMeta = hasMeta || name == "_meta"
	}) || hasMeta {
		return nil, false
	}
	idj := idJSON(id)
	if idj == "" {
		return nil, false
	}
	seal := s.seal(marks{requestID: idj})
	out = make([]byte, 0, len(body)+len(MetaRequestID)+len(idj)+len(MetaSeal)+len(seal)+24)
	out = append(out, body[:m.paramsAt+1]...)
	out = append(out, `"_meta":{"`...)
	out = append(append(append(out, MetaRequestID...), `":`...), idj...)
	out = append(append(append(append(append(out, `,"`...), MetaSeal...), `":"`...), seal...), `"}`...)
	if members {
		out = append(out, ',')
	}
	return append(out, body[m.paramsAt+1:]...), true
}

// messageID reads a single JSON-RPC message's method and the id it names
// when the method (decoded, in any spelling) is tools/call or
// notifications/cancelled: a request's own id, or the requestId of
// notifications/cancelled, as the key of the calls in flight (the id's
// JSON as the SDK reads it). ok is false for any other message, a batch,
// a body that is not JSON or a message without such an id.
func messageID(body []byte) (method, key string, ok bool) {
	m, ok := readMessage(body)
	if !ok {
		return "", "", false
	}
	raw := m.id
	switch {
	case isString(m.method, "tools/call"):
		method = "tools/call"
	case isString(m.method, "notifications/cancelled"):
		method, raw = "notifications/cancelled", nil
		if m.params.Kind() != '{' || !readObject(m.params, func(name string, v jsontext.Value, _ int) {
			if name == "requestId" {
				raw = v
			}
		}) {
			return "", "", false
		}
	default:
		return "", "", false
	}
	id, ok := requestID(json.RawMessage(raw))
	if !ok {
		return "", "", false
	}
	b, err := jsonNoHTML(id)
	if err != nil {
		return "", "", false
	}
	return method, string(b), true
}

// messages returns the JSON-RPC messages of body: its elements when it is
// a batch (protocol 2025-03-26), else body itself.
func messages(body []byte) []json.RawMessage {
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '[' {
		return []json.RawMessage{body}
	}
	var elems []json.RawMessage
	if json.Unmarshal(body, &elems) != nil {
		return nil
	}
	return elems
}

// deleteTaken reports whether the SDK will take r, a DELETE of live
// session ss, rather than refuse it before it ends ss (a non-loopback Host
// on a loopback address, a protocol header naming a version before
// leanProtocolLimit that the SDK does not support: the SDK does not
// compare it with the session's): only then are the session's calls ended
// ahead of it.
func deleteTaken(r *http.Request, ss *mcp.ServerSession) bool {
	if ss == nil {
		return false
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a != nil && isLoopback(a.String()) && !isLoopback(r.Host) {
		return false
	}
	v := r.Header.Get(protocolVersionHeader)
	return v == "" || v >= leanProtocolLimit || slices.Contains(sdkVersions, v)
}

// sdkVersions are the protocol versions the gateway's server supports
// (it narrows none).
var sdkVersions = mcp.SupportedProtocolVersions()

// endSession ends the server's session of id, if it is live, as its
// client's DELETE does: its calls first, then the SDK's session.
func (g *Gateway) endSession(id string) {
	if ss := g.sessionByID(id); ss != nil {
		g.inflight.endSession(id)
		g.pending.endSession(id)
		ss.Close()
	}
}

// Shutdown ends the gateway's HTTP sessions for a server that stops: it
// waits until no tools/call of any session is in flight (on either path)
// or ctx is done, then ends every session as its client's DELETE does (a
// call still in flight is cancelled, audited, and a session's GET stream
// closes), so that http.Server.Shutdown, which waits for every active
// connection, is not held by the streams clients hold open to listen.
func (g *Gateway) Shutdown(ctx context.Context) {
	// The calls end by themselves (kernel.Drain ends those waiting for
	// an approval); inflight has no signal for its last one, so it is
	// looked at every few milliseconds, which costs nothing next to the
	// calls.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for g.inflight.any() && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	var ids []string
	for ss := range g.server.Sessions() {
		ids = append(ids, ss.ID())
	}
	for _, id := range ids {
		g.endSession(id)
	}
}

// busy reports whether a call of session runs, on either path, or waits
// for its client to resume it.
func (g *Gateway) busy(session string) bool {
	return g.inflight.busy(session) || g.pending.holds(session)
}

// liveSessions counts the server's sessions.
func (g *Gateway) liveSessions() int {
	n := 0
	for range g.server.Sessions() {
		n++
	}
	return n
}

// sessionByID returns the server's session of id, or nil.
func (g *Gateway) sessionByID(id string) *mcp.ServerSession {
	for s := range g.server.Sessions() {
		if s.ID() == id {
			return s
		}
	}
	return nil
}
