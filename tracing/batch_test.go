package tracing

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestBatchConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want batchConfig
		err  string
	}{
		{"defaults", nil, batchConfig{defaultQueue, defaultBatch, defaultDelay, defaultTimeout}, ""},
		{"all set", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
			"OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_BSP_EXPORT_TIMEOUT": "1000"}, batchConfig{100, 10, 250 * time.Millisecond, time.Second}, ""},
		{"batch beyond queue", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, batchConfig{100, 100, defaultDelay, defaultTimeout}, ""},
		{"not a number", map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"}, batchConfig{}, `OTEL_BSP_SCHEDULE_DELAY "5s"`},
		{"zero", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, batchConfig{}, `OTEL_BSP_MAX_QUEUE_SIZE "0"`},
	}
	for _, tt := range tests {
		got, err := batchConfigFromEnv(func(k string) string { return tt.env[k] })
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want one with %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

// recordingExporter keeps the batches exported to it.
type recordingExporter struct {
	mu       sync.Mutex
	batches  []int
	names    []string
	shutdown bool
}

func (e *recordingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, len(spans))
	for _, s := range spans {
		e.names = append(e.names, s.Name())
	}
	return nil
}

func (e *recordingExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown = true
	return nil
}

func (e *recordingExporter) state() ([]int, []string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.batches...), append([]string(nil), e.names...), e.shutdown
}

// stubs are n sampled spans named prefix0, prefix1, ….
func stubs(prefix string, n int) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for i := range n {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{byte(i + 1)}, TraceFlags: trace.FlagsSampled})
		out = append(out, tracetest.SpanStub{Name: prefix + string(rune('0'+i)), SpanContext: sc}.Snapshot())
	}
	return out
}

// TestBatcher: a full batch is exported without waiting for the delay,
// in batches of at most the batch size; a call's spans that do not fit
// in the queue are dropped together and reported; unsampled spans are
// not queued; Shutdown exports what is left, shuts the exporter down,
// and nothing is queued after it.
func TestBatcher(t *testing.T) {
	var mu sync.Mutex
	var errs []string
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		errs = append(errs, err.Error())
		mu.Unlock()
	}))
	t.Cleanup(func() { otel.SetErrorHandler(prev) })

	exp := &recordingExporter{}
	b := newBatcher(exp, batchConfig{queue: 10, batch: 4, delay: time.Hour, timeout: time.Minute})
	b.add(stubs("a", 3)...)
	b.add(stubs("b", 2)...) // 5 queued: a full batch wakes the loop
	deadline := time.Now().Add(10 * time.Second)
	for {
		batches, _, _ := exp.state()
		if len(batches) > 0 {
			if batches[0] != 4 || (len(batches) > 1 && batches[1] != 1) {
				t.Fatalf("batches %v, want 4 then 1", batches)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a full batch was not exported before the delay")
		}
		time.Sleep(time.Millisecond)
	}
	b.add(stubs("c", 11)...) // more than the queue holds: dropped
	unsampled := tracetest.SpanStub{Name: "unsampled", SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})}.Snapshot()
	b.OnEnd(unsampled)
	b.add(stubs("d", 2)...)
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.add(stubs("e", 1)...) // after Shutdown: ignored
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	_, names, shut := exp.state()
	if want := "a0 a1 a2 b0 b1 d0 d1"; strings.Join(names, " ") != want || !shut {
		t.Errorf("exported %v (exporter shut down %v), want %s and shut down", names, shut, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1 || !strings.Contains(errs[0], "11 spans dropped: the export queue of 10 spans was full") {
		t.Errorf("errors reported %q, want the 11 dropped spans", errs)
	}
}

func TestSamplerFromEnv(t *testing.T) {
	tests := []struct{ sampler, arg, want, err string }{
		{"", "", "ParentBased{root:AlwaysOnSampler", ""},
		{"parentbased_always_on", "", "ParentBased{root:AlwaysOnSampler", ""},
		{"always_on", "", "AlwaysOnSampler", ""},
		{" Always_Off ", "", "AlwaysOffSampler", ""},
		{"parentbased_always_off", "", "ParentBased{root:AlwaysOffSampler", ""},
		{"traceidratio", "", "TraceIDRatioBased{1}", ""},
		{"traceidratio", "0.25", "TraceIDRatioBased{0.25}", ""},
		{"parentbased_traceidratio", "0.5", "ParentBased{root:TraceIDRatioBased{0.5}", ""},
		{"traceidratio", "2", "", `OTEL_TRACES_SAMPLER_ARG "2"`},
		{"parentbased_traceidratio", "x", "", `OTEL_TRACES_SAMPLER_ARG "x"`},
		{"jaeger_remote", "", "", `OTEL_TRACES_SAMPLER "jaeger_remote"`},
	}
	for _, tt := range tests {
		env := map[string]string{"OTEL_TRACES_SAMPLER": tt.sampler, "OTEL_TRACES_SAMPLER_ARG": tt.arg}
		s, err := SamplerFromEnv(func(k string) string { return env[k] })
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q %q: error %v, want one with %q", tt.sampler, tt.arg, err, tt.err)
			}
			continue
		}
		if err != nil || !strings.HasPrefix(s.Description(), tt.want) {
			t.Errorf("%q %q: %v, %v; want %s…", tt.sampler, tt.arg, s.Description(), err, tt.want)
		}
	}
}
