package telemetry

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// openKernel opens a fresh data dir with the observer o and a token for
// agent a1 over a workspace, with a calls budget of 10.
func openKernel(t *testing.T, o kernel.Observer) (*kernel.Kernel, *kernel.MintedToken, string) {
	t.Helper()
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := kernel.Init(data); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data, Observer: o, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "a1", Tools: []string{"fs.*", "echo"},
		FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}, Budgets: map[string]int64{"calls": 10}})
	if err != nil {
		t.Fatal(err)
	}
	return k, tok, ws
}

func call(k *kernel.Kernel, tok *kernel.MintedToken, tool, args, key string) *kernel.Result {
	return k.Invoke(context.Background(), &kernel.Envelope{ToolID: tool, Args: json.RawMessage(args), AgentID: tok.AgentID,
		CapabilityToken: tok.Token, CapabilityTokenID: tok.ID, PolicyHash: k.PolicyHash(), IdempotencyKey: key})
}

func TestMetricsOfCalls(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	k, tok, _ := openKernel(t, m)
	m.Watch(k)

	calls := []struct {
		tool, args, key string
		status          string
	}{
		{"fs.write", `{"path":"a.txt","content":"hi"}`, "k1", kernel.StatusOK},
		{"fs.read", `{"path":"a.txt"}`, "", kernel.StatusOK},
		{"fs.read", `{"path":"missing.txt"}`, "", kernel.StatusError},
		{"no.such.tool", `{}`, "", kernel.StatusError},
	}
	for _, c := range calls {
		if r := call(k, tok, c.tool, c.args, c.key); r.Status != c.status {
			t.Fatalf("%s: status %s (%+v), want %s", c.tool, r.Status, r.Error, c.status)
		}
	}
	tests := []struct {
		labels []string
		want   float64
	}{
		{[]string{"fs.write", "WRITE", "ok", kernel.Committed, "autopilot"}, 1},
		{[]string{"fs.read", "READ", "ok", kernel.NoOp, "autopilot"}, 1},
		// A caller cannot mint label values with made-up tool ids.
		{[]string{otherTool, "", kernel.ErrToolNotFound, kernel.NoOp, "no_go"}, 1},
	}
	for _, tt := range tests {
		if got := testutil.ToFloat64(m.calls.WithLabelValues(tt.labels...)); got != tt.want {
			t.Errorf("calls_total%v = %v, want %v", tt.labels, got, tt.want)
		}
	}
	// Every stage of a committed write was timed.
	for _, s := range kernel.Stages {
		if n := histCount(t, reg, "capkernel_stage_duration_seconds", s); n == 0 {
			t.Errorf("stage %s: no observations", s)
		}
	}
	if n := histCount(t, reg, "capkernel_group_commit_batch_size", ""); n == 0 {
		t.Error("no group commits observed")
	}
	// A token attenuated from it has a series of no budget of its own: its
	// call is charged to (and shown as) the parent's.
	child, err := k.Attenuate(context.Background(), kernel.AttenuateRequest{Parent: tok.Token, AgentID: tok.AgentID + "/c", Budgets: map[string]int64{"calls": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if r := call(k, child, "fs.read", `{"path":"a.txt"}`, ""); r.Status != kernel.StatusOK {
		t.Fatalf("the child's call: %+v", r.Error)
	}
	// State gauges: the ledger's size and the token's budget.
	h, err := k.Inspector().Head()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReader(`
# HELP capkernel_ledger_entries Entries in the ledger.
# TYPE capkernel_ledger_entries gauge
capkernel_ledger_entries ` + strconv.FormatUint(h.Size, 10) + `
# HELP capkernel_token_budget_used Budget units charged to a capability token (its own calls and its attenuated children's), for budgets it limits.
# TYPE capkernel_token_budget_used gauge
capkernel_token_budget_used{agent="a1",budget="calls",jti="` + tok.ID + `"} 4
`)
	if err := testutil.GatherAndCompare(reg, want, "capkernel_ledger_entries", "capkernel_token_budget_used"); err != nil {
		t.Error(err)
	}
}

func histCount(t *testing.T, g prometheus.Gatherer, name, stage string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := stage == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					match = true
				}
			}
			if match {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// BenchmarkMetricsCallDone is what the metrics cost a call: the counters
// and histograms of an fs.write through its 7 stages.
func BenchmarkMetricsCallDone(b *testing.B) {
	m := NewMetrics(prometheus.NewRegistry())
	t0 := time.Now()
	r := &kernel.CallReport{ToolID: "fs.write", SideEffect: "WRITE", AutonomyMode: "autopilot", Status: kernel.StatusOK,
		TxOutcome: kernel.Committed, Start: t0, End: t0.Add(7 * time.Millisecond)}
	for i, s := range kernel.Stages {
		r.Stages = append(r.Stages, kernel.StageSpan{Stage: s, Start: t0.Add(time.Duration(i) * time.Millisecond), End: t0.Add(time.Duration(i+1) * time.Millisecond)})
	}
	b.ReportAllocs()
	for b.Loop() {
		m.CallDone(r)
	}
}
