package httpapi_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
)

// TestConnsFor: the connection bound is half the descriptors, within [16, 4096].
func TestConnsFor(t *testing.T) {
	for _, tt := range []struct {
		nofile uint64
		want   int
	}{{0, 16}, {20, 16}, {256, 128}, {1024, 512}, {8192, 4096}, {20000, 4096}, {1 << 20, 4096}} {
		if got := httpapi.ConnsFor(tt.nofile); got != tt.want {
			t.Errorf("ConnsFor(%d) = %d, want %d", tt.nofile, got, tt.want)
		}
	}
}

// connServer is a server on loopback through LimitConns whose test sees
// the connections it accepted and the states net/http gave them. A
// request for /hold waits until release is closed; every request's X-Id
// is noted in handled once its handler runs.
type connServer struct {
	addr    string
	holding chan struct{} // a /hold request is being served
	release chan struct{}
	handled sync.Map

	open, peak atomic.Int64 // connections whose descriptor is open, and the most at once

	mu     sync.Mutex
	cond   *sync.Cond
	conns  map[string]*serverConn      // by client address
	states map[string][]http.ConnState // by client address, in order
}

// newConnServer starts a server of at most limit connections; with
// closeRead its connections can be shut for reading (TCP's can), without
// they can only be closed.
func newConnServer(t *testing.T, limit int, closeRead bool) *connServer {
	t.Helper()
	s := &connServer{holding: make(chan struct{}, 16), release: make(chan struct{}),
		conns: map[string]*serverConn{}, states: map[string][]http.ConnState{}}
	s.cond = sync.NewCond(&s.mu)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			s.handled.Store(r.Header.Get("X-Id"), true)
			if r.URL.Path == "/hold" {
				s.holding <- struct{}{}
				<-s.release
			}
			io.WriteString(w, "ok")
		}),
		// LimitConns calls it after noting the state itself.
		ConnState: func(c net.Conn, st http.ConnState) {
			s.mu.Lock()
			s.states[c.RemoteAddr().String()] = append(s.states[c.RemoteAddr().String()], st)
			s.mu.Unlock()
			s.cond.Broadcast()
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	go srv.Serve(httpapi.LimitConns(srv, hookListener{ln, s, closeRead}, limit))
	t.Cleanup(func() { srv.Close() })
	return s
}

// waitState waits until the server gave the connection of client c the
// state st n times in all.
func (s *connServer) waitState(c net.Conn, st http.ConnState, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		seen := 0
		for _, x := range s.states[c.LocalAddr().String()] {
			if x == st {
				seen++
			}
		}
		if seen >= n {
			return
		}
		s.cond.Wait()
	}
}

// conn returns the server's side of client c's connection, once accepted.
func (s *connServer) conn(c net.Conn) *serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.conns[c.LocalAddr().String()] == nil {
		s.cond.Wait()
	}
	return s.conns[c.LocalAddr().String()]
}

// hookListener's connections are serverConns, with CloseRead if closeRead.
type hookListener struct {
	net.Listener
	s         *connServer
	closeRead bool
}

func (l hookListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if n := l.s.open.Add(1); n > l.s.peak.Load() {
		l.s.peak.Store(n) // Accept runs on one goroutine
	}
	sc := &serverConn{Conn: c, s: l.s, shut: make(chan struct{}), got: make(chan struct{})}
	l.s.mu.Lock()
	l.s.conns[c.RemoteAddr().String()] = sc
	l.s.mu.Unlock()
	l.s.cond.Broadcast()
	if l.closeRead {
		return readShutter{sc}, nil
	}
	return sc, nil
}

// serverConn is the server's side of a connection as LimitConns gets it.
type serverConn struct {
	net.Conn
	s *connServer

	closeOnce, shutOnce sync.Once
	shut                chan struct{} // closed by the first CloseRead or Close
	closed              atomic.Bool

	hold     atomic.Bool   // the next Read that gets bytes waits for shut before it returns
	got      chan struct{} // closed when that Read got them
	mu       sync.Mutex
	readErrs []error // the errors its Reads returned
}

func (c *serverConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.hold.CompareAndSwap(true, false) {
		close(c.got)
		<-c.shut
	}
	if err != nil {
		c.mu.Lock()
		c.readErrs = append(c.readErrs, err)
		c.mu.Unlock()
	}
	return n, err
}

func (c *serverConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.s.open.Add(-1)
		c.shutOnce.Do(func() { close(c.shut) })
	})
	return err
}

// readErrors returns the errors its Reads returned.
func (c *serverConn) readErrors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.readErrs...)
}

// readShutter is a serverConn that can be shut for reading.
type readShutter struct{ *serverConn }

func (c readShutter) CloseRead() error {
	defer c.shutOnce.Do(func() { close(c.shut) })
	return c.Conn.(*net.TCPConn).CloseRead()
}

// client is a client's connection. Its deadline only keeps a server that
// never answers from hanging the test.
type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &client{c, bufio.NewReader(c)}
}

// send sends a request for path with X-Id id.
func (c *client) send(method, path, id string) error {
	_, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nX-Id: %s\r\nContent-Length: 2\r\n\r\nhi", method, path, id)
	return err
}

// answer reads the answer to a request sent.
func (c *client) answer() error {
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// do sends a GET of path and reads its answer.
func (c *client) do(path string) error {
	if err := c.send("GET", path, ""); err != nil {
		return err
	}
	return c.answer()
}

// closedByServer reports whether the server closed c: a read finds EOF
// (or a reset) where it would wait for an answer to no request.
func (c *client) closedByServer() bool {
	_, err := c.r.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestLimitConnsClosesQuietest: at its bound the listener closes, to serve
// a new connection, the one that has been quiet the longest — accepted
// and silent, or idle between requests — and never one serving a
// request; the others are still served. Connections that never sent a
// request were never closed: as many silent connections as the bound, of
// one client that sends nothing, kept every other client out.
func TestLimitConnsClosesQuietest(t *testing.T) {
	const limit = 3
	tests := []struct {
		name  string
		conns []string // "silent": sends nothing; "idle": one request, then kept; "busy": a request in progress
		want  int      // the one closed for the new connection
	}{
		{"all silent", []string{"silent", "silent", "silent"}, 0},
		{"silent before idle", []string{"silent", "idle", "idle"}, 0},
		{"idle before silent", []string{"idle", "silent", "silent"}, 0},
		{"busy skipped", []string{"busy", "silent", "idle"}, 1},
		{"busy skipped, idle before silent", []string{"busy", "idle", "silent"}, 1},
	}
	for _, closeRead := range []bool{true, false} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/closeRead=%v", tt.name, closeRead), func(t *testing.T) {
				s := newConnServer(t, limit, closeRead)
				conns := make([]*client, len(tt.conns))
				for i, kind := range tt.conns {
					c := dial(t, s.addr)
					conns[i] = c
					switch kind {
					case "silent":
						s.waitState(c, http.StateNew, 1)
					case "idle":
						if err := c.do("/"); err != nil {
							t.Fatalf("conn %d: %v", i, err)
						}
						s.waitState(c, http.StateIdle, 1)
					case "busy":
						if err := c.send("GET", "/hold", ""); err != nil {
							t.Fatal(err)
						}
						<-s.holding
					}
				}
				if err := dial(t, s.addr).do("/"); err != nil {
					t.Fatalf("new connection at the bound: %v", err)
				}
				if !conns[tt.want].closedByServer() {
					t.Fatalf("conn %d (%s) not closed", tt.want, tt.conns[tt.want])
				}
				close(s.release)
				for i, c := range conns {
					if i == tt.want {
						continue
					}
					if tt.conns[i] == "busy" {
						if err := c.answer(); err != nil {
							t.Fatalf("conn %d (busy): %v", i, err)
						}
					} else if err := c.do("/"); err != nil {
						t.Fatalf("conn %d (%s), not the quiet one the longest, not served: %v", i, tt.conns[i], err)
					}
				}
				if n := s.peak.Load(); n > limit+1 {
					t.Fatalf("the server held %d connections at once, over its bound of %d and the one waiting", n, limit)
				}
			})
		}
	}
}

// TestLimitConnsClosesIdle: ten clients that each keep an idle
// connection are all answered while the server never holds more than
// three and the one waiting, and three are still open, the newest among
// them. Without a bound a client holding idle connections took every
// descriptor of serve.
func TestLimitConnsClosesIdle(t *testing.T) {
	const limit, clients = 3, 10
	s := newConnServer(t, limit, true)
	conns := make([]*client, clients)
	for i := range conns {
		conns[i] = dial(t, s.addr)
		if err := conns[i].do("/"); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	var alive []int
	for i, c := range conns {
		if c.do("/") == nil {
			alive = append(alive, i)
		}
	}
	// Which were idle the longest is the server's view: a connection
	// answered first may go idle after a later one.
	if len(alive) != limit || alive[limit-1] != clients-1 {
		t.Fatalf("connections still served: %v, want %d with the newest", alive, limit)
	}
	if n := s.peak.Load(); n > limit+1 {
		t.Fatalf("the server held %d connections at once, over its bound of %d and the one waiting", n, limit)
	}
}

// TestLimitConnsWaitsForBusy: when every connection is busy with a
// request, the next one is served only once a request ended; none is cut.
func TestLimitConnsWaitsForBusy(t *testing.T) {
	const limit = 3
	s := newConnServer(t, limit, true)
	busy := make([]*client, limit)
	for i := range busy {
		busy[i] = dial(t, s.addr)
		if err := busy[i].send("GET", "/hold", ""); err != nil {
			t.Fatal(err)
		}
		<-s.holding
	}
	var released atomic.Bool
	errs := make(chan error, 1)
	c := dial(t, s.addr)
	go func() {
		if err := c.do("/"); err != nil {
			errs <- err
		} else if !released.Load() {
			errs <- fmt.Errorf("a fourth connection was served while %d held requests", limit)
		} else {
			errs <- nil
		}
	}()
	released.Store(true)
	close(s.release)
	for i, b := range busy {
		if err := b.answer(); err != nil {
			t.Fatalf("busy connection %d: %v", i, err)
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestLimitConnsShutsIdleReader: the connection chosen is shut for
// reading, not closed under the server: the server, waiting in a read for
// the idle connection's next request, wakes with EOF and closes it,
// releasing its descriptor and its slot for the new connection.
func TestLimitConnsShutsIdleReader(t *testing.T) {
	s := newConnServer(t, 1, true)
	a := dial(t, s.addr)
	if err := a.do("/"); err != nil {
		t.Fatal(err)
	}
	s.waitState(a, http.StateIdle, 1)
	if err := dial(t, s.addr).do("/"); err != nil {
		t.Fatalf("new connection at the bound: %v", err)
	}
	if !a.closedByServer() {
		t.Fatal("the idle connection is not closed")
	}
	sc := s.conn(a)
	// (A read before, net/http's look for a request past the first,
	// ended with a timeout when the first was answered.)
	if errs := sc.readErrors(); len(errs) == 0 || errs[len(errs)-1] != io.EOF {
		t.Fatalf("the server's reads of the idle connection ended with %v, want EOF", errs)
	}
	if !sc.closed.Load() {
		t.Fatal("the server did not close the idle connection")
	}
}

// TestLimitConnsChoiceExcludesRequest: a request that reaches an idle
// connection as it is chosen is either served and answered, or not served
// at all — never served with its answer lost. The server's read of the
// request returns just after the connection was chosen; LimitConns closed
// the connection under the server, which then read the request, ran its
// handler (a call: POST /v1/syscalls) and wrote the answer to a closed
// socket, while the client got EOF.
func TestLimitConnsChoiceExcludesRequest(t *testing.T) {
	for _, closeRead := range []bool{true, false} {
		t.Run(fmt.Sprintf("closeRead=%v", closeRead), func(t *testing.T) {
			s := newConnServer(t, 1, closeRead)
			a := dial(t, s.addr)
			if err := a.do("/"); err != nil {
				t.Fatal(err)
			}
			s.waitState(a, http.StateIdle, 1)
			sc := s.conn(a)
			sc.hold.Store(true)
			if err := a.send("POST", "/v1/syscalls", "late"); err != nil {
				t.Fatal(err)
			}
			<-sc.got // the server's read has the request; the new connection chooses a
			if err := dial(t, s.addr).do("/"); err != nil {
				t.Fatalf("new connection at the bound: %v", err)
			}
			err := a.answer()
			_, ran := s.handled.Load("late")
			if err != nil && ran {
				t.Fatalf("the request was served and its answer lost: %v", err)
			}
			if err == nil && !ran {
				t.Fatal("answered without being served")
			}
		})
	}
}
