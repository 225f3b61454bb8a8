package syscalls

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/capkernel/capkernel/netproxy"
)

// FetchOptions configure net.fetch (see RegisterFetch).
type FetchOptions struct {
	// MaxBytes caps the response body returned (default 1 MiB); a call's
	// max_bytes may only lower it.
	MaxBytes int64
	// DefaultTimeout applies when a call gives no timeout_s (default 30 s);
	// MaxTimeout caps timeout_s (default 2 min).
	DefaultTimeout, MaxTimeout time.Duration
	// MaxRedirects bounds the redirects followed (default 10).
	MaxRedirects int
	// Lookup resolves host names (nil: the system resolver).
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// TLS, when set, is the client's TLS configuration (tests trust their
	// own CA with it).
	TLS *tls.Config
}

// FetchID is net.fetch's syscall id.
const FetchID = "net.fetch"

type fetchSys struct{ o *FetchOptions }

type fetchArgs struct {
	URL      string         `json:"url"`
	Method   string         `json:"method"`
	Headers  map[string]any `json:"headers"`
	Body     *string        `json:"body"`
	MaxBytes int64          `json:"max_bytes"`
	TimeoutS int64          `json:"timeout_s"`
}

func (a *fetchArgs) method() string {
	if a.Method == "" {
		return http.MethodGet
	}
	return strings.ToUpper(a.Method)
}

// target parses u and returns its host and port (http or https only).
func target(u *url.URL) (HostPort, error) {
	if u.Scheme != "http" && u.Scheme != "https" {
		return HostPort{}, argsError("url scheme %q is not http or https", u.Scheme)
	}
	if u.User != nil {
		return HostPort{}, argsError("url must not carry user information")
	}
	host := u.Hostname()
	if host == "" {
		return HostPort{}, argsError("url %q has no host", u.String())
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return HostPort{}, argsError("url port %q is not a number from 1 to 65535", p)
		}
		port = n
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return HostPort{Host: host, Port: port}, nil
}

func (f *fetchSys) Definition() Definition {
	return Definition{
		ID: FetchID,
		Description: "Make an HTTP(S) request from the kernel to a host the capability token's net patterns allow. GET and HEAD are reads; other methods change state elsewhere " +
			"(idempotency_key required, never re-sent: a request whose response was lost is outcome_unknown). Redirects are followed only to allowed hosts. " +
			"Returns status, headers, body (capped, with a truncated flag), the final URL and the bytes charged to net_bytes.",
		SideEffect: Network,
		SelfTimed:  true,
		Timeout:    f.o.MaxTimeout + time.Minute,
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"url":{"type":"string","minLength":1,"description":"http:// or https:// URL."},
			"method":{"type":"string","pattern":"^[A-Za-z]{1,16}$","description":"HTTP method (default GET)."},
			"headers":{"type":"object","additionalProperties":true,"description":"Request headers (string values)."},
			"body":{"type":"string","description":"Request body (text)."},
			"max_bytes":{"type":"integer","minimum":1,"description":"Most response body bytes to return (capped by the kernel)."},
			"timeout_s":{"type":"integer","minimum":1,"description":"Time limit in seconds for the whole exchange (default 30)."}},
			"required":["url"],"additionalProperties":false}`),
		Reach: func(args json.RawMessage) (Reach, error) {
			var a fetchArgs
			if err := decodeArgs(args, &a); err != nil {
				return Reach{}, err
			}
			u, err := url.Parse(a.URL)
			if err != nil {
				return Reach{}, argsError("url: %v", err)
			}
			hp, err := target(u)
			if err != nil {
				return Reach{}, err
			}
			class := Network
			if m := a.method(); m == http.MethodGet || m == http.MethodHead {
				class = Read
			}
			return Reach{Class: class, Hosts: []HostPort{hp}}, nil
		},
	}
}

// netMeter counts the net_bytes of one net.fetch call: the bytes on the
// wire (both ways, heads included) and the DNS lookups' cost.
type netMeter struct {
	wire, dns atomic.Int64
	// limited: left bounds wire + dns.
	limited bool
	left    int64
	// body is set once the final response's head is in: from then on
	// every read stops at left (the body is cut there).
	body atomic.Bool
}

// spent is what the call has used of net_bytes so far.
func (m *netMeter) spent() int64 { return m.wire.Load() + m.dns.Load() }

// countingConn counts the bytes a connection carries. A capped one (a
// redirect's hop) sends nothing of a write, and reads nothing, past what
// is left, failing with errNetBudget or errHopBudget; once the final
// response's body is read (netMeter.body), every connection reads nothing
// past it, failing with errBodyBudget.
type countingConn struct {
	net.Conn
	m      *netMeter
	capped bool
	// wrote is set by the connection's first write. The transport starts
	// reading a connection before it writes the request: on a capped
	// connection that read takes at most one byte, as the room left is
	// not known until the request is out (and Write leaves that byte).
	wrote *atomic.Bool
}

var (
	// errNetBudget is what a capped countingConn's refused write returns.
	errNetBudget = fail(FailBudget, "budget net_bytes: a redirect would send past what is left")
	// errHopBudget is what a capped countingConn's refused read returns.
	errHopBudget = fail(FailBudget, "budget net_bytes: a redirect's response would take past what is left")
	// errBodyBudget ends the read of a body at what is left: the body
	// returned is cut there (truncated), not failed.
	errBodyBudget = errors.New("net_bytes budget reached")
)

func (c countingConn) Read(b []byte) (int, error) {
	if c.m.limited && (c.capped || c.m.body.Load()) {
		room := c.m.left - c.m.spent()
		if room <= 0 {
			if c.m.body.Load() {
				return 0, errBodyBudget
			}
			return 0, errHopBudget
		}
		if c.capped && !c.wrote.Load() {
			room = 1
		}
		if int64(len(b)) > room {
			b = b[:room]
		}
	}
	n, err := c.Conn.Read(b)
	c.m.wire.Add(int64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	if c.capped && c.m.spent()+int64(len(b)) >= c.m.left {
		return 0, errNetBudget
	}
	// Counted before it is written: the origin may answer, and the
	// transport read that answer (computing the room left), before
	// Write returns.
	c.m.wire.Add(int64(len(b)))
	n, err := c.Conn.Write(b)
	c.m.wire.Add(int64(n - len(b)))
	c.wrote.Store(true)
	return n, err
}

// clippedError is err with its message cut by clipText: a transport's
// error quotes what an origin sent (a malformed header line, the names
// of a certificate), up to the 64 KiB of a response head.
type clippedError struct{ err error }

func (e clippedError) Error() string { return clipText(e.err.Error()) }
func (e clippedError) Unwrap() error { return e.err }

func (f *fetchSys) Execute(ctx context.Context, c *Call) (Output, error) {
	var a fetchArgs
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	g := c.Grant
	if g == nil || g.AllowsHost == nil {
		return Output{}, errors.New("net.fetch: no network grant")
	}
	method := a.method()
	mutating := method != http.MethodGet && method != http.MethodHead
	timeout := f.o.DefaultTimeout
	if a.TimeoutS > 0 {
		if a.TimeoutS > int64(f.o.MaxTimeout/time.Second) {
			return Output{}, argsError("timeout_s %d exceeds the kernel's limit of %d", a.TimeoutS, int64(f.o.MaxTimeout/time.Second))
		}
		timeout = time.Duration(a.TimeoutS) * time.Second
	}
	limit := f.o.MaxBytes
	if a.MaxBytes > 0 && a.MaxBytes < limit {
		limit = a.MaxBytes
	}
	var body []byte
	if a.Body != nil {
		body = []byte(*a.Body)
	}
	left, limited := g.Left[BudgetNetBytes]
	if limited && left <= 0 {
		// Nothing goes out on a spent budget, not even a bodiless GET
		// (its URL carries data too).
		return Output{}, fail(FailBudget, "budget net_bytes is spent")
	}
	if limited && left < int64(len(body)) {
		return Output{}, fail(FailBudget, "budget net_bytes: %d left, the request body alone is %d", left, len(body))
	}
	// Wire bytes (headers included) are counted, and each DNS lookup
	// costs netproxy.LookupCost (the name goes to the resolver, resolved
	// or not); net_bytes is charged with both, whatever the outcome.
	meter := &netMeter{limited: limited, left: left}
	defer func() { c.Charge(BudgetNetBytes, meter.spent()) }()
	lookup := func(n int64) error {
		if spent := meter.spent(); limited && spent+n > left {
			return fail(FailBudget, "budget net_bytes: a DNS lookup costs %d, %d of %d are spent", n, spent, left)
		}
		meter.dns.Add(n)
		return nil
	}
	guard := &netproxy.Guard{Explicit: g.NamesHost, Lookup: f.o.Lookup, Timeout: timeout}
	var dials atomic.Int32
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := guard.DialContext(netproxy.WithLookupCharge(ctx, lookup), network, addr)
			if err != nil {
				return nil, err
			}
			// Only the first request may overdraw the budget (by its
			// heads: the request's size is known once it is sent); a
			// redirect's hop (one connection each) sends and reads
			// nothing past it.
			return countingConn{Conn: conn, m: meter, capped: limited && dials.Add(1) > 1, wrote: new(atomic.Bool)}, nil
		},
		TLSClientConfig:        f.o.TLS,
		DisableKeepAlives:      true,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	var hops []string
	// The audit record names every hop: host, port, and how it ended.
	type hop struct {
		Host   string `json:"host"`
		Port   int    `json:"port"`
		Method string `json:"method"`
		Status int    `json:"status,omitempty"`
		Reason string `json:"reason,omitempty"`
	}
	var trail []hop
	first, _ := url.Parse(a.URL)
	if hp, err := target(first); err == nil {
		trail = append(trail, hop{Host: hp.Host, Port: hp.Port, Method: method})
	}
	defer func() {
		c.Note("net_connections", map[string]any{"hops": trail, "bytes": meter.wire.Load(), "dns_bytes": meter.dns.Load()})
	}()
	client := &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > f.o.MaxRedirects {
				return fail(FailScope, "more than %d redirects", f.o.MaxRedirects)
			}
			if req.Response != nil && len(trail) > 0 {
				trail[len(trail)-1].Status = req.Response.StatusCode
			}
			hp, err := target(req.URL)
			if err != nil {
				// Both the URL and the error (quoting it) are the origin's.
				return fail(FailScope, "%s", clipText(fmt.Sprintf("redirect to %s: %v", req.URL.Redacted(), err)))
			}
			if len(hp.Host) > netproxy.MaxHostBytes {
				// No DNS name is longer; the record keeps hosts short.
				trail = append(trail, hop{Host: hp.Host[:netproxy.MaxHostBytes], Port: hp.Port, Method: req.Method, Reason: "host name too long"})
				return fail(FailScope, "redirect to a host name of %d bytes (at most %d)", len(hp.Host), netproxy.MaxHostBytes)
			}
			if !g.AllowsHost(hp.Host, hp.Port) {
				trail = append(trail, hop{Host: hp.Host, Port: hp.Port, Method: req.Method, Reason: "host not allowed"})
				return fail(FailScope, "redirect to %s: host %s port %d is outside the capability token's net patterns", clipText(req.URL.Redacted()), hp.Host, hp.Port)
			}
			// A 307 or 308 re-sends the body: the hop goes only if it
			// and a byte of its head fit in what is left.
			if spent, body := meter.spent(), max(req.ContentLength, 0); limited && spent+body >= left {
				trail = append(trail, hop{Host: hp.Host, Port: hp.Port, Method: req.Method, Reason: "net_bytes budget"})
				return fail(FailBudget, "budget net_bytes: redirect to %s not followed: %d of %d bytes spent, and it would send a body of %d again", clipText(req.URL.Redacted()), spent, left, body)
			}
			trail = append(trail, hop{Host: hp.Host, Port: hp.Port, Method: req.Method})
			hops = append(hops, clipText(req.URL.Redacted()))
			return nil
		},
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { sent.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, method, a.URL, bytes.NewReader(body))
	if err != nil {
		return Output{}, argsError("request: %v", err)
	}
	for k, v := range a.Headers {
		s, ok := v.(string)
		if !ok {
			return Output{}, argsError("header %s: value must be a string", k)
		}
		req.Header.Set(k, s)
	}
	resp, err := client.Do(req)
	var ue *url.Error
	if errors.As(err, &ue) {
		// A redirect's error names its Location, as long as an origin
		// makes it (up to the 64 KiB of a response head): the messages
		// and the record keep its start.
		ue.URL = clipText(ue.URL)
	}
	if err != nil {
		// The rest of the message may quote the origin too.
		err = clippedError{err}
	}
	if err != nil && len(trail) > 0 && trail[len(trail)-1].Reason == "" {
		trail[len(trail)-1].Reason = err.Error()
	}
	if err != nil {
		var fl *Failure
		var ae *netproxy.AddrError
		switch {
		case mutating && sent.Load():
			// A hop was sent (a refused redirect or dial comes after the
			// first): the other side may have acted on it.
			return Output{}, fail(FailUnknown, "net.fetch %s %s: the request was sent, then the call failed (%v); it will not be sent again", method, req.URL.Redacted(), err)
		case errors.As(err, &fl):
			return Output{}, fl
		case errors.As(err, &ae):
			return Output{}, fail(FailScope, "net.fetch %s: %v", method, ae)
		case ctx.Err() != nil:
			return Output{}, ctxFailure(ctx, err)
		}
		return Output{}, fmt.Errorf("net.fetch %s: %w", method, err)
	}
	defer resp.Body.Close()
	if len(trail) > 0 {
		trail[len(trail)-1].Status = resp.StatusCode
	}
	// The body is read up to what is left of the budget (the final
	// connection reads no byte past it): cut there, it is truncated.
	meter.body.Store(true)
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	budgetCut := errors.Is(err, errBodyBudget)
	if budgetCut {
		err = nil
	}
	if err != nil {
		err = clippedError{err}
		if mutating {
			return Output{}, fail(FailUnknown, "net.fetch %s %s: reading the response failed (%v) after status %d; it will not be sent again", method, req.URL.Redacted(), err, resp.StatusCode)
		}
		if ctx.Err() != nil {
			return Output{}, ctxFailure(ctx, err)
		}
		return Output{}, fmt.Errorf("net.fetch: reading the response: %w", err)
	}
	truncated := budgetCut || int64(len(data)) > limit
	if int64(len(data)) > limit {
		data = data[:limit]
	}
	headers := map[string]string{}
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		headers[strings.ToLower(k)] = strings.Join(resp.Header.Values(k), ", ")
	}
	out := map[string]any{
		"status": resp.StatusCode, "headers": headers, "truncated": truncated, "final_url": clipText(resp.Request.URL.Redacted()),
		"redirects": append([]string{}, hops...), "bytes_returned": len(data), "net_bytes": meter.spent(),
	}
	putText(out, "body", data)
	return output(out)
}

// maxOriginText is the most of a text an origin makes (a redirect's URL,
// a transport error quoting its response) that net.fetch's messages,
// record and result keep.
const maxOriginText = 1024

// clipText cuts s to maxOriginText bytes (at a UTF-8 boundary), marking
// the cut with "…".
func clipText(s string) string {
	if len(s) <= maxOriginText {
		return s
	}
	n := maxOriginText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// RegisterFetch registers net.fetch with o (defaults filled in).
func RegisterFetch(r *Registry, o FetchOptions) error {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 20
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 30 * time.Second
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = 2 * time.Minute
	}
	if o.MaxRedirects <= 0 {
		o.MaxRedirects = 10
	}
	return r.Register(func() Syscall { return &fetchSys{o: &o} })
}
