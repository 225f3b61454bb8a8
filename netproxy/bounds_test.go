package netproxy_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/netproxy"
)

// TestRecordBounds: a record keeps a bounded part of what the client
// sent, whatever its size. Before, a refused CONNECT kept its host whole
// and a malformed request its whole request line, up to the head's size,
// in the call's audit record.
func TestRecordBounds(t *testing.T) {
	f := newFixture(t, 0, func(string, int) bool { return true })
	long := strings.Repeat("a", 60<<10)
	tests := []struct {
		name, req string
		code      int
		reason    string // the record's reason starts with it
		host      string
		method    string
	}{
		{"connect to a long host", "CONNECT " + long + ":443 HTTP/1.1\r\n\r\n", 400, netproxy.ReasonUnsupported + ": bad host", "", "CONNECT"},
		{"absolute URI with a host over 253 bytes", "GET http://" + strings.Repeat("a", 250) + ".test/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, netproxy.ReasonUnsupported + ": bad host", "", "GET"},
		{"host with a byte outside a host name", "CONNECT a*b!c$d.test:443 HTTP/1.1\r\n\r\n", 400, netproxy.ReasonUnsupported + ": bad host", "", "CONNECT"},
		{"long garbage request line", "GARBAGE" + long + "\r\n\r\n", 400, netproxy.ReasonBadRequest + ": ", "", ""},
		{"long method", strings.Repeat("M", 1000) + fmt.Sprintf(" http://allowed.test:%d/echo HTTP/1.1\r\nHost: x\r\n\r\n", port(f.plain)), 0, "", "allowed.test", strings.Repeat("M", netproxy.MaxMethodBytes)},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _ := raw(t, f, tt.req)
			if tt.code != 0 && code != tt.code {
				t.Fatalf("status %d, want %d", code, tt.code)
			}
			recs := f.proxy.Records()
			if len(recs) != i+1 {
				t.Fatalf("%d records, want %d", len(recs), i+1)
			}
			r := recs[i]
			if !strings.HasPrefix(r.Reason, tt.reason) || r.Host != tt.host || r.Method != tt.method {
				t.Fatalf("record host %.40q method %.40q reason %.80q; want host %q, method %.40q, reason starting %q", r.Host, r.Method, r.Reason, tt.host, tt.method, tt.reason)
			}
			why, detail, _ := strings.Cut(r.Reason, ": ")
			if len(why) > 40 || len(detail) > netproxy.MaxReasonDetail+len("…") {
				t.Fatalf("reason of %d bytes kept: %.80q…", len(r.Reason), r.Reason)
			}
		})
	}
}

// TestRecordBytesBound: the records returned stay within MaxRecordBytes of
// JSON. The refused ones are all kept, then the allowed ones in arrival
// order; the allowed ones beyond are counted with their bytes.
func TestRecordBytesBound(t *testing.T) {
	const limit, allowed = 1000, 10
	f := newFixture(t, 0, allowHosts("allowed.test"), func(o *netproxy.Options) { o.MaxRecordBytes = limit })
	if code, _ := raw(t, f, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n"); code != 403 {
		t.Fatalf("denied CONNECT: status %d", code)
	}
	for range allowed {
		if code, _ := raw(t, f, fmt.Sprintf("GET http://allowed.test:%d/size/100 HTTP/1.1\r\nHost: x\r\n\r\n", port(f.plain))); code != 200 {
			t.Fatalf("allowed GET: status %d", code)
		}
	}
	f.proxy.Close()
	recs, d := f.proxy.Records(), f.proxy.Dropped()
	b, _ := json.Marshal(recs)
	if len(b) > limit {
		t.Fatalf("records of %d bytes, want at most %d", len(b), limit)
	}
	if len(recs) < 2 || recs[0].Allowed || recs[0].Host != "denied.test" {
		t.Fatalf("records %+v, want the refused one first", recs)
	}
	kept := len(recs) - 1
	per := recs[1].BytesDown
	want := netproxy.Drops{Total: allowed - kept, Allowed: allowed - kept, BytesUp: int64(allowed-kept) * recs[1].BytesUp, BytesDown: int64(allowed-kept) * per}
	if d.Allowed == 0 || !reflect.DeepEqual(d, want) {
		t.Fatalf("Dropped = %+v, want %+v (%d allowed records kept)", d, want, kept)
	}
}
