package tracing

import (
	"math/rand/v2"

	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/capkernel/capkernel/kernel"
)

// stageSink hands a call's stage spans straight to the span processor
// that exports them. A stage span is finished the moment it is made,
// has no attributes, events or links, and its parent (the call's span)
// was sampled already, so the SDK's per-span machinery (sampler, a
// mutable span, its snapshot, a context) would be pure overhead: it
// doubled what tracing cost a call (BenchmarkCallDone). The spans are
// made as read-only snapshots of tracetest.SpanStub, the SDK's public
// way to make a ReadOnlySpan outside a tracer.
type stageSink struct {
	proc  sdktrace.SpanProcessor
	res   *resource.Resource
	scope instrumentation.Scope
}

// newStageSink sends stage spans to proc under the resource res.
func newStageSink(proc sdktrace.SpanProcessor, res *resource.Resource) *stageSink {
	return &stageSink{proc: proc, res: res, scope: instrumentation.Scope{Name: ScopeName, SchemaURL: semconv.SchemaURL}}
}

// record hands one span per stage, children of parent, to the processor.
func (s *stageSink) record(parent trace.SpanContext, stages []kernel.StageSpan) {
	for _, st := range stages {
		stub := tracetest.SpanStub{
			Name:                 st.Stage,
			SpanContext:          parent.WithSpanID(newSpanID()).WithRemote(false),
			Parent:               parent,
			SpanKind:             trace.SpanKindInternal,
			StartTime:            st.Start,
			EndTime:              st.End,
			Resource:             s.res,
			InstrumentationScope: s.scope,
		}
		s.proc.OnEnd(stub.Snapshot())
	}
}

// newSpanID is a random non-zero span id (W3C Trace Context: all-zero is
// invalid). Span ids need to be unique, not secret.
func newSpanID() trace.SpanID {
	var id trace.SpanID
	for id == (trace.SpanID{}) {
		v := rand.Uint64()
		for i := range id {
			id[i] = byte(v >> (8 * i))
		}
	}
	return id
}
