package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Control of calls in flight: a per-session concurrency cap with a bounded
// FIFO queue, and cancellation by operation or by session.
//
// A session is provenance.session_id. At most Config.SessionConcurrency
// calls of one session execute at once (from prepare to commit or
// rollback); up to Config.SessionQueue more wait, in arrival order, and
// a call beyond that is refused at once with concurrency_exceeded. Calls
// without a session id are not capped. Waiting for an approval does not
// hold a slot.

// sessionOf reads provenance.session_id, if it is a string, and whether
// the provenance has ProvenanceRequestState.
func sessionOf(prov json.RawMessage) (session string, staleState bool) {
	if len(prov) == 0 {
		return "", false
	}
	var p struct {
		SessionID    any             `json:"session_id"`
		RequestState json.RawMessage `json:"mcp_request_state"`
	}
	if json.Unmarshal(prov, &p) != nil {
		return "", false
	}
	s, _ := p.SessionID.(string)
	return s, p.RequestState != nil
}

// ProvenanceRequestState is the provenance member the MCP gateway gives a
// tools/call retry whose requestState (the MCP multi round-trip, SEP-2322)
// names no call of its session waiting for the client's answer: the
// kernel refuses every envelope that has one, invalid_args with
// StaleRequestState, so that such a refusal is audited as every refused
// call is, though only the gateway knows the states it handed out.
const ProvenanceRequestState = "mcp_request_state"

// StaleRequestState is the message of the refusal of an envelope with
// ProvenanceRequestState.
const StaleRequestState = "requestState names no call of this session waiting for an answer (unknown, answered already or expired)"

// sessionGate is one session's slots and queue.
type sessionGate struct {
	slots   chan struct{} // a token per running call
	waiting atomic.Int64
	users   int // calls holding or waiting for the gate (under sessions.mu)
	running atomic.Int64
}

type sessions struct {
	mu    sync.Mutex
	gates map[string]*sessionGate
	limit int
	queue int
}

func newSessions(limit, queue int) *sessions {
	return &sessions{gates: map[string]*sessionGate{}, limit: limit, queue: queue}
}

// acquire takes a slot of agent's session id, waiting in line while the
// session is at its cap. A session is an agent's: session ids are chosen
// by agents (and seen by approvers), so another agent naming the same id
// has a session, and a cap, of its own rather than filling this one's. It
// returns the release function and the number of the session's calls
// running with this one, or an error class and message:
// concurrency_exceeded when the line is full, cancelled or timeout when
// ctx ends first.
func (s *sessions) acquire(ctx context.Context, agent, id string) (release func(), running int, class, msg string) {
	if id == "" {
		return func() {}, 0, "", ""
	}
	key := sessionKey(agent, id)
	s.mu.Lock()
	g := s.gates[key]
	if g == nil {
		g = &sessionGate{slots: make(chan struct{}, s.limit)}
		s.gates[key] = g
	}
	g.users++
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		if g.users--; g.users == 0 {
			delete(s.gates, key)
		}
		s.mu.Unlock()
	}
	select {
	case g.slots <- struct{}{}:
	default:
		if g.waiting.Add(1) > int64(s.queue) {
			g.waiting.Add(-1)
			done()
			return nil, 0, ErrConcurrencyExceeded, fmt.Sprintf("session %q has %d calls running and %d waiting; the limits are %d and %d", id, s.limit, s.queue, s.limit, s.queue)
		}
		select {
		case g.slots <- struct{}{}:
			g.waiting.Add(-1)
		case <-ctx.Done():
			g.waiting.Add(-1)
			done()
			class, msg := ctxClass(ctx, "waiting for a session slot")
			return nil, 0, class, msg
		}
	}
	n := g.running.Add(1)
	return func() {
		g.running.Add(-1)
		<-g.slots
		done()
	}, int(n), "", ""
}

// sessionKey names agent's session id among the gates.
func sessionKey(agent, id string) string { return agent + "\x00" + id } // agent ids have no control characters

// ctxClass is the error class and message of a call whose ctx ended.
func ctxClass(ctx context.Context, while string) (class, msg string) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout, "timed out " + while
	}
	return ErrCancelled, fmt.Sprintf("cancelled %s: %v", while, context.Cause(ctx))
}

// ErrCancelledByRequest is the cause of a call cancelled through Cancel or
// CancelSession.
var ErrCancelledByRequest = errors.New("cancelled on request")

// inflight is a call that can be cancelled.
type inflight struct {
	agent   string
	session string
	cancel  context.CancelCauseFunc
	// cancelled: Cancel or CancelSession cancelled the call; settled: its
	// outcome was decided in its record's transaction (settle), after
	// which a cancel changes nothing and is not reported as done.
	cancelled, settled bool
}

type registry struct {
	mu      sync.Mutex
	calls   map[string]*inflight // by operation id
	closing error                // cancelAll's cause, once it ran
}

// add registers f under op and returns the function that unregisters it,
// or ok false, registering nothing, when a call with that operation id is
// in flight already. After cancelAll, f is cancelled as it registers.
func (r *registry) add(op string, f *inflight) (remove func(), ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.calls[op]; dup {
		return nil, false
	}
	if r.closing != nil {
		f.cancel(r.closing)
	}
	r.calls[op] = f
	return func() {
		r.mu.Lock()
		delete(r.calls, op)
		r.mu.Unlock()
	}, true
}

// Cancel cancels the call in flight with operation id op, if agent is
// empty (the admin) or the call's agent. It reports whether there was
// such a call. A cancelled call stops waiting (for an approval or a
// session slot) at once; a running syscall gets its context cancelled
// and is abandoned after Config.CancelGrace if it ignores that; either way
// its transaction is rolled back and its result is cancelled.
//
// A call whose outcome is already decided (its record's transaction
// settled it: committed, or recorded as it ended) is not cancelled, and
// Cancel reports false: a cancel up to that point is honoured there, so
// a call reported cancelled never commits (settle).
func (k *Kernel) Cancel(op, agent string) bool {
	k.inflight.mu.Lock()
	defer k.inflight.mu.Unlock()
	f, ok := k.inflight.calls[op]
	if !ok || (agent != "" && f.agent != agent) || f.settled {
		return false
	}
	f.cancelled = true
	f.cancel(ErrCancelledByRequest)
	return true
}

// settle decides, in the transaction that records the call with
// operation id op, whether a cancel reached it: true when Cancel or
// CancelSession did (the record then says cancelled, and nothing
// commits), false otherwise; from then on neither cancels it. The same
// answer every time, so a transaction run again after a batch's abort
// decides alike. A call not in flight (crash recovery's) was not
// cancelled.
func (r *registry) settle(op string) (cancelled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.calls[op]
	if !ok {
		return false
	}
	f.settled = true
	return f.cancelled
}

// CancelSession cancels every call in flight of session id (of agent
// only, unless agent is empty) and returns how many it cancelled.
func (k *Kernel) CancelSession(id, agent string) int {
	k.inflight.mu.Lock()
	defer k.inflight.mu.Unlock()
	n := 0
	for _, f := range k.inflight.calls {
		if f.session == id && (agent == "" || f.agent == agent) && !f.settled {
			f.cancelled = true
			f.cancel(ErrCancelledByRequest)
			n++
		}
	}
	return n
}
