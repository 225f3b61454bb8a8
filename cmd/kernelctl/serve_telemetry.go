package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/console"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/telemetry"
)

// telemetryFlags are serve's flags for metrics, logs and the console.
type telemetryFlags struct {
	metrics   string // off, public or admin
	logFormat string // text or json
	console   bool
}

func (f *telemetryFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.metrics, "metrics", httpapi.MetricsAdmin, "who may read GET /metrics: admin (the admin credential), public, or off")
	cmd.Flags().StringVar(&f.logFormat, "log-format", "text", "server log format on stderr: text or json (log/slog)")
	cmd.Flags().BoolVar(&f.console, "console", true, "serve the operator's web console at /console")
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
	return nil
}

// serverTelemetry is what serve wires around the kernel: the logger, and
// the metrics when they are on.
type serverTelemetry struct {
	flags   telemetryFlags
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *telemetry.Metrics
}

// setup makes the logger and the metrics and sets them in cfg.
func (f *telemetryFlags) setup(cmd *cobra.Command, cfg *kernel.Config) *serverTelemetry {
	log, _ := telemetry.NewLogger(cmd.ErrOrStderr(), f.logFormat, slog.LevelInfo) // checked by check
	t := &serverTelemetry{flags: *f, log: log}
	obs := telemetry.Observers{telemetry.CallLog{Log: log}}
	if f.metrics != "off" {
		t.reg = prometheus.NewRegistry()
		t.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		t.metrics = telemetry.NewMetrics(t.reg)
		obs = append(obs, t.metrics)
	}
	cfg.Logger, cfg.Observer = log, obs
	return t
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
