// Package console is the operator's web console of a kernel: approvals
// decided live, history of receipts and operations, receipts verified in
// the browser, ledger checkpoints, tokens and their budgets. Its page and
// scripts are embedded (assets/, built from web/ by `make console`) and
// load nothing from any other origin.
//
// Access: an operator signs in with an approver, escalation, auditor or
// admin credential (POST /console/api/login), which the server keeps. The
// sign-in answers with the session's key, which the page keeps in its
// tab's sessionStorage (scoped to the console's origin, port included)
// and sends in the X-Console-Key header of every console API request,
// and sets an HttpOnly, SameSite=Strict cookie binding the session to the
// browser (Secure over TLS). A request needs both: cookies are not
// scoped by port, so any server on another port of the console's host
// that the browser visits receives the cookie, which alone opens no
// session and yields no key. Every state-changing request must also come
// from the console's own origin and carry a JSON body. docs/console.md is
// the reference.
package console

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/strictjson"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Limits of the console's sessions.
const (
	SessionTTL = 8 * time.Hour // at most; never past the credential's own expiry
	// MaxSessionsPerCredential is how many sessions one credential (one
	// token, the admin credential) holds at once: signing in once more
	// drops that credential's own oldest session, never another's.
	MaxSessionsPerCredential = 8
	// MaxSessions bounds all sessions, the last resort once many
	// credentials sign in: see Console.add.
	MaxSessions = 1024
	// MaxStreamsPerSession is how many live event streams one session
	// holds open: the page's, and the one replacing it after a break
	// before the server saw the old one end.
	MaxStreamsPerSession = 2
	// MaxStreams bounds the live event streams of all sessions together:
	// each holds a kernel subscription with its event buffer.
	MaxStreams = 1024
	cookieName = "capk_console"
	keyHeader  = "X-Console-Key"
	maxBody    = 64 << 10
)

// Roles a console session can have.
const (
	RoleAdmin      = "admin"
	RoleApprover   = "approver"
	RoleEscalation = "escalation"
	RoleAuditor    = "auditor" // reads every record in full; decides and revokes nothing
)

// ContentSecurityPolicy is sent with every console response: scripts,
// styles and connections from the console's own origin only, no inline
// script or style, no framing.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Console serves the console of one kernel.
type Console struct {
	k      *kernel.Kernel
	mux    *http.ServeMux
	static http.Handler

	mu       sync.Mutex
	sessions map[string]*session   // by id
	byCred   map[string][]*session // each credential's sessions, oldest first
	now      func() time.Time
	// maxPerCred and maxSessions are MaxSessionsPerCredential and
	// MaxSessions (tests set them lower).
	maxPerCred, maxSessions int
	// streams counts the event streams open (guarded by mu), within
	// maxStreamsPerSession of a session and maxStreams in all
	// (MaxStreamsPerSession and MaxStreams; tests set them lower).
	streams                          int
	maxStreamsPerSession, maxStreams int
	// heartbeat is the event stream's (defaultHeartbeat; tests set it
	// shorter).
	heartbeat time.Duration
}

type session struct {
	// id is the session's key: the page's secret, sent in X-Console-Key
	// and given out once, in the answer to the sign-in.
	id string
	// browser is the value of the cookie the session was signed in with:
	// a request must carry it too.
	browser string
	cred    string // the credential signed in with; never sent back
	role    string
	subject string
	jti     string // of a token credential
	// access is what the credential may read of the history
	// (kernel.Access): everything for the admin and auditors, the
	// public parts for approvers, who act for no agent.
	access  kernel.Access
	created time.Time
	expires time.Time
	// streams is how many event streams the session holds open (guarded
	// by Console.mu).
	streams int
}

// New returns the console of k.
func New(k *kernel.Kernel) *Console {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	c := &Console{k: k, mux: http.NewServeMux(), sessions: map[string]*session{}, byCred: map[string][]*session{}, now: time.Now, heartbeat: defaultHeartbeat,
		maxPerCred: MaxSessionsPerCredential, maxSessions: MaxSessions,
		maxStreamsPerSession: MaxStreamsPerSession, maxStreams: MaxStreams,
		static: http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(sub))}
	c.routes()
	return c
}

// ServeHTTP implements http.Handler for paths under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

func (c *Console) routes() {
	m := c.mux
	m.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
	})
	m.Handle("GET /console/", c.static)
	m.HandleFunc("POST /console/api/login", c.login)
	m.HandleFunc("POST /console/api/logout", c.mutate(c.logout))
	m.HandleFunc("GET /console/api/session", c.read(c.whoami))
	m.HandleFunc("GET /console/api/approvals", c.read(c.approvals))
	m.HandleFunc("GET /console/api/approvals/{id}", c.read(c.approval))
	m.HandleFunc("POST /console/api/approvals/{id}", c.mutate(c.decide))
	m.HandleFunc("GET /console/api/events", c.read(c.events))
	m.HandleFunc("GET /console/api/receipts", c.read(c.receipts))
	m.HandleFunc("GET /console/api/receipts/{id}", c.read(c.receipt))
	m.HandleFunc("GET /console/api/receipts/{id}/bundle", c.read(c.bundle))
	m.HandleFunc("GET /console/api/operations/{id}", c.read(c.operation))
	m.HandleFunc("GET /console/api/receipts/{id}/record", c.read(c.record))
	m.HandleFunc("GET /console/api/tokens", c.read(c.readsAll(c.tokens)))
	m.HandleFunc("POST /console/api/tokens/{jti}/revoke", c.mutate(c.adminOnly(c.revoke)))
	unknown := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no console endpoint "+r.Method+" "+r.URL.Path)
	}
	m.HandleFunc("GET /console/api/", unknown)
	m.HandleFunc("POST /console/api/", unknown)
}

type handler func(w http.ResponseWriter, r *http.Request, s *session)

// read wraps a GET endpoint: it needs a live session.
func (c *Console) read(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.session(w, r)
		if ok {
			h(w, r, s)
		}
	}
}

// mutate wraps a state-changing endpoint: same origin, a JSON body and a
// live session. The session's key in its header is what a forged form or
// a request of another origin cannot send, so it is the CSRF token too.
func (c *Console) mutate(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !checkRequest(w, r) {
			return
		}
		s, ok := c.session(w, r)
		if ok {
			h(w, r, s)
		}
	}
}

func (c *Console) adminOnly(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if s.role != RoleAdmin {
			writeError(w, http.StatusForbidden, "only the admin credential may do this")
			return
		}
		h(w, r, s)
	}
}

// readsAll admits the sessions that read everything: the admin and
// auditors.
func (c *Console) readsAll(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if !s.access.All {
			writeError(w, http.StatusForbidden, "only the admin credential or an auditor may read this")
			return
		}
		h(w, r, s)
	}
}

// checkRequest refuses a state-changing request that does not come from
// the console's own origin or whose body is not JSON: a form posted from
// another site can do neither.
func checkRequest(w http.ResponseWriter, r *http.Request) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	origin := r.Header.Get("Origin")
	switch {
	case origin == "" && r.Header.Get("Sec-Fetch-Site") != "same-origin":
		writeError(w, http.StatusForbidden, "cross-origin request refused: no Origin header")
		return false
	case origin != "" && origin != scheme+"://"+r.Host:
		writeError(w, http.StatusForbidden, "cross-origin request refused: origin "+origin)
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "the body must be application/json")
		return false
	}
	return true
}

// session returns the live session whose key r's X-Console-Key header
// holds, when r also carries the session's cookie, re-checking its
// credential (a revoked or expired token ends the session). Anything
// else is 401: no key, a key of no session, or a key without its cookie
// (the key alone, taken from a page, is no more a session than the
// cookie alone).
func (c *Console) session(w http.ResponseWriter, r *http.Request) (*session, bool) {
	key := r.Header.Get(keyHeader)
	if key == "" {
		writeError(w, http.StatusUnauthorized, "sign in first: no "+keyHeader+" header")
		return nil, false
	}
	c.mu.Lock()
	s := c.sessions[key]
	c.mu.Unlock()
	if s == nil {
		writeError(w, http.StatusUnauthorized, errEnded.Error())
		return nil, false
	}
	if !hasCookie(r, s.browser) {
		writeError(w, http.StatusUnauthorized, "the session's cookie is missing: it was signed in from another browser, or its cookie was replaced; sign in again")
		return nil, false
	}
	if err := c.check(s); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil, false
	}
	return s, true
}

// hasCookie reports whether one of r's cookies of the console's name has
// the value v. All of them count: a page on another port of the host can
// add one of a longer path, which the browser sends first.
func hasCookie(r *http.Request, v string) bool {
	for _, ck := range r.CookiesNamed(cookieName) {
		if subtle.ConstantTimeCompare([]byte(ck.Value), []byte(v)) == 1 {
			return true
		}
	}
	return false
}

// browserOf returns the browser binding of a sign-in: the value of r's
// console cookie when a live session is bound to it, so that the
// browser's other tabs stay signed in, else a new random one (a value
// planted by a page on another port is never adopted).
func (c *Console) browserOf(r *http.Request) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ck := range r.CookiesNamed(cookieName) {
		for _, s := range c.sessions {
			if subtle.ConstantTimeCompare([]byte(ck.Value), []byte(s.browser)) == 1 {
				return s.browser
			}
		}
	}
	return randomID()
}

// errEnded: the session was signed out, evicted or expired.
var errEnded = errors.New("the session has ended; sign in again")

// check reports why session s may no longer be used, nil while it may:
// it ended (signed out, evicted, expired: errEnded), or its credential no
// longer verifies (a revoked or expired token, an admin credential that
// is no longer the kernel's). A session that fails is dropped. Every
// request and the event stream (on each heartbeat and before each event)
// check it.
func (c *Console) check(s *session) error {
	c.mu.Lock()
	live := c.sessions[s.id] == s
	c.mu.Unlock()
	if !live {
		return errEnded
	}
	var err error
	switch {
	case !c.now().Before(s.expires):
		err = errEnded
	case s.role == RoleAdmin:
		if !c.k.IsAdmin(s.cred) {
			err = errors.New("the credential no longer verifies: it is not this kernel's admin credential")
		}
	default:
		if _, verr := c.k.VerifyBearer(s.cred); verr != nil {
			err = fmt.Errorf("the credential no longer verifies: %w", verr)
		}
	}
	if err != nil {
		c.drop(s)
	}
	return err
}

// drop ends session s (if it has not ended already).
func (c *Console) drop(s *session) {
	c.mu.Lock()
	if c.sessions[s.id] == s {
		c.remove(s)
	}
	c.mu.Unlock()
}

// remove deletes s, a kept session, from both indexes; c.mu is held.
func (c *Console) remove(s *session) {
	delete(c.sessions, s.id)
	own := slices.DeleteFunc(c.byCred[s.cred], func(o *session) bool { return o == s })
	if len(own) == 0 {
		delete(c.byCred, s.cred)
		return
	}
	c.byCred[s.cred] = own
}

// add keeps the new session s. A credential holds at most maxPerCred
// sessions: beyond that its own oldest is dropped, so signing in again
// and again with one credential signs out nobody else. Once all
// sessions number maxSessions (which takes at least
// maxSessions/maxPerCred credentials), the sessions that would fail
// their next check (expired, credential no longer verifying) are dropped
// first; then, as the last resort, the oldest session of the credential
// holding the most sessions, so a credential loses a session to another
// only when none holds more than it does.
func (c *Console) add(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if own := c.byCred[s.cred]; len(own) >= c.maxPerCred {
		c.remove(own[0])
	}
	if len(c.sessions) >= c.maxSessions {
		now := c.now()
		for _, o := range c.sessions {
			if !now.Before(o.expires) || !c.verifies(o) {
				c.remove(o)
			}
		}
	}
	if len(c.sessions) >= c.maxSessions {
		var most []*session
		for _, own := range c.byCred {
			if len(own) > len(most) || len(own) == len(most) && own[0].created.Before(most[0].created) {
				most = own
			}
		}
		c.remove(most[0])
	}
	c.sessions[s.id] = s
	c.byCred[s.cred] = append(c.byCred[s.cred], s)
}

// verifies reports whether s's credential still verifies.
func (c *Console) verifies(s *session) bool {
	if s.role == RoleAdmin {
		return c.k.IsAdmin(s.cred)
	}
	_, err := c.k.VerifyBearer(s.cred)
	return err == nil
}

// LoginRequest is the body of POST /console/api/login.
type LoginRequest struct {
	Credential string `json:"credential"`
}

// SessionInfo is what the page learns of its session.
type SessionInfo struct {
	// Key is the session's key, which every later request sends in the
	// X-Console-Key header. It is in the answer to the sign-in only,
	// never in GET /console/api/session's.
	Key       string `json:"key,omitempty"`
	Role      string `json:"role"`
	Subject   string `json:"subject"`
	ExpiresAt string `json:"expires_at"`
	// CanDecide: the session may approve or deny (approver and
	// escalation credentials), so the page can offer it from the start.
	CanDecide bool `json:"can_decide"`
	// CanRevoke: the session may revoke tokens (the admin credential).
	CanRevoke bool `json:"can_revoke"`
	// ReadsAll: the session reads every record in full, payloads
	// included (the admin credential and auditor tokens); otherwise it
	// reads records only as their public part.
	ReadsAll bool `json:"reads_all"`
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !checkRequest(w, r) {
		return
	}
	var req LoginRequest
	if !readJSON(w, r, &req) {
		return
	}
	now := c.now()
	s := &session{cred: strings.TrimSpace(req.Credential), created: now, expires: now.Add(SessionTTL)}
	switch {
	case s.cred == "":
		writeError(w, http.StatusBadRequest, "credential is required")
		return
	case c.k.IsAdmin(s.cred):
		s.role, s.subject, s.access = RoleAdmin, "admin", kernel.AccessAll
	case strings.HasPrefix(s.cred, kernel.AdminPrefix):
		writeError(w, http.StatusUnauthorized, "the admin credential is wrong")
		return
	default:
		tok, err := c.k.VerifyBearer(s.cred)
		if err != nil {
			writeError(w, http.StatusUnauthorized, "the credential does not verify: "+err.Error())
			return
		}
		switch tok.Claims.Cap.Role {
		case "":
			writeError(w, http.StatusForbidden, "an agent's capability token cannot sign in; use an approver, auditor or admin credential")
			return
		case RoleApprover, RoleEscalation, RoleAuditor:
			s.role = tok.Claims.Cap.Role
		default:
			writeError(w, http.StatusForbidden, fmt.Sprintf("role %q cannot sign in", tok.Claims.Cap.Role))
			return
		}
		s.access = kernel.AccessOf(tok)
		s.subject, s.jti = tok.Claims.Subject, tok.Claims.ID
		if tok.Claims.Expiry.Before(s.expires) {
			s.expires = tok.Claims.Expiry
		}
	}
	s.id, s.browser = randomID(), c.browserOf(r)
	c.add(s)
	// A browser session cookie (no Expires): it binds the browser's
	// sessions, each of which ends on its own clock; no page may read it.
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.browser, Path: Prefix,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	out := info(s)
	out.Key = s.id
	writeJSON(w, http.StatusOK, out)
}

// canDecide reports whether the session's credential may decide approvals.
func (s *session) canDecide() bool { return s.role == RoleApprover || s.role == RoleEscalation }

func info(s *session) SessionInfo {
	return SessionInfo{Role: s.role, Subject: s.subject, ExpiresAt: s.expires.UTC().Format(time.RFC3339),
		CanDecide: s.canDecide(), CanRevoke: s.role == RoleAdmin, ReadsAll: s.access.All}
}

// logout ends the session. Its body is {} (read strictly like every
// other body, so a body the rules refuse signs nobody out). The cookie
// stays: it binds the browser's other tabs' sessions too.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	if !readJSON(w, r, &struct{}{}) {
		return
	}
	c.drop(s)
	writeJSON(w, http.StatusOK, map[string]bool{"signed_out": true})
}

// whoami answers the page after a reload: the session's role and what it
// may do. It never answers with the key: a request gets here only with
// it.
func (c *Console) whoami(w http.ResponseWriter, _ *http.Request, s *session) {
	writeJSON(w, http.StatusOK, info(s))
}

func randomID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// ErrorBody is the body of every console error.
type ErrorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// readJSON decodes a small JSON body into v by the strictjson rules, as
// every body of the HTTP API is read (docs/http.md "Strict JSON"): one
// value, no duplicate member names, names matched exactly, no member v
// does not define. A refusal is 400 naming the member (413 over maxBody).
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		err = strictjson.Unmarshal(data, v)
	}
	if err != nil {
		status := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		writeError(w, status, "request body: "+err.Error())
		return false
	}
	return true
}
