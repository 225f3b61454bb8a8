// Package httpapi is capkernel's HTTP JSON API: agents send call envelopes
// to POST /v1/syscalls and get result envelopes back; administrators mint
// and revoke tokens; anyone holding a credential reads the ledger,
// receipts and stored operations. docs/http.md is the reference; the
// status table is StatusOf.
//
// Who may call what:
//
//   - public: GET /.well-known/jwks.json, /v1/policy, /v1/ledger/head,
//     /v1/ledger/checkpoint, /v1/ledger/proof/... (hashes only, for
//     witnesses and verifiers),
//     POST /v1/tokens/inspect (a token's holder asking what it grants);
//   - capability endpoints (the capability token in the envelope, or as a
//     bearer token for GET /v1/syscalls): they refuse the admin credential;
//   - admin endpoints (the admin credential as a bearer token): /v1/tokens
//     and /v1/admin/...; they refuse capability tokens;
//   - reads of history (ledger entries, export, receipts, operations,
//     events): the admin credential and auditor tokens read everything;
//     a capability token reads its own agent's records in full and every
//     other record only as its public part (kernel.Access).
package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/strictjson"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/tracing"
)

// Limits of the API.
const (
	MaxEntriesPage = 1000 // entries one GET /v1/ledger/entries returns
	// MaxEntriesPageBytes bounds the entries of one GET /v1/ledger/entries
	// page: an entry whose JSON would take the page's entries past it is
	// left for the next page, unless it is the page's first. A reader's
	// own records carry their payloads (up to about twice the envelope
	// limit each), so a page of MaxEntriesPage of them was gigabytes,
	// built whole in the server's memory.
	MaxEntriesPageBytes = 8 << 20
	maxAdminBody        = 1 << 20 // bytes of a token request or revocation
)

// Server serves the API of one kernel.
type Server struct {
	k       *kernel.Kernel
	mux     *http.ServeMux
	origins http.CrossOriginProtection // see crosssite.go
	// local is the control socket's admin credential (socket.go); empty
	// for a server on TCP.
	local string
	// heartbeat is the GET /v1/events heartbeat (defaultHeartbeat; tests set
	// it shorter).
	heartbeat time.Duration
	// streams counts the open GET /v1/events streams.
	streams streamCount
}

// New returns the API of k.
func New(k *kernel.Kernel) *Server {
	s := &Server{k: k, mux: http.NewServeMux(), heartbeat: defaultHeartbeat,
		streams: streamCount{perAgent: MaxEventStreamsPerAgent, max: MaxEventStreams}}
	s.mux.HandleFunc("POST /v1/syscalls", s.call)
	s.mux.HandleFunc("GET /v1/syscalls", s.tools)
	s.mux.HandleFunc("GET /v1/policy", s.policy)
	s.mux.HandleFunc("GET /.well-known/jwks.json", s.jwks)
	s.mux.HandleFunc("GET /v1/ledger/head", s.head)
	s.mux.HandleFunc("GET /v1/ledger/entries", s.reader(s.entries))
	s.mux.HandleFunc("GET /v1/ledger/export", s.reader(s.export))
	s.mux.HandleFunc("GET /v1/ledger/checkpoint", s.checkpoint)
	s.mux.HandleFunc("GET /v1/ledger/proof/inclusion", s.inclusion)
	s.mux.HandleFunc("GET /v1/ledger/proof/consistency", s.consistency)
	s.mux.HandleFunc("GET /v1/receipts", s.reader(s.receiptList))
	s.mux.HandleFunc("GET /v1/receipts/{id}", s.reader(s.receipt))
	s.mux.HandleFunc("GET /v1/receipts/{id}/bundle", s.reader(s.bundle))
	s.mux.HandleFunc("GET /v1/operations/{id}", s.operation)
	s.mux.HandleFunc("DELETE /v1/operations/{id}", s.cancelOperation)
	s.mux.HandleFunc("POST /v1/sessions/{id}/cancel", s.cancelSession)
	s.mux.HandleFunc("POST /v1/sessions/{id}/handles", s.sessionHandles)
	s.mux.HandleFunc("POST /v1/sessions/{id}/end", s.endSession)
	s.mux.HandleFunc("GET /v1/approvals", s.approvals)
	s.mux.HandleFunc("GET /v1/approvals/{id}", s.approval)
	s.mux.HandleFunc("POST /v1/approvals/{id}", s.decide)
	s.mux.HandleFunc("GET /v1/events", s.eventStream)
	s.mux.HandleFunc("POST /v1/tokens", s.admin(s.mint))
	s.mux.HandleFunc("POST /v1/tokens/{jti}/revoke", s.admin(s.revoke))
	s.mux.HandleFunc("POST /v1/tokens/inspect", s.inspectToken)
	s.mux.HandleFunc("POST /v1/tokens/attenuate", s.attenuate)
	s.mux.HandleFunc("GET /v1/admin/ledger/verify", s.admin(s.verifyLedger))
	s.mux.HandleFunc("POST /v1/admin/ledger/erase", s.admin(s.erase))
	s.mux.HandleFunc("GET /v1/admin/replay/verify", s.admin(s.replayVerify))
	s.mux.HandleFunc("GET /v1/admin/replay", s.admin(s.replayShow))
	s.mux.HandleFunc("/", s.noEndpoint)
	return s
}

// noEndpoint answers a request no endpoint takes: 405 with the methods the
// path takes (Allow) when it is an endpoint's path, else 404.
func (s *Server) noEndpoint(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		if _, pattern := s.mux.Handler(&http.Request{Method: m, URL: r.URL, Host: r.Host}); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, http.StatusNotFound, kernel.ErrInvalidArgs, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, http.StatusMethodNotAllowed, kernel.ErrInvalidArgs, fmt.Sprintf("%s takes %s, not %s", r.URL.Path, strings.Join(allow, " or "), r.Method))
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Cache-Control"] = noStore
	h["X-Content-Type-Options"] = noSniff
	if !s.guard(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// StatusOf maps an error class to the HTTP status of its response: the
// codes of the IETF Idempotency-Key draft for the idempotency classes, and
// the nearest standard code for the others. An ok result is 200.
func StatusOf(class string) int {
	switch class {
	case "":
		return http.StatusOK
	case kernel.ErrInvalidArgs, kernel.ErrIdempotencyKeyRequired:
		return http.StatusBadRequest
	case kernel.ErrTokenInvalid, kernel.ErrTokenRevoked:
		return http.StatusUnauthorized
	case kernel.ErrPermissionDenied, kernel.ErrScopeDenied, kernel.ErrPolicyDenied, kernel.ErrApprovalDenied:
		return http.StatusForbidden
	case kernel.ErrToolNotFound:
		return http.StatusNotFound
	case kernel.ErrIdempotencyInFlight, kernel.ErrPreconditionFailed, kernel.ErrPolicyMismatch:
		return http.StatusConflict
	case kernel.ErrIdempotencyConflict:
		return http.StatusUnprocessableEntity
	case kernel.ErrBudgetExceeded, kernel.ErrConcurrencyExceeded:
		return http.StatusTooManyRequests
	case kernel.ErrTimeout, kernel.ErrApprovalTimeout:
		return http.StatusGatewayTimeout
	case kernel.ErrCancelled:
		return 499 // client closed request, as nginx reports it
	case kernel.ErrExecution, kernel.ErrOutcomeUnknown, kernel.ErrUpstreamUnavailable, kernel.ErrUpstreamError:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// call runs POST /v1/syscalls: the body is a call envelope, the response
// body its result envelope, whatever happens.
func (s *Server) call(w http.ResponseWriter, r *http.Request) {
	limit := s.k.MaxEnvelopeBytes()
	// The body is read into a pooled buffer, given back once the kernel
	// is done with it: InvokeJSON, Refuse and Start keep no reference to
	// the envelope's bytes (TestCallKeepsNoBody).
	bp := bodyBuffers.Get().(*[]byte)
	data, err := readBody(r, (*bp)[:0], limit+1)
	defer putBuffer(bp, data)
	ctx := tracing.FromHTTP(r) // a traceparent header parents the call's span
	var res *kernel.Result
	status := 0
	switch {
	case err != nil:
		res = s.k.Refuse(ctx, data, kernel.ErrInvalidArgs, "reading the request body: "+err.Error())
	case int64(len(data)) > limit:
		res = s.k.Refuse(ctx, data, kernel.ErrInvalidArgs, fmt.Sprintf("request body is over the %d-byte envelope limit", limit))
		status = http.StatusRequestEntityTooLarge
	case bearer(r) != "" && strings.HasPrefix(bearer(r), kernel.AdminPrefix):
		res = s.k.Refuse(ctx, data, kernel.ErrTokenInvalid, "the admin credential cannot make calls; send a capability token in the envelope")
	case preferAsync(r):
		id, refused, err := s.k.Start(ctx, data)
		switch {
		case errors.Is(err, kernel.ErrTooManyBackground):
			writeResult(w, http.StatusTooManyRequests, refused)
			return
		case errors.Is(err, kernel.ErrBadOperationID):
			writeResult(w, http.StatusBadRequest, refused)
			return
		case errors.Is(err, kernel.ErrKernelClosing):
			writeResult(w, http.StatusServiceUnavailable, refused)
			return
		case err != nil:
			writeResult(w, http.StatusConflict, refused)
			return
		}
		w.Header().Set("Location", "/v1/operations/"+id)
		w.Header().Set("Preference-Applied", "respond-async")
		writeJSON(w, http.StatusAccepted, kernel.OperationStatus{OperationID: id, State: kernel.OpRunning})
		return
	default:
		res = s.k.InvokeJSON(ctx, data)
		// The call may have waited for an approval or run for minutes,
		// past the server's WriteTimeout (set when the request was read):
		// its result, committed or not, is still written.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(resultWriteTimeout))
	}
	switch {
	case status != 0:
	case res.KernelClosing():
		status = http.StatusServiceUnavailable // not run: a retry to the next kernel may run it
	default:
		status = StatusOf(errClass(res))
	}
	writeResult(w, status, res)
}

// resultWriteTimeout bounds the write of a call's result, counted from
// the end of the call: a client that stops reading for that long loses
// its answer (the call's outcome is in the ledger and, for a keyed call,
// replayed to a retry).
const resultWriteTimeout = 60 * time.Second

func errClass(r *kernel.Result) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Class
}

// tools answers GET /v1/syscalls: the definitions the bearer token may
// call, in ?format=openai (default), anthropic or mcp.
func (s *Server) tools(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.capability(w, r); !ok {
		return
	}
	format := r.URL.Query().Get("format")
	if format == "" {
		format = syscalls.FormatOpenAI
	}
	out, err := s.k.Tools(bearer(r), format)
	if err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) policy(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"policy_hash": s.k.PolicyHash()})
}

func (s *Server) jwks(w http.ResponseWriter, _ *http.Request) {
	b, err := s.k.JWKS()
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/jwk-set+json")
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// Head is the body of GET /v1/ledger/head.
type Head struct {
	Size            uint64 `json:"size"`
	Hash            string `json:"hash"`              // entry_hash of the last entry
	StateSnapshotID string `json:"state_snapshot_id"` // "<seq>:<hash>" of the last entry
}

func (s *Server) head(w http.ResponseWriter, _ *http.Request) {
	h, err := s.k.Inspector().Head()
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, HeadOf(h))
}

// HeadOf is the wire form of h.
func HeadOf(h ledger.Head) Head {
	out := Head{Size: h.Size, Hash: h.Hash}
	if h.Size > 0 {
		out.StateSnapshotID = fmt.Sprintf("%d:%s", h.Size-1, h.Hash)
	}
	return out
}

// Entries is the body of GET /v1/ledger/entries: each entry as the
// reader may see it (kernel.Access.Entry). A page holds up to limit
// entries and stops early at MaxEntriesPageBytes; More says it did, so a
// short page ends the ledger only when More is false.
type Entries struct {
	Entries []kernel.EntryView `json:"entries"`
	Next    uint64             `json:"next"` // the from of the next page
	// More is set when the page stopped at its byte bound before limit
	// entries: the entries from Next on were left for the next page.
	More bool `json:"more,omitempty"`
}

// errPageFull stops the scan of an entries page at its byte bound.
var errPageFull = errors.New("page full")

func (s *Server) entries(w http.ResponseWriter, r *http.Request, acc kernel.Access) {
	q := r.URL.Query()
	from, err1 := uintParam(q.Get("from"), 0)
	limit, err2 := uintParam(q.Get("limit"), 100)
	if err := errors.Join(err1, err2); err != nil || limit == 0 {
		why := fmt.Sprintf("limit %q is below 1", q.Get("limit"))
		if err != nil {
			why = err.Error()
		}
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, "from and limit must be integers, limit at least 1: "+why)
		return
	}
	limit = min(limit, MaxEntriesPage)
	// Each view is encoded as it is read, so the server holds the page's
	// JSON and one view, never every view of the page (a payload's view
	// is several times its JSON).
	page := []byte(`{"entries":[`)
	n, next, more := uint64(0), from, false
	err := s.k.Inspector().ScanViews(from, acc, func(v kernel.EntryView) error {
		if n == limit {
			return errPageFull
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("entry %d: %w", v.Seq, err)
		}
		if n > 0 && len(page)+1+len(b) > MaxEntriesPageBytes {
			more = true
			return errPageFull
		}
		if n > 0 {
			page = append(page, ',')
		}
		page = append(page, b...)
		n, next = n+1, v.Seq+1
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	page = fmt.Appendf(page, `],"next":%d`, next)
	if more {
		page = append(page, `,"more":true`...)
	}
	writeBody(w, http.StatusOK, append(page, '}'), newline)
}

// ReceiptList is the body of GET /v1/receipts.
type ReceiptList struct {
	Receipts []kernel.ReceiptInfo `json:"receipts"`
}

func (s *Server) receiptList(w http.ResponseWriter, r *http.Request, acc kernel.Access) {
	f, err := ParseReceiptFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	if f.Limit == 0 || f.Limit > MaxEntriesPage {
		f.Limit = MaxEntriesPage
	}
	list, err := s.k.Inspector().Receipts(f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	for i := range list {
		list[i] = acc.Receipt(list[i])
	}
	writeJSON(w, http.StatusOK, ReceiptList{Receipts: list})
}

func (s *Server) receipt(w http.ResponseWriter, r *http.Request, acc kernel.Access) {
	info, err := s.k.Inspector().Receipt(r.PathValue("id"))
	if err != nil {
		writeLookupError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, acc.Receipt(*info))
}

// operation answers GET /v1/operations/{id} with the stored result
// envelope, to the admin, an auditor, or a token of the agent that made
// the call; to anyone else it is unknown.
func (s *Server) operation(w http.ResponseWriter, r *http.Request) {
	acc, ok := s.access(w, r)
	if !ok {
		return
	}
	if st, ok := s.k.OperationFor(r.PathValue("id"), acc); ok {
		if st.State != kernel.OpDone {
			writeJSON(w, http.StatusAccepted, st)
			return
		}
		writeJSON(w, http.StatusOK, st.Result)
		return
	}
	env, err := s.k.Inspector().Operation(r.PathValue("id"))
	if err != nil {
		writeLookupError(w, err)
		return
	}
	if !acc.All {
		var owner struct {
			AgentID string `json:"agent_id"`
		}
		if json.Unmarshal(env, &owner) != nil || !acc.Full(owner.AgentID) {
			// The same answer as for an unknown id: a token learns
			// nothing about other agents' operations.
			writeLookupError(w, fmt.Errorf("operation %q: %w", r.PathValue("id"), kernel.ErrNotFound))
			return
		}
	}
	writeJSON(w, http.StatusOK, env)
}

func (s *Server) mint(w http.ResponseWriter, r *http.Request) {
	var req kernel.TokenRequest
	if !readJSON(w, r, &req) {
		return
	}
	t, err := s.k.Mint(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

// attenuate signs a narrower child of the parent token in the body; the
// parent is the credential (see kernel.Attenuate).
func (s *Server) attenuate(w http.ResponseWriter, r *http.Request) {
	var req kernel.AttenuateRequest
	if !readJSON(w, r, &req) {
		return
	}
	t, err := s.k.Attenuate(r.Context(), req)
	var ae *kernel.AttenuateError
	switch {
	case errors.As(err, &ae):
		status := http.StatusForbidden
		switch ae.Class {
		case kernel.ErrTokenInvalid, kernel.ErrTokenRevoked:
			status = http.StatusUnauthorized
		case kernel.ErrInvalidArgs:
			status = http.StatusBadRequest
		}
		writeError(w, status, ae.Class, ae.Message)
	case err != nil:
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
	default:
		writeJSON(w, http.StatusCreated, t)
	}
}

// RevokeRequest is the body of POST /v1/tokens/{jti}/revoke.
type RevokeRequest struct {
	Reason string `json:"reason"`
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	var req RevokeRequest
	if !readJSON(w, r, &req) {
		return
	}
	jti := r.PathValue("jti")
	err := s.k.Revoke(r.Context(), jti, req.Reason)
	switch {
	case errors.Is(err, kernel.ErrNotTokenID):
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jti": jti, "revoked": true})
}

// TokenInspection is the answer of POST /v1/tokens/inspect.
type TokenInspection struct {
	Valid  bool        `json:"valid"`
	Reason string      `json:"reason,omitempty"` // why not, when not valid
	Class  string      `json:"class,omitempty"`  // token_invalid or token_revoked
	Claims *WireClaims `json:"claims,omitempty"`
}

// WireClaims are a token's claims under the names the token itself
// carries (RFC 7519 iss, sub, aud, jti, iat, nbf, exp in Unix seconds, and
// cap), so that an inspection reads like the token's payload.
type WireClaims struct {
	Issuer    string              `json:"iss"`
	Subject   string              `json:"sub"`
	Audience  string              `json:"aud"`
	ID        string              `json:"jti"`
	IssuedAt  int64               `json:"iat"`
	NotBefore int64               `json:"nbf"`
	Expiry    int64               `json:"exp"`
	Cap       captoken.Capability `json:"cap"`
}

// WireClaimsOf returns c under its wire names.
func WireClaimsOf(c captoken.Claims) *WireClaims {
	return &WireClaims{Issuer: c.Issuer, Subject: c.Subject, Audience: c.Audience, ID: c.ID,
		IssuedAt: c.IssuedAt.Unix(), NotBefore: c.NotBefore.Unix(), Expiry: c.Expiry.Unix(), Cap: c.Cap}
}

// InspectRequest is the body of POST /v1/tokens/inspect.
type InspectRequest struct {
	Token string `json:"token"`
}

func (s *Server) inspectToken(w http.ResponseWriter, r *http.Request) {
	var req InspectRequest
	if !readJSON(w, r, &req) {
		return
	}
	writeJSON(w, http.StatusOK, Inspect(s.k, req.Token))
}

// Inspect verifies token as a bearer credential of k and says what it
// grants, or why it is refused.
func Inspect(k *kernel.Kernel, token string) TokenInspection {
	tok, err := k.VerifyBearer(token)
	if err != nil {
		class, reason := tokenRefusal(err)
		return TokenInspection{Reason: reason, Class: class}
	}
	return TokenInspection{Valid: true, Claims: WireClaimsOf(tok.Claims)}
}

func (s *Server) verifyLedger(w http.ResponseWriter, _ *http.Request) {
	c, err := s.k.Inspector().Verify(nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// checkpoint answers GET /v1/ledger/checkpoint[?stable=true] with the
// latest (stable) signed checkpoint.
func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) {
	stable, err := boolParam(r.URL.Query().Get("stable"))
	if err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	c, err := s.k.Inspector().Checkpoint(stable)
	if err != nil {
		writeLookupError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// inclusion answers GET /v1/ledger/proof/inclusion?seq=N[&size=M].
func (s *Server) inclusion(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	seq, err1 := strconv.ParseUint(q.Get("seq"), 10, 64)
	size, err2 := uintParam(q.Get("size"), 0)
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, fmt.Sprintf("seq (required) and size must be integers: %v", err))
		return
	}
	p, err := s.k.Inspector().ProveInclusion(seq, size)
	if err != nil {
		writeLookupError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// consistency answers GET /v1/ledger/proof/consistency?from=M&to=N.
func (s *Server) consistency(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, err1 := strconv.ParseUint(q.Get("from"), 10, 64)
	to, err2 := strconv.ParseUint(q.Get("to"), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, fmt.Sprintf("from and to (both required) must be integers: %v", err))
		return
	}
	p, err := s.k.Inspector().ProveConsistency(from, to)
	if err != nil {
		writeLookupError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// export answers GET /v1/ledger/export with ledger.Export's JSON lines:
// every entry and every checkpoint, from one read transaction. Only the
// admin and auditors export: an export is verified byte for byte, and
// another agent's records are readable only in part.
func (s *Server) export(w http.ResponseWriter, r *http.Request, acc kernel.Access) {
	if !acc.All {
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, "exporting the ledger needs the admin credential or an auditor token; a capability token reads entries page by page (GET /v1/ledger/entries)")
		return
	}
	w.Header().Set("Content-Type", "application/jsonl")
	// Once the first line is out the status is sent; a later failure can
	// only cut the stream short, which the verifier reports.
	if err := s.k.Inspector().Export(w); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// bundle answers GET /v1/receipts/{id}/bundle. A bundle holds the whole
// audit entry: public for a record with commitments; a record written
// before them, of another agent, is proven in the log by its public part
// and GET /v1/ledger/proof/inclusion instead.
func (s *Server) bundle(w http.ResponseWriter, r *http.Request, acc kernel.Access) {
	b, err := s.k.Inspector().Bundle(r.PathValue("id"))
	if err != nil {
		writeLookupError(w, err)
		return
	}
	if !acc.MayHave(b.Entry) {
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, "a receipt bundle holds the whole audit record: only the call's agent, an auditor or the admin may have it; anyone may prove the record's inclusion (GET /v1/ledger/proof/inclusion?seq=N)")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) replayVerify(w http.ResponseWriter, _ *http.Request) {
	rep, err := s.k.Inspector().ReplayVerify()
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Server) replayShow(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("key") == "" {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, "key (the idempotency key) is required")
		return
	}
	h, err := s.k.Inspector().ReplayShow(q.Get("key"), q.Get("agent"))
	if err != nil {
		writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, h)
}

// admin wraps an admin endpoint: the bearer credential must be the admin
// credential; capability tokens are refused.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if cred := bearer(r); s.isAdmin(cred) {
			h(w, r)
		} else {
			writeAdminRefusal(w, cred)
		}
	}
}

// reader wraps a history read: the admin credential or any valid token
// of this kernel, which h serves with what that credential may read.
func (s *Server) reader(h func(http.ResponseWriter, *http.Request, kernel.Access)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if acc, ok := s.access(w, r); ok {
			h(w, r, acc)
		}
	}
}

// access returns what the bearer of r may read of the history, answering
// the request itself (401) when it has no valid credential.
func (s *Server) access(w http.ResponseWriter, r *http.Request) (kernel.Access, bool) {
	cred := bearer(r)
	switch {
	case s.isAdmin(cred):
		return kernel.AccessAll, true
	case cred == "":
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, "this endpoint needs a bearer credential: the admin credential or a capability token of this kernel")
		return kernel.Access{}, false
	case strings.HasPrefix(cred, kernel.AdminPrefix):
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, msgWrongAdmin)
		return kernel.Access{}, false
	}
	tok, ok := s.capability(w, r)
	if !ok {
		return kernel.Access{}, false
	}
	return kernel.AccessOf(tok), true
}

// capability verifies the bearer capability token of r, answering the
// request itself when there is none or it does not verify.
func (s *Server) capability(w http.ResponseWriter, r *http.Request) (*captoken.Token, bool) {
	cred := bearer(r)
	switch {
	case cred == "":
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, "send a capability token: Authorization: Bearer <token>")
		return nil, false
	case strings.HasPrefix(cred, kernel.AdminPrefix):
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, "the admin credential is not a capability token: send the agent's capability token")
		return nil, false
	}
	tok, err := s.k.VerifyBearer(cred)
	if err != nil {
		class, reason := tokenRefusal(err)
		writeError(w, http.StatusUnauthorized, class, "the bearer capability token: "+reason)
		return nil, false
	}
	return tok, true
}

// tokenRefusal returns the error class of a token that does not verify
// and the reason alone, without the class repeated in front of it.
func tokenRefusal(err error) (class, reason string) {
	var te *captoken.Error
	if errors.As(err, &te) {
		return te.Code, te.Reason
	}
	return kernel.ErrTokenInvalid, err.Error()
}

// bearer returns the credential of an "Authorization: Bearer" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// ErrorBody is the body of every error response other than a result
// envelope.
type ErrorBody struct {
	Error kernel.Error `json:"error"`
}

func writeError(w http.ResponseWriter, status int, class, msg string) {
	writeJSON(w, status, ErrorBody{Error: kernel.Error{Class: class, Message: msg}})
}

func writeLookupError(w http.ResponseWriter, err error) {
	if errors.Is(err, kernel.ErrNotFound) || errors.Is(err, kernel.ErrRange) {
		writeError(w, http.StatusNotFound, kernel.ErrInvalidArgs, err.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, kernel.ErrInternal, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(ErrorBody{Error: kernel.Error{Class: kernel.ErrInternal, Message: err.Error()}})
	}
	writeBody(w, status, b, newline)
}

// writeResult answers with the result envelope r: the encoding of
// json.Marshal (appendResult) made in a pooled buffer.
func writeResult(w http.ResponseWriter, status int, r *kernel.Result) {
	bp := bodyBuffers.Get().(*[]byte)
	b, ok := appendResult((*bp)[:0], r)
	if !ok {
		writeJSON(w, status, r) // json.Marshal's error, as an internal error
	} else if writeBody(w, status, append(b, '\n')) != nil {
		// A failed write may still be reading b (HTTP/2 hands a body over
		// and answers a stream reset without waiting for the copy): b is
		// not reused.
		return
	}
	putBuffer(bp, b)
}

// writeBody answers with a JSON body made of parts, declaring its length:
// the response goes out without chunked encoding, in as few writes as
// net/http's buffers allow. It returns the first write's error; w has
// copied parts when it returns nil.
func writeBody(w http.ResponseWriter, status int, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Content-Length"] = []string{strconv.Itoa(n)}
	w.WriteHeader(status)
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Header values every answer shares; a Header's Set or Add never writes
// into a slice it holds (Add appends to a full one).
var (
	noStore  = []string{"no-store"}
	noSniff  = []string{"nosniff"}
	jsonType = []string{"application/json"}
	newline  = []byte{'\n'}
)

// bodyBuffers holds buffers (*[]byte) for call and result envelopes, so
// that reading a call and writing its answer allocate none.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// putBuffer gives bp back to bodyBuffers holding b, the buffer as it was
// last grown, unless it grew over 256 KiB: a rare large envelope is not
// kept.
func putBuffer(bp *[]byte, b []byte) {
	if cap(b) <= 256<<10 {
		*bp = b
		bodyBuffers.Put(bp)
	}
}

// readBody reads r's body, up to limit bytes, into buf. The buffer grows
// with the bytes that arrive, doubling when full, never ahead of them to
// the length the request declares: a client that declares a large body and
// stalls holds at most buf, or twice what it sent (the body is read before
// any credential is checked). The declared length only caps a growth, so
// that a body of that length ends at EOF without one more.
func readBody(r *http.Request, buf []byte, limit int64) ([]byte, error) {
	b := buf[:0]
	for int64(len(b)) < limit {
		if len(b) == cap(b) {
			n := int64(max(2*cap(b), 512))
			if d := r.ContentLength; d >= int64(len(b)) && d < n {
				n = d + 1 // room for the declared body and the EOF after it
			}
			b = append(make([]byte, 0, min(n, limit)), b...)
		}
		m, err := r.Body.Read(b[len(b):min(int64(cap(b)), limit)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// readJSON decodes a small JSON request body into v by the strictjson
// rules, answering the request itself when it cannot.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := decodeBody(w, r, v); err != nil {
		writeBodyError(w, "request body", err)
		return false
	}
	return true
}

// writeBodyError answers a request whose body decodeBody refused with err:
// 413 for a body over the limit, else 400 with what, the body's
// expected form, in front of the reason.
func writeBodyError(w http.ResponseWriter, what string, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, kernel.ErrInvalidArgs, fmt.Sprintf("request body is over the %d-byte limit of this endpoint", mbe.Limit))
		return
	}
	writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, what+": "+err.Error())
}

// decodeBody reads a request body of at most maxAdminBody bytes and
// decodes it into v by the strictjson rules (one JSON value; no duplicate
// names, invalid UTF-8 or unknown fields at any depth).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		return err
	}
	return strictjson.Unmarshal(data, v)
}

func boolParam(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean", s)
	}
	return b, nil
}

func uintParam(s string, def uint64) (uint64, error) {
	if s == "" {
		return def, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// ParseReceiptFilter reads agent, tool, outcome, since (RFC 3339), after
// and limit from a query.
func ParseReceiptFilter(q map[string][]string) (kernel.ReceiptFilter, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	f := kernel.ReceiptFilter{AgentID: get("agent"), ToolID: get("tool"), TxOutcome: get("outcome")}
	switch f.TxOutcome {
	case "", kernel.Committed, kernel.RolledBack, kernel.NoOp, "ok", "error":
	default:
		return f, fmt.Errorf("outcome %q is not one of committed, rolled_back, no_op, ok, error", f.TxOutcome)
	}
	if v := get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return f, fmt.Errorf("since: %v", err)
		}
		f.Since = t
	}
	after, err := uintParam(get("after"), 0)
	if err != nil {
		return f, fmt.Errorf("after: %v", err)
	}
	limit, err := uintParam(get("limit"), 0)
	if err != nil {
		return f, fmt.Errorf("limit: %v", err)
	}
	f.After, f.Limit = after, int(min(limit, MaxEntriesPage))
	return f, nil
}

// EraseRequest is the body of POST /v1/admin/ledger/erase.
type EraseRequest struct {
	OperationID string `json:"operation_id"`
	Reason      string `json:"reason"`
}

// erase answers POST /v1/admin/ledger/erase: the payload of the
// operation's audit record is removed and an erasure record appended.
func (s *Server) erase(w http.ResponseWriter, r *http.Request) {
	var req EraseRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.OperationID == "" || req.Reason == "" {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, "operation_id and reason are required")
		return
	}
	e, err := s.k.Erase(r.Context(), req.OperationID, req.Reason)
	switch {
	case errors.Is(err, kernel.ErrNothingToErase):
		writeError(w, http.StatusConflict, kernel.ErrInvalidArgs, err.Error())
	case err != nil:
		writeLookupError(w, err)
	default:
		writeJSON(w, http.StatusOK, e)
	}
}
