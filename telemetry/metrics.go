// Package telemetry turns what the kernel reports (kernel.Observer) and
// what it holds (approvals, ledger, budgets) into Prometheus metrics,
// OpenTelemetry traces and structured logs. docs/console.md lists the
// metrics; deploy/grafana/capkernel.json is a dashboard built on them.
package telemetry

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capkernel/capkernel/kernel"
)

// Namespace prefixes every metric name.
const Namespace = "capkernel"

// otherTool is the tool label of calls whose tool id is not a syscall of
// the kernel (tool_not_found, garbage envelopes): a caller must not be
// able to mint label values.
const otherTool = "(unknown)"

// Metrics is a kernel.Observer that keeps Prometheus metrics. Create it
// with NewMetrics, pass it as kernel.Config.Observer, and call Watch with
// the opened kernel so that the gauges read from the kernel's state work.
type Metrics struct {
	calls       *prometheus.CounterVec
	callSeconds *prometheus.HistogramVec
	stages      *prometheus.HistogramVec
	batch       prometheus.Histogram
	commit      prometheus.Histogram
	upstream    *prometheus.CounterVec
	upstreamUp  *prometheus.GaugeVec
	// stageObs are the stage histograms of the kernel's stages, looked
	// up once: a call observes up to len(kernel.Stages) stages, and WithLabelValues
	// hashes its label each time.
	stageObs map[string]prometheus.Observer

	lastCommit atomic.Int64 // unix nanos of the last group commit
	mu         sync.RWMutex
	k          *kernel.Kernel // set by Watch
}

// Latency buckets, in seconds: a cached fs.read is tens of microseconds,
// an fsync milliseconds, an approved call minutes.
var (
	stageBuckets = prometheus.ExponentialBuckets(0.00001, 4, 12) // 10µs .. ~42s
	callBuckets  = prometheus.ExponentialBuckets(0.0001, 4, 12)  // 100µs .. ~7min
	batchBuckets = prometheus.ExponentialBuckets(1, 2, 11)       // 1 .. 1024
)

// NewMetrics registers the kernel's metrics in reg and returns them.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "calls_total",
			Help: "Calls by tool, side-effect class, outcome (ok or the error class), transaction outcome and effective autonomy mode.",
		}, []string{"tool", "class", "outcome", "tx", "mode"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "call_duration_seconds",
			Help: "Whole-call latency in the kernel by side-effect class (approval waits included).", Buckets: callBuckets,
		}, []string{"class"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "stage_duration_seconds",
			Help: "Latency of each pipeline stage: verify, policy, gate, prepare, execute, ledger, commit.", Buckets: stageBuckets,
		}, []string{"stage"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "group_commit_batch_size",
			Help: "Writes carried by one group-commit transaction.", Buckets: batchBuckets,
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "group_commit_duration_seconds",
			Help: "Duration of one group-commit transaction, its fsync included.", Buckets: stageBuckets,
		}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "upstream_calls_total",
			Help: "Calls to upstream MCP servers by server and outcome (ok, upstream_error, upstream_unavailable or another error class).",
		}, []string{"server", "outcome"}),
		upstreamUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "upstream_up",
			Help: "1 if the last call that reached the upstream MCP server got an answer from it, 0 if it was unavailable.",
		}, []string{"server"}),
	}
	reg.MustRegister(m.calls, m.callSeconds, m.stages, m.batch, m.commit, m.upstream, m.upstreamUp, (*stateCollector)(m))
	m.stageObs = map[string]prometheus.Observer{}
	for _, s := range kernel.Stages {
		m.stageObs[s] = m.stages.WithLabelValues(s)
	}
	return m
}

// Watch points the state gauges (approvals, ledger, budgets) at k.
func (m *Metrics) Watch(k *kernel.Kernel) {
	m.mu.Lock()
	m.k = k
	m.mu.Unlock()
}

// CallDone implements kernel.Observer.
func (m *Metrics) CallDone(r *kernel.CallReport) {
	outcome := r.Outcome()
	tool := m.toolLabel(r.ToolID)
	m.calls.WithLabelValues(tool, r.SideEffect, outcome, r.TxOutcome, r.AutonomyMode).Inc()
	m.callSeconds.WithLabelValues(r.SideEffect).Observe(r.End.Sub(r.Start).Seconds())
	for _, s := range r.Stages {
		o, ok := m.stageObs[s.Stage]
		if !ok {
			o = m.stages.WithLabelValues(s.Stage)
		}
		o.Observe(s.End.Sub(s.Start).Seconds())
	}
	if server, ok := upstreamServer(tool); ok {
		m.upstream.WithLabelValues(server, outcome).Inc()
	}
	if server, down, ok := upstreamHealth(r); ok {
		up := 1.0
		if down {
			up = 0
		}
		m.upstreamUp.WithLabelValues(server).Set(up)
	}
}

// GroupCommit implements kernel.Observer.
func (m *Metrics) GroupCommit(batch int, took time.Duration) {
	m.batch.Observe(float64(batch))
	m.commit.Observe(took.Seconds())
	m.lastCommit.Store(time.Now().UnixNano())
}

// toolLabel is id if the kernel knows such a syscall, otherTool if not.
func (m *Metrics) toolLabel(id string) string {
	m.mu.RLock()
	k := m.k
	m.mu.RUnlock()
	if k == nil {
		return otherTool
	}
	if _, ok := k.Registry().Get(id); !ok {
		return otherTool
	}
	return id
}

// upstreamServer is the server of an upstream tool id mcp.<server>.<tool>.
func upstreamServer(tool string) (string, bool) {
	rest, ok := strings.CutPrefix(tool, "mcp.")
	if !ok {
		return "", false
	}
	server, _, ok := strings.Cut(rest, ".")
	return server, ok
}

// stateCollector reads gauges from the kernel's state at scrape time.
type stateCollector Metrics

var (
	descPending = prometheus.NewDesc(Namespace+"_approvals_pending",
		"Calls waiting for an approval, by required role.", []string{"role"}, nil)
	descOldest = prometheus.NewDesc(Namespace+"_approvals_oldest_age_seconds",
		"Age of the oldest pending approval request (0 when none).", nil, nil)
	descLedger = prometheus.NewDesc(Namespace+"_ledger_entries",
		"Entries in the ledger.", nil, nil)
	descCheckpointAge = prometheus.NewDesc(Namespace+"_ledger_checkpoint_age_seconds",
		"Seconds since the last group commit, which signs a checkpoint of the ledger (absent before the first).", nil, nil)
	descBudgetUsed = prometheus.NewDesc(Namespace+"_token_budget_used",
		"Budget units charged to a capability token (its own calls and its attenuated children's), for budgets it limits.", []string{"jti", "agent", "budget"}, nil)
	descBudgetLimit = prometheus.NewDesc(Namespace+"_token_budget_limit",
		"A capability token's budget limit.", []string{"jti", "agent", "budget"}, nil)
)

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descOldest, descLedger, descCheckpointAge, descBudgetUsed, descBudgetLimit} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if t := c.lastCommit.Load(); t != 0 {
		ch <- prometheus.MustNewConstMetric(descCheckpointAge, prometheus.GaugeValue, now.Sub(time.Unix(0, t)).Seconds())
	}
	c.mu.RLock()
	k := c.k
	c.mu.RUnlock()
	if k == nil {
		return
	}
	pending := map[string]float64{"approver": 0, "escalation": 0}
	oldest := 0.0
	for _, a := range k.Approvals(false) {
		pending[a.RequiredRole]++
		if t, err := time.Parse(time.RFC3339Nano, a.RequestedAt); err == nil {
			oldest = max(oldest, now.Sub(t).Seconds())
		}
	}
	for role, n := range pending {
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, n, role)
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, oldest)
	if h, err := k.Inspector().Head(); err == nil {
		ch <- prometheus.MustNewConstMetric(descLedger, prometheus.GaugeValue, float64(h.Size))
	}
	tokens, err := k.Tokens()
	if err != nil {
		return
	}
	for _, t := range tokens {
		if t.Revoked || time.Unix(t.ExpiresAt, 0).Before(now) || t.Parent != "" {
			// Only live tokens: the series of dead ones would grow
			// forever. Only minted ones (the admin's): a bearer attenuates
			// as many children as it likes, each a series of its own, and
			// their calls are charged to the minted ancestor's budgets.
			continue
		}
		for b, l := range t.Limits {
			ch <- prometheus.MustNewConstMetric(descBudgetLimit, prometheus.GaugeValue, float64(l), t.ID, t.AgentID, b)
			ch <- prometheus.MustNewConstMetric(descBudgetUsed, prometheus.GaugeValue, float64(t.Used[b]), t.ID, t.AgentID, b)
		}
	}
}
