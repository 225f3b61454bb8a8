package kernel

import (
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/txn"
)

// TestKVScopes: the kv store is the kernel's, shared by every agent, so a
// token reaches only the keys its kv scopes grant: another agent's key is
// refused for reading, writing and as a precondition (which reads its
// version), a read scope does not write, and a token without kv scopes
// reaches no key. Each refusal is audited.
func TestKVScopes(t *testing.T) {
	h := newHarness(t)
	token := func(agent string, scopes ...captoken.KVScope) *MintedToken {
		tok, jti := h.mint(agent, captoken.Capability{Tools: []string{"kv.*", "echo"}, KV: scopes})
		return &MintedToken{Token: tok, ID: jti, AgentID: agent}
	}
	a := token("a", captoken.KVScope{Keys: "a/*", Mode: "rw"})
	b := token("b", captoken.KVScope{Keys: "b/*", Mode: "rw"}, captoken.KVScope{Keys: "pub/*", Mode: "r"})
	none := token("c")
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "a/secret", "value": "pin 4711"}, as(a), key("a1")))
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "pub/motd", "value": "hi"}, key("h1"))) // the harness token: every key

	onKey := func(ref string) func(*Envelope) {
		return func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{mustPre(ref)} }
	}
	for _, c := range []struct {
		name string
		tool string
		args map[string]any
		mods []func(*Envelope)
		ok   bool
	}{
		{"owner reads", "kv.get", map[string]any{"key": "a/secret"}, []func(*Envelope){as(a)}, true},
		{"other agent reads", "kv.get", map[string]any{"key": "a/secret"}, []func(*Envelope){as(b)}, false},
		{"other agent overwrites", "kv.put", map[string]any{"key": "a/secret", "value": 0}, []func(*Envelope){as(b), key("b1")}, false},
		{"other agent tests the version", "echo", map[string]any{"text": "x"}, []func(*Envelope){as(b), onKey(`{"ref":"kv:a/secret","version":1}`)}, false},
		{"read scope reads", "kv.get", map[string]any{"key": "pub/motd"}, []func(*Envelope){as(b)}, true},
		{"read scope does not write", "kv.put", map[string]any{"key": "pub/motd", "value": 0}, []func(*Envelope){as(b), key("b2")}, false},
		{"own prefix writes", "kv.put", map[string]any{"key": "b/x", "value": 1}, []func(*Envelope){as(b), key("b3")}, true},
		{"no kv scopes", "kv.get", map[string]any{"key": "pub/motd"}, []func(*Envelope){as(none)}, false},
	} {
		r := h.invoke(c.tool, c.args, c.mods...)
		switch {
		case c.ok:
			mustOK(t, r)
		case errClass(r) != ErrScopeDenied || r.LedgerSeq == 0:
			t.Errorf("%s: %s %+v: want an audited %s", c.name, errClass(r), r.Error, ErrScopeDenied)
		}
	}
	if r := h.invoke("kv.get", map[string]any{"key": "a/secret"}, as(b)); r.Result != nil {
		t.Fatalf("a refused read returned %s", r.Result)
	}
}
