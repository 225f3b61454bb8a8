package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/strictjson"
)

// Every JSON-RPC message a client sends, over either transport, is read
// by the kernel's strict JSON rules (package strictjson: no duplicate
// member names at any depth, valid UTF-8) before the SDK decodes it; the
// SDK keeps the last of two members of one name, where another reader
// may keep the first, so a message that breaks the rules could run as a
// different request than a proxy or logger saw. prepare is that reading.

// prepare reads msg, one JSON-RPC message or batch exactly as a client
// sent it, for the SDK. A message that obeys the strictjson rules comes
// out with each tools/call request's id copied into its _meta (tagBody).
// A tools/call request that breaks them comes out rewritten as a call
// the gateway has the kernel refuse and audit (refusedCall). Anything else
// that breaks them is not for the SDK at all: reject is the JSON-RPC
// error response to answer instead (-32700 for bytes that are no JSON,
// -32600 for a message another reader could read differently; in a batch,
// one such message has the whole batch refused, none of it run).
func prepare(s *sealer, msg []byte) (out, reject []byte) {
	fault := strictjson.Check(msg)
	if errors.Is(fault, strictjson.ErrSyntax) {
		return nil, errorResponse(nil, jsonrpc.CodeParseError, "parse error: "+fault.Error())
	}
	trimmed := bytes.TrimLeft(msg, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '[' {
		if fractionalID(msg) {
			return nil, errorResponse(nil, jsonrpc.CodeInvalidRequest, errFractionalID)
		}
		if fault == nil {
			return tagBody(s, msg), nil
		}
		return refuse(s, msg, fault)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(msg, &elems); err != nil {
		return nil, errorResponse(nil, jsonrpc.CodeParseError, "parse error: "+err.Error())
	}
	out = append(out, '[')
	for i, e := range elems {
		if fractionalID(e) {
			return nil, errorResponse(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: batch element %d: %s", i, errFractionalID))
		}
		o, r := tagBody(s, e), []byte(nil)
		err := strictjson.Check(e)
		if err != nil {
			o, r = refuse(s, e, err)
		}
		if r != nil {
			return nil, errorResponse(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: batch element %d: %v", i, err))
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, o...)
	}
	return append(out, ']'), nil
}

// errFractionalID is the refusal of a request whose id is a number with a
// fraction.
const errFractionalID = "invalid request: a request id must be a string or an integer"

// fractionalID reports whether msg is a JSON-RPC message whose id is a
// number but no integer: the SDK takes it, cut to an integer, so two ids
// would be one (and no idempotency key could be derived from it); it is
// refused instead.
func fractionalID(msg []byte) bool {
	m, ok := readMessage(msg, jsontext.AllowDuplicateNames(true))
	if !ok || m.id.Kind() != '0' {
		return false
	}
	var f float64
	if json.Unmarshal(m.id, &f) != nil {
		return false // out of range: the SDK refuses it
	}
	return f != float64(int64(f))
}

// refuse handles a single message that is JSON but breaks the strictjson
// rules (fault). A tools/call request, as the SDK would read it (the last
// of duplicate members), becomes refusedCall; any other message is
// rejected with -32600, answered to its id when it has one.
func refuse(s *sealer, msg []byte, fault error) (out, reject []byte) {
	// As the SDK reads it: exact names, the last of duplicates, the
	// method decoded.
	m, ok := readMessage(msg, sdkReading...)
	if !ok {
		return nil, errorResponse(nil, jsonrpc.CodeInvalidRequest, "invalid request: "+fault.Error())
	}
	id, isRequest := requestID(json.RawMessage(m.id))
	if !isString(m.method, "tools/call") || !isRequest {
		if !isRequest || m.method == nil {
			// A response of the client's is not answered with its id,
			// which names a request of the gateway's.
			id = nil
		}
		return nil, errorResponse(id, jsonrpc.CodeInvalidRequest, "invalid request: "+fault.Error())
	}
	var name string
	if m.params.Kind() == '{' {
		readObject(m.params, func(n string, v jsontext.Value, _ int) {
			if n == "name" {
				name = ""
				json.Unmarshal(v, &name)
			}
		}, sdkReading...)
	}
	return refusedCall(s, id, name, fault.Error(), msg), nil
}

// sdkReading reads JSON as the SDK does a message that breaks the
// strictjson rules: the last of duplicate members, invalid UTF-8 replaced.
var sdkReading = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// refusedCall is a tools/call request with the given id for tool name
// whose _meta says the client's message (raw, kept byte for byte in
// base64) broke the strictjson rules (why): the gateway sends the kernel
// an envelope carrying raw in its provenance, where the kernel finds the
// same fault, refuses the call and audits it. The marks are sealed
// (MetaSeal) as the SDK will hand them to the handler: why as valid
// UTF-8, which JSON carries unchanged.
func refusedCall(s *sealer, id any, name, why string, raw []byte) []byte {
	why = strings.ToValidUTF8(why, "\uFFFD")
	mk := marks{requestID: idJSON(id), invalid: why, raw: base64.StdEncoding.EncodeToString(raw)}
	m := map[string]any{
		"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": name, "_meta": map[string]any{
			MetaInvalid: mk.invalid, MetaRawMessage: mk.raw, MetaRequestID: id, MetaSeal: s.seal(mk),
		}},
	}
	b, err := jsonNoHTML(m)
	if err != nil {
		// Never: every value is a string or an id the SDK read.
		panic(fmt.Sprintf("encoding a refused call: %v", err))
	}
	return b
}

// errorResponse is a JSON-RPC error response to id (nil: null).
func errorResponse(id any, code int64, msg string) []byte {
	b, err := jsonNoHTML(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
	if err != nil {
		panic(fmt.Sprintf("encoding an error response: %v", err))
	}
	return b
}

// MaxLineBytes bounds one message of the stdio transport (the SDK's own
// bound, mcp.DefaultMaxLineLength): a longer line is read to its end
// without being kept and answered with a JSON-RPC error.
const MaxLineBytes = mcp.DefaultMaxLineLength

// lineTransport serves one client over newline-delimited JSON-RPC, the
// MCP stdio transport: it reads the lines itself, hands each one prepare
// lets through to the SDK's own IOTransport and answers each other one
// itself, so that one bad line (not JSON, a duplicate member) is answered
// with an error as JSON-RPC 2.0 requires and the session goes on; the
// SDK's transport ends the session on its first undecodable message.
type lineTransport struct {
	in    io.Reader
	out   io.WriteCloser
	seals *sealer
	// ended, if set, runs when the client's input ends, before the
	// answers of the requests in flight are waited for (drainConn).
	ended func()
}

// Connect starts reading the client's lines.
func (t lineTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	pr, pw := io.Pipe()
	out := &lockedWriter{w: t.out}
	open := &batchIDs{ids: map[jsonrpc.ID]bool{}}
	go screenLines(t.in, pw, out, t.seals, open)
	// The SDK reads the prepared lines, which may be longer than the
	// client's by the tags (a refused call's message in base64).
	c, err := (&mcp.IOTransport{Reader: pr, Writer: out, MaxLineLength: 3 * MaxLineBytes}).Connect(ctx)
	if err != nil {
		return nil, err
	}
	d := newDrainConn(c)
	d.ended = t.ended
	d.batches = open
	return d, nil
}

// screenLines reads in line by line until it ends, writing each prepared
// line to sdk and each rejection to out; it ends sdk's input with in's.
// open are the request ids of the batches passed to the SDK and not yet
// answered.
func screenLines(in io.Reader, sdk *io.PipeWriter, out io.Writer, s *sealer, open *batchIDs) {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, tooLong, err := readLine(br)
		if tooLong {
			msg := errorResponse(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: a message over %d bytes", MaxLineBytes))
			if _, werr := out.Write(append(msg, '\n')); werr != nil {
				sdk.CloseWithError(werr)
				return
			}
		} else if line = bytes.TrimSpace(line); len(line) > 0 {
			// Trimmed: the SDK refuses what follows a message, and
			// whitespace there is still JSON.
			prepared, reject := prepare(s, line)
			if reject == nil {
				id, batch, err := decodable(prepared)
				if err == nil && len(batch) > 0 {
					id, err = open.add(batch)
				}
				if err != nil {
					reject = errorResponse(id, jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error())
				}
			}
			var werr error
			if reject != nil {
				_, werr = out.Write(append(reject, '\n'))
			} else {
				_, werr = sdk.Write(append(prepared, '\n'))
			}
			if werr != nil {
				sdk.CloseWithError(werr)
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			sdk.CloseWithError(err)
			return
		}
	}
}

// decodable reports why the SDK could not take msg, one JSON-RPC message
// or a batch of them, or nil: JSON that is no JSON-RPC message ([], 42,
// {"x":1}), or a batch in which two requests (or notifications) share an
// id, would end the SDK's session. id is what to answer the refusal to:
// the repeated request id, else nil (null). The whole batch is refused,
// none of it run, as over HTTP.
func decodable(msg []byte) (id any, batch []jsonrpc.ID, err error) {
	if msg[0] != '[' {
		_, err := jsonrpc.DecodeMessage(msg)
		return nil, nil, err
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(msg, &elems); err != nil {
		return nil, nil, err
	}
	if len(elems) == 0 {
		return nil, nil, errors.New("an empty batch")
	}
	seen := map[jsonrpc.ID]bool{}
	for i, e := range elems {
		m, err := jsonrpc.DecodeMessage(e)
		if err != nil {
			return nil, nil, fmt.Errorf("batch element %d: %w", i, err)
		}
		if r, ok := m.(*jsonrpc.Request); ok {
			if seen[r.ID] {
				if !r.ID.IsValid() {
					return nil, nil, fmt.Errorf("batch element %d: a second notification in one batch, which the SDK takes for a repeated id", i)
				}
				return r.ID.Raw(), nil, fmt.Errorf("batch element %d: request id %v repeated in the batch", i, r.ID.Raw())
			}
			seen[r.ID] = true
			batch = append(batch, r.ID)
		}
	}
	return nil, batch, nil
}

// batchIDs are the request ids of the batches the SDK has read and not
// answered, which it keeps as ioConn.addBatch does: a later batch naming
// one ends its reader ("batch contains previously seen request"), so no
// line after it would be read. A notification's id (none) is kept for
// good, as the SDK keeps it: it is never answered.
type batchIDs struct {
	mu  sync.Mutex
	ids map[jsonrpc.ID]bool
}

// add records batch's request ids, or reports the first already open
// (its raw id, nil for a notification's) and records none.
func (b *batchIDs) add(batch []jsonrpc.ID) (id any, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range batch {
		if b.ids[id] {
			if !id.IsValid() {
				return nil, errors.New("a notification in a batch after an earlier batch's, which the SDK takes for a repeated id")
			}
			return id.Raw(), fmt.Errorf("request id %v of an earlier batch not yet answered", id.Raw())
		}
	}
	for _, id := range batch {
		b.ids[id] = true
	}
	return nil, nil
}

// answered forgets id, answered (the SDK forgets it as it writes it).
func (b *batchIDs) answered(id jsonrpc.ID) {
	b.mu.Lock()
	delete(b.ids, id)
	b.mu.Unlock()
}

// readLine reads the next line without its end (\n or \r\n); tooLong
// reports a line over MaxLineBytes, read to its end and dropped. err is
// io.EOF after the last line (which may lack a newline).
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			if len(line) > MaxLineBytes+2 {
				line, tooLong = nil, true
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		return line, tooLong, err
	}
}

// lockedWriter writes whole messages to w one at a time: the SDK's
// answers and the transport's own rejections share the client's stream.
type lockedWriter struct {
	mu sync.Mutex
	w  io.WriteCloser
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return l.w.Close() }
