package tracing_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
	"github.com/capkernel/capkernel/tracing"
)

// receiver is an OTLP/HTTP trace receiver on loopback: it decodes what
// the exporter posts to /v1/traces, as a collector does.
type receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	attrs map[string]string // resource attributes, string-valued
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{attrs: map[string]string{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
			t.Errorf("receiver: %s %s (%s): not an OTLP/HTTP protobuf export", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				rc.attrs[a.Key] = a.GetValue().GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// calls are the received spans named name, by their capkernel.operation.id.
func (rc *receiver) calls(name string) map[string]*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string]*tracepb.Span{}
	for _, s := range rc.spans {
		if s.Name == name {
			out[attr(s, "capkernel.operation.id")] = s
		}
	}
	return out
}

// children are the names of the received spans whose parent is s.
func (rc *receiver) children(s *tracepb.Span) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, c := range rc.spans {
		if bytes.Equal(c.ParentSpanId, s.SpanId) && bytes.Equal(c.TraceId, s.TraceId) {
			out = append(out, c.Name)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			if v, ok := a.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(v.IntValue, 10)
			}
			return a.Value.GetStringValue()
		}
	}
	return ""
}

const (
	headerTrace = "0af7651916cd43dd8448eb211c80319c"
	headerSpan  = "b7ad6b7169203331"
	provTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
	provSpan    = "00f067aa0ba902b7"
	mcpTrace    = "5b8efff798038103d269b633813fc60c"
	mcpSpan     = "eee19b7ec3c1b174"
)

// TestOTLPExport runs calls over HTTP and MCP through a kernel whose
// Observer exports to an in-process OTLP receiver, each call carrying the
// trace context one way (HTTP header, envelope provenance, MCP _meta),
// and checks that each call's span continues its trace, with the stages
// as children and the ledger seq of its result.
func TestOTLPExport(t *testing.T) {
	rc := newReceiver(t)
	tp, err := tracing.NewProvider(context.Background(), rc.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := kernel.Init(data); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data, Observer: tp.Observer(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "a1", Tools: []string{"fs.*", "echo"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}, Autonomy: "autopilot"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(k))
	defer srv.Close()

	post := func(prov, traceparent, key string) kernel.Result {
		t.Helper()
		args, _ := json.Marshal(map[string]any{"path": filepath.Join(ws, key+".txt"), "content": "hello\n"})
		env, _ := json.Marshal(kernel.Envelope{ToolID: "fs.write", Args: args, AgentID: "a1", CapabilityToken: tok.Token,
			CapabilityTokenID: tok.ID, PolicyHash: k.PolicyHash(), IdempotencyKey: key, Provenance: json.RawMessage(prov)})
		req, _ := http.NewRequest("POST", srv.URL+"/v1/syscalls", bytes.NewReader(env))
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var res kernel.Result
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || res.Status != kernel.StatusOK {
			t.Fatalf("fs.write %s: %v %+v %+v", key, err, res, res.Error)
		}
		return res
	}
	byHeader := post("", "00-"+headerTrace+"-"+headerSpan+"-01", "header")
	byProv := post(`{"session_id":"s1","traceparent":"00-`+provTrace+`-`+provSpan+`-01"}`, "", "prov")

	// MCP: a client's tools/call with trace context in _meta, through the
	// gateway's streamable HTTP server.
	gw := mcpgateway.New(mcpgateway.Config{Invoker: invoker{k}, Token: tok.Token, TokenID: tok.ID, AgentID: "a1", PolicyHash: k.PolicyHash()})
	msrv := httptest.NewServer(gw.HTTPHandler(mcpgateway.HTTPOptions{}))
	defer msrv.Close()
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: msrv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"},
		Meta: mcp.Meta{"traceparent": "00-" + mcpTrace + "-" + mcpSpan + "-01"}})
	if err != nil || res.IsError {
		t.Fatalf("MCP echo: %v %+v", err, res)
	}
	mcpOp, _ := res.Meta[mcpgateway.MetaOperationID].(string)

	if err := tp.Shutdown(context.Background()); err != nil { // flushes the batch
		t.Fatal(err)
	}
	if rc.attrs["service.name"] != tracing.ServiceName {
		t.Errorf("resource service.name %q, want %q", rc.attrs["service.name"], tracing.ServiceName)
	}
	writes, echoes := rc.calls("execute_tool fs.write"), rc.calls("execute_tool echo")
	tests := []struct {
		name           string
		span           *tracepb.Span
		trace, parent  string
		seq            uint64
		stages         int
		tool, opResult string
	}{
		{"http header", writes[byHeader.OperationID], headerTrace, headerSpan, byHeader.LedgerSeq, 7, "fs.write", byHeader.OperationID},
		{"provenance", writes[byProv.OperationID], provTrace, provSpan, byProv.LedgerSeq, 7, "fs.write", byProv.OperationID},
		{"mcp _meta", echoes[mcpOp], mcpTrace, mcpSpan, 0, 0, "echo", mcpOp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.span
			if s == nil {
				t.Fatalf("no span for operation %s among %d received", tt.opResult, len(rc.spans))
			}
			if hex.EncodeToString(s.TraceId) != tt.trace || hex.EncodeToString(s.ParentSpanId) != tt.parent {
				t.Errorf("span in trace %x under %x, want %s under %s", s.TraceId, s.ParentSpanId, tt.trace, tt.parent)
			}
			if attr(s, "gen_ai.operation.name") != "execute_tool" || attr(s, "gen_ai.tool.name") != tt.tool || attr(s, "capkernel.outcome") != "ok" {
				t.Errorf("attributes %v", s.Attributes)
			}
			if tt.seq != 0 && attr(s, "capkernel.ledger.seq") != strconv.FormatUint(tt.seq, 10) {
				t.Errorf("capkernel.ledger.seq %s, want the result's %d", attr(s, "capkernel.ledger.seq"), tt.seq)
			}
			if ch := rc.children(s); tt.stages != 0 && len(ch) != tt.stages {
				t.Errorf("stage spans %v, want %d", ch, tt.stages)
			}
		})
	}
}

// invoker runs the gateway's envelopes in the kernel in process.
type invoker struct{ k *kernel.Kernel }

func (i invoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return i.k.InvokeJSON(ctx, env), nil
}
