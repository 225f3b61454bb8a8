package mcpgateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
)

// rawSession is an MCP session made and used with plain HTTP requests: no
// GET stream held open, as a client that initializes, calls and goes away.
type rawSession struct {
	t       *testing.T
	url, id string
}

const rawProtocol = "2025-06-18"

func newRawSession(t *testing.T, url string) *rawSession {
	t.Helper()
	s := &rawSession{t: t, url: url}
	resp, body := s.post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + rawProtocol + `","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if s.id = resp.Header.Get(sessionIDHeader); resp.StatusCode != http.StatusOK || s.id == "" {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	if resp, body := s.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", resp.StatusCode, body)
	}
	return s
}

func (s *rawSession) post(body string) (*http.Response, string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.id != "" {
		req.Header.Set(sessionIDHeader, s.id)
		req.Header.Set(protocolVersionHeader, rawProtocol)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// echo calls echo in the session and returns the HTTP status.
func (s *rawSession) echo(id string) int {
	s.t.Helper()
	resp, body := s.post(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`)
	if resp.StatusCode == http.StatusOK && !strings.Contains(body, `\"text\":\"hi\"`) {
		s.t.Fatalf("echo %s: %s", id, body)
	}
	return resp.StatusCode
}

// live reports whether g's server has session id.
func live(g *Gateway, id string) bool { return g.sessionByID(id) != nil }

// waitEnded waits until g's server no longer has session id.
func waitEnded(t *testing.T, g *Gateway, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); live(g, id); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("session %s still live 10 s after it went idle", id)
		}
	}
}

const testIdle = 300 * time.Millisecond

// newIdleGate is a gateway ending sessions idle for testIdle, whose calls
// gt holds, and a raw session of it.
func newIdleGate(t *testing.T) (*gate, *Gateway, *rawSession) {
	t.Helper()
	gt := newGate()
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{Invoker: gt})
	gt.inner = kernelInvoker{k}
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{SessionIdle: testIdle}))
	t.Cleanup(srv.Close)
	return gt, g, newRawSession(t, srv.URL)
}

// A session no request has touched for SessionIdle ends, tracked from its
// initialize (a client that goes away without a DELETE, and without
// another request, even notifications/initialized), and one used since ends that long after its last
// request; its client's next request is answered 404. With SessionIdle
// zero sessions stay.
func TestIdleSessionEnds(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{SessionIdle: testIdle}))
	t.Cleanup(srv.Close)
	keep := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(keep.Close)

	untouched := newRawSession(t, srv.URL)
	// A client that sent initialize alone: no request bore its session id.
	halfway := &rawSession{t: t, url: srv.URL}
	resp, body := halfway.post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + rawProtocol + `","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if halfway.id = resp.Header.Get(sessionIDHeader); halfway.id == "" {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	used := newRawSession(t, srv.URL)
	kept := newRawSession(t, keep.URL)
	if st := used.echo("2"); st != http.StatusOK {
		t.Fatalf("echo: %d", st)
	}
	waitEnded(t, g, untouched.id)
	waitEnded(t, g, halfway.id)
	waitEnded(t, g, used.id)
	if st := used.echo("3"); st != http.StatusNotFound {
		t.Errorf("a call in an ended session: %d, want 404", st)
	}
	if !live(g, kept.id) {
		t.Error("a session of a handler without SessionIdle ended")
	}
	if st := kept.echo("2"); st != http.StatusOK {
		t.Errorf("echo in the kept session: %d", st)
	}
}

// A session is not idle while a call of it runs: a lean call held past
// SessionIdle, its request open, and a call on the SDK's path (it has a
// progress token) held past SessionIdle after its client dropped its
// request, which does not end the call. Each is answered, or runs on,
// uncancelled, and the session ends only SessionIdle after.
func TestIdleSessionKeptWhileCallRuns(t *testing.T) {
	for _, tc := range []struct {
		name, meta string
		drop       bool
	}{
		{"lean, request open", "", false},
		{"SDK's path, request dropped", `,"_meta":{"progressToken":"p1"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gt, g, s := newIdleGate(t)
			ctx, drop := context.WithCancel(context.Background())
			defer drop()
			answered := make(chan int, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(
					`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}`+tc.meta+`}}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set(sessionIDHeader, s.id)
				req.Header.Set(protocolVersionHeader, rawProtocol)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answered <- 0
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered <- resp.StatusCode
			}()
			gt.wait(t, gt.entered)
			if tc.drop {
				drop()
				if st := <-answered; st != 0 {
					t.Fatalf("the dropped request was answered %d", st)
				}
			}
			time.Sleep(3 * testIdle)
			if !live(g, s.id) {
				t.Fatal("the session ended while its call ran")
			}
			gt.release <- struct{}{}
			if err := <-gt.ended; err != nil {
				t.Fatalf("the held call was cancelled: %v", err)
			}
			if !tc.drop {
				if st := <-answered; st != http.StatusOK {
					t.Fatalf("the held call: %d", st)
				}
			}
			waitEnded(t, g, s.id)
		})
	}
}

// A client that holds its GET stream open (the Go SDK's does) is not idle
// however long it makes no call; when its connections go (the client
// gone without a DELETE), its session ends SessionIdle after.
func TestIdleSessionKeptWhileListening(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{SessionIdle: testIdle}))
	t.Cleanup(srv.Close)
	var mu sync.Mutex
	var conns []net.Conn
	dial := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial.DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := cs.ID()
	time.Sleep(3 * testIdle)
	if !live(g, id) {
		t.Fatal("the session of a client holding its stream open ended")
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || res.IsError {
		t.Fatalf("echo: %v %+v", err, res)
	}
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	waitEnded(t, g, id)
	cs.Close()
}

// The idle counts themselves: a session is ended once, after idle with no
// request served and no call busy; a busy one is counted again; one its
// client ended is forgotten once its last request is served, never ended
// again nor kept until its count runs out.
func TestIdleSessionsCount(t *testing.T) {
	var mu sync.Mutex
	ended := map[string]int{}
	busy := map[string]bool{"busy": true}
	s := newIdleSessions(50*time.Millisecond, 50*time.Millisecond, func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return busy[id]
	}, func(id string) {
		mu.Lock()
		ended[id]++
		mu.Unlock()
	})
	s.track("idle")
	s.track("busy")
	done := s.begin("deleted")
	s.ended("deleted")
	done()
	s.mu.Lock()
	_, kept := s.by["deleted"]
	s.mu.Unlock()
	if kept {
		t.Error("a session its client ended is still counted after its last request")
	}
	wait := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			n := ended[id]
			mu.Unlock()
			if n > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s was not ended", id)
			}
		}
	}
	wait("idle")
	time.Sleep(150 * time.Millisecond) // the busy one's count ran out too, more than once
	mu.Lock()
	if ended["idle"] != 1 || ended["busy"] != 0 || ended["deleted"] != 0 {
		t.Fatalf("ended %v: want the idle session once, neither the busy nor the deleted one", ended)
	}
	busy["busy"] = false
	mu.Unlock()
	wait("busy")
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.by) != 0 {
		t.Errorf("records left: %v", s.by)
	}
}

// A DELETE the SDK refuses (a protocol header it does not take) leaves the
// session live, its calls running, and counted: it still ends once idle
// (rev-gate #4: its calls were cancelled and its record dropped as if it
// had ended, so it never was).
func TestIdleSessionRefusedDelete(t *testing.T) {
	gt, g, s := newIdleGate(t)
	answered := make(chan int, 1)
	go func() { answered <- s.echo("2") }()
	gt.wait(t, gt.entered)
	req, _ := http.NewRequest(http.MethodDelete, s.url, nil)
	req.Header.Set(sessionIDHeader, s.id)
	req.Header.Set(protocolVersionHeader, "1999-01-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 || !live(g, s.id) {
		t.Fatalf("DELETE with a bad protocol header: %d, session live %v; want refused and live", resp.StatusCode, live(g, s.id))
	}
	gt.release <- struct{}{}
	if err := <-gt.ended; err != nil {
		t.Fatalf("a refused DELETE cancelled the session's call: %v", err)
	}
	if st := <-answered; st != http.StatusOK {
		t.Fatalf("the call: %d", st)
	}
	waitEnded(t, g, s.id)
}

// A timer that runs out as a request comes waits for the lock while the
// request is served; then it counts on from that request instead of
// ending the session just used (rev-gate #5).
func TestIdleCountAfterRequest(t *testing.T) {
	var ended atomic.Int32
	s := newIdleSessions(50*time.Millisecond, 50*time.Millisecond, func(string) bool { return false }, func(string) { ended.Add(1) })
	s.track("x")
	s.mu.Lock()
	time.Sleep(150 * time.Millisecond) // the count ran out: fire waits for the lock
	r := s.record("x", false)
	s.started(r) // a request, served whole before fire gets the lock
	s.served("x", r)
	s.mu.Unlock()
	time.Sleep(10 * time.Millisecond)
	if n := ended.Load(); n != 0 {
		t.Fatalf("ended %d time(s) 10 ms after a request was served (idle 50 ms)", n)
	}
	for deadline := time.Now().Add(10 * time.Second); ended.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never ended once idle after the request")
		}
	}
}

// After its session ended as idle, the Go SDK's client (v1.8.0, default
// retries) does not start a new session: its next call fails, the session
// missing (mcp.ErrSessionMissing), its client closed, every later call
// fails too, and the application must
// connect again, which works (docs/mcp.md "Idle sessions", rev10-mcp #6).
func TestIdleEndedClientMustReconnect(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(srv.Close) // after the clients' Close
	connect := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	cs := connect()
	g.endSession(cs.ID()) // what the idle count calls
	echo := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}}
	if _, err := cs.CallTool(context.Background(), echo); !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("a call after the session ended: %v, want the session missing", err)
	}
	if _, err := cs.CallTool(context.Background(), echo); err == nil {
		t.Fatal("the client started a new session after all (docs/mcp.md says it does not)")
	}
	if r, err := connect().CallTool(context.Background(), echo); err != nil || r.IsError {
		t.Fatalf("a call on a new session: %v %v", r, err)
	}
}
