package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

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

// limitedServer serves on loopback through LimitConns(max); most
// reports the most connections it ever served at once: from when the
// server takes one (StateNew) to when its descriptor is closed. A request
// for /hold waits until release is closed.
func limitedServer(t *testing.T, max int, release chan struct{}, holding chan<- struct{}) (addr string, most func() int64) {
	t.Helper()
	var open, peak atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				holding <- struct{}{}
				<-release
			}
			io.WriteString(w, "ok")
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				n := open.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(httpapi.LimitConns(srv, countingListener{ln, &open}, max))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), peak.Load
}

// countingListener's connections take one from open when closed.
type countingListener struct {
	net.Listener
	open *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, open: l.open}, nil
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.open.Add(-1) })
	return err
}

// get sends a GET of path on c and reads the answer.
func get(c net.Conn, r *bufio.Reader, path string) error {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// TestLimitConnsClosesIdle: at its bound the listener closes the
// keep-alive connection idle the longest to take a new one, so ten
// clients that each keep an idle connection are all answered while the
// server never holds more than three, and three are still open, the
// newest among them. Without a bound a client holding idle connections took
// every descriptor of serve.
func TestLimitConnsClosesIdle(t *testing.T) {
	const max, clients = 3, 10
	addr, most := limitedServer(t, max, nil, nil)
	conns := make([]net.Conn, clients)
	readers := make([]*bufio.Reader, clients)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i], readers[i] = c, bufio.NewReader(c)
		if err := get(c, readers[i], "/"); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	if n := most(); n > max {
		t.Fatalf("the server held %d connections at once, over its bound of %d", n, max)
	}
	var alive []int
	for i, c := range conns {
		if get(c, readers[i], "/") == nil {
			alive = append(alive, i)
		}
	}
	// Which were idle the longest is the server's view: a connection
	// answered first may go idle after a later one.
	if len(alive) != max || alive[max-1] != clients-1 {
		t.Fatalf("connections still served: %v, want %d with the newest", alive, max)
	}
}

// TestLimitConnsWaitsForBusy: when every connection is busy with a
// request, the next one is taken only once a request ended; none is cut.
func TestLimitConnsWaitsForBusy(t *testing.T) {
	const max = 3
	release, holding := make(chan struct{}), make(chan struct{}, max+1)
	addr, most := limitedServer(t, max, release, holding)
	var wg sync.WaitGroup
	errs := make(chan error, max+1)
	for range max {
		wg.Go(func() { errs <- getNew(addr, "/hold") })
	}
	for range max {
		<-holding
	}
	var released atomic.Bool
	wg.Go(func() {
		if err := getNew(addr, "/"); err != nil {
			errs <- err
		} else if !released.Load() {
			errs <- fmt.Errorf("a fourth connection was served while %d held requests", max)
		}
	})
	released.Store(true)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := most(); n > max {
		t.Fatalf("the server held %d connections at once, over its bound of %d", n, max)
	}
}

// getNew sends a GET of path on a new connection.
func getNew(addr, path string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return get(c, bufio.NewReader(c), path)
}
