package kernel

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/netproxy"
)

// TestExecNetAuditKeepsAllowed: a command floods the allowlist proxy with
// refused CONNECTs, then makes one allowed request. The audit record's
// notes list that request, the first 100 refused ones, and count the rest
// in net_connections_dropped (found by review: 10,000 junk records had
// pushed the real one out, with no sign any were dropped).
func TestExecNetAuditKeepsAllowed(t *testing.T) {
	const flood, kept = 1000, 100
	h := newExecHarness(t)
	port := loopbackServer(t, "allowed")
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		Net: []string{fmt.Sprintf("allowed.test:%d", port)}})
	py := fmt.Sprintf(`import socket
for i in range(%d):
    s = socket.create_connection(("127.0.0.1", 3128)); s.sendall(b"CONNECT junk.invalid:1 HTTP/1.1\r\n\r\n"); s.recv(4096); s.close()
`, flood)
	before := h.headSize()
	e := decodeExec(t, h.invoke("proc.exec", with(execArgs("sh", "-c",
		fmt.Sprintf("python3 -c '%s' && curl -sS --max-time 10 http://allowed.test:%d/upload", py, port)),
		"network", "allowlist", "timeout_s", 120), key("flood")))
	if e.ExitCode != 0 || e.Stdout != "hello from allowed" {
		t.Fatalf("exit %d stdout %q stderr %q", e.ExitCode, e.Stdout, e.Stderr)
	}
	a := h.audits(before)
	if len(a) != 1 {
		t.Fatalf("%d audit records", len(a))
	}
	var recs []netproxy.Record
	if err := json.Unmarshal(a[0].Notes["net_connections"], &recs); err != nil {
		t.Fatalf("net_connections %s: %v", a[0].Notes["net_connections"], err)
	}
	if len(recs) != kept+1 {
		t.Fatalf("%d records, want %d refused and the allowed one", len(recs), kept)
	}
	if r := recs[kept]; !r.Allowed || r.Host != "allowed.test" || r.Port != port || r.BytesDown == 0 {
		t.Fatalf("last record %+v, want the allowed request", r)
	}
	var drops netproxy.Drops
	if err := json.Unmarshal(a[0].Notes["net_connections_dropped"], &drops); err != nil {
		t.Fatalf("net_connections_dropped %s: %v", a[0].Notes["net_connections_dropped"], err)
	}
	if drops.Total != flood-kept || drops.ByReason[netproxy.ReasonDenied] != flood-kept || len(drops.ByReason) != 1 {
		t.Fatalf("net_connections_dropped %+v, want %d denied", drops, flood-kept)
	}
}
