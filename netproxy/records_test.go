package netproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
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
