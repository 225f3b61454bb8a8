package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
)

// TestServersBoundConnections: serve and mcp --http serve at most
// httpapi.MaxConns connections at once, half their descriptors: started
// with 256, 300 clients that each keep a keep-alive connection open after
// one request are all answered — each new one takes the place of one
// idle the longest — and at most 128 of them are still open after. The
// servers bounded none: ~20,000 idle connections of one client took every
// descriptor of serve, and its accept failed (EMFILE) for every agent.
func TestServersBoundConnections(t *testing.T) {
	const nofile, clients = 256, 300
	bound := httpapi.ConnsFor(nofile)
	f := newRunFixture(t)
	data := filepath.Join(t.TempDir(), "data")
	if _, stderr, code := run(t, "init", "--data", data); code != 0 {
		t.Fatal(stderr)
	}
	tests := []struct {
		name  string
		args  []string
		ready string // the ready line's prefix before the address
		path  string
	}{
		{"serve", []string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, "serving", "/v1/ledger/head"},
		{"mcp", []string{"mcp", "--data", f.data, "--token", f.token, "--http", "127.0.0.1:0"}, "mcp gateway on", "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// sh sets the descriptor limit (soft and hard) of the server it becomes.
			addr := startReady(t, exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), kernelctl}, tt.args...)...), tt.ready)
			conns := make([]*keptConn, clients)
			for i := range conns {
				c, err := dialKept(addr)
				if err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				t.Cleanup(func() { c.Close() })
				conns[i] = c
				if err := c.get(tt.path); err != nil {
					t.Fatalf("client %d of %d keeping its connection: %v", i, clients, err)
				}
			}
			open := 0
			for _, c := range conns {
				if c.get(tt.path) == nil {
					open++
				}
			}
			if open == 0 || open > bound {
				t.Fatalf("%d connections of %d still served, want 1 to %d", open, clients, bound)
			}
		})
	}
}

// TestServersCutSlowRequests: serve and mcp --http end a connection whose
// request is still being read after their read timeout (60 s): a POST
// whose body stalls does not hold its connection, which LimitConns does
// not close for a new one, for good. mcp --http had no read timeout.
func TestServersCutSlowRequests(t *testing.T) {
	f := newRunFixture(t)
	data := filepath.Join(t.TempDir(), "data")
	if _, stderr, code := run(t, "init", "--data", data); code != 0 {
		t.Fatal(stderr)
	}
	for _, tt := range []struct {
		name  string
		args  []string
		ready string
		path  string
	}{
		{"serve", []string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, "serving", "/v1/syscalls"},
		{"mcp", []string{"mcp", "--data", f.data, "--token", f.token, "--http", "127.0.0.1:0"}, "mcp gateway on", "/"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := dialKept(startReady(t, exec.Command(kernelctl, tt.args...), tt.ready))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The deadline only keeps a server that never ends it from
			// hanging the test.
			c.SetDeadline(time.Now().Add(3 * readTimeout))
			if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", tt.path, c.RemoteAddr()); err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the connection of a request whose body stalled is still open after %s", 3*readTimeout)
			}
		})
	}
}

// startReady starts cmd, a kernelctl server, and returns the address it
// serves on, read from its ready line (which starts with ready).
func startReady(t *testing.T, cmd *exec.Cmd, ready string) string {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	rest, ok := strings.CutPrefix(line, ready+" ")
	if err != nil || !ok {
		t.Fatalf("ready line %q: %v (%s)", line, err, stderr.String())
	}
	if ready == "serving" {
		rest = strings.Fields(rest)[2] // "<id> on http://ADDR (policy …)"
	}
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(rest), "http://"), "/")
}

// keptConn is a client's keep-alive connection.
type keptConn struct {
	net.Conn
	r *bufio.Reader
}

func dialKept(addr string) (*keptConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &keptConn{Conn: c, r: bufio.NewReader(c)}, nil
}

// get sends a GET of path and reads the answer, whatever its status. The
// deadline only keeps a server that never answers from hanging the test.
func (c *keptConn) get(path string) error {
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, c.RemoteAddr()); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}
