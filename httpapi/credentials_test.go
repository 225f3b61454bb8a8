package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// Each credential an endpoint refuses is answered with what is wrong with
// it and what to send instead; a token that does not verify is refused
// with its reason once, without the class repeated in front; the public
// reads take no credential, and ignore a wrong one.
func TestCredentialErrors(t *testing.T) {
	f := newFixture(t)
	mint := []byte(`{"agent_id":"x","tools":["echo"]}`)
	for _, c := range []struct {
		name, method, path string
		body               []byte
		bearer             string
		status             int
		class, message     string
	}{
		{"admin endpoint, none", "POST", "/v1/tokens", mint, "", 401, "token_invalid", "needs the admin credential as a bearer token (Authorization: Bearer ckadmin_…"},
		{"admin endpoint, a capability token", "POST", "/v1/tokens", mint, f.token, 403, "permission_denied", "a capability token cannot use admin endpoints: send the admin credential"},
		{"admin endpoint, a file path", "POST", "/v1/tokens", mint, "/var/lib/capkernel/admin.token", 403, "permission_denied", "looks like a file path; send the credential itself"},
		{"admin endpoint, garbage", "POST", "/v1/tokens", mint, "hunter2", 403, "permission_denied", "is not an admin credential (one starts with ckadmin_"},
		{"admin endpoint, a wrong admin credential", "POST", "/v1/tokens", mint, "ckadmin_wrong", 401, "token_invalid", "the admin credential is wrong: it has the form of one but is not this kernel's"},
		{"history read, none", "GET", "/v1/receipts", nil, "", 401, "token_invalid", "needs a bearer credential: the admin credential or a capability token of this kernel"},
		{"history read, a wrong admin credential", "GET", "/v1/receipts", nil, "ckadmin_wrong", 401, "token_invalid", "the admin credential is wrong"},
		{"history read, a token that does not verify", "GET", "/v1/receipts", nil, "a.b.c", 401, "token_invalid", "the bearer capability token: token is not a compact JWS"},
		{"public head, none", "GET", "/v1/ledger/head", nil, "", 200, "", ""},
		{"public head, a wrong one", "GET", "/v1/ledger/head", nil, "ckadmin_wrong", 200, "", ""},
		{"public checkpoint", "GET", "/v1/ledger/checkpoint", nil, "", 200, "", ""},
		{"public jwks", "GET", "/.well-known/jwks.json", nil, "", 200, "", ""},
		{"public policy", "GET", "/v1/policy", nil, "", 200, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h []string
			if c.body != nil {
				h = append(h, "Content-Type: application/json")
			}
			if c.bearer != "" {
				h = append(h, "Authorization: Bearer "+c.bearer)
			}
			status, body := f.send(t, c.method, c.path, c.body, h...)
			if status != c.status {
				t.Fatalf("%d %s, want %d", status, body, c.status)
			}
			if c.status == http.StatusOK {
				return
			}
			var e httpapi.ErrorBody
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Class != c.class || !strings.Contains(e.Error.Message, c.message) {
				t.Fatalf("%s, want class %s and a message with %q", body, c.class, c.message)
			}
			if strings.Contains(e.Error.Message, "captoken:") || strings.Contains(e.Error.Message, c.class+": ") {
				t.Errorf("the message repeats what the class says: %q", e.Error.Message)
			}
		})
	}

	// An inspection names the reason alone, and the claims by the token's
	// own names.
	status, body := f.send(t, "POST", "/v1/tokens/inspect", []byte(`{"token":"a.b.c"}`), "Content-Type: application/json")
	var in httpapi.TokenInspection
	if err := json.Unmarshal(body, &in); status != 200 || err != nil || in.Valid || in.Class != "token_invalid" || strings.HasPrefix(in.Reason, "captoken:") {
		t.Fatalf("inspect a.b.c: %d %s", status, body)
	}
	tokJSON, _ := json.Marshal(map[string]string{"token": f.token})
	status, body = f.send(t, "POST", "/v1/tokens/inspect", tokJSON, "Content-Type: application/json")
	var wire struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	json.Unmarshal(body, &wire)
	for _, k := range []string{"iss", "sub", "aud", "jti", "iat", "nbf", "exp", "cap"} {
		if _, ok := wire.Claims[k]; status != 200 || !ok {
			t.Errorf("inspect: no claim %q in %s", k, body)
		}
	}
}

// Admin and token requests with a fault in them are answered with what is
// wrong, on which input, and change nothing: a revocation of something
// that is not a token id records nothing (it could never apply), nor does
// a decision on an approval that does not exist, refused (docs/http.md
// records refused decisions on approvals that do).
func TestRequestErrorsSayWhat(t *testing.T) {
	f := newFixture(t)
	admin := "Authorization: Bearer " + f.admin
	headOf := func() string { _, b := f.send(t, "GET", "/v1/ledger/head", nil); return string(b) }
	for _, c := range []struct {
		name, method, path string
		body               []byte
		bearer             string
		status             int
		class, message     string
		recorded           bool
	}{
		{"revoke, not a token id", "POST", "/v1/tokens/nonexist/revoke", []byte(`{"reason":"x"}`), admin, 400, "invalid_args", `"nonexist": not a token id`, false},
		{"mint, no agent", "POST", "/v1/tokens", []byte(`{"tools":["echo"]}`), admin, 400, "invalid_args", "agent_id is required", false},
		{"mint, a body over the limit", "POST", "/v1/tokens", []byte(`{"agent_id":"` + strings.Repeat("x", 2<<20) + `"}`), admin, 413, "invalid_args", "over the 1048576-byte limit", false},
		{"attenuate, no parent", "POST", "/v1/tokens/attenuate", []byte(`{}`), "", 401, "token_invalid", "parent is required", false},
		{"decide, the admin credential", "POST", "/v1/approvals/a1", []byte(`{"decision":"allow"}`), admin, 403, "permission_denied", "the admin credential cannot decide approvals", false},
		{"entries, limit 0", "GET", "/v1/ledger/entries?limit=0", nil, admin, 400, "invalid_args", `limit "0" is below 1`, false},
		{"an endpoint's path, another method", "PUT", "/v1/syscalls", []byte(`{}`), "", 405, "invalid_args", "/v1/syscalls takes GET or POST, not PUT", false},
		{"no endpoint", "GET", "/v1/nothing", nil, "", 404, "invalid_args", "no endpoint GET /v1/nothing", false},
		{"events, a kind that is none", "GET", "/v1/events?kind=tool.called,bogus", nil, admin, 400, "invalid_args", `kind "bogus" is not an event kind`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := []string{"Content-Type: application/json"}
			if c.bearer != "" {
				h = append(h, c.bearer)
			}
			before := headOf()
			status, body := f.send(t, c.method, c.path, c.body, h...)
			var e httpapi.ErrorBody
			if err := json.Unmarshal(body, &e); status != c.status || err != nil || e.Error.Class != c.class || !strings.Contains(e.Error.Message, c.message) || strings.Contains(e.Error.Message, "<nil>") {
				t.Fatalf("%d %s, want %d, class %s and a message with %q", status, body, c.status, c.class, c.message)
			}
			if after := headOf(); (after != before) != c.recorded {
				t.Fatalf("the ledger: %s, then %s; want it recorded: %v", before, after, c.recorded)
			}
		})
	}
}

// GET /v1/approvals shows a plain approver no escalated request, which it
// cannot decide (docs/console.md; the console filters the same way); an
// escalation approver and the admin see it.
func TestApprovalListByRole(t *testing.T) {
	f := newFixture(t)
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "dir"), 0o755)
	os.WriteFile(filepath.Join(ws, "dir", "x"), []byte("x"), 0o644)
	tok, cl, err := f.k.MintToken(captoken.Claims{Subject: "agent-1", Expiry: time.Now().Add(time.Hour),
		Cap: captoken.Capability{Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	sub := f.k.Subscribe(kernel.EventFilter{Kinds: []string{kernel.EventConfirmationRequested}}, 4)
	defer sub.Close()
	env, _ := json.Marshal(kernel.Envelope{ToolID: "fs.delete", Args: json.RawMessage(`{"path":"dir"}`), AgentID: "agent-1",
		CapabilityToken: tok, CapabilityTokenID: cl.ID, PolicyHash: f.k.PolicyHash(), IdempotencyKey: "d"})
	if _, _, err := f.k.Start(context.Background(), env); err != nil {
		t.Fatal(err)
	}
	if e := <-sub.C; e.Approval == nil || e.Approval.RequiredRole != captoken.RoleEscalation {
		t.Fatalf("the delete's approval: %+v", e.Approval)
	}
	for _, c := range []struct {
		name, role string
		sees       int
	}{{"plain approver", captoken.RoleApprover, 0}, {"escalation approver", captoken.RoleEscalation, 1}, {"admin", "", 1}} {
		cred := f.admin
		if c.role != "" {
			m, err := f.k.Mint(kernel.TokenRequest{AgentID: "alice", Role: c.role})
			if err != nil {
				t.Fatal(err)
			}
			cred = m.Token
		}
		status, body := f.send(t, "GET", "/v1/approvals", nil, "Authorization: Bearer "+cred)
		var l httpapi.ApprovalList
		if err := json.Unmarshal(body, &l); status != 200 || err != nil || len(l.Approvals) != c.sees {
			t.Fatalf("%s: %d %s, want %d approvals", c.name, status, body, c.sees)
		}
	}
}
