package console

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/telemetry"
)

// world is a kernel served over HTTP on loopback with the console and
// metrics, a workspace, and credentials of every kind.
type world struct {
	t         *testing.T
	k         *kernel.Kernel
	srv       *httptest.Server
	ws        string
	admin     string
	alice     *kernel.MintedToken // approver
	bob       *kernel.MintedToken // approver
	carol     *kernel.MintedToken // escalation approver
	dave      *kernel.MintedToken // auditor
	agent     *kernel.MintedToken // a1: fs.*, every call soft_gate
	escalated *kernel.MintedToken // a2: fs.*, every call escalated
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldWith(t, kernel.Config{}, nil)
}

// newWorldWith is newWorld with the kernel's cfg (DataDir and Observer
// are set here) and a change to the console before it serves.
func newWorldWith(t *testing.T, cfg kernel.Config, console func(*Console)) *world {
	t.Helper()
	return newWorldServer(t, cfg, console, nil)
}

// newWorldServer is newWorldWith with a change to the HTTP server before
// it starts (its timeouts).
func newWorldServer(t *testing.T, cfg kernel.Config, console func(*Console), server func(*http.Server)) *world {
	t.Helper()
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("status: draft\nowner: ops\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ini, err := kernel.Init(data)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := telemetry.NewMetrics(reg)
	cfg.DataDir, cfg.Observer = data, m
	k, err := kernel.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(k)
	api := httpapi.New(k)
	api.ServeMetrics(reg, httpapi.MetricsAdmin)
	con := New(k)
	if console != nil {
		console(con)
	}
	api.ServeConsole(con)
	srv := httptest.NewUnstartedServer(api)
	if server != nil {
		server(srv.Config)
	}
	srv.Start()
	w := &world{t: t, k: k, srv: srv, ws: ws, admin: ini.AdminCredential}
	t.Cleanup(func() {
		w.srv.CloseClientConnections()
		w.srv.Close()
		k.Drain()
		k.WaitBackground(context.Background())
		k.Close()
	})
	mint := func(req kernel.TokenRequest) *kernel.MintedToken {
		tok, err := k.Mint(req)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	w.alice = mint(kernel.TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	w.bob = mint(kernel.TokenRequest{AgentID: "bob", Role: captoken.RoleApprover})
	w.carol = mint(kernel.TokenRequest{AgentID: "carol", Role: captoken.RoleEscalation})
	w.dave = mint(kernel.TokenRequest{AgentID: "dave", Role: captoken.RoleAuditor})
	fs := []captoken.FSRoot{{Path: ws, Mode: "rw"}}
	w.agent = mint(kernel.TokenRequest{AgentID: "a1", Tools: []string{"fs.*"}, FS: fs, Autonomy: "soft_gate", Budgets: map[string]int64{"calls": 50}})
	w.escalated = mint(kernel.TokenRequest{AgentID: "a2", Tools: []string{"fs.*"}, FS: fs, Autonomy: "escalated"})
	return w
}

// envelope is a call envelope of tok.
func (w *world) envelope(tok *kernel.MintedToken, tool string, args map[string]any, key string) []byte {
	a, _ := json.Marshal(args)
	b, _ := json.Marshal(kernel.Envelope{ToolID: tool, Args: a, AgentID: tok.AgentID, CapabilityToken: tok.Token,
		CapabilityTokenID: tok.ID, PolicyHash: w.k.PolicyHash(), IdempotencyKey: key})
	return b
}

// gated starts a call of tok in the background and returns its operation
// id and approval request once the call waits for a decision.
func (w *world) gated(tok *kernel.MintedToken, tool string, args map[string]any, key string) (string, kernel.ApprovalRequest) {
	w.t.Helper()
	sub := w.k.Subscribe(kernel.EventFilter{AgentID: tok.AgentID, Kinds: []string{kernel.EventConfirmationRequested}}, 0)
	defer sub.Close()
	id, refused, err := w.k.Start(context.Background(), w.envelope(tok, tool, args, key))
	if err != nil {
		w.t.Fatalf("start: %v (%+v)", err, refused)
	}
	for e := range sub.C {
		if e.OperationID == id {
			return id, *e.Approval
		}
	}
	w.t.Fatal("the event stream ended before the approval request")
	return "", kernel.ApprovalRequest{}
}

// client is a browser-like HTTP client with a cookie jar, sending the
// console's own Origin unless told otherwise, and, like the page, its
// session key in every request once signed in.
type client struct {
	w      *world
	hc     *http.Client
	key    string
	origin string
}

func (w *world) client() *client {
	jar, _ := cookiejar.New(nil)
	c := &client{w: w, origin: w.srv.URL}
	c.hc = &http.Client{Jar: jar, Transport: keyTransport{c}}
	return c
}

// keyTransport adds the client's session key to each request, as the
// page does from its sessionStorage.
type keyTransport struct{ c *client }

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.c.key != "" && r.Header.Get(keyHeader) == "" {
		r = r.Clone(r.Context())
		r.Header.Set(keyHeader, t.c.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// rawBody is a request body sent as it is, not encoded as JSON.
type rawBody string

// do sends a request; for POST the body is JSON (body encoded, or a
// rawBody as it is) with the client's Origin.
func (c *client) do(method, path string, body any) (int, map[string]any) {
	c.w.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case rawBody:
		rd = strings.NewReader(string(b))
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, c.w.srv.URL+path, rd)
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// login signs c in with cred and keeps the session key.
func (c *client) login(cred string) int {
	c.w.t.Helper()
	status, out := c.do(http.MethodPost, "/console/api/login", LoginRequest{Credential: cred})
	if status == http.StatusOK {
		c.key, _ = out["key"].(string)
	}
	return status
}
