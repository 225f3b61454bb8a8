// Package tracing turns the calls the kernel reports (kernel.Observer)
// into OpenTelemetry traces: one span per call, named and attributed
// after the GenAI semantic conventions for tool execution
// ("execute_tool {gen_ai.tool.name}"), with a child span per pipeline
// stage. A call continues the W3C trace context its caller sent, in the
// HTTP headers or in the envelope's provenance (where the MCP gateway
// puts a tools/call's _meta trace context). docs/console.md, section
// "Traces", is the reference.
package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/capkernel/capkernel/kernel"
)

// ScopeName is the instrumentation scope of the kernel's spans.
const ScopeName = "github.com/capkernel/capkernel/tracing"

// Attributes of capkernel's own on a call's span, next to the GenAI ones.
const (
	AttrOperationID = attribute.Key("capkernel.operation.id")
	AttrMode        = attribute.Key("capkernel.autonomy_mode")
	AttrOutcome     = attribute.Key("capkernel.outcome") // ok or the error class
	AttrTxOutcome   = attribute.Key("capkernel.tx_outcome")
	AttrLedgerSeq   = attribute.Key("capkernel.ledger.seq")
	AttrSideEffect  = attribute.Key("capkernel.side_effect")
	AttrTokenID     = attribute.Key("capkernel.token.id")
	AttrReplayed    = attribute.Key("capkernel.replayed")
)

// maxToolName bounds the tool id that goes into a span's name: a span
// name is meant to be low-cardinality, and a refused call's tool id is
// whatever the caller sent.
const maxToolName = 128

// maxAttr bounds each string attribute a span takes from a call: its
// tool id, session, tool call id and the other ids are what the caller
// sent, verified or not (a refused call's tool id may be a megabyte),
// and a span is held in the export queue until the collector takes it.
const maxAttr = 256

// clip is s cut to at most maxAttr bytes, at a character boundary and
// marked with a trailing "…" when cut.
func clip(s string) string {
	if len(s) <= maxAttr {
		return s
	}
	n := maxAttr - len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Tracer is a kernel.Observer that records each call as a span of its
// TracerProvider. The spans are made when the call is reported, with
// the times the kernel measured, so a call costs no tracing work while
// it runs.
type Tracer struct {
	tracer trace.Tracer
	direct *direct // the Provider's spans made without the SDK's span machinery; nil: through tracer
}

// New returns a Tracer recording to tp. A Provider's Observer method
// returns a faster one for its provider.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))}
}

// CallDone implements kernel.Observer: it records the call's span,
// child of the trace context the caller sent (see Parent), and a child
// span per stage the call reached, named after the stage.
func (t *Tracer) CallDone(r *kernel.CallReport) {
	prov := provenanceOf(r.Provenance)
	parent := Parent(r.Context, prov.carrier())
	if t.direct != nil {
		t.direct.record(parent, r, prov.ToolCallID)
		return
	}
	var buf [maxCallAttrs]attribute.KeyValue
	ctx, span := t.tracer.Start(parent, spanName(r.ToolID), trace.WithTimestamp(r.Start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(callAttrs(buf[:0], r, prov.ToolCallID)...))
	if !span.IsRecording() {
		return // not sampled: its stages would not be either
	}
	for _, s := range r.Stages {
		_, child := t.tracer.Start(ctx, s.Stage, trace.WithTimestamp(s.Start))
		child.End(trace.WithTimestamp(s.End))
	}
	if o := r.Outcome(); o != "ok" {
		span.SetStatus(codes.Error, o)
	}
	span.End(trace.WithTimestamp(r.End))
}

// callAttrs appends the attributes of call r's span to attrs: the GenAI
// ones (the tool call id is toolCallID, the agent framework's, else the
// operation id) and capkernel's; at most 14.
func callAttrs(attrs []attribute.KeyValue, r *kernel.CallReport, toolCallID string) []attribute.KeyValue {
	outcome := r.Outcome()
	if toolCallID == "" {
		toolCallID = r.OperationID
	}
	attrs = append(attrs,
		semconv.GenAIOperationNameExecuteTool,
		semconv.GenAIToolName(clip(r.ToolID)),
		semconv.GenAIToolCallID(clip(toolCallID)),
		semconv.GenAIAgentID(clip(r.AgentID)),
		AttrOperationID.String(clip(r.OperationID)),
		AttrOutcome.String(outcome),
		AttrReplayed.Bool(r.Replayed),
	)
	if r.SessionID != "" {
		attrs = append(attrs, semconv.GenAIConversationID(clip(r.SessionID)))
	}
	if r.AutonomyMode != "" {
		attrs = append(attrs, AttrMode.String(r.AutonomyMode))
	}
	if r.TxOutcome != "" {
		attrs = append(attrs, AttrTxOutcome.String(r.TxOutcome))
	}
	if r.SideEffect != "" {
		attrs = append(attrs, AttrSideEffect.String(r.SideEffect))
	}
	if r.TokenID != "" {
		attrs = append(attrs, AttrTokenID.String(clip(r.TokenID)))
	}
	if r.LedgerSeq != 0 {
		attrs = append(attrs, AttrLedgerSeq.Int64(int64(r.LedgerSeq)))
	}
	if outcome != "ok" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(outcome))
	}
	return attrs
}

// GroupCommit implements kernel.Observer; group commits are metrics, not
// spans (one commit serves many calls' traces).
func (*Tracer) GroupCommit(int, time.Duration) {}

// spanName is "execute_tool {tool}", or "execute_tool" alone when the
// tool id is not a plausible tool name (too long, or characters other
// than letters, digits, '.', '_', '-' and '/').
func spanName(tool string) string {
	if tool == "" || len(tool) > maxToolName {
		return "execute_tool"
	}
	for _, r := range tool {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/", r)) {
			return "execute_tool"
		}
	}
	return "execute_tool " + tool
}

// provenance is what the tracer reads of an envelope's provenance: the
// W3C trace context and the agent framework's tool call id. Members of
// another type than string are ignored.
type provenance struct {
	Traceparent string
	Tracestate  string
	ToolCallID  string
}

// provenanceOf reads p, an envelope's provenance object (or nothing).
// Most provenance carries none of the members read here; it is then not
// parsed at all, which keeps tracing cheap for such calls. (A member
// name written with JSON escapes is therefore not seen.)
func provenanceOf(p []byte) provenance {
	if !bytes.Contains(p, []byte(`"traceparent"`)) && !bytes.Contains(p, []byte(`"tool_call_id"`)) {
		return provenance{}
	}
	var m map[string]any
	if json.Unmarshal(p, &m) != nil {
		return provenance{}
	}
	str := func(k string) string { s, _ := m[k].(string); return s }
	return provenance{Traceparent: str("traceparent"), Tracestate: str("tracestate"), ToolCallID: str("tool_call_id")}
}

// maxTracestate is the longest tracestate a call's span carries on: W3C
// Trace Context has every platform propagate at least 512 characters and
// lets it drop a longer one, which anyone's call (a refused one too) may
// send, to be held in the span queue and exported with each span.
const maxTracestate = 512

// carrier is the trace context of p as a propagation carrier: its
// tracestate left out when longer than maxTracestate.
func (p provenance) carrier() propagation.MapCarrier {
	if p.Traceparent == "" {
		return nil
	}
	c := propagation.MapCarrier{"traceparent": p.Traceparent}
	if p.Tracestate != "" && len(p.Tracestate) <= maxTracestate {
		c["tracestate"] = p.Tracestate
	}
	return c
}

// traceContext is W3C Trace Context, the only propagation format the
// kernel accepts.
var traceContext propagation.TraceContext

// Parent is the context a call's span is a child of: ctx when it holds a
// valid span context (the transport's: an HTTP request's traceparent
// header, see FromHTTP, or an in-process caller's span), else the trace
// context in prov (the envelope's provenance "traceparent" and
// "tracestate"), else ctx with no span, which starts a new trace. The
// transport's context wins because it is the nearer parent: an agent's
// instrumented HTTP client span is itself a child of the agent's span.
func Parent(ctx context.Context, prov propagation.MapCarrier) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() || prov == nil {
		return ctx
	}
	return traceContext.Extract(ctx, prov)
}
