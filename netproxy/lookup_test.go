package netproxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
)

// TestLookupsCharged: the proxy's DNS lookups are charged to its byte
// budget (LookupCost each, resolved or not), and a lookup the budget
// cannot pay for whole is not made: its request is refused like one over
// the budget. Before, a name that did not resolve cost nothing, so a
// command leaked data in names to a resolver without limit.
func TestLookupsCharged(t *testing.T) {
	srv := httptest.NewServer(origin())
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	const ok, nx = "allowed.test", "c0-data.nx.test" // nx does not resolve
	cost := netproxy.LookupCost(ok)
	tests := []struct {
		name     string
		budget   int64
		hosts    []string
		codes    []int
		lookups  int32
		exceeded bool
	}{
		{"unlimited", 0, []string{ok}, []int{200}, 1, false},
		{"budget under one lookup", cost - 1, []string{ok}, []int{403}, 0, true},
		{"names that do not resolve", 3*netproxy.LookupCost(nx) + 10, []string{nx, nx, nx, nx, nx}, []int{502, 502, 502, 403, 403}, 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lookups atomic.Int32
			g := &netproxy.Guard{
				Explicit: func(string, int) bool { return true },
				Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
					lookups.Add(1)
					if host != ok {
						return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
					}
					return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
				},
			}
			p, err := netproxy.Listen(filepath.Join(t.TempDir(), "p.sock"), netproxy.Options{
				Allow: func(string, int) bool { return true }, ByteBudget: tt.budget, Dial: g.DialContext,
			})
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{proxy: p}
			for i, h := range tt.hosts {
				code, body := raw(t, f, fmt.Sprintf("GET http://%s:%s/echo HTTP/1.1\r\nHost: x\r\n\r\n", h, port))
				if code != tt.codes[i] {
					t.Fatalf("request %d to %s: %d %q, want %d", i, h, code, body, tt.codes[i])
				}
			}
			p.Close()
			if n := lookups.Load(); n != tt.lookups {
				t.Fatalf("%d lookups, want %d", n, tt.lookups)
			}
			if p.BudgetExceeded() != tt.exceeded {
				t.Fatalf("BudgetExceeded %v, want %v", p.BudgetExceeded(), tt.exceeded)
			}
			recs := p.Records()
			var relayed int64
			for _, r := range recs {
				relayed += r.BytesUp + r.BytesDown
			}
			if last := recs[len(recs)-1]; tt.exceeded && (last.Allowed || !strings.HasPrefix(last.Reason, netproxy.ReasonBudgetRefused)) {
				t.Fatalf("last record %+v, want refused: %s", last, netproxy.ReasonBudgetRefused)
			}
			var charged int64
			for _, h := range tt.hosts[:tt.lookups] {
				charged += netproxy.LookupCost(h)
			}
			if p.BytesUsed() != relayed+charged {
				t.Fatalf("BytesUsed %d, want %d relayed + %d for %d lookups", p.BytesUsed(), relayed, charged, tt.lookups)
			}
		})
	}
}
