package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/propagation"
)

// FromHTTP is r's context, carrying the remote span context of r's W3C
// traceparent (and tracestate) headers when they are valid. Without a
// traceparent header it is r.Context() itself, at no cost.
func FromHTTP(r *http.Request) context.Context {
	// The header's canonical key, looked up as it is: Header.Get would
	// make the canonical form of "traceparent" on every request.
	if len(r.Header["Traceparent"]) == 0 {
		return r.Context()
	}
	if ts := r.Header["Tracestate"]; len(ts) > 0 && len(strings.Join(ts, ",")) > maxTracestate {
		// Dropped, as from an envelope (carrier).
		return traceContext.Extract(r.Context(), propagation.MapCarrier{"traceparent": r.Header.Get("Traceparent")})
	}
	return traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}
