package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/console"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/telemetry"
	"github.com/capkernel/capkernel/tracing"
)

// telemetryFlags are serve's flags for metrics, traces, logs and the
// console.
type telemetryFlags struct {
	metrics   string // off, public or admin
	logFormat string // text or json
	console   bool
	otlp      string // OTLP/HTTP endpoint of traces; "" for the environment's, if any
}

func (f *telemetryFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.metrics, "metrics", httpapi.MetricsAdmin, "who may read GET /metrics: admin (the admin credential), public, or off")
	cmd.Flags().StringVar(&f.logFormat, "log-format", "text", "server log format on stderr: text or json (log/slog)")
	cmd.Flags().BoolVar(&f.console, "console", true, "serve the operator's web console at /console")
	cmd.Flags().StringVar(&f.otlp, "otlp-endpoint", "", "export OpenTelemetry traces of calls over OTLP/HTTP to this collector URL (e.g. http://127.0.0.1:4318); off unless this or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set")
}

func (f *telemetryFlags) check() error {
	switch f.metrics {
	case "off", httpapi.MetricsPublic, httpapi.MetricsAdmin:
	default:
		return fmt.Errorf("serve: --metrics %q is not admin, public or off", f.metrics)
	}
	if _, err := telemetry.NewLogger(nil, f.logFormat, slog.LevelInfo); err != nil {
		return fmt.Errorf("serve: --log-format: %w", err)
	}
	if f.otlp != "" {
		if _, err := tracing.EndpointURL(f.otlp); err != nil {
			return fmt.Errorf("serve: --otlp-endpoint: %w", err)
		}
	}
	return nil
}

// serverTelemetry is what serve wires around the kernel: the logger, and
// the metrics when they are on.
type serverTelemetry struct {
	flags   telemetryFlags
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *telemetry.Metrics
	traces  *tracing.Provider // nil when traces are off
}

// setup makes the logger, the metrics and the trace exporter and sets
// them in cfg.
func (f *telemetryFlags) setup(cmd *cobra.Command, cfg *kernel.Config) (*serverTelemetry, error) {
	// A log line quotes agents' text: jsonSafe escapes what a terminal
	// acts on the way JSON does, so a JSON line stays the same JSON.
	log, _ := telemetry.NewLogger(jsonSafe{cmd.ErrOrStderr()}, f.logFormat, slog.LevelInfo) // checked by check
	t := &serverTelemetry{flags: *f, log: log}
	obs := telemetry.Observers{telemetry.CallLog{Log: log}, &telemetry.UpstreamLog{Log: log}}
	if f.metrics != "off" {
		t.reg = prometheus.NewRegistry()
		t.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		t.metrics = telemetry.NewMetrics(t.reg)
		obs = append(obs, t.metrics)
	}
	if tracing.Enabled(f.otlp, os.Getenv) {
		tp, err := tracing.NewProvider(cmd.Context(), f.otlp)
		if err != nil {
			return nil, fmt.Errorf("serve: traces: %w", err)
		}
		t.traces = tp
		tracing.LogErrors(log)
		obs = append(obs, tp.Observer())
		log.Info("exporting traces", "otlp_endpoint", cmp.Or(f.otlp, "(from OTEL_EXPORTER_OTLP_* variables)"))
	}
	cfg.Logger, cfg.Observer = log, obs
	return t, nil
}

// traceFlushTimeout bounds how long stopping waits for the last spans to
// reach the collector.
const traceFlushTimeout = 5 * time.Second

// close flushes the spans still queued for export.
func (t *serverTelemetry) close() {
	if t.traces == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := t.traces.Shutdown(ctx); err != nil {
		t.log.Error("flushing traces", "error", err)
	}
}

// attach serves the metrics and the console of k on api, as the flags
// say, and logs what recovery did.
func (t *serverTelemetry) attach(k *kernel.Kernel, api *httpapi.Server) {
	if t.metrics != nil {
		t.metrics.Watch(k)
		api.ServeMetrics(t.reg, t.flags.metrics)
	}
	if t.flags.console {
		api.ServeConsole(console.New(k))
	}
	r := k.Recovered
	if n := len(r.Redone) + len(r.RolledBack) + len(r.Unknown); n > 0 {
		t.log.Info("recovered interrupted calls", "redone", len(r.Redone), "rolled_back", len(r.RolledBack), "outcome_unknown", len(r.Unknown))
	}
}
