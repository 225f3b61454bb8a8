package httpapi

import (
	"net"
	"net/http"
	"sync"
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
// ConnState (calling the one srv had too). At the bound a new connection
// takes the place of the one idle the longest — a keep-alive connection
// between requests, which is closed — so that idle connections held open
// do not keep new clients out; when none is idle the new one waits until
// one closes or goes idle. A client finds its idle connection closed as
// after the server's idle timeout, and sends its next request over a new
// one (Go's client does so itself for a request it may repeat).
func LimitConns(srv *http.Server, ln net.Listener, limit int) net.Listener {
	l := &connLimit{Listener: ln, slots: make(chan struct{}, limit), idle: map[*limitedConn]uint64{},
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

	mu   sync.Mutex
	idle map[*limitedConn]uint64 // idle connections, by when they went idle (n)
	n    uint64

	wake      chan struct{} // a connection went idle
	closed    chan struct{}
	closeOnce sync.Once
}

// Accept accepts a connection, then waits for a slot for it, closing the
// connection idle the longest when there is none: a connection is closed
// only for one that came, and the one waiting is the only descriptor past
// the bound.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := l.take(); err != nil {
		c.Close()
		return nil, err
	}
	return &limitedConn{Conn: c, l: l}, nil
}

// take takes a slot for the next connection.
func (l *connLimit) take() error {
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		if l.closeIdle() {
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.wake: // one went idle: close it
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

// closeIdle closes the connection idle the longest, and reports whether
// there was one.
func (l *connLimit) closeIdle() bool {
	l.mu.Lock()
	var oldest *limitedConn
	for c, n := range l.idle {
		if oldest == nil || n < l.idle[oldest] {
			oldest = c
		}
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	oldest.Close() // frees its slot
	return true
}

// state follows srv's connections between idle and not.
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
	if s == http.StateIdle && !lc.done {
		l.n++
		l.idle[lc] = l.n
	} else {
		delete(l.idle, lc)
	}
	l.mu.Unlock()
	if s == http.StateIdle {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// limitedConn is a connection of a connLimit; closing it frees its slot.
type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
	done bool // closed; guarded by l.mu
}

// Close closes the connection, then frees its slot: the descriptor is
// gone before another connection may take it.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.done = true
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}
