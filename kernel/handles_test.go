package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

var handleForm = regexp.MustCompile(`^/object/[a-z2-7]{26}$`)

func inSession(s string) func(*Envelope) {
	return func(e *Envelope) { e.Provenance = json.RawMessage(`{"session_id":"` + s + `"}`) }
}

func withToken(tok, jti string) func(*Envelope) {
	return func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
}

// handlesOf lists the session's handles by tool.
func (h *harness) handlesOf(tok, session string) map[string]string {
	h.t.Helper()
	hs, err := h.k.Handles(tok, session)
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]string{}
	for _, x := range hs {
		if !handleForm.MatchString(x.Handle) {
			h.t.Fatalf("handle %q is not /object/ and 26 base32 characters", x.Handle)
		}
		m[x.Tool] = x.Handle
	}
	return m
}

func TestHandles(t *testing.T) {
	now := time.Now()
	clock := &now
	var mu sync.Mutex
	h := newHarness(t, func(c *Config) {
		c.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return *clock }
	})
	h.write("a.txt", "hello")
	// Tokens outliving the handle TTL, so that the TTL is what ends handles.
	mint := func() (string, string) {
		tok, c, err := h.k.MintToken(captoken.Claims{Subject: h.agent, Expiry: now.Add(3 * DefaultHandleTTL),
			Cap: captoken.Capability{Tools: []string{"fs.read", "echo"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}}, Handles: true}})
		if err != nil {
			t.Fatal(err)
		}
		return tok, c.ID
	}
	tok, jti := mint()
	other, otherJTI := mint()
	mine := h.handlesOf(tok, "s1")
	if len(mine) != 2 || mine["echo"] == "" || mine["fs.read"] == "" || mine["echo"] == mine["fs.read"] {
		t.Fatalf("handles = %v", mine)
	}
	if again := h.handlesOf(tok, "s1"); again["echo"] != mine["echo"] {
		t.Fatal("listing again changed a live handle")
	}
	if h.handlesOf(tok, "s2")["echo"] == mine["echo"] {
		t.Fatal("two sessions share a handle")
	}
	theirs := h.handlesOf(other, "s1")

	// A call by handle runs the tool; the audit names the tool and notes the handle.
	r := h.invoke(mine["fs.read"], map[string]any{"path": "a.txt"}, withToken(tok, jti), inSession("s1"))
	mustOK(t, r)
	if r.ToolID != "fs.read" {
		t.Fatalf("result tool_id = %q", r.ToolID)
	}
	as := h.audits(0)
	if last := as[len(as)-1]; last.ToolID != "fs.read" || string(last.Notes["handle"]) != `"`+mine["fs.read"]+`"` {
		t.Fatalf("audit record: tool %q, notes %s", last.ToolID, last.Notes)
	}

	// Every way of not holding the handle gets the answer an unknown tool gets.
	unknown := h.invoke("/object/aaaaaaaaaaaaaaaaaaaaaaaaaa", map[string]any{"text": "x"}, withToken(tok, jti), inSession("s1"))
	if errClass(unknown) != ErrToolNotFound {
		t.Fatalf("unknown handle: %+v", unknown.Error)
	}
	nothingRevealed := func(name string, r *Result, sent string) {
		t.Helper()
		if errClass(r) != ErrToolNotFound || r.Error.Message != `no syscall "`+sent+`"` {
			t.Fatalf("%s: %+v", name, r.Error)
		}
	}
	nothingRevealed("by name in handle mode", h.invoke("echo", map[string]any{"text": "x"}, withToken(tok, jti), inSession("s1")), "echo")
	nothingRevealed("another session's handle", h.invoke(mine["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s2")), mine["echo"])
	nothingRevealed("no session", h.invoke(mine["echo"], map[string]any{"text": "x"}, withToken(tok, jti)), mine["echo"])
	nothingRevealed("another token's handle", h.invoke(theirs["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s1")), theirs["echo"])
	nothingRevealed("a handle used with another token", h.invoke(mine["echo"], map[string]any{"text": "x"}, withToken(other, otherJTI), inSession("s1")), mine["echo"])

	// A session's end kills its handles, and only its own.
	s3 := h.handlesOf(tok, "s3")
	if n := h.k.EndSession("s1", ""); n != 4 {
		t.Fatalf("EndSession ended %d handles, want 4", n)
	}
	nothingRevealed("after the session ended", h.invoke(mine["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s1")), mine["echo"])
	mustOK(t, h.invoke(s3["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s3")))

	// The TTL.
	mu.Lock()
	*clock = clock.Add(DefaultHandleTTL + time.Second)
	mu.Unlock()
	nothingRevealed("expired", h.invoke(s3["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s3")), s3["echo"])
	fresh := h.handlesOf(tok, "s3")
	if fresh["echo"] == s3["echo"] {
		t.Fatal("an expired handle was handed out again")
	}
	// Expired handles are forgotten, not kept: only s3's fresh two remain.
	h.k.handles.mu.Lock()
	live := len(h.k.handles.by)
	h.k.handles.mu.Unlock()
	if live != 2 {
		t.Fatalf("%d handles in the table after the TTL, want the 2 just listed", live)
	}
	mustOK(t, h.invoke(fresh["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s3")))

	// Revocation.
	if err := h.k.Revoke(context.Background(), jti, "test"); err != nil {
		t.Fatal(err)
	}
	if r := h.invoke(fresh["echo"], map[string]any{"text": "x"}, withToken(tok, jti), inSession("s3")); errClass(r) != ErrTokenRevoked {
		t.Fatalf("revoked token's handle: %+v", r.Error)
	}
	if _, err := h.k.Handles(tok, "s4"); err == nil {
		t.Fatal("a revoked token got handles")
	}
	if _, err := h.k.Handles(other, ""); err == nil {
		t.Fatal("handles without a session")
	}
}

// Tokens not in handle mode keep calling by name, and may use handles too.
func TestHandlesOptional(t *testing.T) {
	h := newHarness(t)
	mustOK(t, h.invoke("echo", map[string]any{"text": "by name"}))
	hs := h.handlesOf(h.token, "s")
	mustOK(t, h.invoke(hs["echo"], map[string]any{"text": "by handle"}, inSession("s")))
}

// Concurrent listing, calling and ending of sessions (run with -race).
func TestHandlesConcurrent(t *testing.T) {
	h := newHarness(t)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := string(rune('a' + w))
			for range 5 {
				hs := h.handlesOf(h.token, s)
				r := h.invoke(hs["echo"], map[string]any{"text": "x"}, inSession(s))
				if r.Status != StatusOK && errClass(r) != ErrToolNotFound {
					t.Errorf("%+v", r.Error)
				}
				h.k.EndSession(s, "")
			}
		}()
	}
	wg.Wait()
}

// The handle table, which any token's holder can ask to grow, is bounded:
// session ids of at most MaxSessionIDBytes, no entry for a token that
// may call no tool or for an approver's, at most MaxHandleSessions
// sessions a token (until one ends or its handles expire, which a later
// request sweeps).
func TestHandleTableBounded(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarness(t, func(c *Config) { c.Now = clock })
	for _, s := range []string{strings.Repeat("s", MaxSessionIDBytes+1), "a\x00b", "bad\xff"} {
		if _, err := h.k.Handles(h.token, s); !errors.Is(err, ErrSessionID) {
			t.Errorf("session %.20q: %v, want ErrSessionID", s, err)
		}
	}
	if _, err := h.k.Handles(h.approver("alice", captoken.RoleApprover), "s"); !errors.Is(err, ErrHandleRole) {
		t.Errorf("an approver's token: %v, want ErrHandleRole", err)
	}
	none, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"no.such.tool"}})
	if hs, err := h.k.Handles(none, "s"); err != nil || len(hs) != 0 {
		t.Errorf("a token calling no tool: %v %v, want no handles", hs, err)
	}
	if n := len(h.k.handles.owner); n != 0 {
		t.Fatalf("%d table entries after refusals and a token without tools, want 0", n)
	}

	for i := range MaxHandleSessions {
		if _, err := h.k.Handles(h.token, fmt.Sprint("s", i)); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
	}
	if _, err := h.k.Handles(h.token, "one-too-many"); !errors.Is(err, ErrHandleLimit) {
		t.Fatalf("session %d: %v, want ErrHandleLimit", MaxHandleSessions+1, err)
	}
	if _, err := h.k.Handles(h.token, "s7"); err != nil {
		t.Fatalf("a session that holds handles already: %v", err)
	}
	h.k.EndSession("s7", "")
	if _, err := h.k.Handles(h.token, "one-too-many"); err != nil {
		t.Fatalf("after a session ended: %v", err)
	}
	mu.Lock()
	now = now.Add(DefaultHandleTTL + time.Second)
	mu.Unlock()
	if _, err := h.k.Handles(h.token, "after-expiry"); err != nil {
		t.Fatalf("after every handle expired: %v", err)
	}
	if n, m := len(h.k.handles.owner), h.k.handles.sessions[h.jti]; n != 1 || m != 1 {
		t.Fatalf("%d entries, %d counted for the token after expiry, want 1 and 1", n, m)
	}

	// Attenuations, which a holder makes at will, count with their root
	// token: they do not add sessions of their own, and another family
	// still gets handles.
	h2 := newHarness(t)
	for i := range MaxHandleSessions {
		if _, err := h2.k.Handles(h2.token, fmt.Sprint("t", i)); err != nil {
			t.Fatalf("session t%d: %v", i, err)
		}
	}
	child := h2.attenuate(AttenuateRequest{Parent: h2.token, Tools: []string{"echo"}})
	if _, err := h2.k.Handles(child.Token, "child-session"); !errors.Is(err, ErrHandleLimit) {
		t.Fatalf("an attenuation of a token at its limit: %v, want ErrHandleLimit", err)
	}
	other, _ := h2.mint("agent-2", captoken.Capability{Tools: []string{"echo"}})
	if _, err := h2.k.Handles(other, "other-session"); err != nil {
		t.Fatalf("another family while one is at its limit: %v", err)
	}
}
