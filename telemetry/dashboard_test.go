package telemetry

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDashboardUsesRealMetrics checks that every capkernel metric the
// Grafana dashboard queries is one NewMetrics registers, so a renamed
// metric cannot leave the dashboard silently empty.
func TestDashboardUsesRealMetrics(t *testing.T) {
	b, err := os.ReadFile("../deploy/grafana/capkernel.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	// A vector gathers only once it has a series.
	m.calls.WithLabelValues("t", "c", "o", "x", "m").Inc()
	m.callSeconds.WithLabelValues("c").Observe(1)
	m.stages.WithLabelValues("s").Observe(1)
	m.upstream.WithLabelValues("s", "ok").Inc()
	m.upstreamUp.WithLabelValues("s").Set(1)
	known := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		known[mf.GetName()] = true
	}
	// The state gauges need a kernel to gather: take their names from
	// their descriptions.
	descs := make(chan *prometheus.Desc, 16)
	(*stateCollector)(m).Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		known[fq.FindStringSubmatch(d.String())[1]] = true
	}
	name := regexp.MustCompile(`capkernel_[a-z_]+`)
	used := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				used++
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suf); ok && known[b] {
						base = b
					}
				}
				if !known[base] {
					t.Errorf("panel %q queries %s, which telemetry does not export", p.Title, n)
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("the dashboard queries no capkernel metric")
	}
}
