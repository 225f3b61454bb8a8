package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// fixture is a real kernel served over real HTTP on loopback.
type fixture struct {
	k     *kernel.Kernel
	srv   *httptest.Server
	admin string
	token string
	jti   string
}

func newFixture(t testing.TB, allow ...string) *fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	ir, err := kernel.Init(dir)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent-1", Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Tools: []string{"echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	s := httpapi.New(k)
	if err := s.AllowOrigins(allow...); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &fixture{k: k, srv: srv, admin: ir.AdminCredential, token: tok, jti: cl.ID}
}

// envelope is a valid echo call.
func (f *fixture) envelope(t testing.TB) []byte {
	t.Helper()
	b, err := json.Marshal(kernel.Envelope{
		ToolID: "echo", Args: json.RawMessage(`{"text":"hi"}`), AgentID: "agent-1",
		CapabilityToken: f.token, CapabilityTokenID: f.jti, PolicyHash: f.k.PolicyHash(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fixture) headSize(t *testing.T) uint64 {
	t.Helper()
	h, err := f.k.Inspector().Head()
	if err != nil {
		t.Fatal(err)
	}
	return h.Size
}

// send makes one request with the given headers ("Name: value").
func (f *fixture) send(t *testing.T, method, path string, body []byte, headers ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ": ")
		req.Header.Set(name, value)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// POST /v1/syscalls refuses what a page on another site could send
// without a preflight, with an audited result envelope; it serves its own
// origin, loopback origins on its port and configured origins.
func TestCallCrossSite(t *testing.T) {
	f := newFixture(t, "https://console.example.com")
	u, _ := url.Parse(f.srv.URL)
	self := f.srv.URL
	localhost := "http://localhost:" + u.Port()
	otherLoopback := "http://127.0.0.2:" + u.Port()
	tests := []struct {
		name    string
		headers []string
		status  int
		class   string // "" for an ok result
	}{
		{"json", []string{"Content-Type: application/json"}, 200, ""},
		{"json with utf-8 charset", []string{"Content-Type: application/json; charset=utf-8"}, 200, ""},
		{"no content type", nil, 415, kernel.ErrInvalidArgs},
		{"text/plain", []string{"Content-Type: text/plain"}, 415, kernel.ErrInvalidArgs},
		{"form", []string{"Content-Type: application/x-www-form-urlencoded"}, 415, kernel.ErrInvalidArgs},
		{"multipart", []string{"Content-Type: multipart/form-data; boundary=x"}, 415, kernel.ErrInvalidArgs},
		{"json in latin1", []string{"Content-Type: application/json; charset=iso-8859-1"}, 415, kernel.ErrInvalidArgs},
		{"unparsable type", []string{"Content-Type: ;;"}, 415, kernel.ErrInvalidArgs},
		{"other origin", []string{"Content-Type: application/json", "Origin: http://evil.example"}, 403, kernel.ErrPermissionDenied},
		{"other origin, form (a browser's form post)", []string{"Content-Type: application/x-www-form-urlencoded", "Origin: http://evil.example", "Sec-Fetch-Site: cross-site"}, 403, kernel.ErrPermissionDenied},
		{"null origin", []string{"Content-Type: application/json", "Origin: null"}, 403, kernel.ErrPermissionDenied},
		{"cross-site by Sec-Fetch-Site", []string{"Content-Type: application/json", "Sec-Fetch-Site: cross-site"}, 403, kernel.ErrPermissionDenied},
		{"loopback on another port", []string{"Content-Type: application/json", "Origin: http://localhost:1"}, 403, kernel.ErrPermissionDenied},
		{"own origin", []string{"Content-Type: application/json", "Origin: " + self}, 200, ""},
		{"same-origin by Sec-Fetch-Site", []string{"Content-Type: application/json", "Origin: " + self, "Sec-Fetch-Site: same-origin"}, 200, ""},
		{"localhost on the server's port", []string{"Content-Type: application/json", "Origin: " + localhost}, 200, ""},
		{"127.0.0.2 on the server's port", []string{"Content-Type: application/json", "Origin: " + otherLoopback}, 200, ""},
		{"localhost on the server's port, same-origin by Sec-Fetch-Site", []string{"Content-Type: application/json", "Origin: " + localhost, "Sec-Fetch-Site: same-origin"}, 200, ""},
		// A browser that says cross-site is believed: the page may be
		// another server's, on the same port of another loopback address.
		{"localhost on the server's port, cross-site by Sec-Fetch-Site", []string{"Content-Type: application/json", "Origin: " + localhost, "Sec-Fetch-Site: cross-site"}, 403, kernel.ErrPermissionDenied},
		{"127.0.0.2 on the server's port, cross-site by Sec-Fetch-Site", []string{"Content-Type: application/json", "Origin: " + otherLoopback, "Sec-Fetch-Site: cross-site"}, 403, kernel.ErrPermissionDenied},
		{"[::1] on the server's port, same-site by Sec-Fetch-Site", []string{"Content-Type: application/json", "Origin: http://[::1]:" + u.Port(), "Sec-Fetch-Site: same-site"}, 403, kernel.ErrPermissionDenied},
		{"configured origin", []string{"Content-Type: application/json", "Origin: https://console.example.com", "Sec-Fetch-Site: cross-site"}, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := f.headSize(t)
			status, body := f.send(t, "POST", "/v1/syscalls", f.envelope(t), tc.headers...)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			var res kernel.Result
			if err := json.Unmarshal(body, &res); err != nil {
				t.Fatalf("answer is not a result envelope: %v: %s", err, body)
			}
			got := ""
			if res.Error != nil {
				got = res.Error.Class
			}
			if got != tc.class {
				t.Fatalf("class %q, want %q (%+v)", got, tc.class, res.Error)
			}
			if res.Receipt == nil || f.headSize(t) <= before {
				t.Fatal("the answer is not in the ledger")
			}
			if tc.class != "" && res.Result != nil {
				t.Fatalf("a refused call ran: %s", res.Result)
			}
		})
	}
}

// The other state-changing endpoints refuse the same requests, before
// acting.
func TestAdminCrossSite(t *testing.T) {
	f := newFixture(t)
	u, _ := url.Parse(f.srv.URL)
	localhost := "http://localhost:" + u.Port()
	auth := "Authorization: Bearer " + f.admin
	revoked := func(t *testing.T) bool {
		t.Helper()
		status, body := f.send(t, "POST", "/v1/tokens/inspect", []byte(fmt.Sprintf(`{"token":%q}`, f.token)), "Content-Type: application/json")
		if status != 200 {
			t.Fatalf("inspect: %d %s", status, body)
		}
		return bytes.Contains(body, []byte(kernel.ErrTokenRevoked))
	}
	revoke := "/v1/tokens/" + f.jti + "/revoke"
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		headers []string
		status  int
	}{
		{"revoke as a form", "POST", revoke, "reason=x", []string{auth, "Content-Type: application/x-www-form-urlencoded"}, 415},
		{"revoke as text", "POST", revoke, `{"reason":"x"}`, []string{auth, "Content-Type: text/plain"}, 415},
		{"revoke without a type", "POST", revoke, `{"reason":"x"}`, []string{auth}, 415},
		{"revoke from another origin", "POST", revoke, `{"reason":"x"}`, []string{auth, "Content-Type: application/json", "Origin: http://evil.example"}, 403},
		{"mint as multipart", "POST", "/v1/tokens", "--x--", []string{auth, "Content-Type: multipart/form-data; boundary=x"}, 415},
		{"cancel from another origin", "POST", "/v1/sessions/s1/cancel", "", []string{auth, "Origin: http://evil.example"}, 403},
		{"delete from another origin", "DELETE", "/v1/operations/x", "", []string{auth, "Origin: http://evil.example", "Sec-Fetch-Site: cross-site"}, 403},
		{"decide from another origin", "POST", "/v1/approvals/x", `{"decision":"allow"}`, []string{"Content-Type: application/json", "Origin: http://evil.example"}, 403},
		{"decide as a form", "POST", "/v1/approvals/x", `decision=allow`, []string{"Content-Type: application/x-www-form-urlencoded"}, 415},
		{"cancel from a loopback origin on the server's port, cross-site", "POST", "/v1/sessions/s1/cancel", "", []string{auth, "Origin: " + localhost, "Sec-Fetch-Site: cross-site"}, 403},
		{"revoke from a loopback origin on the server's port, cross-site", "POST", revoke, `{"reason":"x"}`, []string{auth, "Content-Type: application/json", "Origin: " + localhost, "Sec-Fetch-Site: cross-site"}, 403},
		{"cancel from a loopback origin on the server's port, no Sec-Fetch-Site", "POST", "/v1/sessions/s1/cancel", "", []string{auth, "Origin: " + localhost}, 200},
		{"cancel without a body", "POST", "/v1/sessions/s1/cancel", "", []string{auth}, 200},
		{"a read from another origin", "GET", "/v1/policy", "", []string{"Origin: http://evil.example"}, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			status, out := f.send(t, tc.method, tc.path, body, tc.headers...)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, out)
			}
			if status >= 400 {
				var eb httpapi.ErrorBody
				if err := json.Unmarshal(out, &eb); err != nil || eb.Error.Class == "" || eb.Error.Message == "" {
					t.Fatalf("error answer %s is not an error body", out)
				}
			}
			if revoked(t) {
				t.Fatal("a refused request revoked the token")
			}
		})
	}
	// The same revocation as JSON from a non-browser client works.
	if status, out := f.send(t, "POST", revoke, []byte(`{"reason":"x"}`), auth, "Content-Type: application/json"); status != 200 {
		t.Fatalf("revoke: %d %s", status, out)
	}
	if !revoked(t) {
		t.Fatal("revocation did not take")
	}
}
