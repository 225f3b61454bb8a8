package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// failing is a syscall whose handler fails or panics, registered by tests.
type failing struct{ panics bool }

func (f *failing) Definition() syscalls.Definition {
	id := "test.fail"
	if f.panics {
		id = "test.panic"
	}
	return syscalls.Definition{
		ID: id, Description: "fails", SideEffect: syscalls.None,
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
	}
}

func (f *failing) Execute(context.Context, *syscalls.Call) (syscalls.Output, error) {
	if f.panics {
		panic("handler bug")
	}
	return syscalls.Output{}, errors.New("disk on fire")
}

// TestAcceptance is seed 000 §9: the dispatch outcomes an agent relies on,
// each audited.
func TestAcceptance(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "alpha")
	for _, p := range []bool{false, true} {
		if err := h.k.Registry().Register(func() syscalls.Syscall { return &failing{panics: p} }); err != nil {
			t.Fatal(err)
		}
	}
	echoOnly, echoJTI := h.mint(h.agent, captoken.Capability{Tools: []string{"echo"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	withEchoToken := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = echoOnly, echoJTI }

	cases := []struct {
		name  string
		tool  string
		args  any
		mods  []func(*Envelope)
		class string
	}{
		{"granted", "fs.read", map[string]any{"path": "a.txt"}, nil, ""},
		{"tool not in token", "fs.read", map[string]any{"path": "a.txt"}, []func(*Envelope){withEchoToken}, ErrPermissionDenied},
		{"unknown tool", "fs.teleport", map[string]any{}, nil, ErrToolNotFound},
		{"path not granted", "fs.read", map[string]any{"path": "/etc/hostname"}, nil, ErrScopeDenied},
		{"handler error", "test.fail", map[string]any{}, nil, ErrExecution},
		{"handler panic", "test.panic", map[string]any{}, nil, ErrExecution},
		{"still serving after a panic", "echo", map[string]any{"text": "alive"}, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := h.headSize()
			r := h.invoke(tc.tool, tc.args, tc.mods...)
			if got := errClass(r); got != tc.class {
				t.Fatalf("class = %q, want %q (%+v)", got, tc.class, r.Error)
			}
			audits := h.audits(before)
			if len(audits) != 1 {
				t.Fatalf("%d audit records, want 1", len(audits))
			}
			a := audits[0]
			if a.ToolID != tc.tool || a.AgentID != h.agent || a.OperationID != r.OperationID || a.ErrorClass != tc.class ||
				a.ArgsHash == "" || a.ResultHash != r.ResultHash || a.PolicyHash != h.k.PolicyHash() {
				t.Fatalf("audit record does not match the call: %+v", a)
			}
			if n := len(h.entries(ledger.KindReceipt, before)); n != 0 {
				t.Fatalf("%d receipt entries, want none (the audit entry is the receipt)", n)
			}
			rc := verifyReceipt(t, h.k, r)
			if rc.ReceiptID != r.ReceiptID || rc.OperationID != r.OperationID || rc.ResultHash != r.ResultHash || rc.LedgerSeq != r.LedgerSeq || rc.ErrorClass != tc.class {
				t.Fatalf("receipt %+v does not match result %+v", rc, r)
			}
		})
	}
	mustVerify(t, h.k.Inspector())
}

func TestTokenRefusals(t *testing.T) {
	h := newHarness(t)
	expired, expiredJTI := func() (string, string) {
		tok, cl, err := h.k.MintToken(captoken.Claims{Subject: h.agent, NotBefore: time.Now().Add(-2 * time.Hour),
			IssuedAt: time.Now().Add(-2 * time.Hour), Expiry: time.Now().Add(-time.Hour), Cap: captoken.Capability{Tools: []string{"*"}}})
		if err != nil {
			t.Fatal(err)
		}
		return tok, cl.ID
	}()
	wrongAud, wrongAudJTI := func() (string, string) {
		tok, cl, err := h.k.MintToken(captoken.Claims{Subject: h.agent, Audience: "another-kernel", Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Tools: []string{"*"}}})
		if err != nil {
			t.Fatal(err)
		}
		return tok, cl.ID
	}()
	revoked, revokedJTI := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}})
	if err := h.k.Revoke(context.Background(), revokedJTI, "test"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		mod   func(*Envelope)
		class string
	}{
		{"valid", func(*Envelope) {}, ""},
		{"expired", func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = expired, expiredJTI }, ErrTokenInvalid},
		{"wrong audience", func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = wrongAud, wrongAudJTI }, ErrTokenInvalid},
		{"revoked", func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = revoked, revokedJTI }, ErrTokenRevoked},
		{"jti mismatch", func(e *Envelope) { e.CapabilityTokenID = "someone-else" }, ErrTokenInvalid},
		{"sub mismatch", func(e *Envelope) { e.AgentID = "agent-2" }, ErrTokenInvalid},
		{"garbage token", func(e *Envelope) { e.CapabilityToken = "not.a.token" }, ErrTokenInvalid},
		{"tampered token", func(e *Envelope) { e.CapabilityToken = tamper(e.CapabilityToken) }, ErrTokenInvalid},
		{"no token", func(e *Envelope) { e.CapabilityToken = "" }, ErrTokenInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.invoke("echo", map[string]any{"text": "x"}, tc.mod)
			if got := errClass(r); got != tc.class {
				t.Fatalf("class = %q, want %q (%+v)", got, tc.class, r.Error)
			}
		})
	}
	// A revocation survives a restart and is in the ledger.
	h.k.Close()
	h.open()
	r := h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = revoked, revokedJTI })
	if errClass(r) != ErrTokenRevoked {
		t.Fatalf("after reopen: class %q, want token_revoked", errClass(r))
	}
	if len(h.entries(ledger.KindRevocation, 0)) != 1 {
		t.Fatal("revocation is not in the ledger")
	}
}

// tamper flips the last character of the token's payload segment.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || len(parts[1]) == 0 {
		return tok + "x"
	}
	p := []byte(parts[1])
	if p[len(p)-2] == 'A' {
		p[len(p)-2] = 'B'
	} else {
		p[len(p)-2] = 'A'
	}
	parts[1] = string(p)
	return strings.Join(parts, ".")
}

// TestTraversal: every way out of the workspace is scope_denied, checked
// before anything runs, and leaves the outside untouched.
func TestTraversal(t *testing.T) {
	h := newHarness(t)
	outside := filepath.Join(filepath.Dir(h.ws), "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(h.ws, "link-file")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(h.ws, "link-dir")); err != nil {
		t.Fatal(err)
	}
	h.write("inside.txt", "in")
	cases := []struct{ tool, path string }{
		{"fs.read", "../outside/secret.txt"},
		{"fs.read", "a/../../outside/secret.txt"},
		{"fs.read", secret},
		{"fs.read", "link-file"},
		{"fs.read", "link-dir/secret.txt"},
		{"fs.read", "inside.txt\x00../../outside/secret.txt"},
		{"fs.write", "../outside/secret.txt"},
		{"fs.write", "link-file"},
		{"fs.write", "link-dir/secret.txt"},
		{"fs.write", secret},
		{"fs.delete", "link-dir/secret.txt"},
		{"fs.list", "link-dir"},
		{"fs.stat", "../outside"},
	}
	for i, tc := range cases {
		t.Run(tc.tool+" "+strings.ReplaceAll(tc.path, "\x00", `\0`), func(t *testing.T) {
			args := map[string]any{"path": tc.path}
			if tc.tool == "fs.write" {
				args["content"] = "pwned"
			}
			r := h.invoke(tc.tool, args, key("trav-"+string(rune('a'+i))))
			if errClass(r) != ErrScopeDenied {
				t.Fatalf("class = %q, want scope_denied (%+v)", errClass(r), r.Error)
			}
		})
	}
	b, err := os.ReadFile(secret)
	if err != nil || string(b) != "outside" {
		t.Fatalf("outside file changed: %q, %v", b, err)
	}
	// The precondition path is a resource too.
	r := h.invoke("fs.write", map[string]any{"path": "inside.txt", "content": "x"}, key("pre-escape"), func(e *Envelope) {
		e.PreconditionRefs = append(e.PreconditionRefs, mustPre(`{"ref":"fs:../outside/secret.txt","absent":true}`))
	})
	if errClass(r) != ErrScopeDenied {
		t.Fatalf("precondition outside the workspace: class %q, want scope_denied", errClass(r))
	}
}

func TestSecretsAreNoGo(t *testing.T) {
	h := newHarness(t)
	h.write(".env", "KEY=1")
	h.write("sub/.ssh/id_rsa", "key")
	h.write("innocent.txt", "hi")
	if err := os.Symlink(".env", filepath.Join(h.ws, "alias")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, path string }{
		{"fs.read", ".env"}, {"fs.stat", ".env"}, {"fs.read", "sub/.ssh/id_rsa"}, {"fs.list", "sub/.ssh"},
		{"fs.read", "alias"}, {"fs.write", "cert.pem"},
	} {
		args := map[string]any{"path": c.path}
		if c.tool == "fs.write" {
			args["content"] = "x"
		}
		r := h.invoke(c.tool, args, key("secret-"+c.tool+c.path))
		if errClass(r) != ErrPolicyDenied || r.AutonomyMode != "no_go" {
			t.Errorf("%s %s: class %q mode %s, want policy_denied no_go", c.tool, c.path, errClass(r), r.AutonomyMode)
		}
	}
	if _, err := os.Stat(filepath.Join(h.ws, "cert.pem")); !os.IsNotExist(err) {
		t.Fatal("a denied write left a file")
	}
}

func mustPre(s string) (p txn.Precondition) {
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		panic(err)
	}
	return p
}
