package netproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/netproxy"
)

// origin serves a body of n bytes at /size/<n>, a header field of n
// bytes at /head/<n>, and echoes the Host header and the request URI at
// /echo.
func origin() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s, ok := strings.CutPrefix(r.URL.Path, "/head/"); ok {
			n, _ := strconv.Atoi(s)
			w.Header().Set("X-Pad", strings.Repeat("h", n))
			fmt.Fprint(w, "head")
			return
		}
		if s, ok := strings.CutPrefix(r.URL.Path, "/size/"); ok {
			n, _ := strconv.Atoi(s)
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(bytes.Repeat([]byte("x"), n))
			return
		}
		fmt.Fprintf(w, "host=%s uri=%s conn=%q proxyauth=%q", r.Host, r.RequestURI, r.Header.Get("Connection"), r.Header.Get("Proxy-Authorization"))
	})
}

// fixture is a proxy on a unix socket whose dialer maps every *.test name
// to the origin servers' loopback addresses.
type fixture struct {
	proxy *netproxy.Proxy
	plain *httptest.Server
	tls   *httptest.Server
}

func newFixture(t *testing.T, budget int64, allow func(string, int) bool, opts ...func(*netproxy.Options)) *fixture {
	t.Helper()
	f := &fixture{plain: httptest.NewServer(origin()), tls: httptest.NewTLSServer(origin())}
	t.Cleanup(f.plain.Close)
	t.Cleanup(f.tls.Close)
	plainPort := f.plain.Listener.Addr().(*net.TCPAddr).Port
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if !strings.HasSuffix(host, ".test") {
			return nil, fmt.Errorf("test dialer: unknown host %s", host)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	_ = plainPort
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	o := netproxy.Options{Allow: allow, ByteBudget: budget, Dial: dial}
	for _, f := range opts {
		f(&o)
	}
	p, err := netproxy.Listen(sock, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	f.proxy = p
	return f
}

// client returns an http.Client that uses the proxy over its unix socket.
func (f *fixture) client() *http.Client {
	sock := f.proxy.SocketPath()
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.invalid:1"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func port(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }

func allowHosts(hosts ...string) func(string, int) bool {
	return func(h string, _ int) bool {
		for _, x := range hosts {
			if h == x {
				return true
			}
		}
		return false
	}
}

func TestAllowDeny(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"))
	c := f.client()
	tests := []struct {
		name     string
		url      string
		wantCode int
		wantBody string
		wantErr  bool
		method   string
		allowed  bool
	}{
		{"plain allowed", fmt.Sprintf("http://allowed.test:%d/echo?q=1", port(f.plain)), 200, "host=allowed.test:", false, "GET", true},
		{"plain allowed upper case", fmt.Sprintf("http://ALLOWED.TEST.:%d/echo", port(f.plain)), 200, "uri=/echo", false, "GET", true},
		{"plain denied", fmt.Sprintf("http://denied.test:%d/echo", port(f.plain)), 403, "host not allowed", false, "GET", false},
		{"https allowed", fmt.Sprintf("https://allowed.test:%d/echo", port(f.tls)), 200, "host=allowed.test:", false, "CONNECT", true},
		{"https denied", fmt.Sprintf("https://denied.test:%d/echo", port(f.tls)), 0, "", true, "CONNECT", false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.Get(tc.url)
			if tc.wantErr {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("want an error, got %s", resp.Status)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantBody) {
					t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tc.wantCode, tc.wantBody)
				}
			}
			recs := f.proxy.Records()
			if len(recs) != i+1 {
				t.Fatalf("%d records, want %d: %+v", len(recs), i+1, recs)
			}
			r := recs[i]
			u, _ := url.Parse(tc.url)
			wantHost := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
			if r.Host != wantHost || r.Port != mustAtoi(u.Port()) || r.Allowed != tc.allowed || r.Method != tc.method {
				t.Fatalf("record %+v, want host %s port %s allowed %v method %s", r, wantHost, u.Port(), tc.allowed, tc.method)
			}
			if tc.allowed && (r.BytesUp == 0 || r.BytesDown == 0) {
				t.Fatalf("allowed record without byte counts: %+v", r)
			}
			if !tc.allowed && (r.BytesUp != 0 || r.BytesDown != 0 || r.Reason != netproxy.ReasonDenied) {
				t.Fatalf("denied record: %+v", r)
			}
		})
	}
}

func mustAtoi(s string) int { n, _ := strconv.Atoi(s); return n }

// TestReached: the proxy has reached the network once it connected a
// client to an origin, not for a denied host or a dial that failed.
func TestReached(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"))
	c := f.client()
	closed := httptest.NewServer(origin())
	closed.Close()
	for _, tc := range []struct {
		name, url string
		reached   bool
	}{
		{"denied", fmt.Sprintf("http://denied.test:%d/echo", port(f.plain)), false},
		{"dial fails", fmt.Sprintf("http://allowed.test:%d/echo", port(closed)), false},
		{"allowed", fmt.Sprintf("http://allowed.test:%d/echo", port(f.plain)), true},
	} {
		if resp, err := c.Get(tc.url); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if f.proxy.Reached() != tc.reached {
			t.Fatalf("%s: Reached = %v", tc.name, !tc.reached)
		}
	}
}

// A host the allowlist admits whose address the dialer's guard refuses
// (an SSRF attempt: a name resolving to loopback) is answered 403 and
// recorded refused, with the guard's reason, beside a dial that merely
// failed (502, recorded allowed with its error), for CONNECT and plain
// HTTP alike.
func TestGuardRefusalRecordedRefused(t *testing.T) {
	f := newFixture(t, 0, allowHosts("inward.test", "allowed.test"), func(o *netproxy.Options) {
		next := o.Dial
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if host, _, _ := net.SplitHostPort(addr); host == "inward.test" {
				return nil, &netproxy.AddrError{Host: host, Addr: netip.MustParseAddr("127.0.0.1")}
			}
			return next(ctx, network, addr)
		}
	})
	closed := httptest.NewServer(origin())
	closed.Close()
	c := f.client()
	for _, u := range []string{
		fmt.Sprintf("http://inward.test:%d/echo", port(f.plain)),
		fmt.Sprintf("https://inward.test:%d/echo", port(f.tls)),
		fmt.Sprintf("http://allowed.test:%d/echo", port(closed)),
	} {
		resp, err := c.Get(u)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		want := http.StatusForbidden
		if strings.Contains(u, "allowed.test") {
			want = http.StatusBadGateway
		}
		// A refused CONNECT fails the client's Get with the status in
		// its error; a plain request gets the response.
		if err == nil && resp.StatusCode != want || err != nil && !strings.Contains(err.Error(), http.StatusText(want)) {
			t.Errorf("%s: %v %v, want %d", u, resp, err, want)
		}
	}
	recs := f.proxy.Records()
	if len(recs) != 3 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	for i, r := range recs[:2] {
		if r.Allowed || !strings.HasPrefix(r.Reason, netproxy.ReasonAddress+": ") || !strings.Contains(r.Reason, "127.0.0.1") {
			t.Errorf("record %d of a guard refusal: %+v", i, r)
		}
	}
	if r := recs[2]; !r.Allowed || !strings.HasPrefix(r.Reason, "dial: ") {
		t.Errorf("record of a failed dial: %+v", r)
	}
	if f.proxy.Reached() {
		t.Error("Reached after refused and failed dials")
	}
}

// A plain-HTTP request is forwarded in origin form, to the checked host
// whatever its Host header says, without hop-by-hop headers, and with
// Connection: close.
func TestForwardRewrites(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"))
	conn, err := net.Dial("unix", f.proxy.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET http://allowed.test:%d/echo?a=b HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: secret\r\nConnection: keep-alive\r\n\r\n", port(f.plain))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`host=allowed.test:%d uri=/echo?a=b conn="close" proxyauth=""`, port(f.plain))
	if string(body) != want {
		t.Fatalf("origin saw %q, want %q", body, want)
	}
	if !resp.Close {
		t.Fatal("response to client not marked Connection: close")
	}
}

func TestMalformedAndUnsupported(t *testing.T) {
	f := newFixture(t, 0, func(string, int) bool { return true })
	tests := []struct {
		name, req string
		code      int
	}{
		{"garbage", "hello\r\n\r\n", 400},
		{"origin form", "GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400},
		{"https absolute", "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400},
		{"connect no port", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400},
		{"connect bad port", "CONNECT allowed.test:99999 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("unix", f.proxy.SocketPath())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
		})
	}
	for _, r := range f.proxy.Records() {
		if r.Allowed {
			t.Fatalf("malformed request recorded as allowed: %+v", r)
		}
	}
}

func TestByteBudget(t *testing.T) {
	tests := []struct {
		name   string
		scheme string
		budget int64
		size   int
		cut    bool
	}{
		{"plain under budget", "http", 64 << 10, 1000, false},
		{"plain over budget", "http", 16 << 10, 200 << 10, true},
		{"tunnel under budget", "https", 64 << 10, 1000, false},
		{"tunnel over budget", "https", 16 << 10, 200 << 10, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.budget, allowHosts("allowed.test"))
			srv := f.plain
			if tc.scheme == "https" {
				srv = f.tls
			}
			u := fmt.Sprintf("%s://allowed.test:%d/size/%d", tc.scheme, port(srv), tc.size)
			resp, err := f.client().Get(u)
			var got int
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got = len(b)
			}
			if used := f.proxy.BytesUsed(); used > tc.budget {
				t.Fatalf("relayed %d bytes over a budget of %d", used, tc.budget)
			}
			if f.proxy.BudgetExceeded() != tc.cut {
				t.Fatalf("BudgetExceeded = %v, want %v", f.proxy.BudgetExceeded(), tc.cut)
			}
			if !tc.cut && got != tc.size {
				t.Fatalf("got %d bytes (err %v), want %d", got, err, tc.size)
			}
			if tc.cut {
				if got == tc.size {
					t.Fatal("whole body arrived despite the budget")
				}
				recs := f.proxy.Records()
				if len(recs) != 1 || recs[0].Reason != netproxy.ReasonBudget {
					t.Fatalf("records %+v, want one cut for the budget", recs)
				}
				// Later requests are refused.
				resp, err := f.client().Get(fmt.Sprintf("http://allowed.test:%d/size/1", port(f.plain)))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != 403 {
						t.Fatalf("request after the budget: %s", resp.Status)
					}
				}
				recs = f.proxy.Records()
				if last := recs[len(recs)-1]; last.Reason != netproxy.ReasonBudgetRefused || last.Allowed {
					t.Fatalf("request after the budget recorded as %+v", last)
				}
				// The cut connection's other direction may still be
				// relaying when the client sees the cut; Close waits for
				// its handler, after which its record's counts are final.
				f.proxy.Close()
				recs = f.proxy.Records()
				if sum := recs[0].BytesUp + recs[0].BytesDown; sum != f.proxy.BytesUsed() {
					t.Fatalf("record counts %d bytes, proxy %d", sum, f.proxy.BytesUsed())
				}
			}
		})
	}
}

// Close cuts open tunnels and returns.
func TestCloseCutsTunnels(t *testing.T) {
	port := netproxy.ListenTCP(t, "127.0.0.1:0", func(c net.Conn) { io.Copy(c, c) }) // echo, never closes
	f := newFixture(t, 0, allowHosts("echo.test"))
	conn, err := net.Dial("unix", f.proxy.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test\r\n\r\n", port)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	done := make(chan struct{})
	go func() { f.proxy.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung on an open tunnel")
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("tunnel still open after Close")
	}
	recs := f.proxy.Records()
	if len(recs) != 1 || recs[0].BytesUp != 4 || recs[0].BytesDown != 4 || recs[0].Reason != netproxy.ReasonProxyClosed {
		t.Fatalf("records %+v", recs)
	}
}
