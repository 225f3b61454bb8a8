// Package runner is the supervisor side of the runner IPC protocol (seed
// 000 §2): an agent process, started by `kernelctl run` in a sandbox
// with no authority of its own, writes tool_call lines on an inherited
// channel and reads tool_response lines back. Every call becomes a call
// envelope under the session's capability token and is governed, audited
// and receipted by the kernel like any other; the protocol adds nothing
// the kernel would not decide.
//
// The wire format is JSON lines (docs/runner.md):
//
//	→ {"op":"tool_call","tool_call_id":"c1","tool":"fs.read","args":{"path":"a.txt"}}
//	← {"op":"tool_response","tool_call_id":"c1","ok":true,"result":{…},"receipt_id":"…"}
//	← {"op":"tool_response","tool_call_id":"c2","ok":false,"error":"scope_denied","message":"…","receipt_id":"…"}
package runner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/strictjson"
)

// Protocol limits.
const (
	// DefaultMaxLine bounds a tool_call line, newline excluded. A longer
	// line is answered invalid_args and skipped to its end.
	DefaultMaxLine = 1 << 20
	// DefaultMaxInFlight bounds the calls of one session running at once;
	// further lines wait to be read, so a flooding agent is slowed, not
	// buffered without end.
	DefaultMaxInFlight = 16
	// MaxToolCallID bounds tool_call_id, so that the idempotency key made
	// from it fits the kernel's 255 bytes.
	MaxToolCallID = 200
)

// Ops of the agent's lines.
const (
	OpToolCall  = "tool_call"
	OpListTools = "list_tools"
)

// ToolCall is a line from the agent: a tool_call, or a list_tools
// (ToolCallID only) asking for the session's tool handles.
type ToolCall struct {
	Op         string          `json:"op"` // "tool_call" or "list_tools"
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args,omitempty"`
}

// ToolResponse is a line to the agent: Result when OK, else Error (the
// kernel's error class, see docs/runner.md) and Message. ReceiptID names
// the call's signed receipt, for every call the kernel saw.
type ToolResponse struct {
	Op          string          `json:"op"` // "tool_response"
	ToolCallID  string          `json:"tool_call_id"`
	OK          bool            `json:"ok"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
	Message     string          `json:"message,omitempty"`
	ReceiptID   string          `json:"receipt_id,omitempty"`
	OperationID string          `json:"operation_id,omitempty"`
	// Tools answers list_tools (op "tool_list"): the session's handles.
	Tools []kernel.Handle `json:"tools,omitempty"`
}

// HandleSource mints and ends the tool handles of one capability token
// in a session (kernel.Kernel.Handles and EndSession, in process or over
// the HTTP API): what a session in handle mode calls its tools by.
type HandleSource interface {
	// Handles returns the session's handles, minting those it lacks.
	Handles(ctx context.Context, session string) ([]kernel.Handle, error)
	// EndSession ends the session's handles of the token.
	EndSession(ctx context.Context, session string) error
}

// Invoker runs one call envelope through a kernel and returns its result
// envelope: kernel.Kernel.InvokeJSON in process, httpapi.Client.Call
// against a served kernel.
type Invoker interface {
	Invoke(ctx context.Context, envelope []byte) (*kernel.Result, error)
}

// Session serves one agent's channel under one capability token.
type Session struct {
	Invoker    Invoker
	Token      string // the capability token every call carries
	TokenID    string // its jti
	AgentID    string // its sub
	PolicyHash string // the kernel's policy hash
	// ID is the session id: provenance.session_id of every call, and part
	// of its idempotency key, "runner:<ID>:<tool_call_id>", so a repeated
	// tool_call_id is answered from the first call's outcome (or refused
	// while that call runs) instead of running twice.
	ID          string
	MaxLine     int // default DefaultMaxLine
	MaxInFlight int // default DefaultMaxInFlight
	// Handles, for a token in handle mode, answers list_tools with the
	// session's handles (the agent calls tools by them; a call by name
	// is answered as an unknown tool by the kernel); they end when Serve
	// returns. Nil: list_tools is answered invalid_args.
	Handles HandleSource
}

// Serve reads tool_call lines from r until it ends (the agent exited or
// closed the channel, with answers unread or not) or ctx is done, runs them at most MaxInFlight at
// once, and writes one tool_response line per non-blank line to w, in
// the order calls finish. It returns once every call it started has been
// answered. No input makes it panic or stop early: a line that is not a
// well-formed tool_call (or is over MaxLine) is answered invalid_args,
// and the kernel records the refusal under the session's token (refuse);
// no byte the agent wrote is ever sent as an envelope. Errors writing to
// w (the agent is gone) drop the responses; the calls are in the ledger.
func (s *Session) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	maxLine, maxInFlight := s.MaxLine, s.MaxInFlight
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	out := &responder{w: w}
	slots := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	br := bufio.NewReaderSize(r, 64<<10)
	var readErr error
	for n := 1; ; n++ {
		line, tooLong, err := readLine(br, maxLine)
		if err != nil {
			// An agent that leaves with answers unread resets the
			// channel: that is its end too, not a failure of the run.
			if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
				readErr = fmt.Errorf("runner: reading the agent's channel: %w", err)
			}
			break
		}
		if !tooLong && len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if tooLong {
				out.send(s.refuse(ctx, n, 0, "", "", fmt.Sprintf("line %d is over %d bytes; it was skipped", n, maxLine)))
				return
			}
			out.send(s.handle(ctx, n, line))
		}()
	}
	wg.Wait()
	if s.Handles != nil {
		// The session is over: its handles die with it, whatever ctx says.
		_ = s.Handles.EndSession(context.WithoutCancel(ctx), s.ID)
	}
	return readErr
}

// handle runs one line and returns its response.
func (s *Session) handle(ctx context.Context, n int, line []byte) ToolResponse {
	var tc ToolCall
	err := strictjson.Unmarshal(line, &tc)
	if err == nil && tc.Op == OpListTools {
		return s.listTools(ctx, n, line, &tc)
	}
	if err != nil {
		return s.refuse(ctx, n, len(line), digest.Sum(line), tc.ToolCallID, fmt.Sprintf("line %d is not a tool_call object: %v", n, err))
	}
	if problem := check(&tc); problem != "" {
		return s.refuse(ctx, n, len(line), digest.Sum(line), tc.ToolCallID, fmt.Sprintf("line %d: %s", n, problem))
	}
	env, err := s.envelope(&tc)
	if err != nil {
		return s.refuse(ctx, n, len(line), digest.Sum(line), tc.ToolCallID, fmt.Sprintf("line %d: %v", n, err))
	}
	res, err := s.Invoker.Invoke(ctx, env)
	resp := ToolResponse{ToolCallID: tc.ToolCallID}
	switch {
	case err != nil:
		resp.Error, resp.Message = kernel.ErrInternal, "the kernel did not answer: "+err.Error()
	default:
		resp.ReceiptID, resp.OperationID = res.ReceiptID, res.OperationID
		if res.Status == kernel.StatusOK {
			resp.OK, resp.Result = true, res.Result
		} else if res.Error != nil {
			resp.Error, resp.Message = res.Error.Class, res.Error.Message
		} else {
			resp.Error, resp.Message = kernel.ErrInternal, "result envelope without status ok or an error"
		}
	}
	return resp
}

// InvalidLineTool is the tool_id of the envelope by which a session has
// the kernel record a line it refuses. No syscall can be named so (their
// ids are lowercase labels joined by dots), so the kernel refuses it,
// tool_not_found, once it has verified the run's token: the refusal is
// audited as the run's agent's call, in its session, and executes
// nothing. Nothing of the line but its digest reaches the kernel.
const InvalidLineTool = "runner:invalid_line"

// maxProblem bounds the description of a refused line kept in the
// refusal's provenance.
const maxProblem = 1 << 10

// refuse answers line n (size bytes, whose digest is sum; sum is "" for
// a line too long to keep) invalid_args with problem, and has the kernel
// record the refusal: an envelope of the session's own, under its token
// and session, calling InvalidLineTool, whose provenance.invalid_line
// holds the line's number, size, digest and problem. id is the tool_call_id
// the line gave, if any: the answer carries it, and the provenance too
// when it is a valid one.
func (s *Session) refuse(ctx context.Context, n, size int, sum, id, problem string) ToolResponse {
	resp := ToolResponse{ToolCallID: id, Error: kernel.ErrInvalidArgs, Message: problem}
	what := map[string]any{"line": n, "problem": clip(problem, maxProblem)}
	if sum != "" {
		what["bytes"], what["digest"] = size, sum
	}
	prov := map[string]any{"session_id": s.ID, "source": "runner", "invalid_line": what}
	if validID(id) {
		prov["tool_call_id"] = id
	}
	env, err := s.marshalEnvelope(InvalidLineTool, json.RawMessage("{}"), "", prov)
	if err != nil {
		resp.Error, resp.Message = kernel.ErrInternal, "recording the refusal of "+problem+": "+err.Error()
		return resp
	}
	res, err := s.Invoker.Invoke(ctx, env)
	if err != nil {
		resp.Error, resp.Message = kernel.ErrInternal, "the kernel did not answer (recording the refusal of "+problem+"): "+err.Error()
		return resp
	}
	resp.ReceiptID, resp.OperationID = res.ReceiptID, res.OperationID
	return resp
}

// clip returns s cut to at most max bytes, at a character boundary.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// listTools answers a list_tools line: the session's handles. A line it
// refuses is recorded as any refused line is (refuse).
func (s *Session) listTools(ctx context.Context, n int, line []byte, tc *ToolCall) ToolResponse {
	resp := ToolResponse{Op: "tool_list", ToolCallID: tc.ToolCallID}
	problem := ""
	switch {
	case !validID(tc.ToolCallID):
		problem = fmt.Sprintf("line %d: list_tools needs a tool_call_id (1 to %d bytes, no control characters)", n, MaxToolCallID)
	case tc.Tool != "" || len(tc.Args) > 0:
		problem = fmt.Sprintf("line %d: list_tools takes only op and tool_call_id", n)
	case s.Handles == nil:
		problem = fmt.Sprintf("line %d: list_tools lists tool handles, and the session's token is not in handle mode", n)
	}
	if problem != "" {
		r := s.refuse(ctx, n, len(line), digest.Sum(line), tc.ToolCallID, problem)
		r.Op = resp.Op
		return r
	}
	hs, err := s.Handles.Handles(ctx, s.ID)
	if err != nil {
		resp.Error, resp.Message = kernel.ErrTokenInvalid, "listing the session's tool handles: "+err.Error()
		return resp
	}
	resp.OK, resp.Tools = true, hs
	return resp
}

// check reports what makes tc not a well-formed tool_call, or "".
func check(tc *ToolCall) string {
	switch {
	case tc.Op != "tool_call":
		return fmt.Sprintf(`op is %q, not "tool_call"`, tc.Op)
	case tc.ToolCallID == "":
		return "tool_call_id is missing or empty"
	case len(tc.ToolCallID) > MaxToolCallID:
		return fmt.Sprintf("tool_call_id is %d bytes; at most %d", len(tc.ToolCallID), MaxToolCallID)
	case strings.ContainsFunc(tc.ToolCallID, unicode.IsControl):
		return "tool_call_id holds a control character"
	case tc.Tool == "":
		return "tool is missing or empty"
	case len(tc.Args) > 0 && tc.Args[0] != '{':
		return "args is not a JSON object"
	}
	return ""
}

// validID reports whether id is a tool_call_id: 1 to MaxToolCallID bytes
// without control characters.
func validID(id string) bool {
	return id != "" && len(id) <= MaxToolCallID && !strings.ContainsFunc(id, unicode.IsControl)
}

// envelope is the call envelope of a well-formed tool_call.
func (s *Session) envelope(tc *ToolCall) ([]byte, error) {
	args := tc.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	prov := map[string]any{"session_id": s.ID, "tool_call_id": tc.ToolCallID, "source": "runner"}
	return s.marshalEnvelope(tc.Tool, args, "runner:"+s.ID+":"+tc.ToolCallID, prov)
}

// marshalEnvelope is a call envelope under the session's token: always
// the session's own, whatever the agent wrote.
func (s *Session) marshalEnvelope(tool string, args json.RawMessage, key string, provenance map[string]any) ([]byte, error) {
	prov, err := json.Marshal(provenance)
	if err != nil {
		return nil, err
	}
	return json.Marshal(kernel.Envelope{
		ToolID: tool, Args: args, AgentID: s.AgentID,
		CapabilityToken: s.Token, CapabilityTokenID: s.TokenID, PolicyHash: s.PolicyHash,
		IdempotencyKey: key, Provenance: prov,
	})
}

// readLine returns the next line without its newline; a line over max
// bytes is consumed to its end and reported as tooLong. A last line
// without a newline counts.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+1 {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(buf, []byte("\n")), tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && (len(buf) > 0 || tooLong):
			return buf, tooLong, nil
		default:
			return nil, false, err
		}
	}
}

// responder writes whole lines, one at a time, and stops writing after
// the first error (the agent is gone).
type responder struct {
	mu     sync.Mutex
	w      io.Writer
	broken bool
}

func (r *responder) send(resp ToolResponse) {
	if resp.Op == "" {
		resp.Op = "tool_response"
	}
	b, err := json.Marshal(resp)
	if err != nil {
		b, _ = json.Marshal(ToolResponse{Op: "tool_response", ToolCallID: resp.ToolCallID, Error: kernel.ErrInternal, Message: "the result could not be encoded"})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken {
		return
	}
	if _, err := r.w.Write(append(b, '\n')); err != nil {
		r.broken = true
	}
}

// KernelHandles is the HandleSource of the token (whose jti is jti) in
// an in-process kernel.
func KernelHandles(k *kernel.Kernel, token, jti string) HandleSource {
	return kernelHandles{k, token, jti}
}

type kernelHandles struct {
	k          *kernel.Kernel
	token, jti string
}

func (h kernelHandles) Handles(_ context.Context, session string) ([]kernel.Handle, error) {
	return h.k.Handles(h.token, session)
}

func (h kernelHandles) EndSession(_ context.Context, session string) error {
	h.k.EndSession(session, h.jti)
	return nil
}
