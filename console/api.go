package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// Approvals is the body of GET /console/api/approvals.
type Approvals struct {
	Approvals []kernel.ApprovalRequest `json:"approvals"`
	CanDecide bool                     `json:"can_decide"`
}

func (c *Console) approvals(w http.ResponseWriter, r *http.Request, s *session) {
	all := r.URL.Query().Get("all") == "true"
	out := Approvals{Approvals: []kernel.ApprovalRequest{}, CanDecide: s.canDecide()}
	for _, a := range c.k.Approvals(all) {
		if kernel.SeesApproval(s.role, a.RequiredRole) {
			out.Approvals = append(out.Approvals, a)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (c *Console) approval(w http.ResponseWriter, r *http.Request, s *session) {
	d, err := c.k.ApprovalDetail(r.PathValue("id"))
	if err != nil || !kernel.SeesApproval(s.role, d.RequiredRole) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("approval %q is not pending", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// DecisionRequest is the body of POST /console/api/approvals/{id}.
type DecisionRequest struct {
	Decision string `json:"decision"` // allow or deny
	Reason   string `json:"reason"`
}

// decide hands the session's decision, with its credential, to the
// kernel, which checks the role (the admin credential and auditors decide
// nothing) and that the approver is not the calling agent, and records
// each refusal in the ledger, as for POST /v1/approvals/{id}: the console
// refuses no decision itself. 409 with the request as decided when
// someone decided first.
func (c *Console) decide(w http.ResponseWriter, r *http.Request, s *session) {
	var req DecisionRequest
	if !readJSON(w, r, &req) {
		return
	}
	a, err := c.k.Decide(r.PathValue("id"), s.cred, req.Decision, req.Reason)
	switch {
	case errors.Is(err, kernel.ErrApprovalConflict):
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "approval": a})
	case errors.Is(err, kernel.ErrApprovalForbidden):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, kernel.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeJSON(w, http.StatusOK, a)
	}
}

// defaultHeartbeat is how often an idle event stream gets a comment, so
// proxies and the browser keep it open, and re-checks its session.
const defaultHeartbeat = 15 * time.Second

// streamWriteTimeout bounds one write of the event stream: the stream
// outlives the server's write timeout (kernelctl serve's is 15 minutes, a
// deadline for the whole response), a reader that stops reading does not.
const streamWriteTimeout = 30 * time.Second

// EventEnded is the last event of a stream whose session ended or whose
// credential no longer verifies; its data is an ErrorBody saying why.
const EventEnded = "ended"

// events streams the kernel's tool.* events as Server-Sent Events, without
// the escalated approvals the session may not see. The session is checked
// (Console.check: it still exists, has not expired, its credential still
// verifies) on every heartbeat and before each event is written; once it
// fails, the stream sends "event: ended" with the reason and ends, the
// event in hand unsent, and the session is gone. Each write has
// streamWriteTimeout to go out; the stream ends at the first that fails.
// A stream beyond maxStreamsPerSession of the session, or maxStreams in
// all, is refused with 429.
func (c *Console) events(w http.ResponseWriter, r *http.Request, s *session) {
	if why := c.openStream(s); why != "" {
		writeError(w, http.StatusTooManyRequests, why)
		return
	}
	defer c.closeStream(s)
	sub := c.k.Subscribe(kernel.EventFilter{}, 0)
	defer sub.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	write := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write(": capkernel console events\n\n") {
		return
	}
	tick := time.NewTicker(c.heartbeat)
	defer tick.Stop()
	// live reports whether the session may still read, ending the stream
	// with "event: ended" when it may not.
	live := func() bool {
		err := c.check(s)
		if err == nil {
			return true
		}
		b, _ := json.Marshal(ErrorBody{Error: err.Error()})
		write("event: %s\ndata: %s\n\n", EventEnded, b)
		return false
	}
	var dropped uint64
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !live() || !write(": keep-alive\n\n") {
				return
			}
		case e, ok := <-sub.C:
			if !ok {
				return
			}
			if e.Approval != nil && !kernel.SeesApproval(s.role, e.Approval.RequiredRole) {
				continue
			}
			if e, ok = s.access.Event(e); !ok {
				continue
			}
			if !live() {
				return
			}
			b, err := json.Marshal(e)
			if err != nil {
				continue
			}
			if !write("id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, b) {
				return
			}
		}
		if n := sub.Dropped(); n != dropped {
			dropped = n
			if !write("event: dropped\ndata: {\"dropped\":%d}\n\n", n) {
				return
			}
		}
	}
}

// openStream counts an event stream of s, or says why it may not open
// (s holds maxStreamsPerSession, or all sessions maxStreams) and counts
// nothing.
func (c *Console) openStream(s *session) (refusal string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case s.streams >= c.maxStreamsPerSession:
		return fmt.Sprintf("this session holds %d event streams open, the most a session may", s.streams)
	case c.streams >= c.maxStreams:
		return fmt.Sprintf("the console holds %d event streams open, the most it serves at once; try again later", c.streams)
	}
	s.streams++
	c.streams++
	return ""
}

// closeStream uncounts a stream openStream counted.
func (c *Console) closeStream(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.streams--
	c.streams--
}

// Receipts is the body of GET /console/api/receipts.
type Receipts struct {
	Receipts []ReceiptRow `json:"receipts"`
	Next     uint64       `json:"next,omitempty"` // the after of the next page, when there may be one
}

// ReceiptRow is a receipt with its syscall's side-effect class.
type ReceiptRow struct {
	kernel.ReceiptInfo
	SideEffect string `json:"side_effect,omitempty"` // the tool's declared class (a call's own class may be narrower)
}

// pageSize is the receipts one page of the history holds.
const pageSize = 200

// receipts answers the history search: agent, tool, outcome (committed,
// rolled_back, no_op, ok, error), class (a side-effect class), since and
// until (RFC 3339), after (a receipt seq, for paging).
func (c *Console) receipts(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := kernel.ReceiptFilter{AgentID: q.Get("agent"), ToolID: q.Get("tool"), TxOutcome: q.Get("outcome")}
	switch f.TxOutcome {
	case "", kernel.Committed, kernel.RolledBack, kernel.NoOp, "ok", "error":
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("outcome %q is not one of committed, rolled_back, no_op, ok, error", f.TxOutcome))
		return
	}
	var until time.Time
	for name, t := range map[string]*time.Time{"since": &f.Since, "until": &until} {
		if v := q.Get(name); v != "" {
			var err error
			if *t, err = time.Parse(time.RFC3339, v); err != nil {
				writeError(w, http.StatusBadRequest, name+": "+err.Error())
				return
			}
		}
	}
	if v := q.Get("after"); v != "" {
		var err error
		if f.After, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, "after: "+err.Error())
			return
		}
	}
	class := q.Get("class")
	out := Receipts{Receipts: []ReceiptRow{}}
	// Pages of the kernel's filter, then the console's own (class, until).
	for len(out.Receipts) < pageSize {
		f.Limit = pageSize
		list, err := c.k.Inspector().Receipts(f)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		for _, ri := range list {
			f.After = ri.Seq
			row := ReceiptRow{ReceiptInfo: s.access.Receipt(ri)}
			if e, ok := c.k.Registry().Get(ri.Receipt.ToolID); ok {
				row.SideEffect = string(e.Def.SideEffect)
			}
			if class != "" && row.SideEffect != class {
				continue
			}
			if !until.IsZero() {
				if t, err := time.Parse(time.RFC3339Nano, ri.Receipt.IssuedAt); err != nil || t.After(until) {
					continue
				}
			}
			out.Receipts = append(out.Receipts, row)
		}
		if len(list) < pageSize {
			break
		}
		out.Next = f.After
	}
	if len(out.Receipts) < pageSize {
		out.Next = 0
	}
	writeJSON(w, http.StatusOK, out)
}

func (c *Console) receipt(w http.ResponseWriter, r *http.Request, s *session) {
	info, err := c.k.Inspector().Receipt(r.PathValue("id"))
	if err != nil {
		lookupError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.access.Receipt(*info))
}

// bundle answers with the receipt proven by the log: a record with
// commitments is public whole, one written before them only to a reader
// of it in full (as GET /v1/receipts/{id}/bundle).
func (c *Console) bundle(w http.ResponseWriter, r *http.Request, s *session) {
	b, err := c.k.Inspector().Bundle(r.PathValue("id"))
	if err != nil {
		lookupError(w, err)
		return
	}
	if !s.access.MayHave(b.Entry) {
		writeError(w, http.StatusForbidden, "this receipt's record predates commitments and holds the call's arguments: only its agent, an auditor or the admin may have it")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// operation answers with an operation's state or stored result to a
// reader of its agent's records in full (the admin and auditors); to
// anyone else it is unknown, as in GET /v1/operations/{id}: the result
// is the call's payload.
func (c *Console) operation(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	notFound := fmt.Errorf("operation %q: %w", id, kernel.ErrNotFound)
	// The kernel's memory of recent calls first (erasure rewrites it as
	// it rewrites the operations table), then the table.
	if st, ok := c.k.OperationFor(id, s.access); ok {
		writeJSON(w, http.StatusOK, st)
		return
	}
	env, err := c.k.Inspector().Operation(id)
	if err != nil {
		lookupError(w, err)
		return
	}
	var owner struct {
		AgentID string `json:"agent_id"`
	}
	if json.Unmarshal(env, &owner) != nil || !s.access.Full(owner.AgentID) {
		lookupError(w, notFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"operation_id": id, "state": kernel.OpDone, "result": env})
}

// Tokens is the body of GET /console/api/tokens.
type Tokens struct {
	Tokens []kernel.TokenInfo `json:"tokens"`
}

func (c *Console) tokens(w http.ResponseWriter, _ *http.Request, _ *session) {
	list, err := c.k.Tokens()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if list == nil {
		list = []kernel.TokenInfo{}
	}
	writeJSON(w, http.StatusOK, Tokens{Tokens: list})
}

// RevokeRequest is the body of POST /console/api/tokens/{jti}/revoke.
type RevokeRequest struct {
	Reason string `json:"reason"`
}

func (c *Console) revoke(w http.ResponseWriter, r *http.Request, _ *session) {
	var req RevokeRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.Reason == "" {
		writeError(w, http.StatusBadRequest, "a reason is required")
		return
	}
	jti := r.PathValue("jti")
	if err := c.k.Revoke(r.Context(), jti, req.Reason); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jti": jti, "revoked": true})
}

func lookupError(w http.ResponseWriter, err error) {
	if errors.Is(err, kernel.ErrNotFound) || errors.Is(err, kernel.ErrRange) {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, err.Error())
}
