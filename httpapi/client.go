package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// Client calls the API of a running kernel.
type Client struct {
	// BaseURL is the server's address, e.g. "http://127.0.0.1:7070".
	BaseURL string
	// Credential is sent as the bearer token: the admin credential or a
	// capability token. It may be empty for public endpoints and calls.
	Credential string
	// HTTP is the client used; nil means one with a 15-minute timeout
	// for every request but calls (POST /v1/syscalls), which have none of
	// the client's own: they may wait for an approval, then run, for as
	// long as the server's timeouts allow, and the caller's context ends
	// them sooner.
	HTTP *http.Client
}

// APIError is an error response of the API.
type APIError struct {
	Status  int
	Class   string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("server: %d %s: %s", e.Status, e.Class, e.Message)
}

var defaultHTTP = &http.Client{Timeout: 15 * time.Minute}

// callHTTP sends calls: a call may wait for an approval and then run for
// as long as the server allows (its approval timeout and the syscall's
// own), so no whole-request timeout of the client's ends it first; the
// caller's context does.
var callHTTP = &http.Client{}

// do sends a request and decodes a 2xx JSON answer into out (unless nil);
// any other answer is an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := c.send(ctx, method, path, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return apiError(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = data
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// send sends a request carrying the credential as its bearer.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return c.sendHeader(ctx, method, path, body, nil)
}

// sendHeader is send with the extra request headers in header.
func (c *Client) sendHeader(ctx context.Context, method, path string, body io.Reader, header http.Header) (*http.Response, error) {
	return c.sendVia(ctx, c.httpClient(), method, path, body, header)
}

// sendVia is sendHeader through hc.
func (c *Client) sendVia(ctx context.Context, hc *http.Client, method, path string, body io.Reader, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Credential != "" {
		req.Header.Set("Authorization", "Bearer "+c.Credential)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp, nil
}

// Call sends a call envelope and returns its result envelope and the HTTP
// status. Every answer of POST /v1/syscalls is a result envelope.
func (c *Client) Call(ctx context.Context, envelope []byte) (*kernel.Result, int, error) {
	resp, err := c.sendVia(ctx, c.callClient(), http.MethodPost, "/v1/syscalls", bytes.NewReader(envelope), nil)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var r kernel.Result
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("POST /v1/syscalls: %d, and the body is not a result envelope: %w", resp.StatusCode, err)
	}
	return &r, resp.StatusCode, nil
}

// Tools returns the definitions the credential (a capability token) may
// call, in format.
func (c *Client) Tools(ctx context.Context, format string) (json.RawMessage, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, "/v1/syscalls?format="+url.QueryEscape(format), nil, &raw)
	return raw, err
}

// PolicyHash returns the active policy's hash.
func (c *Client) PolicyHash(ctx context.Context) (string, error) {
	var out struct {
		PolicyHash string `json:"policy_hash"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/policy", nil, &out)
	return out.PolicyHash, err
}

// JWKS returns the kernel's JWKS document.
func (c *Client) JWKS(ctx context.Context) ([]byte, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, "/.well-known/jwks.json", nil, &raw)
	return raw, err
}

// Head returns the ledger head.
func (c *Client) Head(ctx context.Context) (Head, error) {
	var h Head
	err := c.do(ctx, http.MethodGet, "/v1/ledger/head", nil, &h)
	return h, err
}

// Entries returns up to limit entries from seq from on: fewer, with More
// set, when they reached the page's byte bound (MaxEntriesPageBytes).
func (c *Client) Entries(ctx context.Context, from uint64, limit int) (Entries, error) {
	var e Entries
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/ledger/entries?from=%d&limit=%d", from, limit), nil, &e)
	return e, err
}

// Receipt returns a receipt by id.
func (c *Client) Receipt(ctx context.Context, id string) (*kernel.ReceiptInfo, error) {
	var r kernel.ReceiptInfo
	err := c.do(ctx, http.MethodGet, "/v1/receipts/"+url.PathEscape(id), nil, &r)
	return &r, err
}

// Receipts lists receipts selected by f.
func (c *Client) Receipts(ctx context.Context, f kernel.ReceiptFilter) ([]kernel.ReceiptInfo, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("agent", f.AgentID)
	set("tool", f.ToolID)
	set("outcome", f.TxOutcome)
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339))
	}
	if f.After > 0 {
		q.Set("after", strconv.FormatUint(f.After, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out ReceiptList
	err := c.do(ctx, http.MethodGet, "/v1/receipts?"+q.Encode(), nil, &out)
	return out.Receipts, err
}

// Operation returns the stored result envelope of an operation.
func (c *Client) Operation(ctx context.Context, id string) (json.RawMessage, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, &raw)
	return raw, err
}

// Mint asks for a capability token (admin).
func (c *Client) Mint(ctx context.Context, req kernel.TokenRequest) (*kernel.MintedToken, error) {
	var t kernel.MintedToken
	err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &t)
	return &t, err
}

// Attenuate asks for a child of req.Parent that grants no more than it;
// the parent token is the credential.
func (c *Client) Attenuate(ctx context.Context, req kernel.AttenuateRequest) (*kernel.MintedToken, error) {
	var t kernel.MintedToken
	err := c.do(ctx, http.MethodPost, "/v1/tokens/attenuate", req, &t)
	return &t, err
}

// Revoke revokes the token jti (admin).
func (c *Client) Revoke(ctx context.Context, jti, reason string) error {
	return c.do(ctx, http.MethodPost, "/v1/tokens/"+url.PathEscape(jti)+"/revoke", RevokeRequest{Reason: reason}, nil)
}

// InspectToken asks the kernel what token grants, or why it is refused.
func (c *Client) InspectToken(ctx context.Context, token string) (TokenInspection, error) {
	var out TokenInspection
	err := c.do(ctx, http.MethodPost, "/v1/tokens/inspect", InspectRequest{Token: token}, &out)
	return out, err
}

// VerifyLedger asks the kernel to verify its whole ledger (admin).
func (c *Client) VerifyLedger(ctx context.Context) (kernel.LedgerCheck, error) {
	var out kernel.LedgerCheck
	err := c.do(ctx, http.MethodGet, "/v1/admin/ledger/verify", nil, &out)
	return out, err
}

// Checkpoint returns the latest signed checkpoint, or the latest stable one.
func (c *Client) Checkpoint(ctx context.Context, stable bool) (kernel.SignedCheckpoint, error) {
	var out kernel.SignedCheckpoint
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/ledger/checkpoint?stable=%t", stable), nil, &out)
	return out, err
}

// ProveInclusion returns the inclusion proof of entry seq in the tree of
// size entries (0: the latest checkpoint's, which comes with it).
func (c *Client) ProveInclusion(ctx context.Context, seq, size uint64) (*kernel.InclusionResponse, error) {
	var out kernel.InclusionResponse
	path := fmt.Sprintf("/v1/ledger/proof/inclusion?seq=%d", seq)
	if size > 0 {
		path += fmt.Sprintf("&size=%d", size)
	}
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ProveConsistency returns the consistency proof between two tree sizes.
func (c *Client) ProveConsistency(ctx context.Context, from, to uint64) (*kernel.ConsistencyResponse, error) {
	var out kernel.ConsistencyResponse
	if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/ledger/proof/consistency?from=%d&to=%d", from, to), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Export copies the ledger's export (every entry and checkpoint, as JSON
// lines) to w.
func (c *Client) Export(ctx context.Context, w io.Writer) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/ledger/export", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return apiError(resp.StatusCode, b)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("GET /v1/ledger/export: %w", err)
	}
	return nil
}

// Bundle returns the offline-verifiable bundle of receipt id.
func (c *Client) Bundle(ctx context.Context, id string) (*receipts.Logged, error) {
	var out receipts.Logged
	if err := c.do(ctx, http.MethodGet, "/v1/receipts/"+url.PathEscape(id)+"/bundle", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReplayVerify asks the kernel to prove its replay history (admin).
func (c *Client) ReplayVerify(ctx context.Context) (*kernel.ReplayReport, error) {
	var out kernel.ReplayReport
	err := c.do(ctx, http.MethodGet, "/v1/admin/replay/verify", nil, &out)
	return &out, err
}

// ReplayShow returns every call made with an idempotency key (admin).
func (c *Client) ReplayShow(ctx context.Context, key, agent string) ([]kernel.ReplayHistory, error) {
	var out []kernel.ReplayHistory
	q := url.Values{"key": {key}}
	if agent != "" {
		q.Set("agent", agent)
	}
	err := c.do(ctx, http.MethodGet, "/v1/admin/replay?"+q.Encode(), nil, &out)
	return out, err
}

// Scan calls fn for every ledger entry from seq from on, paging through
// GET /v1/ledger/entries, and stops at fn's first error.
func (c *Client) Scan(ctx context.Context, from uint64, fn func(ledger.Entry) error) error {
	return c.ScanViews(ctx, from, func(v kernel.EntryView) error { return fn(v.Entry) })
}

// ScanViews is Scan with each entry as the credential sees it: the
// payloads of the audit records it reads in full, what is withheld of the
// others (kernel.EntryView).
func (c *Client) ScanViews(ctx context.Context, from uint64, fn func(kernel.EntryView) error) error {
	for {
		page, err := c.Entries(ctx, from, MaxEntriesPage)
		if err != nil {
			return err
		}
		for _, e := range page.Entries {
			if err := fn(e); err != nil {
				return err
			}
		}
		// A page short of its limit is the ledger's end unless it
		// stopped at its byte bound (More).
		if len(page.Entries) < MaxEntriesPage && !page.More {
			return nil
		}
		from = page.Next
	}
}

// Start sends a call envelope with Prefer: respond-async and returns the
// operation id the kernel runs it under. Like every request of c it
// carries the credential as its bearer: over the control socket a call
// without one would act as the admin, whom calls refuse.
func (c *Client) Start(ctx context.Context, envelope []byte) (string, error) {
	resp, err := c.sendHeader(ctx, http.MethodPost, "/v1/syscalls", bytes.NewReader(envelope), http.Header{"Prefer": {"respond-async"}})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusAccepted {
		return "", apiError(resp.StatusCode, data)
	}
	var st kernel.OperationStatus
	if err := json.Unmarshal(data, &st); err != nil || st.OperationID == "" {
		return "", fmt.Errorf("POST /v1/syscalls (async): no operation id in %q", data)
	}
	return st.OperationID, nil
}

// OperationStatus returns the state of an operation: running or awaiting
// approval (with the approval), or done with its result envelope.
func (c *Client) OperationStatus(ctx context.Context, id string) (kernel.OperationStatus, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil)
	if err != nil {
		return kernel.OperationStatus{}, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	switch resp.StatusCode {
	case http.StatusAccepted:
		var st kernel.OperationStatus
		err := json.Unmarshal(data, &st)
		return st, err
	case http.StatusOK:
		var r kernel.Result
		if err := json.Unmarshal(data, &r); err != nil {
			return kernel.OperationStatus{}, err
		}
		return kernel.OperationStatus{OperationID: id, State: kernel.OpDone, AgentID: r.AgentID, Result: &r}, nil
	}
	return kernel.OperationStatus{}, apiError(resp.StatusCode, data)
}

// Cancel cancels the call in flight with operation id id.
func (c *Client) Cancel(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/operations/"+url.PathEscape(id), nil, nil)
}

// CancelSession cancels the calls in flight of a session and returns how
// many.
func (c *Client) CancelSession(ctx context.Context, id string) (int, error) {
	var out struct {
		Cancelled int `json:"cancelled"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/cancel", nil, &out)
	return out.Cancelled, err
}

// SessionHandles returns the session's handles for the tools of the
// bearer capability token (POST /v1/sessions/{id}/handles).
func (c *Client) SessionHandles(ctx context.Context, id string) ([]kernel.Handle, error) {
	var out HandleList
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/handles", nil, &out)
	return out.Handles, err
}

// EndSession ends the session's handles of the bearer token (every
// token's with the admin credential) and returns how many ended.
func (c *Client) EndSession(ctx context.Context, id string) (int, error) {
	var out struct {
		Ended int `json:"ended"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/end", nil, &out)
	return out.Ended, err
}

// Approvals lists pending approval requests (all: and recent decisions).
func (c *Client) Approvals(ctx context.Context, all bool) ([]kernel.ApprovalRequest, error) {
	var out ApprovalList
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/approvals?all=%t", all), nil, &out)
	return out.Approvals, err
}

// ApprovalDetail returns a pending approval whole: the request, the
// call's args and the files it writes or deletes as they are now.
func (c *Client) ApprovalDetail(ctx context.Context, id string) (kernel.ApprovalDetail, error) {
	var out kernel.ApprovalDetail
	err := c.do(ctx, http.MethodGet, "/v1/approvals/"+url.PathEscape(id), nil, &out)
	return out, err
}

// Decide allows or denies an approval; the client's credential must be an
// approver token.
func (c *Client) Decide(ctx context.Context, id, decision, reason string) (kernel.ApprovalRequest, error) {
	var out kernel.ApprovalRequest
	err := c.do(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(id), Decision{Decision: decision, Reason: reason}, &out)
	return out, err
}

// Events streams the events f selects to fn until ctx ends, the stream
// ends or fn returns an error. dropped, if set, is told the total of
// events lost so far whenever the kernel reports a loss. When the server
// ends the stream because the credential no longer verifies (revoked or
// expired), Events returns an *APIError of Status 401 with the
// refusal's class (token_revoked, token_invalid).
func (c *Client) Events(ctx context.Context, f kernel.EventFilter, fn func(kernel.Event) error, dropped func(uint64)) error {
	return c.Follow(ctx, f, nil, fn, dropped)
}

// Follow is Events that calls ready, if not nil, once the stream is open:
// every event the kernel emits from then on reaches fn.
func (c *Client) Follow(ctx context.Context, f kernel.EventFilter, ready func(), fn func(kernel.Event) error, dropped func(uint64)) error {
	q := url.Values{}
	if f.SessionID != "" {
		q.Set("session", f.SessionID)
	}
	if f.AgentID != "" {
		q.Set("agent", f.AgentID)
	}
	if len(f.Kinds) > 0 {
		q.Set("kind", strings.Join(f.Kinds, ","))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.BaseURL, "/")+"/v1/events?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.Credential != "" {
		req.Header.Set("Authorization", "Bearer "+c.Credential)
	}
	h := &http.Client{Transport: c.httpClient().Transport} // no overall timeout: a stream lasts
	resp, err := h.Do(req)
	if err != nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return apiError(resp.StatusCode, data)
	}
	// The server subscribes before it sends the header.
	if ready != nil {
		ready()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var kind, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			if kind == EventEnded {
				// The credential no longer verifies: the refusal a new
				// request would get.
				return apiError(http.StatusUnauthorized, []byte(data))
			}
			if kind == "dropped" {
				var d struct {
					Dropped uint64 `json:"dropped"`
				}
				if json.Unmarshal([]byte(data), &d) == nil && dropped != nil {
					dropped(d.Dropped)
				}
			} else {
				var e kernel.Event
				if err := json.Unmarshal([]byte(data), &e); err != nil {
					return fmt.Errorf("GET /v1/events: bad event %q: %w", data, err)
				}
				if err := fn(e); err != nil {
					return err
				}
			}
			kind, data = "", ""
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// callClient is the client calls are sent with: HTTP, or one with no
// timeout of its own (callHTTP).
func (c *Client) callClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return callHTTP
}

// apiError reads an error answer.
func apiError(status int, data []byte) error {
	var eb ErrorBody
	if json.Unmarshal(data, &eb) != nil || eb.Error.Class == "" {
		return &APIError{Status: status, Class: kernel.ErrInternal, Message: strings.TrimSpace(string(data))}
	}
	return &APIError{Status: status, Class: eb.Error.Class, Message: eb.Error.Message}
}

// Erase removes the payload of an operation's audit record and records
// the erasure (admin).
func (c *Client) Erase(ctx context.Context, operationID, reason string) (*kernel.Erasure, error) {
	var out kernel.Erasure
	if err := c.do(ctx, http.MethodPost, "/v1/admin/ledger/erase", EraseRequest{OperationID: operationID, Reason: reason}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
