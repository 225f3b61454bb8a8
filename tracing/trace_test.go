package tracing

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/capkernel/capkernel/kernel"
)

// Trace contexts of an agent's span: sampled, and not sampled.
const (
	agentTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
	agentSpan    = "00f067aa0ba902b7"
	agentParent  = "00-" + agentTrace + "-" + agentSpan + "-01"
	headerTrace  = "0af7651916cd43dd8448eb211c80319c"
	headerSpan   = "b7ad6b7169203331"
	headerParent = "00-" + headerTrace + "-" + headerSpan + "-01"
	unsampled    = "00-" + agentTrace + "-" + agentSpan + "-00"
)

// procSink hands a call's spans to a span processor one by one.
type procSink struct{ sdktrace.SpanProcessor }

func (p procSink) add(spans ...sdktrace.ReadOnlySpan) {
	for _, s := range spans {
		p.OnEnd(s)
	}
}

// path is one way a Tracer records, to its own recorder.
type path struct {
	name string
	tr   *Tracer
	rec  *tracetest.SpanRecorder
}

// paths are the two ways a Tracer records: through the SDK's tracer
// (New) and directly to the span processor (a Provider's Observer), both
// parent-based always-on under the same resource.
func paths() []path {
	res := resource.NewSchemaless(attribute.String("service.name", ServiceName))
	sdk := tracetest.NewSpanRecorder()
	dir := tracetest.NewSpanRecorder()
	sampler := sdktrace.ParentBased(sdktrace.AlwaysSample())
	d := New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(dir), sdktrace.WithResource(res), sdktrace.WithSampler(sampler)))
	d.direct = newDirect(procSink{dir}, sampler, res)
	return []path{
		{"sdk", New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdk), sdktrace.WithResource(res), sdktrace.WithSampler(sampler))), sdk},
		{"direct", d, dir},
	}
}

// report is a finished call: an fs.write committed through every stage.
func report(prov string, ctx context.Context) *kernel.CallReport {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	var stages []kernel.StageSpan
	at := t0
	for _, s := range []string{kernel.StageVerify, kernel.StagePolicy, kernel.StageGate, kernel.StagePrepare, kernel.StageExecute, kernel.StageLedger, kernel.StageCommit} {
		stages = append(stages, kernel.StageSpan{Stage: s, Start: at, End: at.Add(time.Millisecond)})
		at = at.Add(time.Millisecond)
	}
	var p []byte
	if prov != "" {
		p = []byte(prov)
	}
	return &kernel.CallReport{
		OperationID: "op-1", ToolID: "fs.write", AgentID: "a1", SessionID: "s1", TokenID: "jti-1",
		SideEffect: "reversible_write", AutonomyMode: "auto", Status: kernel.StatusOK, TxOutcome: kernel.Committed,
		LedgerSeq: 42, Start: t0, End: at, Stages: stages, Provenance: p, Context: ctx,
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

func TestCallSpan(t *testing.T) {
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) { testCallSpan(t, p) })
	}
}

func testCallSpan(t *testing.T, p path) {
	r := report(`{"session_id":"s1","tool_call_id":"call_abc"}`, context.Background())
	p.tr.CallDone(r)
	spans := p.rec.Ended()
	if len(spans) != 8 {
		t.Fatalf("%d spans, want the call's and its 7 stages'", len(spans))
	}
	call := spans[len(spans)-1]
	if call.Name() != "execute_tool fs.write" || call.SpanKind() != trace.SpanKindInternal {
		t.Fatalf("call span %q kind %v", call.Name(), call.SpanKind())
	}
	if !call.StartTime().Equal(r.Start) || !call.EndTime().Equal(r.End) {
		t.Errorf("call span %v..%v, want the kernel's %v..%v", call.StartTime(), call.EndTime(), r.Start, r.End)
	}
	if call.Parent().IsValid() {
		t.Errorf("a call without trace context has parent %v", call.Parent())
	}
	want := map[attribute.Key]attribute.Value{
		"gen_ai.operation.name":   attribute.StringValue("execute_tool"),
		"gen_ai.tool.name":        attribute.StringValue("fs.write"),
		"gen_ai.tool.call.id":     attribute.StringValue("call_abc"),
		"gen_ai.agent.id":         attribute.StringValue("a1"),
		"gen_ai.conversation.id":  attribute.StringValue("s1"),
		"capkernel.operation.id":  attribute.StringValue("op-1"),
		"capkernel.autonomy_mode": attribute.StringValue("auto"),
		"capkernel.outcome":       attribute.StringValue("ok"),
		"capkernel.tx_outcome":    attribute.StringValue("committed"),
		"capkernel.ledger.seq":    attribute.Int64Value(42),
		"capkernel.side_effect":   attribute.StringValue("reversible_write"),
		"capkernel.token.id":      attribute.StringValue("jti-1"),
		"capkernel.replayed":      attribute.BoolValue(false),
	}
	got := attrs(call)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, got[k].Emit(), v.Emit())
		}
	}
	if _, ok := got["error.type"]; ok || call.Status().Code == codes.Error {
		t.Errorf("an ok call has error.type or an error status: %v", call.Status())
	}
	for i, s := range spans[:7] {
		st := r.Stages[i]
		if s.Name() != st.Stage || s.Parent().SpanID() != call.SpanContext().SpanID() || !s.StartTime().Equal(st.Start) || !s.EndTime().Equal(st.End) {
			t.Errorf("stage span %d: %q parent %v %v..%v, want %q child of the call %v..%v",
				i, s.Name(), s.Parent().SpanID(), s.StartTime(), s.EndTime(), st.Stage, st.Start, st.End)
		}
	}
}

func TestCallSpanError(t *testing.T) {
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) { testCallSpanError(t, p) })
	}
}

func testCallSpanError(t *testing.T, p path) {
	r := report("", context.Background())
	r.Status, r.ErrorClass, r.TxOutcome, r.LedgerSeq, r.Stages = kernel.StatusError, kernel.ErrPolicyDenied, kernel.NoOp, 7, r.Stages[:2]
	p.tr.CallDone(r)
	spans := p.rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the call's and the 2 stages it reached", len(spans))
	}
	call := spans[2]
	a := attrs(call)
	if call.Status().Code != codes.Error || call.Status().Description != kernel.ErrPolicyDenied ||
		a["error.type"].AsString() != kernel.ErrPolicyDenied || a["capkernel.outcome"].AsString() != kernel.ErrPolicyDenied {
		t.Fatalf("denied call: status %v, attributes %v", call.Status(), a)
	}
	// Without a tool_call_id in the provenance, the operation id is it.
	if a["gen_ai.tool.call.id"].AsString() != "op-1" {
		t.Errorf("gen_ai.tool.call.id %q, want the operation id", a["gen_ai.tool.call.id"].AsString())
	}
}

func TestParent(t *testing.T) {
	headerWith := func(state string) context.Context {
		r, _ := http.NewRequest("POST", "http://127.0.0.1/v1/syscalls", nil)
		r.Header.Set("traceparent", headerParent)
		r.Header.Set("tracestate", state)
		return FromHTTP(r)
	}
	header := func() context.Context { return headerWith("vendor=x") }
	// A tracestate past 512 bytes (valid: 32 members of a long value) is
	// dropped, the parent kept (rev-key #6: 16 KB rode every span).
	var long []string
	for i := range 32 {
		long = append(long, fmt.Sprintf("v%d=%s", i, strings.Repeat("x", 200)))
	}
	longState := strings.Join(long, ",")
	tests := []struct {
		name       string
		prov       string
		ctx        context.Context
		wantTrace  string // "" for a new trace
		wantParent string
		wantState  string
		recorded   bool
	}{
		{"none", "", context.Background(), "", "", "", true},
		{"provenance", `{"traceparent":"` + agentParent + `","tracestate":"agent=1"}`, context.Background(), agentTrace, agentSpan, "agent=1", true},
		{"http header", "", header(), headerTrace, headerSpan, "vendor=x", true},
		{"http header wins over provenance", `{"traceparent":"` + agentParent + `"}`, header(), headerTrace, headerSpan, "vendor=x", true},
		{"a long tracestate in the provenance dropped", `{"traceparent":"` + agentParent + `","tracestate":"` + longState + `"}`, context.Background(), agentTrace, agentSpan, "", true},
		{"a long tracestate header dropped", "", headerWith(longState), headerTrace, headerSpan, "", true},
		{"invalid traceparent starts a trace", `{"traceparent":"00-zz-11-01"}`, context.Background(), "", "", "", true},
		{"traceparent not a string", `{"traceparent":5}`, context.Background(), "", "", "", true},
		{"provenance not an object", `[1]`, context.Background(), "", "", "", true},
		{"unsampled parent is not recorded", `{"traceparent":"` + unsampled + `"}`, context.Background(), "", "", "", false},
	}
	for _, tt := range tests {
		for _, p := range paths() {
			t.Run(p.name+"/"+tt.name, func(t *testing.T) {
				p.tr.CallDone(report(tt.prov, tt.ctx))
				spans := p.rec.Ended()
				if !tt.recorded {
					if len(spans) != 0 {
						t.Fatalf("%d spans recorded under an unsampled parent", len(spans))
					}
					return
				}
				call := spans[len(spans)-1]
				sc, p := call.SpanContext(), call.Parent()
				if tt.wantTrace == "" {
					if p.IsValid() {
						t.Fatalf("parent %v, want a new trace", p)
					}
					return
				}
				if sc.TraceID().String() != tt.wantTrace || p.SpanID().String() != tt.wantParent || !p.IsRemote() {
					t.Fatalf("span in trace %s under %s (remote %v), want trace %s under %s", sc.TraceID(), p.SpanID(), p.IsRemote(), tt.wantTrace, tt.wantParent)
				}
				if sc.TraceState().String() != tt.wantState {
					t.Errorf("tracestate %q, want %q", sc.TraceState(), tt.wantState)
				}
			})
		}
	}
}

func TestSpanName(t *testing.T) {
	tests := []struct{ tool, want string }{
		{"fs.write", "execute_tool fs.write"},
		{"mcp.github.create_issue", "execute_tool mcp.github.create_issue"},
		{"", "execute_tool"},
		{"fs.write\nforged", "execute_tool"},
		{"rm -rf", "execute_tool"},
		{strings.Repeat("a", maxToolName+1), "execute_tool"},
	}
	for _, tt := range tests {
		if got := spanName(tt.tool); got != tt.want {
			t.Errorf("spanName(%q) = %q, want %q", tt.tool, got, tt.want)
		}
	}
}

func TestEnabled(t *testing.T) {
	tests := []struct {
		name     string
		endpoint string
		env      map[string]string
		want     bool
	}{
		{"off by default", "", nil, false},
		{"flag", "http://127.0.0.1:4318", nil, true},
		{"flag beats disabled SDK", "http://127.0.0.1:4318", map[string]string{"OTEL_SDK_DISABLED": "true"}, true},
		{"env endpoint", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{"env traces endpoint", "", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{"env exporter none", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{"env SDK disabled", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, false},
	}
	for _, tt := range tests {
		if got := Enabled(tt.endpoint, func(k string) string { return tt.env[k] }); got != tt.want {
			t.Errorf("%s: Enabled = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestEndpointURL(t *testing.T) {
	tests := []struct{ in, want, err string }{
		{"http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces", ""},
		{"https://collector.example/", "https://collector.example/v1/traces", ""},
		{"http://c:4318/otlp/v1/traces", "http://c:4318/otlp/v1/traces", ""},
		{"127.0.0.1:4318", "", "not an http"},
		{"grpc://c:4317", "", "not an http"},
		{"http://", "", "not an http"},
		{"http://c:x", "", "invalid port"},
	}
	for _, tt := range tests {
		got, err := EndpointURL(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("EndpointURL(%q) = %q, %v; want an error with %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("EndpointURL(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// BenchmarkCallDone is the tracer's own cost per call: the call's span
// and its stage spans made and handed to the batch processor exporting
// over OTLP/HTTP to a receiver on loopback (the export runs on the batch
// processor's goroutine; its CPU counts in cpu-µs/op). Every span must
// reach the receiver: a processor that dropped spans would look cheap.
// A loop of calls outruns any exporter, so the loop flushes each full
// batch itself.
func BenchmarkCallDone(b *testing.B) {
	// An audited echo reaches 5 stages, a committed fs.write all 7.
	write := report(`{"session_id":"s1"}`, context.Background())
	echo := report(`{"session_id":"s1"}`, context.Background())
	echo.ToolID, echo.SideEffect, echo.TxOutcome = "echo", "read_only", ""
	echo.Stages = []kernel.StageSpan{write.Stages[0], write.Stages[1], write.Stages[2], write.Stages[4], write.Stages[5]}
	for _, r := range []*kernel.CallReport{echo, write} {
		b.Run(fmt.Sprintf("%s/%d-stages", r.ToolID, len(r.Stages)), func(b *testing.B) { benchCallDone(b, r) })
	}
}

func benchCallDone(b *testing.B, r *kernel.CallReport) {
	var spans atomic.Int64
	var mu sync.Mutex
	var body bytes.Buffer // reused: the receiver's allocations are not the tracer's
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		body.Reset()
		body.ReadFrom(r.Body)
		spans.Add(int64(countSpans(body.Bytes())))
	}))
	defer rc.Close()
	tp, err := NewProvider(context.Background(), rc.URL)
	if err != nil {
		b.Fatal(err)
	}
	tr := tp.Observer()
	// Flush when a batch is full, as the batcher's goroutine would.
	every := tp.direct.sink.(*batcher).cfg.batch / (1 + len(r.Stages))
	b.ReportAllocs()
	b.ResetTimer()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for i := 1; b.Loop(); i++ {
		tr.CallDone(r)
		if i%every == 0 {
			if err := tp.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/1000/float64(b.N), "cpu-µs/op")
	if want := int64(b.N * (1 + len(r.Stages))); spans.Load() != want {
		b.Fatalf("the receiver got %d spans, want %d", spans.Load(), want)
	}
}

// countSpans counts the spans of an OTLP ExportTraceServiceRequest by
// walking its wire format (resource_spans = 1, scope_spans = 2,
// spans = 2), without decoding them: the receiver's CPU counts in
// BenchmarkCallDone's.
func countSpans(b []byte) int {
	n := 0
	var walk func(b []byte, depth int)
	walk = func(b []byte, depth int) {
		for len(b) > 0 {
			num, typ, l := protowire.ConsumeTag(b)
			if l < 0 {
				return
			}
			b = b[l:]
			if typ != protowire.BytesType {
				l = protowire.ConsumeFieldValue(num, typ, b)
			} else {
				v, m := protowire.ConsumeBytes(b)
				l = m
				switch {
				case depth == 0 && num == 1, depth == 1 && num == 2:
					walk(v, depth+1)
				case depth == 2 && num == 2:
					n++
				}
			}
			if l < 0 {
				return
			}
			b = b[l:]
		}
	}
	walk(b, 0)
	return n
}

// TestDirectMatchesSDK: the spans the direct path hands the processor
// must be what the SDK's tracer makes of the same call, field by field,
// but for the random ids: a call of every stage, a refused one, a new
// trace, a sampled and an unsampled parent with trace state.
func TestDirectMatchesSDK(t *testing.T) {
	refused := report(`{"traceparent":"`+agentParent+`","tracestate":"agent=1"}`, context.Background())
	refused.Status, refused.ErrorClass, refused.Stages = kernel.StatusError, kernel.ErrPolicyDenied, refused.Stages[:2]
	tests := []struct {
		name string
		r    *kernel.CallReport
	}{
		{"every stage", report(`{"traceparent":"`+agentParent+`","tool_call_id":"c1"}`, context.Background())},
		{"refused", refused},
		{"new trace", report(`{"session_id":"s1"}`, context.Background())},
		{"unsampled parent", report(`{"traceparent":"`+unsampled+`"}`, context.Background())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := paths()
			for _, p := range ps {
				p.tr.CallDone(tt.r)
			}
			want, got := ps[0].rec.Ended(), ps[1].rec.Ended()
			if len(got) != len(want) {
				t.Fatalf("direct: %d spans, SDK: %d", len(got), len(want))
			}
			ids := map[trace.SpanID]bool{}
			for i, w := range want {
				g := got[i]
				// Ids are random: the SDK's call span id stands for the
				// direct one in the stages' parent, and a new trace's id
				// for the direct one.
				callID := func(sp []sdktrace.ReadOnlySpan) trace.SpanContext { return sp[len(sp)-1].SpanContext() }
				norm := func(sc, call trace.SpanContext) trace.SpanContext {
					if sc.SpanID() == call.SpanID() {
						sc = sc.WithSpanID(trace.SpanID{1})
					}
					if sc.TraceID() == call.TraceID() && sc.TraceID().String() != agentTrace {
						sc = sc.WithTraceID(trace.TraceID{1})
					}
					return sc
				}
				gp, wp := norm(g.Parent(), callID(got)), norm(w.Parent(), callID(want))
				gsc, wsc := g.SpanContext(), w.SpanContext()
				if ids[gsc.SpanID()] || !gsc.SpanID().IsValid() {
					t.Errorf("span %d: span id %v repeated or invalid", i, gsc.SpanID())
				}
				ids[gsc.SpanID()] = true
				if g.Name() != w.Name() || !gp.Equal(wp) || gsc.TraceFlags() != wsc.TraceFlags() || gsc.IsRemote() != wsc.IsRemote() ||
					gsc.TraceState().String() != wsc.TraceState().String() || (gsc.TraceID() == wsc.TraceID()) != (wsc.TraceID().String() == agentTrace) ||
					g.SpanKind() != w.SpanKind() || !g.StartTime().Equal(w.StartTime()) || !g.EndTime().Equal(w.EndTime()) ||
					g.Status() != w.Status() || g.InstrumentationScope() != w.InstrumentationScope() || !g.Resource().Equal(w.Resource()) ||
					g.ChildSpanCount() != w.ChildSpanCount() || len(g.Links())+len(g.Events()) != len(w.Links())+len(w.Events()) ||
					g.DroppedAttributes()+g.DroppedLinks()+g.DroppedEvents() != w.DroppedAttributes()+w.DroppedLinks()+w.DroppedEvents() {
					t.Errorf("span %d: direct %q %v parent %v kind %v %v..%v %v %v %v children %d\n                SDK %q %v parent %v kind %v %v..%v %v %v %v children %d", i,
						g.Name(), gsc, gp, g.SpanKind(), g.StartTime(), g.EndTime(), g.Status(), g.InstrumentationScope(), g.Resource(), g.ChildSpanCount(),
						w.Name(), wsc, wp, w.SpanKind(), w.StartTime(), w.EndTime(), w.Status(), w.InstrumentationScope(), w.Resource(), w.ChildSpanCount())
				}
				if ga, wa := attrs(g), attrs(w); len(ga) != len(wa) || len(g.Attributes()) != len(w.Attributes()) {
					t.Errorf("span %d: direct attributes %v, SDK %v", i, g.Attributes(), w.Attributes())
				} else {
					for k, v := range wa {
						if ga[k] != v {
							t.Errorf("span %d: attribute %s = %v, SDK %v", i, k, ga[k].Emit(), v.Emit())
						}
					}
				}
			}
		})
	}
}

// Every string a span takes from a call is bounded (maxAttr bytes, cut at
// a character boundary): a refused call's tool id, session or tool call
// id is whatever its sender put there, a megabyte each made the span
// queue hold gigabytes (rev-console #4). Short ones are kept whole.
func TestCallSpanAttributesBounded(t *testing.T) {
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			huge := strings.Repeat("é", 1<<19) // 1 MiB of two-byte characters
			r := report(`{"tool_call_id":"`+huge+`"}`, context.Background())
			r.ToolID, r.SessionID, r.AgentID, r.OperationID, r.TokenID = huge, huge, huge, huge, huge
			r.Status, r.ErrorClass, r.TxOutcome, r.Stages = kernel.StatusError, kernel.ErrTokenInvalid, kernel.NoOp, r.Stages[:1]
			p.tr.CallDone(r)
			spans := p.rec.Ended()
			call := spans[len(spans)-1]
			for _, a := range call.Attributes() {
				if v := a.Value.AsString(); len(v) > maxAttr || !utf8.ValidString(v) {
					t.Errorf("attribute %s: %d bytes (valid UTF-8: %v)", a.Key, len(v), utf8.ValidString(v))
				}
			}
			if got := attrs(call)["gen_ai.tool.name"].AsString(); !strings.HasSuffix(got, "…") || !strings.HasPrefix(huge, strings.TrimSuffix(got, "…")) {
				t.Errorf("gen_ai.tool.name %.40q…: want the tool id's start, marked as cut", got)
			}
			short := report("", context.Background())
			p.tr.CallDone(short)
			spans = p.rec.Ended()
			if got := attrs(spans[len(spans)-1])["gen_ai.tool.name"].AsString(); got != "fs.write" {
				t.Errorf("a short tool id: %q", got)
			}
		})
	}
}
