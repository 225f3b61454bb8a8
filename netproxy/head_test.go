package netproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
)

// TestHeadLimits: a request head or a response head larger than
// MaxHeaderBytes (64 KiB by default) is not read whole: the client gets
// 431 (request) or 502 (response) and the record says why. Before, both
// were read whole into the kernel's memory, however large.
func TestHeadLimits(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"))
	tests := []struct {
		name    string
		pad     int    // bytes of one request header field
		path    string // what the origin is asked for
		code    int
		body    string
		allowed bool
		reason  string
	}{
		{"request head under the limit", 60 << 10, "/echo", 200, "host=allowed.test", true, ""},
		{"request head over the limit", 512 << 10, "/echo", 431, netproxy.ReasonHeadTooLarge, false, netproxy.ReasonHeadTooLarge + ": more than 65536 bytes"},
		{"response head under the limit", 0, "/head/60000", 200, "head", true, ""},
		{"response head over the limit", 0, "/head/524288", 502, "upstream response head too large", true, "upstream: response head larger than 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(f.proxy.Records())
			c, err := net.Dial("unix", f.proxy.SocketPath())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := fmt.Sprintf("GET http://allowed.test:%d%s HTTP/1.1\r\nHost: allowed.test\r\nX-Pad: %s\r\n\r\n", port(f.plain), tt.path, strings.Repeat("p", tt.pad))
			// The proxy may answer and close before it has read the
			// whole request: write it aside.
			go io.WriteString(c, req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.code || !strings.Contains(string(body), tt.body) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.code, tt.body)
			}
			// The record (and its reason) is made before the answer.
			recs := f.proxy.Records()
			if len(recs) != n+1 {
				t.Fatalf("%d records, want %d", len(recs), n+1)
			}
			if r := recs[n]; r.Allowed != tt.allowed || r.Reason != tt.reason {
				t.Fatalf("record %+v, want allowed %v, reason %q", r, tt.allowed, tt.reason)
			}
		})
	}
}

// TestInterimResponses: an origin's interim (1xx) responses, such as the
// "100 Continue" a client's "Expect: 100-continue" asks for, are relayed
// and the final response after them too; more than 5 are a bad upstream
// response. Before, the first interim response was relayed as the whole
// answer and the final one lost (review rev2-fronts F2).
func TestInterimResponses(t *testing.T) {
	port := netproxy.ListenTCP(t, "127.0.0.1:0", func(c net.Conn) {
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		interim := "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
		switch req.URL.Path {
		case "/many":
			interim = strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6)
		case "/upgrade":
			// Unasked for: the proxy took Upgrade off the request.
			interim = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
		}
		io.WriteString(c, interim)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
	})
	f := newFixture(t, 0, allowHosts("allowed.test"))
	tests := []struct {
		path    string
		interim []int
		code    int
		body    string
		reason  string
	}{
		{"/", []int{100, 103}, 200, "done", ""},
		{"/many", []int{100, 100, 100, 100, 100}, 502, "bad upstream response", "upstream: more than 5 interim (1xx) responses"},
		{"/upgrade", nil, 502, "bad upstream response", "upstream: 101 Switching Protocols to a request that asked for no upgrade"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			c, err := net.Dial("unix", f.proxy.SocketPath())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST http://allowed.test:%d%s HTTP/1.1\r\nHost: allowed.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", port, tt.path)
			br := bufio.NewReader(c)
			var interim []int
			var resp *http.Response
			for {
				if resp, err = http.ReadResponse(br, nil); err != nil {
					t.Fatalf("after interim responses %v: %v", interim, err)
				}
				if resp.StatusCode >= 200 {
					break
				}
				interim = append(interim, resp.StatusCode)
			}
			body, _ := io.ReadAll(resp.Body)
			if fmt.Sprint(interim) != fmt.Sprint(tt.interim) || resp.StatusCode != tt.code || !strings.Contains(string(body), tt.body) {
				t.Fatalf("interim %v, then %d %q; want interim %v, then %d containing %q", interim, resp.StatusCode, body, tt.interim, tt.code, tt.body)
			}
			recs := f.proxy.Records()
			if r := recs[len(recs)-1]; !r.Allowed || r.Reason != tt.reason {
				t.Fatalf("record %+v, want allowed, reason %q", r, tt.reason)
			}
		})
	}
}
