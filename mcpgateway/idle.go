package mcpgateway

import (
	"sync"
	"time"
)

// DefaultSessionIdle is how long `kernelctl mcp --http` keeps an HTTP
// session that is idle (see HTTPOptions.SessionIdle).
const DefaultSessionIdle = time.Hour

// idleSessions ends the HTTP sessions that are idle: no request of theirs
// has been served for idle (a POST, or a GET holding a stream open: a
// client that listens is not idle) and no call of theirs runs (a gated
// call outlives its request while it waits for an approver or for its
// client's answer). Every request passes through the gateway (tagHTTP),
// those the lean path answers too, which the SDK never sees: its own
// SessionTimeout would end sessions busy there, so none is set. A session
// with no request after the one that made it is idle after fresh.
type idleSessions struct {
	idle  time.Duration
	fresh time.Duration             // the idle time of a session with no request after the one that made it
	busy  func(session string) bool // a call of session runs or may be resumed
	end   func(session string)      // ends session, if it is live

	mu sync.Mutex
	by map[string]*idleSession
}

type idleSession struct {
	refs  int         // requests of the session being served
	timer *time.Timer // counts idle down while refs is 0
	last  time.Time   // when the last request of it was served, or it began
	ended bool        // its client ended it (DELETE): forgotten once refs is 0
	fresh bool        // no request of it since the one that made it
}

func newIdleSessions(idle, fresh time.Duration, busy func(string) bool, end func(string)) *idleSessions {
	return &idleSessions{idle: idle, fresh: fresh, busy: busy, end: end, by: map[string]*idleSession{}}
}

// record returns session's record, made with its timer running (under
// mu); a record made fresh counts down s.fresh.
func (s *idleSessions) record(session string, fresh bool) *idleSession {
	r := s.by[session]
	if r == nil {
		r = &idleSession{last: time.Now(), fresh: fresh}
		r.timer = time.AfterFunc(s.limit(r), func() { s.fire(session, r) })
		s.by[session] = r
	}
	return r
}

// limit is how long r may be idle (under mu).
func (s *idleSessions) limit(r *idleSession) time.Duration {
	if r.fresh {
		return s.fresh
	}
	return s.idle
}

// track starts the idle count of a new session: s.fresh, until a request
// of it comes.
func (s *idleSessions) track(session string) {
	s.mu.Lock()
	s.record(session, true)
	s.mu.Unlock()
}

// begin marks a request of session as being served until the returned
// done: the session is not idle meanwhile, and its idle count starts
// again from done.
func (s *idleSessions) begin(session string) (done func()) {
	s.mu.Lock()
	r := s.record(session, false)
	s.started(r)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.served(session, r)
		s.mu.Unlock()
	}
}

// started and served are begin's and done's steps (under mu).
func (s *idleSessions) started(r *idleSession) {
	r.refs++
	r.fresh = false
	r.timer.Stop()
}

func (s *idleSessions) served(session string, r *idleSession) {
	switch r.refs--; {
	case r.refs > 0 || s.by[session] != r:
	case r.ended:
		delete(s.by, session)
	default:
		r.last = time.Now()
		r.timer.Reset(s.idle)
	}
}

// ended marks session as ended by its client: its record goes when its
// last request is served, rather than when its count runs out.
func (s *idleSessions) ended(session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.by[session]; r != nil {
		r.ended = true
	}
}

// fire ends session r once its idle count ran out, unless a request of it
// began meanwhile, or one was served since the count started (a timer
// that fired as a request came waited for the lock while it was served:
// the count goes on from that request), or a call of it runs (then the
// count starts again).
func (s *idleSessions) fire(session string, r *idleSession) {
	s.mu.Lock()
	if s.by[session] != r || r.refs > 0 {
		s.mu.Unlock()
		return
	}
	if left := s.limit(r) - time.Since(r.last); left > 0 {
		r.timer.Reset(left)
		s.mu.Unlock()
		return
	}
	if s.busy(session) {
		r.timer.Reset(s.idle)
		s.mu.Unlock()
		return
	}
	delete(s.by, session)
	s.mu.Unlock()
	s.end(session)
}
