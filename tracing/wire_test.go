package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// captured is an OTLP/HTTP receiver that keeps the requests it decodes.
type captured struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []*coltrace.ExportTraceServiceRequest
}

func newCaptured(t *testing.T) *captured {
	c := &captured{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := new(coltrace.ExportTraceServiceRequest)
		if err := proto.Unmarshal(body, req); err != nil {
			t.Errorf("receiver: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.reqs = append(c.reqs, req)
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// wireSpans are spans with every feature OTLP carries: each attribute
// type, events, links (remote and not), every status, dropped counts,
// two resources (one with a schema URL), three scopes (one the zero
// scope, one with a version and attributes), a span before the epoch.
func wireSpans() []sdktrace.ReadOnlySpan {
	k := attribute.Key("k")
	attrs := []attribute.KeyValue{
		k.Bool(false), attribute.Bool("t", true), attribute.Int64("i", -7), attribute.Int64("zero", 0),
		attribute.Float64("f", 1.5), attribute.String("s", "v"), attribute.String("empty", ""),
		attribute.BoolSlice("bs", []bool{true, false}), attribute.Int64Slice("is", []int64{1, -2}),
		attribute.Float64Slice("fs", []float64{0.25}), attribute.StringSlice("ss", []string{"a", ""}),
		attribute.StringSlice("none", nil), attribute.ByteSlice("b", []byte{0, 1, 2}),
		attribute.Slice("sl", attribute.IntValue(1), attribute.StringValue("x"), attribute.Float64Value(2)),
		attribute.Map("m", attribute.String("a", "b"), attribute.Int("n", 3)), {Key: "emptyvalue"},
		attribute.String("long", strings.Repeat("x", 300)),
	}
	res1 := resource.NewSchemaless(attribute.String("service.name", "capkernel"))
	res2 := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.41.0", attribute.String("service.name", "other"), attribute.Int("n", 2))
	scope1 := instrumentation.Scope{Name: ScopeName, SchemaURL: "https://opentelemetry.io/schemas/1.41.0"}
	scope2 := instrumentation.Scope{Name: "other", Version: "1.2", Attributes: attribute.NewSet(attribute.String("a", "b"))}
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ts, _ := trace.ParseTraceState("vendor=x,other=y")
	sc := func(sid byte, flags trace.TraceFlags, remote bool) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{sid}, TraceFlags: flags, TraceState: ts, Remote: remote})
	}
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 123, time.UTC)
	stubs := []tracetest.SpanStub{
		{
			Name: "execute_tool fs.write", SpanContext: sc(1, trace.FlagsSampled, false), Parent: sc(9, trace.FlagsSampled, true),
			SpanKind: trace.SpanKindInternal, StartTime: t0, EndTime: t0.Add(time.Millisecond), Attributes: attrs,
			Events: []sdktrace.Event{
				{Name: "e1", Time: t0, Attributes: attrs[:3], DroppedAttributeCount: 2},
				{Name: "e2"},
			},
			Links: []sdktrace.Link{
				{SpanContext: sc(7, trace.FlagsSampled, true), Attributes: attrs[5:6], DroppedAttributeCount: 1},
				{SpanContext: sc(8, 0, false)},
			},
			Status: sdktrace.Status{Code: codes.Error, Description: "policy_denied"}, DroppedAttributes: 3, DroppedEvents: 4, DroppedLinks: 5,
			ChildSpanCount: 2, Resource: res1, InstrumentationScope: scope1,
		},
		{Name: "verify", SpanContext: sc(2, trace.FlagsSampled, false), Parent: sc(1, trace.FlagsSampled, false), SpanKind: trace.SpanKindServer,
			StartTime: t0, EndTime: t0, Status: sdktrace.Status{Code: codes.Ok}, Resource: res1, InstrumentationScope: scope2},
		{Name: "ancient", SpanContext: sc(3, 0, false), SpanKind: trace.SpanKindClient, StartTime: time.Unix(-5, 0), Resource: res2, InstrumentationScope: scope1},
		{Name: "", SpanContext: sc(4, trace.FlagsSampled, false), SpanKind: trace.SpanKindProducer, Resource: res1},
		{Name: "c", SpanContext: sc(5, trace.FlagsSampled, false), SpanKind: trace.SpanKindConsumer, Resource: res2, InstrumentationScope: scope2},
		{Name: "u", SpanContext: sc(6, trace.FlagsSampled, false), SpanKind: trace.SpanKindUnspecified, Resource: res1, InstrumentationScope: scope1},
	}
	var spans []sdktrace.ReadOnlySpan
	for _, s := range stubs {
		spans = append(spans, s.Snapshot())
	}
	return spans
}

// TestWireMatchesExporter: what exporter sends must decode to what the
// OTLP/HTTP exporter of the OpenTelemetry SDK sends for the same spans,
// field by field (ResourceSpans in either order: the SDK's come out of a
// map).
func TestWireMatchesExporter(t *testing.T) {
	ctx := context.Background()
	spans := wireSpans()
	ours, theirs := newCaptured(t), newCaptured(t)
	exp, err := newExporter(ctx, otlptracehttp.NewClient(otlptracehttp.WithEndpointURL(ours.srv.URL+"/v1/traces")))
	if err != nil {
		t.Fatal(err)
	}
	sdk, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(theirs.srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	// Twice: the second export reuses the buffers of the first.
	for range 2 {
		if err := exp.ExportSpans(ctx, spans); err != nil {
			t.Fatal(err)
		}
		if err := sdk.ExportSpans(ctx, spans); err != nil {
			t.Fatal(err)
		}
	}
	if len(ours.reqs) != 2 || len(theirs.reqs) != 2 {
		t.Fatalf("%d and %d requests, want 2 each", len(ours.reqs), len(theirs.reqs))
	}
	for i := range 2 {
		got, want := ours.reqs[i], theirs.reqs[i]
		for _, r := range []*coltrace.ExportTraceServiceRequest{got, want} {
			slices.SortFunc(r.ResourceSpans, func(a, b *tracepb.ResourceSpans) int {
				return strings.Compare(prototext.Format(a.GetResource()), prototext.Format(b.GetResource()))
			})
		}
		if !proto.Equal(got, want) {
			t.Errorf("export %d differs from the SDK exporter's:\nours:\n%s\nSDK's:\n%s", i, prototext.Format(got), prototext.Format(want))
		}
	}
	if len(ours.reqs[0].ResourceSpans) != 2 {
		t.Errorf("%d ResourceSpans, want one per resource (2)", len(ours.reqs[0].ResourceSpans))
	}
	if err := exp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sdk.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestJSONProtocol: OTEL_EXPORTER_OTLP_PROTOCOL=http/json gets the SDK's
// OTLP/HTTP exporter and JSON bodies (the wire encoder writes protobuf
// only); OTEL_EXPORTER_OTLP_TRACES_PROTOCOL wins over it.
func TestJSONProtocol(t *testing.T) {
	tests := []struct{ protocol, traces, want string }{
		{"http/json", "", "application/json"},
		{"http/json", "http/protobuf", "application/x-protobuf"},
		{"", "", "application/x-protobuf"},
	}
	for _, tt := range tests {
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tt.protocol)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", tt.traces)
		var mu sync.Mutex
		var types []string
		var body []byte
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			types, body = append(types, r.Header.Get("Content-Type")), append(body, b...)
			mu.Unlock()
		}))
		p, err := NewProvider(context.Background(), srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		p.Observer().CallDone(report("", context.Background()))
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		if len(types) != 1 || types[0] != tt.want || !strings.Contains(string(body), "execute_tool fs.write") {
			t.Errorf("protocol %q, traces %q: requests %v, body %q; want one %s with the call's span", tt.protocol, tt.traces, types, body, tt.want)
		}
	}
}

// TestProviderExportsEveryCall: calls traced from several goroutines,
// exported in batches of 5 spans (a call's 8 spans straddle batches) and
// their memory recycled after export, all reach the collector intact:
// each call's span with its own attributes, each of its stages once,
// under it, with the stage's times.
func TestProviderExportsEveryCall(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
	rc := newCaptured(t)
	p, err := NewProvider(context.Background(), rc.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Observer()
	const workers, calls = 4, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				r := report(`{"session_id":"s1"}`, context.Background())
				r.OperationID = fmt.Sprintf("op-%d-%d", w, i)
				r.LedgerSeq = uint64(w*calls + i + 1)
				tr.CallDone(r)
			}
		})
	}
	wg.Wait()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := report("", context.Background()).Stages
	type call struct {
		seq    int64
		stages []string
	}
	byID := map[string]*call{}  // call span id -> call
	byOp := map[string]string{} // operation id -> call span id
	var stages []*tracepb.Span
	for _, req := range rc.reqs {
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if s.Name != "execute_tool fs.write" {
						stages = append(stages, s)
						continue
					}
					a := map[string]*commonpb.AnyValue{}
					for _, kv := range s.Attributes {
						a[kv.Key] = kv.Value
					}
					op := a["capkernel.operation.id"].GetStringValue()
					if _, dup := byOp[op]; dup || a["gen_ai.tool.call.id"].GetStringValue() != op {
						t.Errorf("call span of %s: repeated or with tool call id %q", op, a["gen_ai.tool.call.id"].GetStringValue())
					}
					byOp[op] = string(s.SpanId)
					byID[string(s.SpanId)] = &call{seq: a["capkernel.ledger.seq"].GetIntValue()}
				}
			}
		}
	}
	for _, s := range stages {
		c := byID[string(s.ParentSpanId)]
		if c == nil {
			t.Errorf("stage span %q without its call's", s.Name)
			continue
		}
		st := want[len(c.stages)%len(want)]
		if s.Name != st.Stage || s.StartTimeUnixNano != uint64(st.Start.UnixNano()) || s.EndTimeUnixNano != uint64(st.End.UnixNano()) {
			t.Errorf("stage span %q %d..%d, want %q %v..%v", s.Name, s.StartTimeUnixNano, s.EndTimeUnixNano, st.Stage, st.Start, st.End)
		}
		c.stages = append(c.stages, s.Name)
	}
	seqs := map[int64]bool{}
	for op, id := range byOp {
		c := byID[id]
		if len(c.stages) != len(want) || seqs[c.seq] || c.seq == 0 {
			t.Errorf("%s: stages %v, ledger seq %d (repeated %v)", op, c.stages, c.seq, seqs[c.seq])
		}
		seqs[c.seq] = true
	}
	if len(byOp) != workers*calls || len(stages) != workers*calls*len(want) {
		t.Errorf("%d calls and %d stage spans received, want %d and %d", len(byOp), len(stages), workers*calls, workers*calls*len(want))
	}
}
