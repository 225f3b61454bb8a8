package tracing

import (
	"math"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// This file writes spans in the OTLP protobuf wire format
// (opentelemetry/proto/trace/v1/trace.proto) straight from the SDK's
// read-only spans into one reused buffer. It writes what the OTLP
// exporter's own transform (otlptrace/internal/tracetransform) builds as
// Go protobuf messages before marshalling them, field for field
// (TestWireMatchesExporter compares the two decoded), without the dozen
// allocations per span and attribute that building those messages takes:
// that transform and its marshalling were most of what exporting a call's
// spans cost (BenchmarkCallDone).

// Field numbers of the OTLP messages written here.
const (
	fResourceSpansResource   = 1
	fResourceSpansScopeSpans = 2
	fResourceSpansSchemaURL  = 3

	fResourceAttributes = 1

	fScopeSpansScope     = 1
	fScopeSpansSpans     = 2
	fScopeSpansSchemaURL = 3

	fScopeName       = 1
	fScopeVersion    = 2
	fScopeAttributes = 3

	fSpanTraceID           = 1
	fSpanSpanID            = 2
	fSpanTraceState        = 3
	fSpanParentSpanID      = 4
	fSpanName              = 5
	fSpanKind              = 6
	fSpanStart             = 7
	fSpanEnd               = 8
	fSpanAttributes        = 9
	fSpanDroppedAttributes = 10
	fSpanEvents            = 11
	fSpanDroppedEvents     = 12
	fSpanLinks             = 13
	fSpanDroppedLinks      = 14
	fSpanStatus            = 15
	fSpanFlags             = 16

	fEventTime              = 1
	fEventName              = 2
	fEventAttributes        = 3
	fEventDroppedAttributes = 4

	fLinkTraceID           = 1
	fLinkSpanID            = 2
	fLinkAttributes        = 4
	fLinkDroppedAttributes = 5
	fLinkFlags             = 6

	fStatusMessage = 2
	fStatusCode    = 3

	fKeyValueKey   = 1
	fKeyValueValue = 2

	fAnyString = 1
	fAnyBool   = 2
	fAnyInt    = 3
	fAnyDouble = 4
	fAnyArray  = 5
	fAnyKVList = 6
	fAnyBytes  = 7

	fListValues = 1 // ArrayValue.values and KeyValueList.values
)

// zeros make room for a longer length prefix in endMsg.
var zeros [10]byte // the longest varint

// beginMsg appends the tag of message field num and a one-byte length
// placeholder, and returns where the message's content starts.
func beginMsg(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = append(b, 0)
	return b, len(b)
}

// endMsg sets the length of the message whose content began at start,
// moving the content right when the length takes more than one byte.
func endMsg(b []byte, start int) []byte {
	n := len(b) - start
	l := protowire.SizeVarint(uint64(n))
	if l > 1 {
		b = append(b, zeros[:l-1]...)
		copy(b[start+l-1:], b[start:start+n])
	}
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendUvarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, v)
}

// appendCount appends a dropped-items count, clamped to uint32.
func appendCount(b []byte, num protowire.Number, n int) []byte {
	return appendUvarint(b, num, uint64(min(max(n, 0), math.MaxUint32)))
}

// unixNano is t in nanoseconds since the epoch, 0 for earlier times.
func unixNano(t interface{ UnixNano() int64 }) uint64 {
	return uint64(max(0, t.UnixNano()))
}

// appendResourceSpans appends one ResourceSpans message's content: res,
// and spans (all under res) grouped by scope in the order each scope
// first appears.
func appendResourceSpans(b []byte, res *resource.Resource, spans []sdktrace.ReadOnlySpan, done []bool) []byte {
	if res != nil {
		var start int
		b, start = beginMsg(b, fResourceSpansResource)
		for it := res.Iter(); it.Next(); {
			b = appendKeyValue(b, fResourceAttributes, it.Attribute())
		}
		b = endMsg(b, start)
	}
	clear(done)
	for i, s := range spans {
		if done[i] {
			continue
		}
		scope := s.InstrumentationScope()
		var start int
		b, start = beginMsg(b, fResourceSpansScopeSpans)
		b = appendScope(b, scope)
		for j := i; j < len(spans); j++ {
			if !done[j] && spans[j].InstrumentationScope() == scope {
				done[j] = true
				var sp int
				b, sp = beginMsg(b, fScopeSpansSpans)
				b = appendSpan(b, spans[j])
				b = endMsg(b, sp)
			}
		}
		b = appendString(b, fScopeSpansSchemaURL, scope.SchemaURL)
		b = endMsg(b, start)
	}
	if res != nil {
		b = appendString(b, fResourceSpansSchemaURL, res.SchemaURL())
	}
	return b
}

// appendScope appends the scope field of a ScopeSpans, unless scope is
// the zero scope.
func appendScope(b []byte, scope instrumentation.Scope) []byte {
	if scope == (instrumentation.Scope{}) {
		return b
	}
	b, start := beginMsg(b, fScopeSpansScope)
	b = appendString(b, fScopeName, scope.Name)
	b = appendString(b, fScopeVersion, scope.Version)
	for it := scope.Attributes.Iter(); it.Next(); {
		b = appendKeyValue(b, fScopeAttributes, it.Attribute())
	}
	return endMsg(b, start)
}

// appendSpan appends the content of s's Span message.
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	b = appendString(b, fSpanTraceState, sc.TraceState().String())
	parent := s.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, fSpanParentSpanID, psid[:])
	}
	b = appendString(b, fSpanName, s.Name())
	b = appendUvarint(b, fSpanKind, uint64(spanKind(s.SpanKind())))
	b = appendFixed64(b, fSpanStart, unixNano(s.StartTime()))
	b = appendFixed64(b, fSpanEnd, unixNano(s.EndTime()))
	for _, kv := range s.Attributes() {
		b = appendKeyValue(b, fSpanAttributes, kv)
	}
	b = appendCount(b, fSpanDroppedAttributes, s.DroppedAttributes())
	for _, e := range s.Events() {
		var start int
		b, start = beginMsg(b, fSpanEvents)
		b = appendFixed64(b, fEventTime, unixNano(e.Time))
		b = appendString(b, fEventName, e.Name)
		for _, kv := range e.Attributes {
			b = appendKeyValue(b, fEventAttributes, kv)
		}
		b = appendCount(b, fEventDroppedAttributes, e.DroppedAttributeCount)
		b = endMsg(b, start)
	}
	b = appendCount(b, fSpanDroppedEvents, s.DroppedEvents())
	for _, l := range s.Links() {
		// As the exporter's transform: no trace state on a link.
		var start int
		b, start = beginMsg(b, fSpanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, fLinkTraceID, ltid[:])
		b = appendBytes(b, fLinkSpanID, lsid[:])
		for _, kv := range l.Attributes {
			b = appendKeyValue(b, fLinkAttributes, kv)
		}
		b = appendCount(b, fLinkDroppedAttributes, l.DroppedAttributeCount)
		b = appendFixed32(b, fLinkFlags, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = endMsg(b, start)
	}
	b = appendCount(b, fSpanDroppedLinks, s.DroppedLinks())
	// The status is always there, as the transform makes it.
	st := s.Status()
	var code tracepb.Status_StatusCode
	switch st.Code {
	case codes.Ok:
		code = tracepb.Status_STATUS_CODE_OK
	case codes.Error:
		code = tracepb.Status_STATUS_CODE_ERROR
	}
	b, start := beginMsg(b, fSpanStatus)
	b = appendString(b, fStatusMessage, st.Description)
	b = appendUvarint(b, fStatusCode, uint64(code))
	b = endMsg(b, start)
	return appendFixed32(b, fSpanFlags, spanFlags(sc.TraceFlags(), parent))
}

// spanFlags are the W3C trace flags and whether the parent (or linked
// span) is remote, as OTLP's SpanFlags carry them.
func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
	if parent.IsRemote() {
		f |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	return f
}

// spanKind is k as OTLP's enum.
func spanKind(k trace.SpanKind) tracepb.Span_SpanKind {
	switch k {
	case trace.SpanKindInternal:
		return tracepb.Span_SPAN_KIND_INTERNAL
	case trace.SpanKindServer:
		return tracepb.Span_SPAN_KIND_SERVER
	case trace.SpanKindClient:
		return tracepb.Span_SPAN_KIND_CLIENT
	case trace.SpanKindProducer:
		return tracepb.Span_SPAN_KIND_PRODUCER
	case trace.SpanKindConsumer:
		return tracepb.Span_SPAN_KIND_CONSUMER
	}
	return tracepb.Span_SPAN_KIND_UNSPECIFIED
}

// appendKeyValue appends kv as KeyValue field num.
func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	b, start := beginMsg(b, num)
	b = appendString(b, fKeyValueKey, string(kv.Key))
	b = appendAnyValue(b, fKeyValueValue, kv.Value)
	return endMsg(b, start)
}

// appendAnyValue appends v as AnyValue field num. The member of its
// oneof is written even when it holds its type's zero value, which is
// how protobuf tells a false from no value.
func appendAnyValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	b, start := beginMsg(b, num)
	switch v.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, fAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, fAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, v.AsString())
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, fAnyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		vs := v.AsBoolSlice() // a copy each call
		b = appendArray(b, len(vs), func(i int) attribute.Value { return attribute.BoolValue(vs[i]) })
	case attribute.INT64SLICE:
		vs := v.AsInt64Slice() // a copy each call
		b = appendArray(b, len(vs), func(i int) attribute.Value { return attribute.Int64Value(vs[i]) })
	case attribute.FLOAT64SLICE:
		vs := v.AsFloat64Slice() // a copy each call
		b = appendArray(b, len(vs), func(i int) attribute.Value { return attribute.Float64Value(vs[i]) })
	case attribute.STRINGSLICE:
		vs := v.AsStringSlice() // a copy each call
		b = appendArray(b, len(vs), func(i int) attribute.Value { return attribute.StringValue(vs[i]) })
	case attribute.SLICE:
		vs := v.AsSlice()
		b = appendArray(b, len(vs), func(i int) attribute.Value { return vs[i] })
	case attribute.MAP:
		var ls int
		b, ls = beginMsg(b, fAnyKVList)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, fListValues, kv)
		}
		b = endMsg(b, ls)
	case attribute.EMPTY:
	default:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return endMsg(b, start)
}

// appendArray appends an ArrayValue member of n values, value(i) each.
// (Slice attributes are rare; the closure's cost does not matter.)
func appendArray(b []byte, n int, value func(int) attribute.Value) []byte {
	b, start := beginMsg(b, fAnyArray)
	for i := range n {
		b = appendAnyValue(b, fListValues, value(i))
	}
	return endMsg(b, start)
}
