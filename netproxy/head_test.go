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
