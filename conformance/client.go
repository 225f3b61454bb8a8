package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
)

// The suite's own wire types: only the fields of docs/http.md and TOOL-01
// it checks, so that it does not depend on one implementation's structs.

// FSRoot is a file system root of a token request.
type FSRoot struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	AgentID    string           `json:"agent_id"`
	Tools      []string         `json:"tools"`
	FS         []FSRoot         `json:"fs,omitempty"`
	Net        []string         `json:"net,omitempty"`
	KV         []KVScope        `json:"kv,omitempty"`
	Budgets    map[string]int64 `json:"budgets,omitempty"`
	Autonomy   string           `json:"autonomy,omitempty"`
	TTLSeconds int64            `json:"ttl_seconds,omitempty"`
	Role       string           `json:"role,omitempty"` // "approver" or "escalation": an approver token
}

// KVScope grants kv keys: Keys "*" (all), "p*" (a prefix) or one key;
// Mode "r" or "rw".
type KVScope struct {
	Keys string `json:"keys"`
	Mode string `json:"mode"`
}

// Token is a minted capability token.
type Token struct {
	Token   string `json:"token"`
	ID      string `json:"jti"`
	AgentID string `json:"agent_id"`
}

// Result is the result envelope of TOOL-01 §2 as the suite reads it.
type Result struct {
	ToolID          string          `json:"tool_id"`
	AgentID         string          `json:"agent_id"`
	OperationID     string          `json:"operation_id"`
	StateSnapshotID string          `json:"state_snapshot_id"`
	Status          string          `json:"status"`
	Result          json.RawMessage `json:"result"`
	Error           *ErrorBody      `json:"error"`
	ResultHash      string          `json:"result_hash"`
	Provenance      json.RawMessage `json:"provenance"`
	TaskClass       string          `json:"task_class"`
	AutonomyMode    string          `json:"autonomy_mode"`
	RiskScore       *float64        `json:"risk_score"`
	RiskBasis       []string        `json:"risk_basis"`
	// Notes are the details the record's context holds besides
	// risk_basis and provenance (net.fetch's connections, a handle).
	Notes         map[string]json.RawMessage `json:"notes"`
	TxOutcome     string                     `json:"tx_outcome"`
	CommitDeltaID string                     `json:"commit_delta_id"`
	ReceiptID     string                     `json:"receipt_id"`
	Receipt       json.RawMessage            `json:"receipt"` // a receipt proven by the log (docs/formats.md)
	Replayed      *bool                      `json:"replayed"`
	AuditSalt     string                     `json:"audit_salt"` // opens the commitments of the call's audit record

	raw map[string]json.RawMessage
}

// ErrorBody is the error of a result envelope, and of other endpoints'
// error answers.
type ErrorBody struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

func (r *Result) errClass() string {
	if r == nil || r.Error == nil {
		return ""
	}
	return r.Error.Class
}

// Entry is a ledger entry as GET /v1/ledger/entries serves it.
type Entry struct {
	Seq      uint64          `json:"seq"`
	Kind     string          `json:"kind"`
	Time     string          `json:"time"`
	PrevHash string          `json:"prev_hash"`
	Body     json.RawMessage `json:"body"`
	Hash     string          `json:"entry_hash"`
	// Payload is what an audit record with commitments commits to, for a
	// reader of it in full (salt and parts; see OpenBody).
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Checkpoint is the answer of GET /v1/ledger/checkpoint.
type Checkpoint struct {
	Number      uint64 `json:"number"`
	Origin      string `json:"origin"`
	Size        uint64 `json:"size"`
	Root        string `json:"root"`
	Note        string `json:"note"`
	VerifierKey string `json:"verifier_key"`
}

// InclusionProof is the answer of GET /v1/ledger/proof/inclusion.
type InclusionProof struct {
	ledger.Inclusion
	Root       string      `json:"root"`
	Checkpoint *Checkpoint `json:"checkpoint"`
}

// ConsistencyProof is the answer of GET /v1/ledger/proof/consistency.
type ConsistencyProof struct {
	ledger.Consistency
	Root1 string `json:"root1"`
	Root2 string `json:"root2"`
}

const maxShown = 2048

func shorten(s string) string {
	if len(s) <= maxShown {
		return s
	}
	return s[:maxShown] + fmt.Sprintf("… (%d bytes)", len(s))
}

// redact shortens capability tokens and the admin credential in evidence.
func (e *env) redact(s string) string {
	if e.admin != "" {
		s = strings.ReplaceAll(s, e.admin, "<admin credential>")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, tok := range e.tokens {
		s = strings.ReplaceAll(s, tok.Token, "<token "+tok.ID+">")
	}
	return s
}

// do sends one request and returns the status and body.
func (e *env) do(ctx context.Context, method, path, cred string, body []byte, header ...string) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.h.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, b, err
}

// getJSON fetches path and decodes a 2xx answer into out.
func (e *env) getJSON(ctx context.Context, path, cred string, out any) (int, error) {
	status, b, err := e.do(ctx, http.MethodGet, path, cred, nil)
	if err != nil {
		return status, err
	}
	if status/100 != 2 {
		return status, fmt.Errorf("GET %s: %d %s", path, status, shorten(string(b)))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return status, fmt.Errorf("GET %s: decoding: %w", path, err)
	}
	return status, nil
}

func (e *env) mint(ctx context.Context, req TokenRequest) (*Token, error) {
	body, _ := json.Marshal(req)
	status, b, err := e.do(ctx, http.MethodPost, "/v1/tokens", e.admin, body)
	if err != nil {
		return nil, err
	}
	if status != http.StatusCreated && status != http.StatusOK {
		return nil, fmt.Errorf("POST /v1/tokens: %d %s", status, shorten(string(b)))
	}
	var tok Token
	if err := json.Unmarshal(b, &tok); err != nil || tok.Token == "" || tok.ID == "" {
		return nil, fmt.Errorf("POST /v1/tokens: answer without token and jti: %s", shorten(string(b)))
	}
	if tok.AgentID == "" {
		tok.AgentID = req.AgentID
	}
	e.mu.Lock()
	e.tokens["jti:"+tok.ID] = &tok
	e.mu.Unlock()
	return &tok, nil
}

// envelope builds a call envelope with every TOOL-01 §1 field a caller
// normally sends; edit changes it before it is encoded.
func (e *env) envelope(tok *Token, tool string, args any, edit func(map[string]any)) []byte {
	a, _ := json.Marshal(args)
	m := map[string]any{
		"tool_id": tool, "args": json.RawMessage(a),
		"policy_hash": e.policyHash,
	}
	if tok != nil {
		m["agent_id"], m["capability_token"], m["capability_token_id"] = tok.AgentID, tok.Token, tok.ID
	}
	if edit != nil {
		edit(m)
	}
	b, _ := json.Marshal(m)
	return b
}

// rawCall posts body to /v1/syscalls and decodes the result envelope.
func (e *env) rawCall(ctx context.Context, body []byte, header ...string) (int, *Result, error) {
	status, b, err := e.do(ctx, http.MethodPost, "/v1/syscalls", "", body, header...)
	if err != nil {
		return status, nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return status, nil, fmt.Errorf("POST /v1/syscalls answered %d without a result envelope: %v: %s", status, err, shorten(string(b)))
	}
	json.Unmarshal(b, &r.raw)
	return status, &r, nil
}

// Resp is the answer to one call.
type Resp struct {
	Status int
	Body   []byte
	R      *Result
}

// Class is the answer's error class ("" for ok).
func (r *Resp) Class() string { return r.R.errClass() }

// Call sends a call envelope and records the exchange as evidence. It
// fails the case when the answer is not a result envelope.
func (t *T) Call(tok *Token, tool string, args any, edit func(map[string]any), header ...string) *Resp {
	return t.Post(t.env.envelope(tok, tool, args, edit), header...)
}

// Post sends raw bytes to POST /v1/syscalls (see Call).
func (t *T) Post(body []byte, header ...string) *Resp {
	status, b, err := t.env.do(t.ctx, http.MethodPost, "/v1/syscalls", "", body, header...)
	t.addEvidence(Evidence{Label: "call", Request: "POST /v1/syscalls " + shorten(t.env.redact(string(body))), Status: status, Response: shorten(t.env.redact(string(b)))})
	if err != nil {
		t.Failf("POST /v1/syscalls: %v", err)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Failf("POST /v1/syscalls answered %d, and the body is not a result envelope: %v", status, err)
	}
	json.Unmarshal(b, &r.raw)
	return &Resp{Status: status, Body: b, R: &r}
}

// Get fetches path with cred and records the exchange.
func (t *T) Get(path, cred string) (int, []byte) {
	return t.Do(http.MethodGet, path, cred, nil)
}

// Do sends a request and records the exchange.
func (t *T) Do(method, path, cred string, body []byte) (int, []byte) {
	status, b, err := t.env.do(t.ctx, method, path, cred, body)
	req := method + " " + path
	if body != nil {
		req += " " + shorten(t.env.redact(string(body)))
	}
	t.addEvidence(Evidence{Label: "http", Request: req, Status: status, Response: shorten(t.env.redact(string(b)))})
	if err != nil {
		t.Failf("%s %s: %v", method, path, err)
	}
	return status, b
}

// GetJSON fetches path, requires status 200 and decodes the body.
func (t *T) GetJSON(path, cred string, out any) {
	status, b := t.Get(path, cred)
	if status != http.StatusOK {
		t.Failf("GET %s: %d, want 200", path, status)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Failf("GET %s: decoding: %v", path, err)
	}
}

// Mint mints a token for agent name (run-unique) with req's grants; an
// empty FS grants the run's workspace read-write.
func (t *T) Mint(name string, req TokenRequest) *Token {
	req.AgentID = t.env.agent(name)
	tok, err := t.env.mint(t.ctx, req)
	t.addEvidence(Evidence{Label: "mint", Request: "POST /v1/tokens " + mustJSON(req)})
	if err != nil {
		t.Failf("minting a token: %v", err)
	}
	return tok
}

// Full returns a token for agent name granting every tool and the run's
// workspace read-write, minted once per run and name.
func (t *T) Full(name string) *Token {
	t.env.mu.Lock()
	tok := t.env.tokens[name]
	t.env.mu.Unlock()
	if tok != nil {
		return tok
	}
	tok = t.Mint(name, TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, KV: []KVScope{{Keys: "*", Mode: "rw"}}})
	t.env.mu.Lock()
	t.env.tokens[name] = tok
	t.env.mu.Unlock()
	return tok
}

// NeedWorkspace skips the case when the kernel cannot see the workspace.
func (t *T) NeedWorkspace() {
	if !t.env.wsVisible {
		t.Skipf("%s", t.env.wsProblem)
	}
}

// NeedTool skips the case when the endpoint lists no syscall id.
func (t *T) NeedTool(id, why string) {
	if !t.env.tools[id] {
		t.Skipf("the endpoint has no %s syscall (GET /v1/syscalls lists %s): %s", id, strings.Join(t.env.sortedTools(), ", "), why)
	}
}

// Dir makes a fresh directory for the case in the workspace and returns
// its path relative to the workspace root.
func (t *T) Dir() string {
	t.NeedWorkspace()
	rel := strings.ToLower(t.id)
	if err := os.MkdirAll(filepath.Join(t.env.ws, rel), 0o755); err != nil {
		t.Failf("workspace: %v", err)
	}
	return rel
}

// WriteFile writes a workspace file directly (not through the kernel).
func (t *T) WriteFile(rel, content string) {
	p := filepath.Join(t.env.ws, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Failf("workspace: %v", err)
	}
}

// ReadFile reads a workspace file directly; ok is false when it is absent.
func (t *T) ReadFile(rel string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(t.env.ws, rel))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Failf("workspace: %v", err)
	}
	return string(b), true
}

// Abs is the absolute path of a workspace-relative path.
func (t *T) Abs(rel string) string { return filepath.Join(t.env.ws, rel) }

// Key returns a run-unique idempotency key.
func (t *T) Key(name string) string { return t.env.runID + "-" + strings.ToLower(t.id) + "-" + name }

// PolicyHash is the endpoint's active policy hash.
func (t *T) PolicyHash() string { return t.env.policyHash }

// Admin is the admin credential.
func (t *T) Admin() string { return t.env.admin }

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// blake3Of is the digest string of s.
func blake3Of(s string) string { return digest.Sum([]byte(s)) }

// listDir lists a workspace directory's names, sorted.
func listDir(t *T, rel string) []string {
	es, err := os.ReadDir(filepath.Join(t.env.ws, rel))
	if err != nil {
		t.Failf("workspace: %v", err)
	}
	names := []string{}
	for _, e := range es {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}
