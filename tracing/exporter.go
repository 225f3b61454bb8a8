package tracing

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// exporter is an sdktrace.SpanExporter that writes spans in the OTLP
// protobuf wire format itself (wire.go) and sends them with the OTLP/HTTP
// exporter's own client, which keeps that client's configuration (the
// OTEL_EXPORTER_OTLP_* endpoint, headers, TLS, compression, timeout),
// retries and error handling. The client takes ResourceSpans messages:
// each is handed over with its already encoded content as the message's
// unknown fields, which protobuf marshals as they are.
type exporter struct {
	client otlptrace.Client

	mu   sync.Mutex // one export at a time: the buffers are reused
	buf  []byte
	done []bool // per span of a resource group: written
	by   []sdktrace.ReadOnlySpan
}

// newExporter starts client and returns an exporter sending with it.
func newExporter(ctx context.Context, client otlptrace.Client) (*exporter, error) {
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	return &exporter{client: client}, nil
}

// ExportSpans implements sdktrace.SpanExporter: spans, grouped by
// resource and then by scope, in one request.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*tracepb.ResourceSpans
	buf := e.buf[:0]
	// A batch's spans nearly always share one resource: the first
	// span's resource takes every span under an equivalent one, and
	// the others, if any, go round again.
	rest := spans
	for len(rest) > 0 {
		res := rest[0].Resource()
		key := res.Equivalent()
		group, others := e.by[:0], rest[:0:0]
		for _, s := range rest {
			if s.Resource().Equivalent() == key {
				group = append(group, s)
			} else {
				others = append(others, s)
			}
		}
		if cap(e.done) < len(group) {
			e.done = make([]bool, len(group))
		}
		start := len(buf)
		buf = appendResourceSpans(buf, res, group, e.done[:len(group)])
		rs := new(tracepb.ResourceSpans)
		rs.ProtoReflect().SetUnknown(protoreflect.RawFields(buf[start:len(buf):len(buf)]))
		out = append(out, rs)
		clear(group)
		e.by, rest = group[:0], others
	}
	e.buf = buf
	if err := e.client.UploadTraces(ctx, out); err != nil {
		return fmt.Errorf("traces export: %w", err)
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter: it stops the client.
func (e *exporter) Shutdown(ctx context.Context) error {
	return e.client.Stop(ctx)
}
