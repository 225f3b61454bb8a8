// Package netproxy is the kernel-run HTTP proxy behind the "allowlist"
// network posture of proc.exec.
//
// A Proxy listens on a unix socket (which the sandbox binds into the
// sandboxed command's file system and relays to a loopback TCP port, see
// package sandbox) and speaks the two forms of the HTTP proxy protocol:
//
//   - CONNECT host:port — a TCP tunnel, used by clients for HTTPS (TLS runs
//     end to end between the client and the origin; the proxy sees only the
//     host name of the CONNECT line and the tunnelled byte counts, so the
//     TLS server name and the Host inside the tunnel may name any site the
//     allowed host's address serves: a CDN's other customers, say);
//   - absolute-URI requests (GET http://host:port/path HTTP/1.1, any method)
//     — plain HTTP, forwarded to the origin in origin form with
//     "Connection: close", one request per client connection; the
//     origin's interim (1xx) responses ("100 Continue", "103 Early
//     Hints") are relayed before its final one.
//
// Every request is checked against Options.Allow, a predicate over the host
// (lower case, without a trailing dot or IPv6 brackets) and port. A denied
// request gets "403 Forbidden" and nothing is dialed. Every request,
// allowed or denied, leaves a Record (host, port, method, allowed, bytes up
// and down, reason) for the call's audit record.
//
// The records stay bounded without losing one that matters: every allowed
// request's record is kept, and a proxy allows at most Options.MaxAllowed
// requests (default 10,000; later ones are refused with ReasonLimit).
// Refused requests (denied, malformed, over a limit, or admitted and then
// refused by the dialer: ReasonAddress, ReasonBudgetRefused) are kept in
// full up to Options.MaxRefusedRecords (default 100); later ones are only counted,
// by reason, in Dropped. So a command cannot push the record of its real
// connection out with a flood of refused ones.
//
// Each record keeps a bounded part of what a client or an origin sent: a
// host longer than MaxHostBytes, or with a byte no host name has, is
// refused (ReasonUnsupported); a method is cut to MaxMethodBytes and a
// reason's detail (a quoted request line, an origin's error) to
// MaxReasonDetail. The records Records returns stay within
// Options.MaxRecordBytes of JSON (default 1 MiB): the refused ones first,
// then the allowed ones in arrival order; the allowed requests beyond are
// counted in Dropped with the bytes they relayed. (With the default
// limits 100 refused records take at most about 220 KiB, and 1 MiB holds a few
// thousand allowed records.)
//
// Options.ByteBudget bounds the bytes relayed through the proxy as a whole
// (up + down, payload only: tunnelled bytes, the forwarded request and the
// origin's response), and the DNS lookups the proxy makes for them, each
// charged LookupCost (a name carries data to whoever serves its zone, even
// one that does not resolve). The byte that would exceed the budget is
// never relayed: the connection carrying it is cut, every other open
// connection is closed too, and later requests are refused with 403; a
// lookup the budget cannot pay for whole is not made, and its request is
// refused with 403 (ReasonBudgetRefused). BudgetExceeded reports it, so
// the caller can fail the call with budget_exceeded.
//
// Options.MaxConns bounds the client connections open at once (default
// 64). The proxy accepts a connection only when one of those slots is
// free; until then later connections wait unaccepted in the socket's listen
// queue, where they cost the proxy's process no file descriptor (a client
// whose connect finds that queue full waits in connect, or gets EAGAIN if
// it does not block). A proxy thus holds at most 1 + 2 × MaxConns
// descriptors (the listener; per connection the client's and the
// origin's), whatever the sandboxed command does. An Accept error that can
// pass (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, EINTR, EAGAIN, a
// timeout) is retried after a pause doubling from 5 ms to 1 s; it never
// ends Serve.
//
// The proxy runs in the kernel's process, so what it buffers for a client
// is bounded: a request head (request line and header fields) of more than
// Options.MaxHeaderBytes (default 64 KiB) is answered "431 Request Header
// Fields Too Large" after reading that much of it, and recorded refused
// with ReasonHeadTooLarge; an origin's response head of more than that is
// answered 502, its record's reason saying so. Bodies and tunnels are
// streamed, never buffered whole.
//
// Host names are resolved by the proxy (Options.Dial), never by the
// sandboxed client, so the predicate sees the name the client asked for.
// An SSRF guard on the dialed address (refusing loopback, private or
// metadata addresses) belongs in Options.Dial; the default dialer has none.
package netproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
)

// Options configure a Proxy.
type Options struct {
	// Allow reports whether the proxy may connect to host:port. host is
	// lower case, without a trailing dot and without IPv6 brackets. A nil
	// Allow denies everything.
	Allow func(host string, port int) bool

	// ByteBudget is the total number of payload bytes (both directions,
	// all connections) the proxy relays, DNS lookups included at
	// LookupCost each; 0 means unlimited.
	ByteBudget int64

	// Dial connects to the origin; nil uses a Guard that refuses no
	// address (Explicit always true) with DialTimeout. The proxy passes
	// it a ctx with a lookup charge (WithLookupCharge) that takes the
	// lookup's cost from ByteBudget, or refuses it when the budget cannot
	// pay for all of it: a Guard charges it, another Dial may not.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// DialTimeout bounds Dial (default 10 s).
	DialTimeout time.Duration

	// HeaderTimeout bounds reading the client's request head (default 10 s).
	HeaderTimeout time.Duration

	// MaxHeaderBytes bounds a request head a client sends (request line
	// and header fields, line ends included) and a response head an
	// origin sends, as http.Server's MaxHeaderBytes bounds a request's
	// (default 64 KiB, net.fetch's bound on a response head). A larger
	// request head is answered 431 and recorded refused with
	// ReasonHeadTooLarge; a larger response head is answered 502 and
	// recorded with the reason "upstream: response head …". The proxy
	// reads no further byte of it either way.
	MaxHeaderBytes int

	// MaxConns is the number of client connections handled at once
	// (default 64); more wait, unaccepted, until one ends.
	MaxConns int

	// MaxAllowed is the number of requests the proxy allows (default
	// 10,000), each with its record; later requests are refused with
	// ReasonLimit.
	MaxAllowed int

	// MaxRefusedRecords is the number of refused requests whose records
	// are kept (default 100); later refused requests are counted in
	// Dropped instead.
	MaxRefusedRecords int

	// MaxRecordBytes bounds the records Records returns, as the sum of
	// their JSON encodings' lengths (default 1 MiB): every refused
	// request's record kept (MaxRefusedRecords) is returned, then the
	// allowed ones in arrival order while the sum stays within the bound;
	// later allowed ones are counted in Dropped (Drops.Allowed, with
	// their bytes) instead.
	MaxRecordBytes int
}

// Bounds of what one Record keeps of what a client or an origin sent.
const (
	// MaxHostBytes is the longest host a request may name: the longest
	// DNS name. A longer host, or one with a byte that is not a letter,
	// digit, '.', '-', '_', ':' or '%', is refused (ReasonUnsupported).
	MaxHostBytes = 253
	// MaxMethodBytes is the most of a request's method a Record keeps.
	MaxMethodBytes = 32
	// MaxReasonDetail is the most of a reason's detail (what follows the
	// constant part and ": ") a Record keeps; a longer detail is cut at
	// a UTF-8 boundary and ends with "…".
	MaxReasonDetail = 256
)

// Record is one proxied request.
type Record struct {
	Host       string    `json:"host"` // at most MaxHostBytes
	Port       int       `json:"port"`
	Method     string    `json:"method"` // CONNECT, or the plain-HTTP method (its first MaxMethodBytes)
	Allowed    bool      `json:"allowed"`
	Reason     string    `json:"reason,omitempty"` // why denied, or why the connection ended abnormally (detail cut at MaxReasonDetail)
	BytesUp    int64     `json:"bytes_up"`         // client → origin
	BytesDown  int64     `json:"bytes_down"`       // origin → client
	Start      time.Time `json:"start"`
	DurationMS int64     `json:"duration_ms"` // set when the connection ends
}

// Reasons recorded in Record.Reason.
const (
	ReasonDenied        = "host not allowed"
	ReasonBudget        = "net byte budget exceeded"
	ReasonBudgetRefused = "net byte budget exhausted"
	ReasonBadRequest    = "malformed proxy request"
	ReasonHeadTooLarge  = "request head too large" // Options.MaxHeaderBytes
	ReasonUnsupported   = "unsupported proxy request"
	ReasonProxyClosed   = "proxy closed"
	ReasonLimit         = "connection limit reached" // Options.MaxAllowed
	// ReasonAddress: the host was allowed, but the dialer refused every
	// address it resolved to (ErrSpecialAddress: loopback, private and
	// other special-purpose ranges, the SSRF guard).
	ReasonAddress        = "address not allowed"
	reasonDialPrefix     = "dial: "
	reasonUpstreamPrefix = "upstream: "
)

// ErrBudget is the error a relayed read or write returns once the byte
// budget is spent.
var ErrBudget = errors.New("netproxy: " + ReasonBudget)

// Proxy is an allowlisting HTTP/HTTPS proxy. It is safe for concurrent use.
type Proxy struct {
	opts Options
	path string // unix socket path when made by Listen

	used     atomic.Int64
	exceeded atomic.Bool
	reached  atomic.Bool

	mu        sync.Mutex
	records   []Record
	gone      map[int]bool // records refused after admission beyond MaxRefusedRecords: not returned
	allowed   int          // allowed requests so far
	refused   int          // records of refused requests kept
	drops     Drops
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closed    bool
	wg        sync.WaitGroup

	// slots holds a token per client connection being handled (at most
	// MaxConns); done is closed by Close, releasing a serve loop waiting
	// for a slot or pausing after an Accept error.
	slots chan struct{}
	done  chan struct{}
}

// New returns a Proxy; serve it with Serve.
func New(opts Options) *Proxy {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.HeaderTimeout <= 0 {
		opts.HeaderTimeout = 10 * time.Second
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = 64 << 10
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 64
	}
	if opts.MaxAllowed <= 0 {
		opts.MaxAllowed = 10000
	}
	if opts.MaxRefusedRecords <= 0 {
		opts.MaxRefusedRecords = 100
	}
	if opts.MaxRecordBytes <= 0 {
		opts.MaxRecordBytes = 1 << 20
	}
	if opts.Dial == nil {
		g := &Guard{Explicit: func(string, int) bool { return true }, Timeout: opts.DialTimeout}
		opts.Dial = g.DialContext
	}
	return &Proxy{opts: opts, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		slots: make(chan struct{}, opts.MaxConns), done: make(chan struct{})}
}

// Listen creates a unix socket at path (mode 0600; path must not exist),
// and serves the proxy on it in the background until Close.
func Listen(path string, opts Options) (*Proxy, error) {
	p := New(opts)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("netproxy: %w", err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("netproxy: %w", err)
	}
	p.path = path
	if err := p.track(l); err != nil {
		return nil, err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.serve(l)
	}()
	return p, nil
}

// SocketPath is the unix socket made by Listen ("" for a Proxy from New).
func (p *Proxy) SocketPath() string { return p.path }

// Serve accepts connections on l until l or the Proxy is closed, at most
// Options.MaxConns at a time (over all listeners). It returns nil after
// Close, and an error only for an Accept error that cannot pass (see the
// package comment).
func (p *Proxy) Serve(l net.Listener) error {
	if err := p.track(l); err != nil {
		return err
	}
	return p.serve(l)
}

func (p *Proxy) track(l net.Listener) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.Close()
		return errors.New("netproxy: closed")
	}
	p.listeners[l] = struct{}{}
	return nil
}

func (p *Proxy) serve(l net.Listener) error {
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
		l.Close()
	}()
	var pause time.Duration
	for {
		// Take a slot before accepting: a connection beyond MaxConns stays
		// in the listen queue, costing no descriptor here.
		select {
		case p.slots <- struct{}{}:
		case <-p.done:
			return nil
		}
		c, err := l.Accept()
		if err != nil {
			<-p.slots
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !temporary(err) {
				return fmt.Errorf("netproxy: accept: %w", err)
			}
			// Out of descriptors (or memory) for now: the connection
			// waits in the queue while handlers end and free some.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(pause):
			case <-p.done:
				return nil
			}
			continue
		}
		pause = 0
		cc := &conn{client: c, rec: -1}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			<-p.slots
			return nil
		}
		p.conns[cc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots }()
			defer p.forget(cc)
			p.handle(cc)
		}()
	}
}

// temporary reports whether an Accept error may pass: the process or the
// system is out of descriptors, buffers or memory for now, or the
// connection went away before it was accepted.
func temporary(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close stops the listeners, cuts every open connection and waits for the
// handlers to finish. Records stay readable.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	for l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		c.abort(ReasonProxyClosed)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Records returns a copy of the records kept so far, in arrival order:
// the first MaxRefusedRecords refused requests', and the allowed requests'
// within MaxRecordBytes. The byte counts of connections still open are
// their counts so far, and their reason is the one already known: a
// connection cut (for the budget, say) shows why at once, not only once
// its handler has finished.
func (p *Proxy) Records() []Record {
	recs, _ := p.report()
	return recs
}

// Drops counts the requests whose records Records does not return.
type Drops struct {
	// Total is the number of requests not itemised: the refused ones
	// beyond Options.MaxRefusedRecords plus Allowed.
	Total int `json:"total"`
	// ByReason splits the refused ones of Total by the constant part of
	// the reason the record would have had (ReasonDenied,
	// ReasonBadRequest, … without the detail after ": "); nil when there
	// are none.
	ByReason map[string]int `json:"by_reason,omitempty"`
	// Allowed is the number of allowed requests whose records did not
	// fit in Options.MaxRecordBytes, and BytesUp and BytesDown the
	// bytes they relayed.
	Allowed   int   `json:"allowed,omitempty"`
	BytesUp   int64 `json:"bytes_up,omitempty"`
	BytesDown int64 `json:"bytes_down,omitempty"`
}

// Dropped counts the requests whose records Records does not return.
func (p *Proxy) Dropped() Drops {
	_, d := p.report()
	return d
}

// report makes what Records and Dropped return.
func (p *Proxy) report() ([]Record, Drops) {
	p.mu.Lock()
	all := append([]Record(nil), p.records...)
	for c := range p.conns {
		if c.rec >= 0 && c.rec < len(all) {
			r := &all[c.rec]
			r.BytesUp = c.up.Load()
			r.BytesDown = c.down.Load()
			if why := c.reason(); why != "" && r.Reason == "" {
				r.Reason = why
			}
		}
	}
	d := Drops{Total: p.drops.Total}
	if d.Total > 0 {
		d.ByReason = make(map[string]int, len(p.drops.ByReason))
		for k, n := range p.drops.ByReason {
			d.ByReason[k] = n
		}
	}
	if len(p.gone) > 0 {
		kept := all[:0]
		for i, r := range all {
			if !p.gone[i] {
				kept = append(kept, r)
			}
		}
		all = kept
	}
	p.mu.Unlock()

	// The refused records are few (MaxRefusedRecords) and each bounded:
	// they come first, so that a flood of allowed requests cannot push
	// them out; the allowed ones share what is left, in arrival order.
	size := func(r *Record) int {
		b, err := json.Marshal(r)
		if err != nil {
			return 0
		}
		return len(b) + 1 // the comma of the list
	}
	sizes := make([]int, len(all))
	left := p.opts.MaxRecordBytes
	for i := range all {
		sizes[i] = size(&all[i])
		if !all[i].Allowed {
			left -= sizes[i]
		}
	}
	out := all[:0]
	for i, r := range all {
		if r.Allowed {
			if sizes[i] > left {
				left = 0 // keep the arrival order: no later one either
				d.Total++
				d.Allowed++
				d.BytesUp += r.BytesUp
				d.BytesDown += r.BytesDown
				continue
			}
			left -= sizes[i]
		}
		out = append(out, r)
	}
	return out, d
}

// Reached reports whether the proxy has connected a client to an origin
// (a dial that succeeded): from then on the client may have acted there.
func (p *Proxy) Reached() bool { return p.reached.Load() }

// BytesUsed is the number of payload bytes relayed so far plus the cost
// of the DNS lookups made (LookupCost), never more than a non-zero
// ByteBudget.
func (p *Proxy) BytesUsed() int64 { return p.used.Load() }

// BudgetExceeded reports whether a connection was cut or refused because
// the byte budget was spent.
func (p *Proxy) BudgetExceeded() bool { return p.exceeded.Load() }

// take reserves up to n bytes of the budget and returns how many it got.
func (p *Proxy) take(n int) int {
	if n <= 0 {
		return 0
	}
	if p.opts.ByteBudget <= 0 {
		p.used.Add(int64(n))
		return n
	}
	for {
		u := p.used.Load()
		rem := p.opts.ByteBudget - u
		if rem <= 0 {
			return 0
		}
		k := int64(n)
		if k > rem {
			k = rem
		}
		if p.used.CompareAndSwap(u, u+k) {
			return int(k)
		}
	}
}

// spend takes n bytes of the budget for a DNS lookup, all or none: when
// the budget cannot pay for all of them, nothing is taken, the budget is
// marked exceeded and spend returns ErrBudget.
func (p *Proxy) spend(n int64) error {
	if p.opts.ByteBudget <= 0 {
		p.used.Add(n)
		return nil
	}
	for {
		u := p.used.Load()
		if u+n > p.opts.ByteBudget {
			p.exceeded.Store(true)
			return ErrBudget
		}
		if p.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

// overBudget marks the budget spent and cuts every open connection.
func (p *Proxy) overBudget() {
	p.exceeded.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.abort(ReasonBudget)
	}
}

func (p *Proxy) forget(c *conn) {
	c.closeAll()
	p.mu.Lock()
	delete(p.conns, c)
	if c.rec >= 0 && c.rec < len(p.records) {
		r := &p.records[c.rec]
		r.BytesUp = c.up.Load()
		r.BytesDown = c.down.Load()
		r.DurationMS = time.Since(r.Start).Milliseconds()
		if reason := c.reason(); reason != "" && r.Reason == "" {
			r.Reason = reason
		}
	}
	p.mu.Unlock()
}

// record keeps r, a refused request's record, as the record of c, or
// counts it in the drops beyond MaxRefusedRecords.
func (p *Proxy) record(c *conn, r Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keep(c, r)
}

// admit allows r's request, keeping its record, unless MaxAllowed
// requests were allowed already: then r is kept refused with ReasonLimit
// and admit returns false.
func (p *Proxy) admit(c *conn, r Record) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.allowed >= p.opts.MaxAllowed {
		r.Reason = ReasonLimit
		p.keep(c, r)
		return false
	}
	p.allowed++
	r.Allowed = true
	p.keep(c, r)
	return true
}

// refuse turns c's admitted request into a refused one: the dialer
// refused its host's addresses (ReasonAddress), or the budget could not
// pay for its DNS lookup (ReasonBudgetRefused). An audit looking for
// refused requests finds it there, not among the allowed ones with a
// failed dial. It still counts against MaxAllowed, which bounds the dials
// (and DNS lookups) one proxy makes; and its record against
// MaxRefusedRecords, as any refused one: beyond, it is counted in the
// drops and no longer returned.
func (p *Proxy) refuse(c *conn, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.rec < 0 || c.rec >= len(p.records) {
		return
	}
	r := &p.records[c.rec]
	r.Allowed, r.Reason = false, clip(reason)
	if p.refused < p.opts.MaxRefusedRecords {
		p.refused++
		return
	}
	// The record stays in place (other connections' indices point past
	// it), marked gone.
	if p.gone == nil {
		p.gone = map[int]bool{}
	}
	p.gone[c.rec] = true
	p.drop(r.Reason)
}

// keep appends r as the record of c, within the bounds of a Record;
// p.mu is held.
func (p *Proxy) keep(c *conn, r Record) {
	r.Reason = clip(r.Reason)
	if len(r.Method) > MaxMethodBytes {
		r.Method = r.Method[:MaxMethodBytes] // a token: ASCII
	}
	if !r.Allowed {
		if p.refused >= p.opts.MaxRefusedRecords {
			p.drop(r.Reason)
			return
		}
		p.refused++
	}
	p.records = append(p.records, r)
	c.rec = len(p.records) - 1
}

// drop counts a refused request whose record is not kept, by the
// constant part of its reason; p.mu is held.
func (p *Proxy) drop(reason string) {
	why, _, _ := strings.Cut(reason, ": ")
	if p.drops.ByReason == nil {
		p.drops.ByReason = map[string]int{}
	}
	p.drops.Total++
	p.drops.ByReason[why]++
}

// clip cuts the detail of reason (what follows its constant part and
// ": ") to MaxReasonDetail bytes: details quote what a client or an
// origin sent (a malformed request line, a bad response), and a record
// keeps only a bounded part of that.
func clip(reason string) string {
	why, detail, found := strings.Cut(reason, ": ")
	if !found {
		why, detail = "", reason
	}
	if len(detail) <= MaxReasonDetail {
		return reason
	}
	n := MaxReasonDetail
	for n > 0 && !utf8.RuneStart(detail[n]) {
		n--
	}
	if !found {
		return detail[:n] + "…"
	}
	return why + ": " + detail[:n] + "…"
}

// conn is one client connection and, once dialed, its origin connection.
type conn struct {
	client net.Conn
	rec    int // index in Proxy.records, -1 if none; guarded by Proxy.mu
	up     atomic.Int64
	down   atomic.Int64

	mu       sync.Mutex
	upstream net.Conn
	why      string
	done     bool
}

func (c *conn) setUpstream(u net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		u.Close()
		return false
	}
	c.upstream = u
	return true
}

func (c *conn) abort(why string) {
	c.mu.Lock()
	if c.why == "" {
		c.why = why
	}
	c.done = true
	u := c.upstream
	c.mu.Unlock()
	c.client.Close()
	if u != nil {
		u.Close()
	}
}

func (c *conn) closeAll() {
	c.mu.Lock()
	c.done = true
	u := c.upstream
	c.mu.Unlock()
	c.client.Close()
	if u != nil {
		u.Close()
	}
}

func (c *conn) reason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.why
}

func (c *conn) setReason(why string) {
	c.mu.Lock()
	if c.why == "" {
		c.why = clip(why)
	}
	c.mu.Unlock()
}

func (p *Proxy) handle(c *conn) {
	c.client.SetReadDeadline(time.Now().Add(p.opts.HeaderTimeout))
	// http.ReadRequest has no limit of its own: the head is read through
	// a limit, lifted once it is read, as http.Server does.
	head := &io.LimitedReader{R: c.client, N: int64(p.opts.MaxHeaderBytes)}
	br := bufio.NewReader(head)
	req, err := http.ReadRequest(br)
	if err != nil {
		switch {
		case head.N <= 0:
			p.record(c, Record{Reason: fmt.Sprintf("%s: more than %d bytes", ReasonHeadTooLarge, p.opts.MaxHeaderBytes), Start: time.Now()})
			reply(c.client, http.StatusRequestHeaderFieldsTooLarge, ReasonHeadTooLarge)
		case !errors.Is(err, io.EOF):
			p.record(c, Record{Method: "", Reason: ReasonBadRequest + ": " + err.Error(), Start: time.Now()})
			reply(c.client, http.StatusBadRequest, ReasonBadRequest)
		}
		return
	}
	head.N = math.MaxInt64 // the body or the tunnel
	c.client.SetReadDeadline(time.Time{})

	host, port, perr := target(req)
	rec := Record{Host: host, Port: port, Method: req.Method, Start: time.Now()}
	switch {
	case perr != nil:
		rec.Reason = ReasonUnsupported + ": " + perr.Error()
		p.record(c, rec)
		reply(c.client, http.StatusBadRequest, rec.Reason)
		return
	case p.opts.Allow == nil || !p.opts.Allow(host, port):
		rec.Reason = ReasonDenied
		p.record(c, rec)
		reply(c.client, http.StatusForbidden, fmt.Sprintf("%s: %s", ReasonDenied, net.JoinHostPort(host, strconv.Itoa(port))))
		return
	case p.exceeded.Load() || (p.opts.ByteBudget > 0 && p.used.Load() >= p.opts.ByteBudget):
		p.exceeded.Store(true)
		rec.Reason = ReasonBudgetRefused
		p.record(c, rec)
		reply(c.client, http.StatusForbidden, ReasonBudgetRefused)
		return
	}
	if !p.admit(c, rec) {
		reply(c.client, http.StatusForbidden, ReasonLimit)
		return
	}

	ctx, cancel := context.WithTimeout(WithLookupCharge(context.Background(), p.spend), p.opts.DialTimeout)
	u, err := p.opts.Dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	cancel()
	switch {
	case errors.Is(err, ErrSpecialAddress):
		p.refuse(c, ReasonAddress+": "+err.Error())
		reply(c.client, http.StatusForbidden, ReasonAddress)
		return
	case errors.Is(err, ErrBudget):
		p.refuse(c, ReasonBudgetRefused+": the DNS lookup of "+host+" costs more than is left")
		reply(c.client, http.StatusForbidden, ReasonBudgetRefused)
		return
	case err != nil:
		c.setReason(reasonDialPrefix + err.Error())
		reply(c.client, http.StatusBadGateway, "dial failed")
		return
	}
	p.reached.Store(true)
	if !c.setUpstream(u) {
		return
	}
	up := &metered{Conn: u, p: p, c: c}

	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		p.tunnel(c, br, up)
		return
	}
	p.forward(c, req, up)
}

// target extracts the origin of a proxy request.
func target(req *http.Request) (string, int, error) {
	var hostport, defPort string
	if req.Method == http.MethodConnect {
		hostport = req.URL.Host
		if hostport == "" {
			hostport = req.RequestURI
		}
	} else {
		if !req.URL.IsAbs() {
			return "", 0, errors.New("not an absolute-URI proxy request")
		}
		if !strings.EqualFold(req.URL.Scheme, "http") {
			return "", 0, fmt.Errorf("scheme %q (use CONNECT for https)", req.URL.Scheme)
		}
		hostport, defPort = req.URL.Host, "80"
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		if defPort == "" {
			return "", 0, fmt.Errorf("target %q: %v", hostport, err)
		}
		host, port = hostport, defPort
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" || len(host) > MaxHostBytes || strings.IndexFunc(host, func(r rune) bool {
		return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || strings.ContainsRune(".-_:%", r))
	}) >= 0 {
		return "", 0, fmt.Errorf("bad host %q", host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return host, 0, fmt.Errorf("bad port %q", port)
	}
	return host, n, nil
}

// tunnel relays bytes both ways until both directions end.
func (p *Proxy) tunnel(c *conn, br *bufio.Reader, up *metered) {
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, br) // client → origin (buffered bytes first)
		closeWrite(up.Conn)
		done <- struct{}{}
	}()
	go func() {
		_, err := io.Copy(c.client, up) // origin → client
		if err != nil && !errors.Is(err, ErrBudget) && !errors.Is(err, net.ErrClosed) {
			c.setReason(reasonUpstreamPrefix + err.Error())
		}
		closeWrite(c.client)
		done <- struct{}{}
	}()
	<-done
	<-done
}

// hop-by-hop headers, not forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Upgrade"}

// maxInterim is the most interim (1xx) responses forward relays before
// the final one, as net/http's client takes.
const maxInterim = 5

// dropHopHeaders removes the hop-by-hop fields from h: those of
// hopHeaders and those its Connection fields name.
func dropHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, f := range hopHeaders {
		h.Del(f)
	}
}

// forward sends one plain-HTTP request to the origin and relays the
// response, then closes the client connection. Interim (1xx) responses
// before it, but 101, are relayed as they come (at most maxInterim; a
// request's "Expect: 100-continue" is forwarded, and its body sent whole
// without waiting for the "100 Continue" it asks for).
func (p *Proxy) forward(c *conn, req *http.Request, up *metered) {
	dropHopHeaders(req.Header)
	req.RequestURI = ""
	req.Host = req.URL.Host // the checked host, whatever the Host header said
	req.Close = true
	if err := req.Write(up); err != nil {
		if !errors.Is(err, ErrBudget) {
			c.setReason(reasonUpstreamPrefix + err.Error())
			reply(c.client, http.StatusBadGateway, "upstream write failed")
		}
		return
	}
	head := &io.LimitedReader{R: up}
	br := bufio.NewReader(head)
	var resp *http.Response
	for interim := 0; ; interim++ {
		head.N = int64(p.opts.MaxHeaderBytes) // each head
		var err error
		resp, err = http.ReadResponse(br, req)
		if err != nil {
			switch {
			case errors.Is(err, ErrBudget):
			case head.N <= 0:
				c.setReason(fmt.Sprintf("%sresponse head larger than %d bytes", reasonUpstreamPrefix, p.opts.MaxHeaderBytes))
				reply(c.client, http.StatusBadGateway, "upstream response head too large")
			default:
				c.setReason(reasonUpstreamPrefix + err.Error())
				reply(c.client, http.StatusBadGateway, "bad upstream response")
			}
			return
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// Never asked for: the proxy takes Upgrade off every request.
			c.setReason(reasonUpstreamPrefix + "101 Switching Protocols to a request that asked for no upgrade")
			reply(c.client, http.StatusBadGateway, "bad upstream response")
			return
		}
		if resp.StatusCode >= 200 {
			break
		}
		if interim == maxInterim {
			c.setReason(fmt.Sprintf("%smore than %d interim (1xx) responses", reasonUpstreamPrefix, maxInterim))
			reply(c.client, http.StatusBadGateway, "bad upstream response")
			return
		}
		// An interim response has no body and no Content-Length: its
		// head is relayed as it is, without "Connection: close" (the
		// final response follows on the connection).
		dropHopHeaders(resp.Header)
		text, _ := strings.CutPrefix(resp.Status, strconv.Itoa(resp.StatusCode)+" ")
		var b strings.Builder
		fmt.Fprintf(&b, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, text)
		resp.Header.Write(&b)
		b.WriteString("\r\n")
		if _, err := io.WriteString(c.client, b.String()); err != nil {
			if !errors.Is(err, net.ErrClosed) {
				c.setReason(reasonUpstreamPrefix + err.Error())
			}
			return
		}
	}
	head.N = math.MaxInt64 // the body
	defer resp.Body.Close()
	resp.Close = true
	if err := resp.Write(c.client); err != nil && !errors.Is(err, ErrBudget) && !errors.Is(err, net.ErrClosed) {
		c.setReason(reasonUpstreamPrefix + err.Error())
	}
}

// metered is the origin connection: it counts the bytes relayed and
// enforces the budget.
type metered struct {
	net.Conn
	p *Proxy
	c *conn
}

func (m *metered) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	if n > 0 {
		k := m.p.take(n)
		m.c.down.Add(int64(k))
		if k < n {
			m.c.setReason(ReasonBudget)
			m.p.overBudget()
			return k, ErrBudget
		}
	}
	return n, err
}

func (m *metered) Write(b []byte) (int, error) {
	k := m.p.take(len(b))
	n, err := m.Conn.Write(b[:k])
	m.c.up.Add(int64(n))
	if err == nil && k < len(b) {
		m.c.setReason(ReasonBudget)
		m.p.overBudget()
		return n, ErrBudget
	}
	return n, err
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

func reply(w io.Writer, code int, msg string) {
	body := "capkernel netproxy: " + msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}
