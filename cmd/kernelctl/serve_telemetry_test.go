package main

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestServeTraces runs serve with --otlp-endpoint pointing at an OTLP/HTTP
// receiver on loopback: a call carrying a traceparent header is exported,
// on the agent's trace, by the time serve has stopped.
func TestServeTraces(t *testing.T) {
	var mu sync.Mutex
	traces := map[string]string{} // span name -> trace id
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					traces[s.Name] = hex.EncodeToString(s.TraceId)
				}
			}
		}
		mu.Unlock()
	}))
	defer rc.Close()
	s := initServed(t, "--otlp-endpoint", rc.URL)
	tok := mintCLI(t, s.server, s.admin, "--agent", "a1", "--tools", "echo")
	_, b := s.get("/v1/policy", "")
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	json.Unmarshal(b, &pol)
	const trace = "0af7651916cd43dd8448eb211c80319c"
	if _, r := s.post(envelope(tok, pol.PolicyHash, "echo", map[string]any{"text": "hi"}, ""), "Content-Type", "application/json", "traceparent", "00-"+trace+"-b7ad6b7169203331-01"); r.Status != "ok" {
		t.Fatalf("echo: %+v", r.Error)
	}
	s.stop()
	mu.Lock()
	defer mu.Unlock()
	if traces["execute_tool echo"] != trace || traces["verify"] != trace {
		t.Fatalf("exported spans %v: want execute_tool echo and its stages on trace %s", traces, trace)
	}
	if !strings.Contains(s.out.String(), "exporting traces") {
		t.Errorf("serve did not log that it exports traces: %s", s.out)
	}
}

func TestServeOTLPEndpointFlag(t *testing.T) {
	for _, bad := range []string{"127.0.0.1:4318", "grpc://c:4317"} {
		_, stderr, code := run(t, "serve", "--data", t.TempDir(), "--otlp-endpoint", bad)
		if code == 0 || !strings.Contains(stderr, "--otlp-endpoint") {
			t.Errorf("serve --otlp-endpoint %s: exit %d, %s", bad, code, stderr)
		}
	}
}

// TestServeJSONLogs: with --log-format json, the server's start and stop
// are JSON log records on stderr.
func TestServeJSONLogs(t *testing.T) {
	s := initServed(t, "--log-format", "json")
	s.stop()
	var msgs []string
	for _, line := range strings.Split(s.out.String(), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue // the human lines of kernelctl itself
		}
		var r struct {
			Level, Msg string
			KernelID   string `json:"kernel_id"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r.Msg == "serving" && r.KernelID == "" {
			t.Errorf("serving without kernel_id: %s", line)
		}
		msgs = append(msgs, r.Msg)
	}
	if want := []string{"serving", "draining", "stopped"}; strings.Join(msgs, ",") != strings.Join(want, ",") {
		t.Fatalf("JSON log messages %v, want %v (stderr: %s)", msgs, want, s.out)
	}
}
