package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// preferAsync reports whether r asks for an asynchronous answer (RFC 7240
// Prefer: respond-async).
func preferAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for p := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(strings.SplitN(p, ";", 2)[0]), "respond-async") {
				return true
			}
		}
	}
	return false
}

// caller is who sent a control request: the admin (agent and role empty),
// an agent's capability token, or an approver token.
type caller struct {
	admin bool
	tok   *captoken.Token
}

func (c caller) agent() string {
	if c.admin || c.tok == nil {
		return ""
	}
	return c.tok.Claims.Subject
}

func (c caller) role() string {
	if c.tok == nil {
		return ""
	}
	return c.tok.Claims.Cap.Role
}

// who identifies the bearer of r, answering the request itself (401) when
// there is no valid credential.
func (s *Server) who(w http.ResponseWriter, r *http.Request) (caller, bool) {
	cred := bearer(r)
	if strings.HasPrefix(cred, kernel.AdminPrefix) {
		if s.isAdmin(cred) {
			return caller{admin: true}, true
		}
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, msgWrongAdmin)
		return caller{}, false
	}
	tok, ok := s.capability(w, r)
	return caller{tok: tok}, ok
}

// canceller identifies who cancels: the admin (every agent's calls, "")
// or an agent's capability token (its own calls); approver tokens cannot.
func (s *Server) canceller(w http.ResponseWriter, r *http.Request) (agent string, ok bool) {
	c, ok := s.who(w, r)
	if !ok {
		return "", false
	}
	if c.role() != "" {
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, "approver tokens cannot cancel calls")
		return "", false
	}
	return c.agent(), true
}

// cancelOperation answers DELETE /v1/operations/{id}: the admin, or a
// token of the agent that made the call, cancels it.
func (s *Server) cancelOperation(w http.ResponseWriter, r *http.Request) {
	agent, ok := s.canceller(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if !s.k.Cancel(id, agent) {
		writeError(w, http.StatusNotFound, kernel.ErrInvalidArgs, fmt.Sprintf("no call in flight with operation id %q that a cancel can still stop (its outcome may be decided already: GET /v1/operations/%s)", id, id))
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"operation_id": id, "cancelled": true})
}

// cancelSession answers POST /v1/sessions/{id}/cancel: every call in
// flight of the session (of the token's agent, unless the admin asks).
func (s *Server) cancelSession(w http.ResponseWriter, r *http.Request) {
	agent, ok := s.canceller(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	writeJSON(w, http.StatusOK, map[string]any{"session_id": id, "cancelled": s.k.CancelSession(id, agent)})
}

// HandleList is the body of POST /v1/sessions/{id}/handles.
type HandleList struct {
	SessionID string          `json:"session_id"`
	Handles   []kernel.Handle `json:"handles"`
}

// sessionHandles answers POST /v1/sessions/{id}/handles: the session's
// handles for the tools the bearer capability token may call.
func (s *Server) sessionHandles(w http.ResponseWriter, r *http.Request) {
	tok, ok := s.capability(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	hs, err := s.k.Handles(tok.Raw, id)
	switch {
	case errors.Is(err, kernel.ErrHandleRole):
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, err.Error())
		return
	case errors.Is(err, kernel.ErrHandleLimit):
		writeError(w, http.StatusTooManyRequests, kernel.ErrConcurrencyExceeded, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, HandleList{SessionID: id, Handles: hs})
}

// endSession answers POST /v1/sessions/{id}/end: the handles of the
// session die (the bearer token's own, or with the admin credential every
// token's).
func (s *Server) endSession(w http.ResponseWriter, r *http.Request) {
	c, ok := s.who(w, r)
	if !ok {
		return
	}
	jti := ""
	if !c.admin {
		jti = c.tok.Claims.ID
	}
	id := r.PathValue("id")
	writeJSON(w, http.StatusOK, map[string]any{"session_id": id, "ended": s.k.EndSession(id, jti)})
}

// ApprovalList is the body of GET /v1/approvals.
type ApprovalList struct {
	Approvals []kernel.ApprovalRequest `json:"approvals"`
}

// approvalReader is who reads approvals: the admin or an approver token
// (which sees those its role decides: kernel.SeesApproval); anyone else
// is answered 403.
func (s *Server) approvalReader(w http.ResponseWriter, r *http.Request) (caller, bool) {
	c, ok := s.who(w, r)
	if !ok {
		return c, false
	}
	if !c.admin && c.role() == "" {
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, "reading approvals needs the admin credential or an approver token")
		return c, false
	}
	return c, true
}

// approvals answers GET /v1/approvals[?all=true] to the admin and to
// approver tokens.
func (s *Server) approvals(w http.ResponseWriter, r *http.Request) {
	c, ok := s.approvalReader(w, r)
	if !ok {
		return
	}
	all, err := boolParam(r.URL.Query().Get("all"))
	if err != nil {
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
		return
	}
	out := ApprovalList{Approvals: []kernel.ApprovalRequest{}}
	for _, a := range s.k.Approvals(all) {
		if kernel.SeesApproval(c.role(), a.RequiredRole) {
			out.Approvals = append(out.Approvals, a)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// approval answers GET /v1/approvals/{id}: a pending approval whole, as
// the console's detail shows it (kernel.ApprovalDetail: the call's args,
// and each file it writes or deletes as it is now), to the admin or an
// approver token whose role sees it; 404 for one not pending or not seen.
func (s *Server) approval(w http.ResponseWriter, r *http.Request) {
	c, ok := s.approvalReader(w, r)
	if !ok {
		return
	}
	d, err := s.k.ApprovalDetail(r.PathValue("id"))
	if err != nil || !kernel.SeesApproval(c.role(), d.RequiredRole) {
		writeError(w, http.StatusNotFound, kernel.ErrInvalidArgs, fmt.Sprintf("approval %q is not pending", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// Decision is the body of POST /v1/approvals/{id}.
type Decision struct {
	Decision string `json:"decision"` // allow or deny
	Reason   string `json:"reason"`
}

// decide answers POST /v1/approvals/{id}: an approver token decides.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	var d Decision
	if err := decodeBody(w, r, &d); err != nil {
		writeBodyError(w, "body must be {\"decision\": \"allow\"|\"deny\", \"reason\": \"…\"}", err)
		return
	}
	cred := bearer(r)
	if cred == "" {
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, "send an approver token: Authorization: Bearer <token>")
		return
	}
	req, err := s.k.Decide(r.PathValue("id"), cred, d.Decision, d.Reason)
	switch {
	case errors.Is(err, kernel.ErrApprovalConflict):
		writeJSON(w, http.StatusConflict, struct {
			ErrorBody
			Approval kernel.ApprovalRequest `json:"approval"`
		}{ErrorBody{Error: kernel.Error{Class: kernel.ErrInvalidArgs, Message: err.Error()}}, req})
	case errors.Is(err, kernel.ErrApprovalForbidden):
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, err.Error())
	case errors.Is(err, kernel.ErrNotFound):
		writeError(w, http.StatusNotFound, kernel.ErrInvalidArgs, err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, err.Error())
	default:
		writeJSON(w, http.StatusOK, req)
	}
}

// defaultHeartbeat is how often an idle GET /v1/events stream sends a comment,
// so proxies and clients see it is alive, and re-verifies its credential.
const defaultHeartbeat = 15 * time.Second

// streamWriteTimeout bounds one write of an event stream: the stream
// outlives the server's write timeout, a stalled reader does not.
const streamWriteTimeout = 30 * time.Second

// Bounds of the GET /v1/events streams open at once. Each holds a
// subscription, with its event buffer, in the kernel, and every event is
// offered to every subscription.
const (
	// MaxEventStreamsPerAgent is how many streams one agent with its
	// sub-agents (agent/…: a token's subject up to its first "/") holds;
	// a person's approver and auditor tokens count as that person's, the
	// admin credential as one more.
	MaxEventStreamsPerAgent = 64
	// MaxEventStreams is how many streams all credentials hold together.
	MaxEventStreams = 1024
)

// streamCount counts the open GET /v1/events streams per owner and in
// all, within its bounds.
type streamCount struct {
	mu            sync.Mutex
	total         int
	byOwner       map[streamOwner]int
	perAgent, max int
}

// streamOwner is whose bound a stream counts against: the admin
// credential's, or a token's agent family.
type streamOwner struct {
	admin bool
	agent string
}

func ownerOf(c caller) streamOwner {
	if c.admin {
		return streamOwner{admin: true}
	}
	family, _, _ := strings.Cut(c.tok.Claims.Subject, "/")
	return streamOwner{agent: family}
}

// open counts a stream of o, or says why it may not open (o holds
// perAgent streams, or all hold max) and counts nothing.
func (n *streamCount) open(o streamOwner) (refusal string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.byOwner[o] >= n.perAgent:
		who := "the admin credential"
		if !o.admin {
			who = fmt.Sprintf("agent %q with its sub-agents", o.agent)
		}
		return fmt.Sprintf("%s holds %d event streams open, the most one agent may; close one first", who, n.byOwner[o])
	case n.total >= n.max:
		return fmt.Sprintf("the server holds %d event streams open, the most it serves at once; try again later", n.total)
	}
	if n.byOwner == nil {
		n.byOwner = map[streamOwner]int{}
	}
	n.byOwner[o]++
	n.total++
	return ""
}

// close uncounts a stream open counted.
func (n *streamCount) close(o streamOwner) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byOwner[o]--; n.byOwner[o] == 0 {
		delete(n.byOwner, o)
	}
	n.total--
}

// EventEnded is the event that ends a GET /v1/events stream whose
// credential no longer verifies; its data is an ErrorBody.
const EventEnded = "ended"

// eventStream answers GET /v1/events?session=&agent=&kind=a,b with
// Server-Sent Events. The admin and auditor tokens see every agent's
// events; approver tokens every agent's without messages but on approval
// requests (kernel.Access.Event); a capability token only its own agent's. Each event is
// "id: <seq>", "event: <kind>", "data: <json>"; when the client fell
// behind and events were lost, an "event: dropped" with {"dropped": N}
// (the total so far) comes before the next event.
//
// The credential is verified again on every heartbeat and before each
// event is written: once it no longer verifies (the token was revoked or
// expired, or the admin credential is no longer the kernel's), the
// stream sends "event: ended" with the refusal as an ErrorBody and ends,
// and the event in hand is not sent.
//
// A stream beyond MaxEventStreamsPerAgent of its credential's agent, or
// beyond MaxEventStreams in all, is refused with 429
// concurrency_exceeded.
func (s *Server) eventStream(w http.ResponseWriter, r *http.Request) {
	c, ok := s.who(w, r)
	if !ok {
		return
	}
	cred := bearer(r)
	q := r.URL.Query()
	f := kernel.EventFilter{SessionID: q.Get("session"), AgentID: q.Get("agent")}
	if k := q.Get("kind"); k != "" {
		f.Kinds = strings.Split(k, ",")
		for _, k := range f.Kinds {
			if !slices.Contains(kernel.EventKinds, k) {
				writeError(w, http.StatusBadRequest, kernel.ErrInvalidArgs, fmt.Sprintf("kind %q is not an event kind: one of %s", k, strings.Join(kernel.EventKinds, ", ")))
				return
			}
		}
	}
	acc := kernel.AccessAll
	if !c.admin {
		acc = kernel.AccessOf(c.tok)
	}
	if acc.Agent != "" {
		if f.AgentID != "" && f.AgentID != acc.Agent {
			writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, "a capability token sees only its own agent's events")
			return
		}
		f.AgentID = acc.Agent
	}
	owner := ownerOf(c)
	if why := s.streams.open(owner); why != "" {
		writeError(w, http.StatusTooManyRequests, kernel.ErrConcurrencyExceeded, why)
		return
	}
	defer s.streams.close(owner)
	sub := s.k.Subscribe(f, 0)
	defer sub.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	tick := time.NewTicker(s.heartbeat)
	defer tick.Stop()
	var reported uint64
	write := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// verified reports whether the credential still verifies, ending the
	// stream with "event: ended" when it does not.
	verified := func() bool {
		refusal := s.reverify(c, cred)
		if refusal == nil {
			return true
		}
		b, _ := json.Marshal(ErrorBody{Error: *refusal})
		write("event: %s\ndata: %s\n\n", EventEnded, b)
		return false
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !verified() || !write(": keep-alive\n\n") {
				return
			}
		case e, ok := <-sub.C:
			if !ok {
				return
			}
			if e, ok = acc.Event(e); !ok || e.Approval != nil && !kernel.SeesApproval(c.role(), e.Approval.RequiredRole) {
				continue
			}
			if !verified() {
				return
			}
			if d := sub.Dropped(); d != reported {
				reported = d
				if !write("event: dropped\ndata: {\"dropped\":%d}\n\n", d) {
					return
				}
			}
			b, _ := json.Marshal(e)
			if !write("id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, b) {
				return
			}
		}
	}
}

// reverify checks again the credential cred a stream was opened with as
// c: nil while it still verifies, else the refusal a new request with it
// would get.
func (s *Server) reverify(c caller, cred string) *kernel.Error {
	if c.admin {
		if s.isAdmin(cred) {
			return nil
		}
		return &kernel.Error{Class: kernel.ErrTokenInvalid, Message: msgWrongAdmin}
	}
	if _, err := s.k.VerifyBearer(cred); err != nil {
		class, reason := tokenRefusal(err)
		return &kernel.Error{Class: class, Message: "the bearer capability token: " + reason}
	}
	return nil
}
