package syscalls_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
	"github.com/capkernel/capkernel/syscalls"
)

// host is a syscalls.Host that keeps what a call charges and notes.
type host struct {
	mu      sync.Mutex
	charged map[string]int64
	notes   map[string]any
}

func (h *host) Charge(budget string, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.charged == nil {
		h.charged = map[string]int64{}
	}
	h.charged[budget] += n
}

func (h *host) Note(key string, v any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.notes == nil {
		h.notes = map[string]any{}
	}
	h.notes[key] = v
}

func (h *host) Cleanup(f func()) { f() }
func (h *host) After(f func())   { f() }

// countingListener counts the bytes its connections read: what a server
// received.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countedConn{Conn: c, n: l.n}, nil
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// serve starts a loopback HTTP server with h, counting the bytes it
// receives in got.
func serve(t *testing.T, h http.Handler, got *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = countingListener{Listener: srv.Listener, n: got}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// fetch runs net.fetch with args under a grant allowing (and naming)
// every host, with net_bytes left (none if < 0), and returns its output,
// its error and what it charged.
func fetch(t *testing.T, o syscalls.FetchOptions, left int64, args map[string]any) (syscalls.Output, error, *host) {
	t.Helper()
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterFetch(r, o); err != nil {
		t.Fatal(err)
	}
	entry, ok := r.Get(syscalls.FetchID)
	if !ok {
		t.Fatal("no net.fetch")
	}
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	if err := entry.Validate(raw); err != nil {
		t.Fatalf("Validate: %.200v", err)
	}
	all := func(string, int) bool { return true }
	g := &syscalls.Grant{AllowsHost: all, NamesHost: all, Left: map[string]int64{}}
	if left >= 0 {
		g.Left[syscalls.BudgetNetBytes] = left
	}
	h := &host{}
	out, err := entry.New().Execute(context.Background(), &syscalls.Call{Args: raw, Grant: g, Host: h})
	return out, err, h
}

func failClass(err error) string {
	var f *syscalls.Failure
	if errors.As(err, &f) {
		return f.Class
	}
	if err != nil {
		return "error"
	}
	return ""
}

// TestFetchRedirectsKeepTheBudget: a 307 or 308 re-sends the request body
// at every hop; the hops a net_bytes budget cannot pay for are not sent.
// Before, the body was checked against the budget once, and ten 307s sent
// it eleven times.
func TestFetchRedirectsKeepTheBudget(t *testing.T) {
	var got atomic.Int64
	var hops atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only a request that arrived whole counts: a hop cut by the
		// budget mid-body may reach the handler before or after the
		// call has returned.
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		n := hops.Add(1)
		code := 307
		if strings.HasPrefix(r.URL.Path, "/308") {
			code = 308
		}
		if strings.HasSuffix(r.URL.Path, "/twice") && n > 2 {
			fmt.Fprint(w, "done")
			return
		}
		http.Redirect(w, r, r.URL.Path, code)
	}), &got)
	const body = 100 << 10
	tests := []struct {
		name    string
		method  string
		path    string
		headers map[string]any
		left    int64
		class   string
		hops    int32
	}{
		{"POST 307s past the budget", "POST", "/307", nil, 120 << 10, syscalls.FailUnknown, 1},
		{"GET with a body 308s past the budget", "GET", "/308", nil, 120 << 10, syscalls.FailBudget, 1},
		// The second hop's body fits, its 20 KiB of headers do not.
		{"a hop whose head would overdraw", "GET", "/307", map[string]any{"X-Pad": strings.Repeat("p", 20<<10)}, 2*body + 30<<10, syscalls.FailBudget, 1},
		{"hops the budget pays for", "POST", "/307/twice", nil, 4 * body, "", 3},
		{"no budget", "POST", "/307/twice", nil, -1, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got.Store(0)
			hops.Store(0)
			args := map[string]any{"url": srv.URL + tt.path, "method": tt.method, "body": strings.Repeat("b", body)}
			if tt.headers != nil {
				args["headers"] = tt.headers
			}
			_, err, h := fetch(t, syscalls.FetchOptions{}, tt.left, args)
			if failClass(err) != tt.class {
				t.Fatalf("error %v, want class %q", err, tt.class)
			}
			if n := hops.Load(); n != tt.hops {
				t.Fatalf("the server received %d requests whole, want %d", n, tt.hops)
			}
			if tt.left >= 0 && (got.Load() > tt.left || h.charged[syscalls.BudgetNetBytes] > tt.left+1<<10) {
				t.Fatalf("the server received %d bytes and %d were charged under a net_bytes budget of %d", got.Load(), h.charged[syscalls.BudgetNetBytes], tt.left)
			}
		})
	}
}

// TestFetchChargesLookups: a DNS lookup costs net_bytes
// (netproxy.LookupCost), resolved or not, and one the budget cannot pay
// for is not made. Before, a name that did not resolve cost nothing, and a
// token with 1 byte left sent names to the resolver without limit.
func TestFetchChargesLookups(t *testing.T) {
	var got atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }), &got)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	const name, nx = "srv.test", "chunk00-data.nx.test"
	var lookups atomic.Int32
	o := syscalls.FetchOptions{Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		if host == name {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}}
	tests := []struct {
		name    string
		host    string
		left    int64
		class   string
		lookups int32
		charged int64 // -1: the lookup's cost and the bytes on the wire
	}{
		{"a name that does not resolve", nx, -1, "error", 1, netproxy.LookupCost(nx)},
		{"a budget under the lookup's cost", nx, netproxy.LookupCost(nx) - 1, syscalls.FailBudget, 0, 0},
		{"a name that resolves", name, 10000, "", 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookups.Store(0)
			out, err, h := fetch(t, o, tt.left, map[string]any{"url": "http://" + tt.host + ":" + port + "/"})
			if failClass(err) != tt.class {
				t.Fatalf("error %v, want class %q", err, tt.class)
			}
			if n := lookups.Load(); n != tt.lookups {
				t.Fatalf("%d lookups, want %d", n, tt.lookups)
			}
			charged := h.charged[syscalls.BudgetNetBytes]
			if tt.charged >= 0 && charged != tt.charged {
				t.Fatalf("charged %d, want %d", charged, tt.charged)
			}
			if tt.charged < 0 {
				var res struct {
					NetBytes int64 `json:"net_bytes"`
				}
				if err := json.Unmarshal(out.Result, &res); err != nil {
					t.Fatal(err)
				}
				if res.NetBytes != charged || charged <= netproxy.LookupCost(tt.host) {
					t.Fatalf("net_bytes %d, charged %d; want the same, the lookup's %d and the bytes on the wire", res.NetBytes, charged, netproxy.LookupCost(tt.host))
				}
			}
		})
	}
}

// TestFetchRecordBounds: what an origin puts in a redirect's Location
// reaches the call's error and its record only in part. Before, an
// origin's 60 KiB Location went whole into both.
func TestFetchRecordBounds(t *testing.T) {
	long := strings.Repeat("l", 60<<10)
	var got atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/loop"):
			http.Redirect(w, r, "/loop/"+long, http.StatusFound)
		case r.URL.Path == "/far":
			http.Redirect(w, r, "http://"+strings.Repeat("h", 300)+".test/", http.StatusFound)
		case r.URL.Path == "/scheme":
			w.Header().Set("Location", strings.Repeat("s", 60<<10)+"://h/")
			w.WriteHeader(http.StatusFound)
		}
	}), &got)
	tests := []struct {
		name, method, path, class string
	}{
		{"a sent request, then too many redirects", "POST", "/loop", syscalls.FailUnknown},
		{"a GET, then too many redirects", "GET", "/loop", syscalls.FailScope},
		{"a redirect to a host over 253 bytes", "GET", "/far", syscalls.FailScope},
		{"a redirect to a scheme of 60 KiB", "GET", "/scheme", syscalls.FailScope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err, h := fetch(t, syscalls.FetchOptions{}, -1, map[string]any{"url": srv.URL + tt.path, "method": tt.method})
			if failClass(err) != tt.class {
				t.Fatalf("error %.300v, want class %q", err, tt.class)
			}
			note, _ := json.Marshal(h.notes["net_connections"])
			if len(err.Error()) > 2<<10 || len(note) > 8<<10 {
				t.Fatalf("error of %d bytes, net_connections of %d: %.300s", len(err.Error()), len(note), note)
			}
		})
	}
}

// TestFetchBodyWithinBudget: with a net_bytes budget the body returned is
// cut to what is left once the response head is in, redirects' hops
// included, and the call succeeds with truncated set. Before, the body was
// read up to the budget computed before the first hop: the hops' bytes
// were spent twice, the charge passed the budget and the call lost its
// body to budget_exceeded (review rev2-fronts F1).
func TestFetchBodyWithinBudget(t *testing.T) {
	var got atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hop" {
			// A redirect whose response head spends most of the budget.
			w.Header().Set("X-Pad", strings.Repeat("p", 9000))
			http.Redirect(w, r, "/big", http.StatusFound)
			return
		}
		fmt.Fprint(w, strings.Repeat("x", 20000))
	}), &got)
	const left = 10000
	for _, path := range []string{"/big", "/hop"} {
		t.Run(path, func(t *testing.T) {
			out, err, h := fetch(t, syscalls.FetchOptions{}, left, map[string]any{"url": srv.URL + path})
			if err != nil {
				t.Fatalf("error %.300v, want a truncated body", err)
			}
			var res struct {
				Body      string `json:"body"`
				Truncated bool   `json:"truncated"`
				NetBytes  int64  `json:"net_bytes"`
			}
			if err := json.Unmarshal(out.Result, &res); err != nil {
				t.Fatal(err)
			}
			charged := h.charged[syscalls.BudgetNetBytes]
			if charged > left || res.NetBytes != charged || !res.Truncated || len(res.Body) == 0 {
				t.Fatalf("charged %d of %d net_bytes, result net_bytes %d, truncated %v, %d body bytes; want at most %[2]d charged, a truncated body",
					charged, left, res.NetBytes, res.Truncated, len(res.Body))
			}
		})
	}
}

// TestFetchOriginTextBounds: what an origin sends reaches the call's
// error, its record and its result only in part: a malformed header line
// quoted by the transport's error, and the Locations of the redirects
// followed (result redirects and final_url). Before, the header line went
// whole into the error and the record, and ten 60 KiB Locations into the
// result (review rev2-fronts F5).
func TestFetchOriginTextBounds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Read(make([]byte, 4096))
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n%s\x1b[8m\r\n\r\n", strings.Repeat("A", 60000))
			}()
		}
	}()
	_, err, h := fetch(t, syscalls.FetchOptions{}, -1, map[string]any{"url": "http://" + l.Addr().String() + "/"})
	if err == nil {
		t.Fatal("a malformed response head was taken")
	}
	note, _ := json.Marshal(h.notes["net_connections"])
	if len(err.Error()) > 2<<10 || len(note) > 8<<10 {
		t.Fatalf("a malformed header line: error of %d bytes, net_connections of %d", len(err.Error()), len(note))
	}

	var got atomic.Int64
	var n atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if i := n.Add(1); i <= 10 {
			http.Redirect(w, r, fmt.Sprintf("/r%d/%s", i, strings.Repeat("u", 60<<10)), http.StatusFound)
			return
		}
		fmt.Fprint(w, "x")
	}), &got)
	out, err, _ := fetch(t, syscalls.FetchOptions{}, -1, map[string]any{"url": srv.URL + "/", "max_bytes": 1})
	if err != nil {
		t.Fatalf("error %.300v", err)
	}
	if len(out.Result) > 16<<10 {
		t.Fatalf("ten redirects of 60 KiB Locations made a result of %d bytes", len(out.Result))
	}
}
