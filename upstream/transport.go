package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// codeTooLarge is the JSON-RPC error code of the response the framer puts
// in place of a stdio frame over its limit, and cappedBody in place of an
// HTTP message over it; its data is {"bytes": size}, with "cut": true when
// the message was cut at size bytes (its whole size is not known).
const codeTooLarge = -32099

// sentKey marks a call's context; the transports set the flag once the
// tools/call request has been written to a live connection, which is the
// point after which the upstream may act on it.
type sentKey struct{}

// withSent returns ctx carrying a flag the transports set when the call's
// request is written.
func withSent(ctx context.Context) (context.Context, *atomic.Bool) {
	f := new(atomic.Bool)
	return context.WithValue(ctx, sentKey{}, f), f
}

func markSent(ctx context.Context) {
	if f, ok := ctx.Value(sentKey{}).(*atomic.Bool); ok {
		f.Store(true)
	}
}

// answerKey marks a call's context with the slot its tools/call answer's
// result goes to, as it came (answerConn): the SDK decodes a result's
// numbers into float64s, and only the bytes tell one that was rounded.
type answerKey struct{}

// answer is the slot of one call's raw result.
type answer struct {
	mu     sync.Mutex
	conn   *answerConn // nil until its request is written
	id     jsonrpc.ID
	result json.RawMessage
}

// withAnswer returns ctx carrying a slot for the raw result of the
// tools/call sent with it.
func withAnswer(ctx context.Context) (context.Context, *answer) {
	a := new(answer)
	return context.WithValue(ctx, answerKey{}, a), a
}

// raw returns the result as it came, or nil if none came (yet).
func (a *answer) raw() json.RawMessage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.result
}

// set keeps result, the answer's as it came; a nil slot keeps nothing.
func (a *answer) set(result json.RawMessage) {
	if a != nil {
		a.mu.Lock()
		a.result = result
		a.mu.Unlock()
	}
}

// done forgets the slot's request on its connection: an answer that comes
// after it (the call was cancelled) is nobody's.
func (a *answer) done() {
	a.mu.Lock()
	c, id := a.conn, a.id
	a.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
	}
}

// answerConn is a stdio connection to an upstream: it marks a call's
// tools/call request written (markSent), and keeps the result of its
// answer, as it came, for the call whose context has a slot (withAnswer).
// (Over HTTP, the round trip does both: sentTransport, cappedBody.)
type answerConn struct {
	mcp.Connection

	mu      sync.Mutex
	waiting map[jsonrpc.ID]*answer
}

func (c *answerConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	a, _ := ctx.Value(answerKey{}).(*answer)
	req, ok := msg.(*jsonrpc.Request)
	if a == nil || !ok || req.Method != "tools/call" || !req.ID.IsValid() {
		a = nil
	} else {
		// Before the write: the answer may come before Write returns.
		a.mu.Lock()
		a.conn, a.id = c, req.ID
		a.mu.Unlock()
		c.mu.Lock()
		c.waiting[req.ID] = a
		c.mu.Unlock()
	}
	err := c.Connection.Write(ctx, msg)
	if err == nil {
		markSent(ctx)
	} else if a != nil {
		a.done()
	}
	return err
}

func (c *answerConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if resp, ok := msg.(*jsonrpc.Response); ok && resp.Result != nil {
		c.mu.Lock()
		a := c.waiting[resp.ID]
		delete(c.waiting, resp.ID)
		c.mu.Unlock()
		a.set(resp.Result)
	}
	return msg, err
}

// sentTransport marks requests whose bytes an HTTP connection took —
// unless the server answered 404 to a request naming its session
// (Mcp-Session-Id): by the streamable HTTP transport, it has not processed
// it (the session is gone, as after the server restarted), so the call is
// sent again on a new session. It also bounds what a response can make the
// kernel read (see cappedBody).
type sentTransport struct {
	base  http.RoundTripper
	limit int // the most bytes of one message in a response
}

func (t sentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var id json.RawMessage
	var method string
	var st *sendState
	if req.Method == http.MethodPost {
		if f, ok := req.Context().Value(sentKey{}).(*atomic.Bool); ok {
			st = &sendState{sent: f}
			trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
				// A request whose write failed part way may still have
				// reached the server: only an error before any byte left
				// would be safe to count as unsent, and the trace cannot
				// tell, so any attempt to write counts.
				st.wrote()
			}}
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		}
		id, method = requestOf(req)
	}
	var ans *answer
	if method == "tools/call" && id != nil {
		ans, _ = req.Context().Value(answerKey{}).(*answer)
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	// Only the tools/call itself may be taken back: a later message of
	// the same call (its notifications/cancelled, after a timeout)
	// answered 404 says nothing of whether the call ran.
	if st != nil && method == "tools/call" && resp.StatusCode == http.StatusNotFound && req.Header.Get("Mcp-Session-Id") != "" {
		st.refused()
	}
	resp.Body = &cappedBody{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10), limit: t.limit, id: id, answer: ans,
		sse: strings.HasPrefix(strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Type"))), "text/event-stream")}
	return resp, nil
}

// sendState is the sent flag of one HTTP request: written, unless refused.
type sendState struct {
	mu      sync.Mutex // orders wrote (on the connection's writer) and refused
	sent    *atomic.Bool
	refusal bool
}

func (s *sendState) wrote() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.refusal {
		s.sent.Store(true)
	}
}

func (s *sendState) refused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusal = true
	s.sent.Store(false)
}

// requestOf returns the JSON-RPC id (a number or a string; nil for none)
// and method of the message req's body carries.
func requestOf(req *http.Request) (json.RawMessage, string) {
	if req.GetBody == nil {
		return nil, ""
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, ""
	}
	defer body.Close()
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.NewDecoder(body).Decode(&m) != nil {
		return nil, ""
	}
	if len(m.ID) == 0 || len(m.ID) >= 256 || m.ID[0] != '"' && m.ID[0] != '-' && (m.ID[0] < '0' || m.ID[0] > '9') {
		return nil, m.Method
	}
	return m.ID, m.Method
}

// cappedBody is an HTTP response body read so that no message in it makes
// the SDK read more than limit bytes: a whole body (a JSON response), or
// one event of an SSE stream, is passed on only once it has ended within
// the limit. One over the limit is cut there and the body ends: in its
// place comes an error response (code codeTooLarge, as the stdio framer's)
// to the request the body answers, or, with no request id, a read error.
type cappedBody struct {
	body   io.ReadCloser
	r      *bufio.Reader
	limit  int
	id     json.RawMessage // the request's JSON-RPC id, if any
	answer *answer         // where the result of the answer to a tools/call goes, if any
	sse    bool
	out    []byte
	err    error // the error after out
}

func (b *cappedBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.out, b.err = b.next()
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *cappedBody) Close() error { return b.body.Close() }

// next reads the next whole message, the body or one SSE event, and
// keeps the result it holds for the call (keep).
func (b *cappedBody) next() ([]byte, error) {
	msg, err := b.message()
	b.keep(msg)
	return msg, err
}

// keep puts the result of msg in the call's slot when msg is the answer
// to the body's tools/call request: the JSON-RPC response of the body, or
// of the event's data read as the SDK reads it (its data lines, each
// trimmed of white space, joined with newlines). The SDK gets msg only
// after this, so the slot holds the result before CallTool returns.
func (b *cappedBody) keep(msg []byte) {
	if b.answer == nil {
		return
	}
	if b.sse {
		var data []byte
		seen := false
		for line := range bytes.Lines(msg) {
			name, value, ok := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":"))
			if !ok || string(name) != "data" {
				continue
			}
			if seen {
				data = append(data, '\n')
			}
			data, seen = append(data, bytes.TrimSpace(value)...), true
		}
		msg = data
	}
	// Member names matched exactly, and a name twice refused (json/v2's
	// defaults): the SDK matches them exactly too, so a "Result" beside
	// "result" cannot show this check one result and the SDK another. An
	// answer read otherwise leaves the slot empty, and Execute withholds
	// its result (unchecked).
	var r struct {
		ID     jsontext.Value `json:"id"`
		Result jsontext.Value `json:"result"`
	}
	// Invalid UTF-8 and lone surrogate escapes are let through, as the
	// SDK's decoder lets them (as U+FFFD): a string cut inside an emoji
	// is an honest answer.
	if jsonv2.Unmarshal(msg, &r, jsontext.AllowInvalidUTF8(true)) == nil && r.Result != nil && sameID(r.ID, b.id) {
		b.answer.set(json.RawMessage(r.Result))
	}
}

// sameID reports whether the JSON-RPC ids a and b name one request as
// the SDK tells them apart (jsonrpc2.MakeID): strings by their value, and
// numbers by the int64 of their float64 (1 and 1.0 are one id).
func sameID(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	switch x := va.(type) {
	case string:
		y, ok := vb.(string)
		return ok && x == y
	case float64:
		y, ok := vb.(float64)
		return ok && int64(x) == int64(y)
	}
	return false
}

// message reads the next whole message: the body, or one SSE event.
func (b *cappedBody) message() ([]byte, error) {
	if !b.sse {
		buf, err := io.ReadAll(io.LimitReader(b.r, int64(b.limit)+1))
		if len(buf) > b.limit {
			return b.tooLarge()
		}
		if err == nil {
			err = io.EOF
		}
		return buf, err
	}
	var ev []byte
	for {
		start := len(ev)
		for {
			chunk, err := b.r.ReadSlice('\n')
			if len(ev)+len(chunk) > b.limit {
				return b.tooLarge()
			}
			ev = append(ev, chunk...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				return ev, err
			}
			break
		}
		if len(bytes.TrimRight(ev[start:], "\r\n")) == 0 {
			return ev, nil // a blank line ends the event
		}
	}
}

// tooLarge ends the body with the answer for a message over the limit.
func (b *cappedBody) tooLarge() ([]byte, error) {
	if b.id == nil {
		return nil, fmt.Errorf("an upstream message over %d bytes was cut", b.limit)
	}
	resp := tooLargeResponse(b.id, fmt.Sprintf("the upstream's answer is over %d bytes; it was cut there", b.limit), b.limit+1, true)
	if b.sse {
		resp = slices.Concat([]byte("event: message\ndata: "), resp, []byte("\n\n"))
	}
	return resp, io.EOF
}

// stdioTransport runs a command and speaks MCP over its stdin/stdout, with
// a framer between its stdout and the SDK: a frame over the limit is
// replaced by an error response and never breaks the connection.
type stdioTransport struct {
	cmd   *exec.Cmd
	limit int
	log   *slog.Logger
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	r := &framer{r: bufio.NewReaderSize(stdout, 64<<10), limit: t.limit, log: t.log}
	w := &procWriter{cmd: t.cmd, stdin: stdin}
	// The framer bounds every frame it passes on, so the SDK's own line
	// limit (which would end the connection) can never trip first.
	c, err := (&mcp.IOTransport{Reader: io.NopCloser(r), Writer: w, MaxLineLength: t.limit + 1<<20}).Connect(ctx)
	if err != nil {
		w.Close()
		return nil, err
	}
	return &answerConn{Connection: c, waiting: map[jsonrpc.ID]*answer{}}, nil
}

// procWriter is the command's stdin; closing it ends the command: stdin
// closed, SIGTERM after 2 s, SIGKILL 2 s later (as the SDK's
// CommandTransport does).
type procWriter struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	once  sync.Once
	err   error
}

func (w *procWriter) Write(p []byte) (int, error) { return w.stdin.Write(p) }

func (w *procWriter) Close() error {
	w.once.Do(func() {
		w.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- w.cmd.Wait() }()
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			select {
			case err := <-done:
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					w.err = err
				}
				return
			case <-time.After(2 * time.Second):
				w.cmd.Process.Signal(sig)
			}
		}
		<-done
	})
	return w.err
}

// framer passes newline-delimited JSON-RPC frames through unchanged, up to
// limit bytes each. A longer frame is read to its end without being kept,
// and in its place comes an error response to the request it answered
// (found by its top-level "id"), naming the frame's size and the limit; a
// longer frame that is not a response (it has a "method") is dropped with
// a warning.
type framer struct {
	r     *bufio.Reader
	limit int
	log   *slog.Logger
	out   []byte
}

func (f *framer) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		line, err := f.next()
		if len(line) > 0 {
			f.out = line
			break
		}
		if err != nil {
			return 0, err
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// next returns the next frame (with its newline), or its replacement.
func (f *framer) next() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := f.r.ReadSlice('\n')
		if len(buf)+len(chunk) > f.limit {
			return f.oversize(append(buf, chunk...), err)
		}
		buf = append(buf, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		return buf, err
	}
}

// oversize consumes the rest of a frame that began with head and answers
// for it.
func (f *framer) oversize(head []byte, err error) ([]byte, error) {
	var s idScanner
	s.feed(head)
	size := len(head)
	for err == bufio.ErrBufferFull {
		var chunk []byte
		chunk, err = f.r.ReadSlice('\n')
		s.feed(chunk)
		size += len(chunk)
	}
	if err != nil && err != io.EOF {
		return nil, err
	}
	if s.method || len(s.id) == 0 || len(s.id) >= 256 {
		f.log.Warn("upstream frame over the limit dropped: it answers no request", "bytes", size, "limit", f.limit)
		return nil, err
	}
	resp := tooLargeResponse(s.id, fmt.Sprintf("the upstream's answer is %d bytes; the frame limit is %d bytes", size, f.limit), size, false)
	return append(resp, '\n'), err
}

// tooLargeResponse is the error response (code codeTooLarge) that stands
// for an answer to request id over the limit, saying msg: its data is
// {"bytes": size}, with "cut": true when the answer was cut at size bytes.
func tooLargeResponse(id json.RawMessage, msg string, size int, cut bool) []byte {
	data := fmt.Sprintf(`{"bytes":%d}`, size)
	if cut {
		data = fmt.Sprintf(`{"bytes":%d,"cut":true}`, size)
	}
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q,"data":%s}}`, id, codeTooLarge, msg, data)
}

// idScanner finds the top-level "id" member of a JSON object fed to it in
// pieces, keeping nothing else, and notes a top-level "method".
type idScanner struct {
	depth    int
	inString bool
	escaped  bool
	wantKey  bool   // at depth 1, the next string is a member name
	key      []byte // the member name being read (bounded)
	isKey    bool
	lastKey  string
	inID     bool // reading the value of "id"
	id       []byte
	method   bool
}

func (s *idScanner) feed(b []byte) {
	for _, c := range b {
		if s.inString {
			if s.inID {
				s.id = appendBounded(s.id, c)
			}
			switch {
			case s.escaped:
				s.escaped = false
				if s.isKey {
					s.key = appendBounded(s.key, c)
				}
			case c == '\\':
				s.escaped = true
				if s.isKey {
					s.key = appendBounded(s.key, c)
				}
			case c == '"':
				s.inString = false
				if s.isKey {
					s.isKey = false
					s.lastKey = string(s.key)
					if s.lastKey == "method" {
						s.method = true
					}
				}
			default:
				if s.isKey {
					s.key = appendBounded(s.key, c)
				}
			}
			continue
		}
		switch c {
		case '"':
			s.inString = true
			if s.depth == 1 && s.wantKey {
				s.wantKey, s.isKey, s.key = false, true, s.key[:0]
			} else if s.inID {
				s.id = appendBounded(s.id, c)
			}
		case '{', '[':
			s.depth++
			if s.depth == 1 {
				s.wantKey = c == '{'
			}
			if s.inID {
				s.inID, s.id = false, nil // not a valid id
			}
		case '}', ']':
			s.depth--
			s.inID = false
		case ',':
			if s.depth == 1 {
				s.wantKey, s.inID = true, false
			}
		case ':':
			if s.depth == 1 && s.lastKey == "id" {
				s.inID, s.id = true, nil
			}
		case ' ', '\t', '\r', '\n':
		default:
			if s.inID {
				s.id = appendBounded(s.id, c)
			}
		}
	}
}

// appendBounded appends c unless b holds 256 bytes (ids and member names
// that matter are short; longer ones are kept cut, never grown).
func appendBounded(b []byte, c byte) []byte {
	if len(b) >= 256 {
		return b
	}
	return append(b, c)
}
