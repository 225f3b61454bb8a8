package httpapi

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Who may read GET /metrics (ServeMetrics).
const (
	MetricsPublic = "public" // anyone who can reach the listener
	MetricsAdmin  = "admin"  // the admin credential as a bearer token
)

// ServeMetrics serves the metrics of g at GET /metrics in Prometheus's
// text format, to anyone (MetricsPublic) or to the admin credential only
// (MetricsAdmin, refused like any admin endpoint).
func (s *Server) ServeMetrics(g prometheus.Gatherer, access string) {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	if access == MetricsPublic {
		s.mux.Handle("GET /metrics", h)
		return
	}
	s.mux.HandleFunc("GET /metrics", s.admin(h.ServeHTTP))
}
