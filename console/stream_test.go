package console

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// sse collects the raw bytes of an event stream until the server ends it
// (done closes).
type sse struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

// events opens c's GET /console/api/events; the stream is closed when
// the test ends.
func (c *client) events() *sse {
	c.w.t.Helper()
	return openSSE(c.w.t, c.hc, c.w.srv.URL+"/console/api/events", "")
}

// openSSE opens the event stream at url with hc, sending cred as a bearer
// credential unless it is empty; the stream is closed when the test ends.
func openSSE(t *testing.T, hc *http.Client, url, cred string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		resp.Body.Close()
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	s := &sse{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			s.mu.Lock()
			s.buf.Write(sc.Bytes())
			s.buf.WriteByte('\n')
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-s.done })
	return s
}

func (s *sse) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the stream holds want.
func (s *sse) waitFor(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if strings.Contains(s.String(), want) {
			return
		}
	}
	t.Fatalf("the event stream never carried %q:\n%s", want, s)
}

// waitEnded waits until the server has ended the stream.
func (s *sse) waitEnded(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream of a session whose credential no longer verifies is still open:\n%s", s)
	}
}

// skewedClock is the kernel's clock in a test: the real time, moved on
// by Advance, so a token's expiry comes without waiting for it.
type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) Now() time.Time          { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Advance(d time.Duration) { c.skew.Add(int64(d)) }

// TestEventStreamEndsWithCredential: the console's event stream checks its
// session's credential again before each event and on each heartbeat.
// Once the approver's token is revoked, or expires (a real token of a
// 60 s TTL, the kernel's clock moved past it), the stream sends "event:
// ended" with the reason and ends, no later approval request (with its
// arguments) reaches it, and the session is gone. Another approver's
// stream gets that request, so it was emitted. The stream only checked
// that the session existed, and a revoked approver kept reading every
// approval request.
func TestEventStreamEndsWithCredential(t *testing.T) {
	tests := []struct {
		name      string
		heartbeat time.Duration
		expire    bool // else revoke
		reason    string
	}{
		{"revoked, the next event", time.Hour, false, "revoked"},
		{"revoked, idle until the heartbeat", 10 * time.Millisecond, false, "revoked"},
		{"expired, the next event", time.Hour, true, "expired"},
		{"expired, idle until the heartbeat", 10 * time.Millisecond, true, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &skewedClock{}
			w := newWorldWith(t, kernel.Config{Now: clock.Now}, func(c *Console) { c.heartbeat = tt.heartbeat })
			tok, err := w.k.Mint(kernel.TokenRequest{AgentID: "erin", Role: captoken.RoleApprover, TTLSeconds: 60})
			if err != nil {
				t.Fatal(err)
			}
			leaving, staying := w.client(), w.client()
			if leaving.login(tok.Token) != 200 || staying.login(w.alice.Token) != 200 {
				t.Fatal("login")
			}
			stream, control := leaving.events(), staying.events()
			before, _ := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, "k-before")
			stream.waitFor(t, before)

			if tt.expire {
				clock.Advance(60*time.Second + kernel.DefaultTokenLeeway + time.Second)
			} else if err := w.k.Revoke(context.Background(), tok.ID, "erin left the team"); err != nil {
				t.Fatal(err)
			}
			if tt.heartbeat < time.Hour {
				// Idle: the heartbeat alone must end the stream.
				stream.waitEnded(t)
			}
			after, _ := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "SECRET=hunter2"}, "k-after")
			control.waitFor(t, after)
			stream.waitEnded(t)
			got := stream.String()
			if strings.Contains(got, after) || strings.Contains(got, "hunter2") {
				t.Errorf("the stream delivered an event after its credential stopped verifying:\n%s", got)
			}
			if want := "event: ended\ndata: {\"error\":\"the credential no longer verifies: "; !strings.Contains(got, want) || !strings.Contains(got, tt.reason) {
				t.Errorf("the stream did not end with %q (%s):\n%s", want, tt.reason, got)
			}
			if status, _ := leaving.do(http.MethodGet, "/console/api/session", nil); status != http.StatusUnauthorized {
				t.Errorf("the session outlived its credential: %d", status)
			}
		})
	}
}

// TestEventStreamsOutliveWriteTimeout: every event stream of the server
// extends its write deadline before each write, so it outlives the
// server's WriteTimeout (kernelctl serve: 15 minutes, here 1 s): the
// event of a call made after the WriteTimeout passed still reaches it.
// The console's stream kept the deadline the server set when it opened,
// and was cut (no "event: ended") that long after, every 15 minutes for
// every open console.
func TestEventStreamsOutliveWriteTimeout(t *testing.T) {
	const writeTimeout = time.Second
	w := newWorldServer(t, kernel.Config{}, func(c *Console) { c.heartbeat = 100 * time.Millisecond },
		func(s *http.Server) { s.WriteTimeout = writeTimeout })
	auditor := w.client()
	if st := auditor.login(w.dave.Token); st != http.StatusOK {
		t.Fatalf("login: %d", st)
	}
	streams := []struct {
		name string
		s    *sse
	}{
		{"GET /console/api/events", auditor.events()},
		{"GET /v1/events", openSSE(t, http.DefaultClient, w.srv.URL+"/v1/events", w.dave.Token)},
	}
	time.Sleep(writeTimeout + writeTimeout/2) // the server's deadline for the streams has passed
	op, _ := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, "k-late")
	for _, st := range streams {
		t.Run(st.name, func(t *testing.T) {
			st.s.waitFor(t, op)
			select {
			case <-st.s.done:
				t.Fatalf("the stream ended:\n%s", st.s)
			default:
			}
		})
	}
}

// TestEventStreamLimits: a session holds at most maxStreamsPerSession
// event streams open (the page's, and the one replacing it after a
// break) and the console at most maxStreams in all; beyond either a
// stream is refused 429, which the page retries, and a stream that closes
// frees its place. A session opened as many as it liked, each a kernel
// subscription with its event buffer.
func TestEventStreamLimits(t *testing.T) {
	w := newWorldWith(t, kernel.Config{}, func(c *Console) { c.maxStreamsPerSession, c.maxStreams = 2, 3 })
	alice, alice2, bob := w.client(), w.client(), w.client()
	for _, c := range []*client{alice, alice2} {
		if st := c.login(w.alice.Token); st != http.StatusOK {
			t.Fatalf("login: %d", st)
		}
	}
	if st := bob.login(w.bob.Token); st != http.StatusOK {
		t.Fatalf("login: %d", st)
	}
	var first func()
	steps := []struct {
		name   string
		c      *client
		status int
	}{
		{"alice's first", alice, 200},
		{"alice's second", alice, 200},
		{"alice's third: over the session's bound", alice, 429},
		{"alice's other session: its own bound", alice2, 200},
		{"bob's first: over the bound in all", bob, 429},
	}
	for i, st := range steps {
		status, stop := st.c.openEvents()
		if i == 0 {
			first = stop
		}
		if status != st.status {
			t.Fatalf("%s: status %d, want %d", st.name, status, st.status)
		}
	}
	first()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		status, _ := bob.openEvents()
		if status == http.StatusOK {
			break
		}
		if status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("bob's stream after one closed: %d", status)
		}
	}
}

// openEvents opens c's GET /console/api/events and answers its status; a
// stream open is closed by stop, or when the test ends.
func (c *client) openEvents() (status int, stop func()) {
	c.w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.w.srv.URL+"/console/api/events", nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		c.w.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return resp.StatusCode, func() {}
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); resp.Body.Close() }) }
	c.w.t.Cleanup(stop)
	return resp.StatusCode, stop
}
