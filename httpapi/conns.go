package httpapi

import (
	"container/list"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
)

// Bounds of MaxConns.
const (
	minConns = 16
	maxConns = 4096
)

// MaxConns is how many connections a server of this process keeps open at
// once (LimitConns): half the file descriptors the process may open
// (RLIMIT_NOFILE, which Go raises to its hard limit at start), so the
// other half stays for the kernel's own files (its database, workspace
// files, sandboxes, the control socket), within [16, 4096]: 4096 with a
// limit of 8192 or more. Every open connection is a descriptor, and
// without a bound one client holding idle keep-alive connections took
// every descriptor of the process, the kernel's with them.
func MaxConns() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return minConns
	}
	return ConnsFor(r.Cur)
}

// ConnsFor is MaxConns for a process that may open nofile descriptors.
func ConnsFor(nofile uint64) int {
	return int(min(max(nofile/2, minConns), maxConns))
}

// LimitConns returns ln serving at most limit connections of srv at once,
// and holding one more while it waits to serve it; it sets srv's
// ConnState (calling the one srv had too). srv accepts from one goroutine,
// as http.Server does.
//
// At the bound a new connection takes the place of the connection quiet
// the longest: a connection is quiet while it has no request in progress —
// accepted and nothing read from it yet, or kept alive between requests
// with nothing read since its last answer. So neither idle keep-alive
// connections nor connections that never send a request keep new clients
// out: a slot is held only by a request being read (a request sent slowly
// holds it until srv's read timeouts) or served. When no connection is
// quiet, the new one waits until one closes or goes quiet.
//
// The connection chosen is not closed under the server. Its read side is
// shut (TCPConn.CloseRead), so the server, waiting for its next request,
// reads EOF and closes it, and bytes that reach the server from it after it
// was chosen are dropped, so that no request starts on it: choosing it and
// reading a request from it exclude each other. A request whose bytes the
// server had read keeps its connection out of the choice and is answered.
// A client whose connection is chosen sees it closed without an answer
// (EOF, or a reset when it had sent a request since) and no request it sent
// on it since its last answer was served: it may send it again over a new
// connection, as after the server's idle timeout (Go's client does so
// itself for a request it may repeat: GET, HEAD, or one with an
// Idempotency-Key header). One case escapes the exclusion: a request a
// client pipelined (sent before the answer to the one before), which the
// server read along with the one before, may be served on a chosen
// connection, and the new connection then waits until its handler returns.
func LimitConns(srv *http.Server, ln net.Listener, limit int) net.Listener {
	l := &connLimit{Listener: ln, slots: make(chan struct{}, limit),
		wake: make(chan struct{}, 1), closed: make(chan struct{})}
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		l.state(c, s)
		if prev != nil {
			prev(c, s)
		}
	}
	return l
}

// connLimit is the listener of LimitConns.
type connLimit struct {
	net.Listener
	slots chan struct{} // one per open connection

	mu       sync.Mutex
	quiet    list.List // *limitedConn quiet, the one quiet the longest first
	shutting int       // connections chosen whose server is about to close them

	wake      chan struct{} // a connection went quiet, or one chosen started a request
	closed    chan struct{}
	closeOnce sync.Once
}

// Accept accepts a connection, then waits for a slot for it, choosing the
// connection quiet the longest to close when there is none: a connection
// is closed only for one that came, and the one waiting is the only
// descriptor past the bound.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := l.take(); err != nil {
		c.Close()
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l}
	l.mu.Lock()
	l.setQuiet(lc) // nothing read from it yet
	l.mu.Unlock()
	return lc, nil
}

// take takes a slot for the next connection.
func (l *connLimit) take() error {
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		l.shutQuietest()
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.wake: // one went quiet, or the one chosen did not close
		case <-l.closed:
			return net.ErrClosed
		}
	}
}

// Close closes the listener; an Accept waiting for a slot returns.
func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// shutQuietest chooses the connection quiet the longest and shuts its
// read side, unless one chosen before is about to free its slot. A
// connection that cannot be shut for reading is closed.
func (l *connLimit) shutQuietest() {
	l.mu.Lock()
	if l.shutting > 0 || l.quiet.Len() == 0 {
		l.mu.Unlock()
		return
	}
	c := l.quiet.Front().Value.(*limitedConn)
	l.setBusy(c)
	c.chosen, c.shutting = true, true
	c.watched.Store(true)
	l.shutting++
	l.mu.Unlock()
	if r, ok := c.Conn.(interface{ CloseRead() error }); ok && r.CloseRead() == nil {
		return // the server reads EOF and closes it
	}
	c.Close()
}

// state follows srv's connections between quiet and not.
func (l *connLimit) state(c net.Conn, s http.ConnState) {
	// A TLS server's connection wraps the one Accept returned.
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = w.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateIdle:
		if l.setQuiet(lc) {
			l.signal()
		}
	case http.StateActive, http.StateHijacked:
		l.setBusy(lc)
		if lc.shutting {
			// Chosen with a request read already (pipelined): it
			// closes only after its answer, so choose another.
			lc.shutting = false
			l.shutting--
			l.signal()
		}
	}
}

// setQuiet puts c, unless closed or chosen, at the end of l.quiet, and
// reports whether it did; l.mu is held.
func (l *connLimit) setQuiet(c *limitedConn) bool {
	if c.quiet != nil || c.chosen || c.done {
		return false
	}
	c.quiet = l.quiet.PushBack(c)
	c.watched.Store(true)
	return true
}

// setBusy takes c out of l.quiet; l.mu is held.
func (l *connLimit) setBusy(c *limitedConn) {
	if c.quiet != nil {
		l.quiet.Remove(c.quiet)
		c.quiet = nil
	}
	c.watched.Store(c.chosen)
}

// signal wakes an Accept waiting for a slot.
func (l *connLimit) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// limitedConn is a connection of a connLimit; closing it frees its slot.
type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once

	// watched is set while the connection is quiet or chosen, the states
	// in which a Read must take l.mu; it is written under l.mu.
	watched atomic.Bool

	// Guarded by l.mu.
	quiet    *list.Element // its element of l.quiet while quiet
	chosen   bool          // chosen to close: its read side is shut, Read returns EOF
	shutting bool          // chosen and counted in l.shutting
	done     bool          // closed
}

// Read reads from the connection. Bytes read while it is quiet make it
// busy; bytes read once it is chosen are dropped (EOF), so that no request
// starts on a connection being closed.
func (c *limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.watched.Load() {
		return n, err
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.chosen {
		return 0, io.EOF
	}
	if n > 0 {
		c.l.setBusy(c)
	}
	return n, err
}

// Close closes the connection, then frees its slot: the descriptor is
// gone before another connection may take it.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		c.done = true
		l.setBusy(c)
		if c.shutting {
			c.shutting = false
			l.shutting--
		}
		l.mu.Unlock()
		<-l.slots
	})
	return err
}
