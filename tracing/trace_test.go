package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

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

func recorder() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), rec
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
	tr, rec := recorder()
	r := report(`{"session_id":"s1","tool_call_id":"call_abc"}`, context.Background())
	tr.CallDone(r)
	spans := rec.Ended()
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
	tr, rec := recorder()
	r := report("", context.Background())
	r.Status, r.ErrorClass, r.TxOutcome, r.LedgerSeq, r.Stages = kernel.StatusError, kernel.ErrPolicyDenied, kernel.NoOp, 7, r.Stages[:2]
	tr.CallDone(r)
	spans := rec.Ended()
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
	header := func() context.Context {
		r, _ := http.NewRequest("POST", "http://127.0.0.1/v1/syscalls", nil)
		r.Header.Set("traceparent", headerParent)
		r.Header.Set("tracestate", "vendor=x")
		return FromHTTP(r)
	}
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
		{"invalid traceparent starts a trace", `{"traceparent":"00-zz-11-01"}`, context.Background(), "", "", "", true},
		{"traceparent not a string", `{"traceparent":5}`, context.Background(), "", "", "", true},
		{"provenance not an object", `[1]`, context.Background(), "", "", "", true},
		{"unsampled parent is not recorded", `{"traceparent":"` + unsampled + `"}`, context.Background(), "", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, rec := recorder()
			tr.CallDone(report(tt.prov, tt.ctx))
			spans := rec.Ended()
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
// and its 7 stage spans made and handed to a batch processor exporting
// over OTLP/HTTP to a receiver on loopback (the export runs on the batch
// processor's goroutine; its CPU counts in cpu-µs/op).
func BenchmarkCallDone(b *testing.B) {
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	defer rc.Close()
	tp, err := NewProvider(context.Background(), rc.URL)
	if err != nil {
		b.Fatal(err)
	}
	tr := tp.Observer()
	r := report(`{"session_id":"s1"}`, context.Background())
	b.ReportAllocs()
	b.ResetTimer()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for b.Loop() {
		tr.CallDone(r)
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/1000/float64(b.N), "cpu-µs/op")
}

// TestDirectStages: the Provider's Tracer hands stage spans straight to
// the batch processor; they must be what the SDK path makes: children of
// the call's span in its trace, named and timed as the stages, internal,
// under the provider's resource and the tracer's scope.
func TestDirectStages(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	res := resource.NewSchemaless(attribute.String("service.name", ServiceName))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res))
	tr := New(tp)
	tr.stages = newStageSink(rec, res)
	r := report(`{"traceparent":"`+agentParent+`"}`, context.Background())
	tr.CallDone(r)
	spans := rec.Ended()
	if len(spans) != 8 {
		t.Fatalf("%d spans, want 8", len(spans))
	}
	call := spans[7]
	ids := map[trace.SpanID]bool{call.SpanContext().SpanID(): true}
	for i, s := range spans[:7] {
		st := r.Stages[i]
		sc := s.SpanContext()
		if s.Name() != st.Stage || !s.Parent().Equal(call.SpanContext()) || sc.TraceID() != call.SpanContext().TraceID() ||
			!sc.IsSampled() || !sc.IsValid() || sc.IsRemote() || ids[sc.SpanID()] ||
			!s.StartTime().Equal(st.Start) || !s.EndTime().Equal(st.End) || s.SpanKind() != trace.SpanKindInternal ||
			s.Resource() != res || s.InstrumentationScope().Name != ScopeName {
			t.Errorf("stage span %d: %q %v parent %v kind %v %v..%v scope %v", i, s.Name(), sc, s.Parent(), s.SpanKind(),
				s.StartTime(), s.EndTime(), s.InstrumentationScope())
		}
		ids[sc.SpanID()] = true
	}
	if call.SpanContext().TraceID().String() != agentTrace {
		t.Errorf("call span in trace %s, want the agent's", call.SpanContext().TraceID())
	}
}
