package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
)

// ServiceName is the service.name of the kernel's spans unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise.
const ServiceName = "capkernel"

// Standard OpenTelemetry environment variables that turn export on or off
// when no endpoint is given explicitly.
var (
	envEndpoints = []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}
	envOff       = map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "none"}
)

// Enabled reports whether the kernel exports traces: endpoint is set, or
// one of OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_EXPORTER_OTLP_ENDPOINT
// is, as getenv reads them, and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none turns the environment's export off. Traces
// are off by default.
func Enabled(endpoint string, getenv func(string) string) bool {
	if endpoint != "" {
		return true
	}
	for k, off := range envOff {
		if strings.EqualFold(strings.TrimSpace(getenv(k)), off) {
			return false
		}
	}
	for _, k := range envEndpoints {
		if getenv(k) != "" {
			return true
		}
	}
	return false
}

// EndpointURL checks endpoint, an OTLP/HTTP collector's URL, and returns
// the URL traces are posted to: a URL without a path (or with "/") gets
// the standard /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does; a URL
// with another path is used as it is.
func EndpointURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("OTLP endpoint %q is not an http:// or https:// URL with a host: %v", endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("OTLP endpoint %q is not an http:// or https:// URL with a host", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Provider is the kernel's trace pipeline: an SDK TracerProvider whose
// span processor (batcher) exports in batches over OTLP/HTTP (exporter),
// and the faster path to that processor that its Observer takes (see
// direct). Shut it down to flush the spans still queued.
type Provider struct {
	*sdktrace.TracerProvider
	direct *direct
}

// Observer returns the Tracer that records the kernel's calls to p.
func (p *Provider) Observer() *Tracer {
	t := New(p.TracerProvider)
	t.direct = p.direct
	return t
}

// NewProvider returns a Provider that exports spans in batches over
// OTLP/HTTP (protobuf) to endpoint (see EndpointURL), or, when endpoint
// is "", where the standard OTEL_EXPORTER_OTLP_* variables say. Its
// sampler is parent-based always-on unless OTEL_TRACES_SAMPLER says
// otherwise (SamplerFromEnv); OTEL_BSP_* set its batches (a queue of
// 32768 spans, batches of 2048, sent at least every 5 s). An invalid
// sampler or batch setting is an error.
func NewProvider(ctx context.Context, endpoint string) (*Provider, error) {
	var opts []otlptracehttp.Option
	if endpoint != "" {
		u, err := EndpointURL(endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	}
	sampler, err := SamplerFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	bcfg, err := batchConfigFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if jsonProtocol(os.Getenv) {
		// OTLP/HTTP with JSON bodies: the OTLP exporter's own encoding.
		exp, err = otlptracehttp.New(ctx, opts...)
	} else {
		exp, err = newExporter(ctx, otlptracehttp.NewClient(append(opts, otlptracehttp.WithEncoding(otlptracehttp.EncodingProtobuf))...))
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// The environment's service name and attributes win over the default.
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(ServiceName)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	b := newBatcher(exp, bcfg)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b), sdktrace.WithResource(res), sdktrace.WithSampler(sampler))
	return &Provider{TracerProvider: tp, direct: newDirect(b, sampler, res)}, nil
}

// jsonProtocol reports whether OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, or
// else OTEL_EXPORTER_OTLP_PROTOCOL, asks for http/json, as the OTLP/HTTP
// exporter reads them.
func jsonProtocol(getenv func(string) string) bool {
	p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if p == "" {
		p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	return p == "http/json"
}

// LogErrors sends the OpenTelemetry SDK's errors (an export the collector
// refused or that could not reach it, spans dropped) to log at warning
// level, as "trace export failed", instead of the SDK's default of
// Go's standard logger. It sets the process-wide handler.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export failed", "error", err)
	}))
}
