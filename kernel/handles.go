package kernel

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
)

// HandlePrefix starts every tool handle: "/object/" and 26 characters of
// unpadded lower-case base32 encoding 128 random bits (docs/kernel.md,
// Handles).
const HandlePrefix = "/object/"

// DefaultHandleTTL is how long a handle lives unless its token expires or
// is revoked, or its session ends, first.
const DefaultHandleTTL = time.Hour

var handleEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// handleNameLen is the length of a handle's name: 128 bits in base32.
var handleNameLen = handleEncoding.EncodedLen(16)

// Handle is a per-session name of a tool a token may call: what a session
// in handle mode sees instead of the tool's id.
type Handle struct {
	Handle      string              `json:"handle"` // "/object/<base32>"
	Tool        string              `json:"tool"`
	Description string              `json:"description"`
	InputSchema json.RawMessage     `json:"input_schema"`
	SideEffect  syscalls.SideEffect `json:"side_effect"`
	ExpiresAt   string              `json:"expires_at"` // RFC 3339, UTC
}

// binding is what a handle stands for: one tool, for one token, in one
// session, until expires.
type binding struct {
	session, jti, tool string
	expires            time.Time
}

// handles is the kernel's handle table. It lives in memory: a kernel
// restart ends every session, and with it every handle.
type handles struct {
	mu       sync.Mutex
	by       map[string]binding              // handle → binding
	owner    map[[2]string]map[string]string // (session, jti) → tool → handle; never empty
	family   map[[2]string]string            // (session, jti) → the token's family (see family)
	sessions map[string]int                  // token family (root jti) → its entries in owner
	swept    time.Time                       // when sweepLocked last ran
}

func newHandles() *handles {
	return &handles{by: map[string]binding{}, owner: map[[2]string]map[string]string{}, family: map[[2]string]string{}, sessions: map[string]int{}}
}

// Bounds of the handle table, which any token's holder can ask to grow:
// each (session, token) entry holds a handle per tool for up to an hour.
const (
	// MaxSessionIDBytes bounds a session id given handles.
	MaxSessionIDBytes = 256
	// MaxHandleSessions bounds the sessions one token family (a root
	// token and every attenuation of it, which its holders make at will)
	// holds handles in.
	MaxHandleSessions = 1024
	// MaxHandleEntries bounds the (session, token) entries of the table.
	MaxHandleEntries = 65536
)

var (
	// ErrNoSession refuses handles outside a session: a handle is bound
	// to one.
	ErrNoSession = errors.New("handles: a session id is required")
	// ErrSessionID refuses a session id over MaxSessionIDBytes, or not
	// UTF-8 without control characters, or holding the admin
	// credential's prefix (validSessionID).
	ErrSessionID = errors.New("handles: a session id is at most 256 bytes of UTF-8 without control characters or " + AdminPrefix)
	// ErrHandleRole refuses an approver's or auditor's token: it calls no
	// tool.
	ErrHandleRole = errors.New("handles: approver and auditor tokens call no tools, so they get no handles")
	// ErrHandleLimit refuses handles in a new session once the token's
	// family holds them in MaxHandleSessions sessions, or the table holds
	// MaxHandleEntries: end sessions (POST /v1/sessions/{id}/end) or wait
	// for their handles to expire.
	ErrHandleLimit = errors.New("handles: too many sessions hold handles")
)

// Handles returns the handles the session sees for the tools token may
// call, minting those it lacks: the same handle for a tool while it
// lives. A token that does not verify as a bearer credential is refused
// with a *captoken.Error.
func (k *Kernel) Handles(token, session string) ([]Handle, error) {
	tok, err := k.VerifyBearer(token)
	if err != nil {
		return nil, err
	}
	switch {
	case session == "":
		return nil, ErrNoSession
	case !validSessionID(session):
		return nil, ErrSessionID
	case tok.Claims.Cap.Role != "":
		return nil, ErrHandleRole
	}
	var tools []syscalls.Definition
	for _, d := range k.registry.List() {
		if tok.AllowsTool(d.ID) {
			tools = append(tools, d)
		}
	}
	if len(tools) == 0 {
		return []Handle{}, nil // nothing to bind, nothing kept
	}
	now := k.cfg.Now()
	exp := now.Add(DefaultHandleTTL)
	if tok.Claims.Expiry.Before(exp) {
		exp = tok.Claims.Expiry
	}
	key := [2]string{session, tok.Claims.ID}
	t := k.handles
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	mine := t.owner[key]
	if mine == nil {
		fam := family(tok.Claims)
		if t.sessions[fam] >= MaxHandleSessions || len(t.owner) >= MaxHandleEntries {
			return nil, ErrHandleLimit
		}
		mine = map[string]string{}
		t.owner[key] = mine
		t.family[key] = fam
		t.sessions[fam]++
	}
	var out []Handle
	for _, d := range tools {
		h, ok := mine[d.ID]
		if b, live := t.by[h]; !ok || !live || !now.Before(b.expires) {
			delete(t.by, h)
			var raw [16]byte
			rand.Read(raw[:])
			h = HandlePrefix + handleEncoding.EncodeToString(raw[:])
			t.by[h] = binding{session: session, jti: tok.Claims.ID, tool: d.ID, expires: exp}
			mine[d.ID] = h
		}
		out = append(out, Handle{Handle: h, Tool: d.ID, Description: d.Description, InputSchema: d.InputSchema,
			SideEffect: d.SideEffect, ExpiresAt: t.by[h].expires.UTC().Format(time.RFC3339)})
	}
	return out, nil
}

// EndSession ends a session's handles: those of every token when jti is
// "", else those of the token jti. It returns how many ended.
func (k *Kernel) EndSession(session, jti string) int {
	t := k.handles
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for key, mine := range t.owner {
		if key[0] != session || (jti != "" && key[1] != jti) {
			continue
		}
		for _, h := range mine {
			if _, ok := t.by[h]; ok {
				delete(t.by, h)
				n++
			}
		}
		t.forgetLocked(key)
	}
	return n
}

// forgetLocked removes the entry key from owner. The caller holds h.mu.
func (h *handles) forgetLocked(key [2]string) {
	if _, ok := h.owner[key]; !ok {
		return
	}
	fam := h.family[key]
	delete(h.owner, key)
	delete(h.family, key)
	if h.sessions[fam]--; h.sessions[fam] <= 0 {
		delete(h.sessions, fam)
	}
}

// family names the tokens that count together against MaxHandleSessions:
// a root token's jti, shared by every attenuation of it.
func family(c captoken.Claims) string {
	if a := c.Cap.Ancestors; len(a) > 0 {
		return a[0].ID
	}
	return c.ID
}

// sweepLocked forgets expired handles, so that sessions nobody ends do
// not hold their entries: at most once a second, since it walks the whole
// table. The caller holds h.mu.
func (h *handles) sweepLocked(now time.Time) {
	if now.Sub(h.swept) < time.Second && !now.Before(h.swept) {
		return
	}
	h.swept = now
	for hd, b := range h.by {
		if now.Before(b.expires) {
			continue
		}
		delete(h.by, hd)
		key := [2]string{b.session, b.jti}
		delete(h.owner[key], b.tool)
		if len(h.owner[key]) == 0 {
			h.forgetLocked(key)
		}
	}
}

// dropToken ends every handle of the token jti (on its revocation).
func (h *handles) dropToken(jti string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, mine := range h.owner {
		if key[1] != jti {
			continue
		}
		for _, hd := range mine {
			delete(h.by, hd)
		}
		h.forgetLocked(key)
	}
}

// boundTool returns the tool of handle h when the table still holds its
// binding to the token jti, expired or not, or false: what the audit
// record of a call refused before its handle resolved may go by.
func (h *handles) boundTool(handle, jti string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.by[handle]
	if !ok || b.jti != jti {
		return "", false
	}
	return b.tool, true
}

// resolveTool returns the tool c addresses: the handle's tool for a
// handle bound to c's session and token and not expired; the name itself
// for a token not in handle mode; else false, which the pipeline answers
// exactly as it answers a tool that does not exist, so a guessed, stale or
// foreign handle reveals nothing.
func (k *Kernel) resolveTool(c *call) (string, bool) {
	id := c.env.ToolID
	if !strings.HasPrefix(id, HandlePrefix) {
		return id, !c.token.Claims.Cap.Handles
	}
	t := k.handles
	t.mu.Lock()
	b, ok := t.by[id]
	t.mu.Unlock()
	if !ok || c.session == "" || b.session != c.session || b.jti != c.token.Claims.ID || !k.cfg.Now().Before(b.expires) {
		return "", false
	}
	return b.tool, true
}
