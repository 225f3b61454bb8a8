package mcpgateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

const rawInitialize = `{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"` + rawProtocol + `","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// TestHTTPSessionsBounded: the gateway holds at most MaxSessions sessions
// (DefaultMaxSessions by default); an initialize past them is answered
// 503 with a JSON-RPC error answering its id, and makes no session, while
// the live sessions are served as before; once one ends, a new one may
// start. Sessions were not bounded: 20,000 initializes made 20,000
// sessions, 568 MB of the gateway's process for the idle hour.
func TestHTTPSessionsBounded(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts HTTPOptions
		max  int
	}{
		{"set", HTTPOptions{MaxSessions: 4}, 4},
		{"default", HTTPOptions{}, DefaultMaxSessions},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
			srv := httptest.NewServer(g.HTTPHandler(tt.opts))
			t.Cleanup(srv.Close)
			sessions := make([]*rawSession, tt.max)
			for i := range sessions {
				sessions[i] = newRawSession(t, srv.URL)
			}
			fresh := &rawSession{t: t, url: srv.URL}
			resp, body := fresh.post(rawInitialize)
			var answer struct {
				ID    int `json:"id"`
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &answer); err != nil || resp.StatusCode != http.StatusServiceUnavailable ||
				answer.ID != 7 || answer.Error.Code != CodeSessionsFull || resp.Header.Get(sessionIDHeader) != "" {
				t.Fatalf("initialize past %d sessions: %d %s %s (%v), want 503 with error %d for id 7 and no session",
					tt.max, resp.StatusCode, resp.Header.Get(sessionIDHeader), body, err, CodeSessionsFull)
			}
			if n := g.liveSessions(); n != tt.max {
				t.Fatalf("%d sessions live, want %d", n, tt.max)
			}
			if resp, body := sessions[0].post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK {
				t.Fatalf("a live session's request at the bound: %d %s", resp.StatusCode, body)
			}
			g.endSession(sessions[0].id)
			newRawSession(t, srv.URL) // fails the test unless it starts
		})
	}
}

// TestFreshSessionEnds: a session with no request after its initialize
// ends after the fresh idle time, not the session idle time (an hour
// here), while one that sent notifications/initialized lives on; so
// sessions made and dropped do not hold places under MaxSessions for an
// hour.
func TestFreshSessionEnds(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	// freshIdle is long enough that the used session's notification,
	// sent right after its initialize, comes within it on a loaded machine.
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{SessionIdle: time.Hour, freshIdle: time.Second}))
	t.Cleanup(srv.Close)
	used := newRawSession(t, srv.URL) // initialize, then notifications/initialized
	dropped := &rawSession{t: t, url: srv.URL}
	resp, body := dropped.post(rawInitialize)
	if dropped.id = resp.Header.Get(sessionIDHeader); resp.StatusCode != http.StatusOK || dropped.id == "" {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	waitEnded(t, g, dropped.id)
	if !live(g, used.id) {
		t.Fatal("a session in use ended with the one never used after its initialize")
	}
}
