package sandbox_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
	"github.com/capkernel/capkernel/sandbox"
)

// The allowlist posture: no network but loopback in the sandbox;
// HTTP(S)_PROXY leads, through the in-sandbox relay and the bound unix
// socket, to a netproxy that admits allowed.test only. The proxy's dialer
// maps *.test names to the loopback test servers, so the allowed server
// is reached under an allowed name.
func TestNetAllowlist(t *testing.T) {
	requireSandbox(t)
	needCommand(t, "curl")
	needCommand(t, "socat")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s, ok := strings.CutPrefix(r.URL.Path, "/size/"); ok {
			n, _ := strconv.Atoi(s)
			w.Write([]byte(strings.Repeat("z", n)))
			return
		}
		fmt.Fprintf(w, "hello from %s", r.Host)
	})
	plain := httptest.NewServer(handler)
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(handler)
	defer tlsSrv.Close()
	pp := plain.Listener.Addr().(*net.TCPAddr).Port
	tp := tlsSrv.Listener.Addr().(*net.TCPAddr).Port
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || !strings.HasSuffix(host, ".test") {
			return nil, fmt.Errorf("test dialer: %s unknown", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	allow := func(host string, port int) bool { return host == "allowed.test" }

	newProxy := func(t *testing.T, budget int64) *netproxy.Proxy {
		p, err := netproxy.Listen(filepath.Join(t.TempDir(), "proxy.sock"), netproxy.Options{Allow: allow, Dial: dial, ByteBudget: budget})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	ws := t.TempDir()
	s := newSandbox(t, sandbox.Options{})

	t.Run("allowed and denied", func(t *testing.T) {
		proxy := newProxy(t, 0)
		res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Net: sandbox.NetAllowlist, ProxySocket: proxy.SocketPath()}, fmt.Sprintf(`
curl -sS --max-time 10 http://allowed.test:%[1]d/; echo " [$?]"
curl -sS --max-time 10 -k https://allowed.test:%[2]d/; echo " [$?]"
curl -sS --max-time 10 -o /dev/null -w '%%{http_code}' http://denied.test:%[1]d/; echo " [$?]"
curl -sS --max-time 10 -k https://denied.test:%[2]d/ 2>/dev/null; echo " [$?]"
curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:%[1]d/ 2>/dev/null; echo " [$?]"
echo "$HTTPS_PROXY"`, pp, tp))
		want := fmt.Sprintf("hello from allowed.test:%d [0]\nhello from allowed.test:%d [0]\n403 [0]\n [56]\n [7]\nhttp://127.0.0.1:3128\n", pp, tp)
		if string(res.Stdout) != want {
			t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
		}
		recs := proxy.Records()
		var got []string
		for _, r := range recs {
			got = append(got, fmt.Sprintf("%s %s:%d allowed=%v", r.Method, r.Host, r.Port, r.Allowed))
			if r.Allowed && (r.BytesUp == 0 || r.BytesDown == 0) {
				t.Errorf("no bytes counted: %+v", r)
			}
		}
		wantRecs := []string{
			fmt.Sprintf("GET allowed.test:%d allowed=true", pp),
			fmt.Sprintf("CONNECT allowed.test:%d allowed=true", tp),
			fmt.Sprintf("GET denied.test:%d allowed=false", pp),
			fmt.Sprintf("CONNECT denied.test:%d allowed=false", tp),
		}
		if strings.Join(got, "\n") != strings.Join(wantRecs, "\n") {
			t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantRecs, "\n"))
		}
	})

	t.Run("byte budget", func(t *testing.T) {
		proxy := newProxy(t, 20000)
		res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Net: sandbox.NetAllowlist, ProxySocket: proxy.SocketPath()}, fmt.Sprintf(`
curl -sS --max-time 10 http://allowed.test:%[1]d/size/1000 | wc -c
curl -sS --max-time 10 http://allowed.test:%[1]d/size/1000000 2>/dev/null | wc -c
curl -sS --max-time 10 -o /dev/null -w '%%{http_code}\n' http://allowed.test:%[1]d/size/10 2>/dev/null`, pp))
		lines := strings.Fields(string(res.Stdout))
		if len(lines) != 3 || lines[0] != "1000" || lines[2] != "403" {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		if n, _ := strconv.Atoi(lines[1]); n >= 1000000 || n > 20000 {
			t.Fatalf("%d bytes arrived through a 20000-byte budget", n)
		}
		if !proxy.BudgetExceeded() || proxy.BytesUsed() > 20000 {
			t.Fatalf("BudgetExceeded %v, used %d", proxy.BudgetExceeded(), proxy.BytesUsed())
		}
		recs := proxy.Records()
		if len(recs) != 3 || recs[1].Reason != netproxy.ReasonBudget || recs[2].Reason != netproxy.ReasonBudgetRefused {
			t.Fatalf("records %+v", recs)
		}
	})

	t.Run("off posture ignores the proxy", func(t *testing.T) {
		res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, fmt.Sprintf(
			`curl -sS --max-time 5 --proxy http://127.0.0.1:3128 http://allowed.test:%d/ 2>/dev/null; echo "[$?]"; test -e /run/capkernel/proxy.sock || echo no-socket`, pp))
		if string(res.Stdout) != "[7]\nno-socket\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
}
