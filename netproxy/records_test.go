package netproxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
)

// raw sends one raw request to the proxy and returns the response's status
// and body.
func raw(t *testing.T, f *fixture, req string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", f.proxy.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRefusedFloodKeepsAllowed: 10,000 refused CONNECTs, then one allowed
// request. The allowed request's record is kept, the first 100 refused
// ones are kept in full, and the other 9,900 are counted as dropped.
func TestRefusedFloodKeepsAllowed(t *testing.T) {
	const flood, kept = 10000, 100
	f := newFixture(t, 0, allowHosts("allowed.test"))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < flood; i += 8 {
				if code, _ := raw(t, f, fmt.Sprintf("CONNECT junk%d.invalid:1 HTTP/1.1\r\n\r\n", i)); code != http.StatusForbidden {
					t.Errorf("junk CONNECT %d: status %d", i, code)
					return
				}
			}
		})
	}
	wg.Wait()
	getAllowed(t, f)
	f.proxy.Close()

	recs := f.proxy.Records()
	if len(recs) != kept+1 {
		t.Fatalf("%d records, want %d refused and the allowed one", len(recs), kept)
	}
	for _, r := range recs[:kept] {
		if r.Allowed || r.Reason != netproxy.ReasonDenied {
			t.Fatalf("refused record %+v", r)
		}
	}
	if r := recs[kept]; !r.Allowed || r.Host != "allowed.test" || r.BytesDown == 0 {
		t.Fatalf("last record %+v, want the allowed request", r)
	}
	want := netproxy.Drops{Total: flood - kept, ByReason: map[string]int{netproxy.ReasonDenied: flood - kept}}
	if got := f.proxy.Dropped(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Dropped = %+v, want %+v", got, want)
	}
}

// TestRecordLimits: the records kept and counted under MaxAllowed and
// MaxRefusedRecords, request by request.
func TestRecordLimits(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"), func(o *netproxy.Options) {
		o.MaxAllowed, o.MaxRefusedRecords = 2, 1
	})
	allowed := fmt.Sprintf("GET http://allowed.test:%d/echo HTTP/1.1\r\nHost: allowed.test\r\n\r\n", port(f.plain))
	denied := "CONNECT denied.test:443 HTTP/1.1\r\n\r\n"
	steps := []struct {
		name, req string
		code      int
		body      string
		records   int // records kept after the step
		drops     netproxy.Drops
	}{
		{"allowed", allowed, 200, "host=allowed.test", 1, netproxy.Drops{}},
		{"denied, kept", denied, 403, netproxy.ReasonDenied, 2, netproxy.Drops{}},
		{"allowed, the last one", allowed, 200, "host=allowed.test", 3, netproxy.Drops{}},
		{"over MaxAllowed", allowed, 403, netproxy.ReasonLimit, 3,
			netproxy.Drops{Total: 1, ByReason: map[string]int{netproxy.ReasonLimit: 1}}},
		{"denied, counted", denied, 403, netproxy.ReasonDenied, 3,
			netproxy.Drops{Total: 2, ByReason: map[string]int{netproxy.ReasonLimit: 1, netproxy.ReasonDenied: 1}}},
		{"malformed, counted without its detail", "hello\r\n\r\n", 400, netproxy.ReasonBadRequest, 3,
			netproxy.Drops{Total: 3, ByReason: map[string]int{netproxy.ReasonLimit: 1, netproxy.ReasonDenied: 1, netproxy.ReasonBadRequest: 1}}},
	}
	for _, st := range steps {
		code, body := raw(t, f, st.req)
		if code != st.code || !strings.Contains(body, st.body) {
			t.Fatalf("%s: got %d %q, want %d containing %q", st.name, code, body, st.code, st.body)
		}
		if n := len(f.proxy.Records()); n != st.records {
			t.Fatalf("%s: %d records, want %d: %+v", st.name, n, st.records, f.proxy.Records())
		}
		if got := f.proxy.Dropped(); !reflect.DeepEqual(got, st.drops) {
			t.Fatalf("%s: Dropped = %+v, want %+v", st.name, got, st.drops)
		}
	}
	recs := f.proxy.Records()
	if !recs[0].Allowed || recs[1].Allowed || !recs[2].Allowed {
		t.Fatalf("records %+v, want allowed, denied, allowed", recs)
	}
}

// TestRefusedByAddressCounted: requests the dialer refuses (an allowed
// host resolving to a private address) are refused records like the
// others, kept up to MaxRefusedRecords and counted in Dropped beyond.
// Before, each was kept, outside the limit: 10,000 of them made 6.7 MB of
// records (review rev2-fronts F3).
func TestRefusedByAddressCounted(t *testing.T) {
	g := &netproxy.Guard{Lookup: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
	}}
	const kept, n = 3, 5
	p := netproxy.New(netproxy.Options{Allow: func(string, int) bool { return true }, Dial: g.DialContext, MaxRefusedRecords: kept})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	defer p.Close()
	for i := range n {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET http://h%d.test/ HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request %d: %v, %v; want 403", i, resp, err)
		}
	}
	p.Close()
	recs, d := p.Records(), p.Dropped()
	for _, r := range recs {
		if r.Allowed || !strings.HasPrefix(r.Reason, netproxy.ReasonAddress) {
			t.Errorf("record %+v, want refused with %q", r, netproxy.ReasonAddress)
		}
	}
	if len(recs) != kept || d.Total != n-kept || d.ByReason[netproxy.ReasonAddress] != n-kept {
		t.Fatalf("%d records, dropped %+v; want %d records and %d dropped as %q", len(recs), d, kept, n-kept, netproxy.ReasonAddress)
	}
}
