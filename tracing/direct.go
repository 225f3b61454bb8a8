package tracing

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/capkernel/capkernel/kernel"
)

// direct records a call's spans as finished spans handed straight to the
// span processor that exports them (the Provider's batcher). A call is
// reported once it is over, with the times the kernel measured, so its
// spans need none of the SDK's per-span machinery: a mutable span with
// its locks, attribute de-duplication, a context per child, a snapshot
// at End, some 50 allocations for a call of 7 stages. The call and its
// stages are made here instead, in one allocation, as what the SDK would
// have handed the processor: TestDirectMatchesSDK compares the two.
//
// Sampling is the provider's: the sampler decides on the call's span as
// the SDK's tracer would (same parameters, same trace flags and trace
// state); its stages follow it.
type direct struct {
	sink    spanSink
	sampler sdktrace.Sampler
	res     *resource.Resource
	scope   instrumentation.Scope
	// pool recycles a call's spans once they are exported (see
	// callSpan.release): they were most of the bytes tracing allocated
	// per call.
	pool sync.Pool
}

// maxCallAttrs is the most attributes callAttrs makes; a sampler's
// attributes are appended after them.
const maxCallAttrs = 14

// callSpans is one call's spans, made in one allocation: the call's,
// its attributes, and its stages (a kernel call reports each of
// kernel.Stages at most once).
type callSpans struct {
	call   callSpan
	attrs  [maxCallAttrs]attribute.KeyValue
	stages [len(kernel.Stages)]stageSpan
}

// record makes the spans of call r, child of parent, and hands them to
// the sink, stages first (they end before the call), in the order the
// SDK would.
func (d *direct) record(parent context.Context, r *kernel.CallReport, toolCallID string) {
	c, _ := d.pool.Get().(*callSpans)
	if c == nil {
		c = new(callSpans)
	}
	attrs := callAttrs(c.attrs[:0], r, toolCallID)
	name := spanName(r.ToolID)
	psc := trace.SpanContextFromContext(parent)
	tid := psc.TraceID()
	if !tid.IsValid() {
		tid = newTraceID()
	}
	res := d.sampler.ShouldSample(sdktrace.SamplingParameters{
		ParentContext: parent, TraceID: tid, Name: name, Kind: trace.SpanKindInternal, Attributes: attrs,
	})
	if res.Decision != sdktrace.RecordAndSample {
		// Not sampled: the batcher, the only processor, exports
		// sampled spans alone (a RecordOnly span would be recorded for
		// nothing).
		*c = callSpans{}
		d.pool.Put(c)
		return
	}
	attrs = append(attrs, res.Attributes...)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: newSpanID(), TraceFlags: psc.TraceFlags() | trace.FlagsSampled, TraceState: res.Tracestate,
	})
	c.call = callSpan{spanBase: spanBase{d: d}, owner: c, name: name, sc: sc, parent: psc, start: r.Start, end: r.End, attrs: attrs, children: len(r.Stages)}
	if o := r.Outcome(); o != "ok" {
		c.call.status = sdktrace.Status{Code: codes.Error, Description: o}
	}
	stages := c.stages[:0]
	if len(r.Stages) > len(c.stages) {
		stages = make([]stageSpan, 0, len(r.Stages))
	}
	for _, st := range r.Stages {
		stages = append(stages, stageSpan{
			spanBase: spanBase{d: d}, call: &c.call, name: st.Stage, id: newSpanID(), start: st.Start.UnixNano(), end: st.End.UnixNano(),
		})
	}
	var buf [1 + len(c.stages)]sdktrace.ReadOnlySpan
	out := buf[:0]
	for i := range stages {
		out = append(out, &stages[i])
	}
	d.sink.add(append(out, &c.call)...)
}

// spanSink takes the finished spans of a call, all sampled, at once
// (batcher.add).
type spanSink interface {
	add(spans ...sdktrace.ReadOnlySpan)
}

// spanBase is what the spans direct makes share: they are internal,
// ended, without events or links, under direct's resource and scope.
type spanBase struct {
	// ReadOnlySpan is embedded, and nil, only for its unexported method,
	// which lets nothing outside the SDK implement the interface
	// otherwise (the SDK's own test stubs do the same). Every exported
	// method is spanBase's or its embedder's own.
	sdktrace.ReadOnlySpan

	d *direct
}

// SpanKind implements sdktrace.ReadOnlySpan: internal, as the SDK path's.
func (spanBase) SpanKind() trace.SpanKind { return trace.SpanKindInternal }

// Links implements sdktrace.ReadOnlySpan: none.
func (spanBase) Links() []sdktrace.Link { return nil }

// Events implements sdktrace.ReadOnlySpan: none.
func (spanBase) Events() []sdktrace.Event { return nil }

// InstrumentationScope implements sdktrace.ReadOnlySpan.
func (s spanBase) InstrumentationScope() instrumentation.Scope { return s.d.scope }

// InstrumentationLibrary implements sdktrace.ReadOnlySpan.
//
//nolint:staticcheck // the interface still requires it
func (s spanBase) InstrumentationLibrary() instrumentation.Library { return s.d.scope }

// Resource implements sdktrace.ReadOnlySpan.
func (s spanBase) Resource() *resource.Resource { return s.d.res }

// DroppedAttributes implements sdktrace.ReadOnlySpan: none are.
func (spanBase) DroppedAttributes() int { return 0 }

// DroppedLinks implements sdktrace.ReadOnlySpan: none are.
func (spanBase) DroppedLinks() int { return 0 }

// DroppedEvents implements sdktrace.ReadOnlySpan: none are.
func (spanBase) DroppedEvents() int { return 0 }

// callSpan is a call's span.
type callSpan struct {
	spanBase
	owner      *callSpans
	name       string
	sc, parent trace.SpanContext
	start, end time.Time
	attrs      []attribute.KeyValue
	status     sdktrace.Status
	children   int
}

// Name implements sdktrace.ReadOnlySpan.
func (s *callSpan) Name() string { return s.name }

// SpanContext implements sdktrace.ReadOnlySpan.
func (s *callSpan) SpanContext() trace.SpanContext { return s.sc }

// Parent implements sdktrace.ReadOnlySpan.
func (s *callSpan) Parent() trace.SpanContext { return s.parent }

// StartTime implements sdktrace.ReadOnlySpan.
func (s *callSpan) StartTime() time.Time { return s.start }

// EndTime implements sdktrace.ReadOnlySpan.
func (s *callSpan) EndTime() time.Time { return s.end }

// Attributes implements sdktrace.ReadOnlySpan.
func (s *callSpan) Attributes() []attribute.KeyValue { return s.attrs }

// Status implements sdktrace.ReadOnlySpan.
func (s *callSpan) Status() sdktrace.Status { return s.status }

// ChildSpanCount implements sdktrace.ReadOnlySpan: the call's stages.
func (s *callSpan) ChildSpanCount() int { return s.children }

// release recycles the spans of s's call. The batcher calls it once it
// has exported s: a call's spans are queued together, stages first, and
// exported in queue order, so its stages are exported by then too, and
// nothing else holds them (the exporters keep nothing of the spans they
// are given).
func (s *callSpan) release() {
	c, d := s.owner, s.d // s is in c
	*c = callSpans{}
	d.pool.Put(c)
}

// stageSpan is a stage's span, child of its call's. It keeps only what
// is its own, in few bytes: a call's 7 stage spans were most of what it
// allocated.
type stageSpan struct {
	spanBase
	call       *callSpan
	name       string
	id         trace.SpanID
	start, end int64 // Unix nanoseconds
}

// Name implements sdktrace.ReadOnlySpan.
func (s *stageSpan) Name() string { return s.name }

// SpanContext implements sdktrace.ReadOnlySpan: the call's, with the
// stage's span id.
func (s *stageSpan) SpanContext() trace.SpanContext { return s.call.sc.WithSpanID(s.id) }

// Parent implements sdktrace.ReadOnlySpan: the call's span.
func (s *stageSpan) Parent() trace.SpanContext { return s.call.sc }

// StartTime implements sdktrace.ReadOnlySpan.
func (s *stageSpan) StartTime() time.Time { return time.Unix(0, s.start) }

// EndTime implements sdktrace.ReadOnlySpan.
func (s *stageSpan) EndTime() time.Time { return time.Unix(0, s.end) }

// Attributes implements sdktrace.ReadOnlySpan: none.
func (*stageSpan) Attributes() []attribute.KeyValue { return nil }

// Status implements sdktrace.ReadOnlySpan: unset.
func (*stageSpan) Status() sdktrace.Status { return sdktrace.Status{} }

// ChildSpanCount implements sdktrace.ReadOnlySpan: none.
func (*stageSpan) ChildSpanCount() int { return 0 }

// newDirect records to sink under res with sampler.
func newDirect(sink spanSink, sampler sdktrace.Sampler, res *resource.Resource) *direct {
	return &direct{sink: sink, sampler: sampler, res: res, scope: instrumentation.Scope{Name: ScopeName, SchemaURL: semconv.SchemaURL}}
}

// newTraceID is a random non-zero trace id, as the SDK's default id
// generator makes (W3C Trace Context: all-zero is invalid).
func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		hi, lo := rand.Uint64(), rand.Uint64()
		for i := range 8 {
			id[i], id[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
		}
	}
	return id
}

// newSpanID is a random non-zero span id. Ids need to be unique, not
// secret: math/rand/v2's generator is per-thread, without a lock.
func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		v := rand.Uint64()
		for i := range id {
			id[i] = byte(v >> (8 * i))
		}
	}
	return id
}
