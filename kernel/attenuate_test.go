package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// as makes an envelope use the minted token t.
func as(t *MintedToken) func(*Envelope) {
	return func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = t.AgentID, t.Token, t.ID }
}

func (h *harness) attenuate(req AttenuateRequest) *MintedToken {
	h.t.Helper()
	m, err := h.k.Attenuate(context.Background(), req)
	if err != nil {
		h.t.Fatalf("Attenuate: %v", err)
	}
	return m
}

func TestAttenuateRefuses(t *testing.T) {
	h := newHarness(t)
	parent, _ := h.mint(h.agent, captoken.Capability{
		Tools: []string{"fs.*", "echo"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}},
		Net: []string{"api.example.com:443"}, Budgets: map[string]int64{"calls": 10}, Autonomy: "soft_gate",
	})
	approver, _ := h.mint("alice", captoken.Capability{Role: captoken.RoleApprover})
	revoked, revokedID := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}})
	if err := h.k.Revoke(context.Background(), revokedID, "test"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		req   AttenuateRequest
		class string
	}{
		{"tool outside", AttenuateRequest{Parent: parent, Tools: []string{"proc.exec"}}, ErrScopeDenied},
		{"all tools", AttenuateRequest{Parent: parent, Tools: []string{"*"}}, ErrScopeDenied},
		{"path outside", AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: filepath.Dir(h.ws), Mode: "r"}}}, ErrScopeDenied},
		{"mode upgraded", AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}}, ErrScopeDenied},
		{"host added", AttenuateRequest{Parent: parent, Net: []string{"evil.example.com"}}, ErrScopeDenied},
		{"budget beyond", AttenuateRequest{Parent: parent, Budgets: map[string]int64{"calls": 11}}, ErrScopeDenied},
		{"autonomy raised", AttenuateRequest{Parent: parent, Autonomy: "autopilot"}, ErrScopeDenied},
		{"outlives parent", AttenuateRequest{Parent: parent, TTLSeconds: 7200}, ErrScopeDenied},
		{"approver parent", AttenuateRequest{Parent: approver}, ErrScopeDenied},
		{"forged parent", AttenuateRequest{Parent: tamper(parent)}, ErrTokenInvalid},
		{"no parent", AttenuateRequest{}, ErrTokenInvalid},
		{"revoked parent", AttenuateRequest{Parent: revoked}, ErrTokenRevoked},
		{"negative ttl", AttenuateRequest{Parent: parent, TTLSeconds: -1}, ErrInvalidArgs},
		// 2^64 ns and 0.29 s: as a time.Duration it wrapped to 0.29 s.
		{"a ttl that wraps around", AttenuateRequest{Parent: parent, TTLSeconds: 18446744074}, ErrInvalidArgs},
		{"another agent", AttenuateRequest{Parent: parent, AgentID: "agent-2"}, ErrScopeDenied},
		{"a prefix that is not a sub-agent", AttenuateRequest{Parent: parent, AgentID: h.agent + "x/sub"}, ErrScopeDenied},
		{"an empty sub-agent name", AttenuateRequest{Parent: parent, AgentID: h.agent + "/"}, ErrScopeDenied},
		{"a sub-agent id no call would take", AttenuateRequest{Parent: parent, AgentID: h.agent + "/" + strings.Repeat("x", 300)}, ErrInvalidArgs},
		{"a control character", AttenuateRequest{Parent: parent, AgentID: h.agent + "/a\nb"}, ErrInvalidArgs},
	}
	before := h.headSize()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.k.Attenuate(context.Background(), c.req)
			var ae *AttenuateError
			if !errors.As(err, &ae) || ae.Class != c.class {
				t.Fatalf("Attenuate = %v, want class %s", err, c.class)
			}
		})
	}
	if after := h.headSize(); after != before {
		t.Fatalf("refused attenuations appended %d ledger entries", after-before)
	}
	// Narrowing every dimension is allowed, and inherits what it leaves out.
	child := h.attenuate(AttenuateRequest{Parent: parent, AgentID: h.agent + "/sub", Tools: []string{"fs.read"}, Budgets: map[string]int64{"calls": 3}, TTLSeconds: 60})
	if child.Cap.Autonomy != "soft_gate" || !slices.Equal(child.Cap.Net, []string{"api.example.com:443"}) || child.Cap.Budgets["calls"] != 3 || child.AgentID != h.agent+"/sub" {
		t.Fatalf("child grants %+v", child.Cap)
	}
}

// Two children of one parent, calling at once through both the direct
// (echo) and the transactional (fs.write) path, never spend more than the
// parent's budget between them, though each child's own budget would allow
// it.
func TestAttenuatedChildrenShareParentBudget(t *testing.T) {
	h := newHarness(t)
	const limit = 10
	parent, parentID := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Budgets: map[string]int64{"calls": limit}})
	a := h.attenuate(AttenuateRequest{Parent: parent, AgentID: h.agent + "/sub-a"})
	b := h.attenuate(AttenuateRequest{Parent: parent, AgentID: h.agent + "/sub-b"})
	var mu sync.Mutex
	ok, refused := 0, 0
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				var r *Result
				if w%2 == 0 {
					r = h.k.Invoke(context.Background(), h.env("echo", map[string]any{"text": "x"}, as(a)))
				} else {
					r = h.k.Invoke(context.Background(), h.env("fs.write", map[string]any{"path": fmt.Sprintf("f%d-%d.txt", w, i), "content": "x"}, as(b), key(fmt.Sprint(w, "-", i))))
				}
				mu.Lock()
				switch {
				case r.Status == StatusOK:
					ok++
				case errClass(r) == ErrBudgetExceeded:
					refused++
				default:
					t.Errorf("call: %+v", r.Error)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != limit || refused != 32-limit {
		t.Fatalf("%d calls ran and %d were refused; the parent allows %d", ok, refused, limit)
	}
	// And the parent itself has nothing left either.
	r := h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = parent, parentID })
	if errClass(r) != ErrBudgetExceeded {
		t.Fatalf("parent's own call after its children spent its budget: %+v", r.Error)
	}
}

// Revoking an ancestor refuses every descendant, even one whose token
// the kernel has verified (and cached) before.
func TestAttenuationCascadeRevocation(t *testing.T) {
	h := newHarness(t)
	root, rootID := h.mint(h.agent, captoken.Capability{Tools: []string{"echo"}})
	child := h.attenuate(AttenuateRequest{Parent: root, AgentID: h.agent + "/child"})
	grandchild := h.attenuate(AttenuateRequest{Parent: child.Token, AgentID: h.agent + "/child/grandchild"})
	if got := grandchild.Cap.Ancestors; len(got) != 2 || got[0].ID != rootID || got[1].ID != child.ID || grandchild.Cap.Parent != child.ID {
		t.Fatalf("grandchild's chain = %+v, parent %q", got, grandchild.Cap.Parent)
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "before"}, as(grandchild)))
	if err := h.k.Revoke(context.Background(), rootID, "compromised"); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []*MintedToken{child, grandchild} {
		if r := h.invoke("echo", map[string]any{"text": "after"}, as(tok)); errClass(r) != ErrTokenRevoked {
			t.Fatalf("%s after its root's revocation: %+v", tok.AgentID, r.Error)
		}
	}
	var ae *AttenuateError
	if _, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: grandchild.Token}); !errors.As(err, &ae) || ae.Class != ErrTokenRevoked {
		t.Fatalf("attenuating a revoked descendant: %v", err)
	}
}

// The ledger records every attenuation with its chain, and the depth is
// bounded.
func TestAttenuationLedgerAndDepth(t *testing.T) {
	h := newHarness(t)
	tok, rootID := h.mint(h.agent, captoken.Capability{Tools: []string{"echo"}})
	chain := []string{rootID}
	from := h.headSize()
	for range captoken.MaxChainDepth {
		m := h.attenuate(AttenuateRequest{Parent: tok})
		tok = m.Token
		chain = append(chain, m.ID)
	}
	_, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: tok})
	var ae *AttenuateError
	if !errors.As(err, &ae) || ae.Class != ErrScopeDenied {
		t.Fatalf("attenuation %d: %v, want refused", captoken.MaxChainDepth+1, err)
	}
	es := h.entries(KindTokenAttenuated, from)
	if len(es) != captoken.MaxChainDepth {
		t.Fatalf("%d %s entries, want %d", len(es), KindTokenAttenuated, captoken.MaxChainDepth)
	}
	for i, e := range es {
		var rec struct {
			JTI       string   `json:"jti"`
			Parent    string   `json:"parent"`
			Ancestors []string `json:"ancestors"`
			Exp       int64    `json:"exp"`
		}
		if err := json.Unmarshal(e.Body, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.JTI != chain[i+1] || rec.Parent != chain[i] || !slices.Equal(rec.Ancestors, chain[:i+1]) {
			t.Fatalf("entry %d = %+v, want jti %s under %v", i, rec, chain[i+1], chain[:i+1])
		}
		if time.Unix(rec.Exp, 0).After(time.Now().Add(time.Hour + time.Minute)) {
			t.Fatalf("entry %d expires %v, after its root", i, time.Unix(rec.Exp, 0))
		}
	}
	mustVerify(t, h.k.Inspector())
}

// A delegator who can write in its root cannot point a child's root
// outside it with a symbolic link: not one in place at attenuation, and
// not one swapped in afterwards. Commands run only in whole roots.
func TestAttenuatedRootSymlinks(t *testing.T) {
	h := newHarness(t)
	outside := filepath.Join(filepath.Dir(h.ws), "outside")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("not yours"), 0o644)
	h.write("sub/own.txt", "mine")
	if err := os.Symlink(outside, filepath.Join(h.ws, "link")); err != nil {
		t.Fatal(err)
	}
	parent, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*", "proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	read := func(m *MintedToken, path string) *Result {
		return h.invoke("fs.read", map[string]any{"path": path}, as(m))
	}

	viaLink := h.attenuate(AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: filepath.Join(h.ws, "link"), Mode: "r"}}})
	if viaLink.Cap.FS[0].Base != h.ws {
		t.Fatalf("child root base = %q, want %q", viaLink.Cap.FS[0].Base, h.ws)
	}
	if r := read(viaLink, "secret.txt"); errClass(r) != ErrScopeDenied {
		t.Fatalf("child rooted at a link out of the parent's root: %+v", r)
	}

	os.Mkdir(filepath.Join(h.ws, "sub", "deeper"), 0o755)
	sub := h.attenuate(AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: filepath.Join(h.ws, "sub"), Mode: "r"}}})
	grand := h.attenuate(AttenuateRequest{Parent: sub.Token, FS: []captoken.FSRoot{{Path: filepath.Join(h.ws, "sub", "deeper"), Mode: "r"}}})
	if grand.Cap.FS[0].Base != h.ws {
		t.Fatalf("grandchild's base = %q, want the root token's root %q", grand.Cap.FS[0].Base, h.ws)
	}
	// The delegator swaps its delegated directory for a link to elsewhere.
	os.RemoveAll(filepath.Join(h.ws, "sub"))
	if err := os.Symlink(outside, filepath.Join(h.ws, "sub")); err != nil {
		t.Fatal(err)
	}
	if r := read(sub, "secret.txt"); errClass(r) != ErrScopeDenied {
		t.Fatalf("child after its root was swapped for a link: %+v", r)
	}

	os.MkdirAll(filepath.Join(h.ws, "other"), 0o755)
	narrow := h.attenuate(AttenuateRequest{Parent: parent, Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: filepath.Join(h.ws, "other"), Mode: "rw"}}})
	if r := h.invoke("proc.exec", execArgs("true"), as(narrow), key("narrow-exec")); errClass(r) != ErrScopeDenied {
		t.Fatalf("proc.exec in a narrowed root: %+v", r)
	}
}

// A token's jti is a UUID, as the kernel mints them: MintToken refuses
// another (Revoke could not revoke it), and Revoke refuses a jti that is
// none, recording nothing.
func TestTokenIDsAreUUIDs(t *testing.T) {
	h := newHarness(t)
	if _, _, err := h.k.MintToken(captoken.Claims{ID: "custom-jti-1", Subject: h.agent, Cap: captoken.Capability{Tools: []string{"echo"}}}); !errors.Is(err, ErrNotTokenID) {
		t.Fatalf("MintToken with jti custom-jti-1: %v, want ErrNotTokenID", err)
	}
	before := h.headSize()
	if err := h.k.Revoke(context.Background(), "custom-jti-1", "x"); !errors.Is(err, ErrNotTokenID) || h.headSize() != before {
		t.Fatalf("Revoke of custom-jti-1: %v, head %d → %d", err, before, h.headSize())
	}
}

// A read-only root inside a writable one keeps its files read-only for
// the token, and for every attenuation of it: a child may not have the
// inner root writable, nor take the outer root without the inner one;
// one keeping both writes beside the inner root and not inside it.
func TestAttenuateKeepsNestedReadOnlyRoot(t *testing.T) {
	h := newHarness(t)
	ro := filepath.Join(h.ws, "ro")
	h.write("ro/f", "original")
	ptok, pjti := h.mint(h.agent, captoken.Capability{
		Tools: []string{"fs.*"},
		FS:    []captoken.FSRoot{{Path: h.ws, Mode: "rw"}, {Path: ro, Mode: "r"}},
	})
	write := func(tok, jti, path string) *Result {
		a, _ := json.Marshal(map[string]any{"path": path, "content": "overwritten"})
		return h.k.Invoke(context.Background(), &Envelope{ToolID: "fs.write", Args: a, AgentID: h.agent,
			CapabilityToken: tok, CapabilityTokenID: jti, PolicyHash: h.k.PolicyHash(), IdempotencyKey: "k-" + newID()})
	}
	if r := write(ptok, pjti, "ro/f"); r.Error == nil || r.Error.Class != ErrScopeDenied {
		t.Fatalf("the parent's own write in its read-only root: %+v", r.Error)
	}
	for _, c := range []struct {
		name string
		fs   []captoken.FSRoot
	}{
		{"the read-only root writable", []captoken.FSRoot{{Path: ro, Mode: "rw"}}},
		{"below the read-only root writable", []captoken.FSRoot{{Path: filepath.Join(ro, "sub"), Mode: "rw"}}},
		{"the writable root without the read-only one", []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}},
	} {
		_, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: ptok, FS: c.fs})
		var ae *AttenuateError
		if !errors.As(err, &ae) || ae.Class != ErrScopeDenied || !strings.Contains(ae.Message, "read-only for the parent") {
			t.Errorf("%s: Attenuate = %v, want scope_denied saying the path is read-only for the parent", c.name, err)
		}
	}
	child := h.attenuate(AttenuateRequest{Parent: ptok, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}, {Path: ro, Mode: "r"}}})
	if r := write(child.Token, child.ID, "ro/f"); r.Error == nil || r.Error.Class != ErrScopeDenied {
		t.Errorf("the child's write in the read-only root: %+v", r.Error)
	}
	if r := write(child.Token, child.ID, "beside"); r.Status != StatusOK {
		t.Errorf("the child's write beside the read-only root: %+v", r.Error)
	}
	if b, _ := os.ReadFile(filepath.Join(ro, "f")); string(b) != "original" {
		t.Errorf("ro/f is %q", b)
	}
}

// A root token's root spelled through a link holds, really, a read-only
// root its spelling does not contain (proj → ws, ws/ro:r): an attenuation
// to proj:rw alone is refused, as ws:rw alone is, since the workspace
// takes a path's mode from the roots' real paths; one keeping ws/ro:r, or
// rooted beside it, is granted.
func TestAttenuateResolvesLinkedRoots(t *testing.T) {
	h := newHarness(t)
	ro := filepath.Join(h.ws, "ro")
	h.write("ro/f", "original")
	proj := filepath.Join(filepath.Dir(h.ws), "proj")
	if err := os.Symlink(h.ws, proj); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(h.ws, "other"), 0o755)
	ptok, _ := h.mint(h.agent, captoken.Capability{
		Tools: []string{"fs.*"},
		FS:    []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: ro, Mode: "r"}},
	})
	for _, c := range []struct {
		name string
		fs   []captoken.FSRoot
		ok   bool
	}{
		{"the linked root writable alone", []captoken.FSRoot{{Path: proj, Mode: "rw"}}, false},
		{"a new directory under the link", []captoken.FSRoot{{Path: filepath.Join(proj, "ro", "new"), Mode: "rw"}}, false},
		{"keeping the read-only root", []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: ro, Mode: "r"}}, true},
		{"beside the read-only root", []captoken.FSRoot{{Path: filepath.Join(proj, "other"), Mode: "rw"}}, true},
	} {
		_, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: ptok, FS: c.fs})
		var ae *AttenuateError
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v, want granted", c.name, err)
		case !c.ok && (!errors.As(err, &ae) || ae.Class != ErrScopeDenied || !strings.Contains(ae.Message, "read-only for the parent")):
			t.Errorf("%s: %v, want scope_denied naming the read-only path", c.name, err)
		}
	}
}

// TestMintTTLRange: Mint refuses a ttl_seconds outside 1..MaxTokenTTL,
// also one so large that it wraps around as a time.Duration (2^64 ns and
// 0.29 s minted a token of 0.29 s, 2^64 ns and an hour one of an hour).
func TestMintTTLRange(t *testing.T) {
	h := newHarness(t)
	max := int64(MaxTokenTTL / time.Second)
	for _, ttl := range []int64{-1, max + 1, 18446744074, 18446744074 + 3600, math.MaxInt64} {
		if m, err := h.k.Mint(TokenRequest{AgentID: "a", Tools: []string{"echo"}, TTLSeconds: ttl}); err == nil {
			t.Errorf("ttl_seconds %d: minted a token expiring %s", ttl, m.ExpiresAt)
		}
	}
	for _, ttl := range []int64{0, 1, max} {
		if _, err := h.k.Mint(TokenRequest{AgentID: "a", Tools: []string{"echo"}, TTLSeconds: ttl}); err != nil {
			t.Errorf("ttl_seconds %d: %v", ttl, err)
		}
	}
}
