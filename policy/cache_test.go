package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

func TestDecisionCache(t *testing.T) {
	e, err := Load(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if e.cache == nil {
		t.Fatal("the default policy calls no nondeterministic builtin, yet its engine has no cache")
	}
	in := &Input{ToolID: "fs.write", SideEffect: "WRITE", AgentID: "a", Resources: []Resource{{Kind: "fs", Op: "write", Path: ".git/config", RealPath: ".git/config"}}}
	first, err := e.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	// A caller appending to the basis (the kernel does) must not change
	// what the next caller is told.
	first.RiskBasis = append(first.RiskBasis[:len(first.RiskBasis):len(first.RiskBasis)], "appended")
	first.RiskBasis[0] = "overwritten"
	second, err := e.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if e.cache.hits != 1 {
		t.Fatalf("hits = %d after the same input twice, want 1", e.cache.hits)
	}
	if second.AutonomyMode != SoftGate || !slices.Equal(second.RiskBasis, []string{"write in scope", "write under sensitive path: .git/config"}) {
		t.Fatalf("cached decision = %+v", second)
	}
	// Any difference in the input is another question.
	in.Resources[0].Path, in.Resources[0].RealPath = "notes.txt", "notes.txt"
	third, err := e.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if e.cache.hits != 1 || third.AutonomyMode != Autopilot {
		t.Fatalf("changed input: hits = %d, decision %+v", e.cache.hits, third)
	}
}

func TestDecisionCacheBounded(t *testing.T) {
	c := newDecisionCache()
	for i := range 3*cacheGeneration + 7 {
		c.put(fmt.Appendf(nil, "k%d", i), Decision{AutonomyMode: Autopilot})
	}
	if n := len(c.cur) + len(c.old); n > 2*cacheGeneration {
		t.Fatalf("cache holds %d decisions, bound is %d", n, 2*cacheGeneration)
	}
	// The most recent are kept, the oldest dropped; a hit in the old
	// generation survives the next turnover.
	if _, ok := c.get(fmt.Appendf(nil, "k%d", 3*cacheGeneration+6)); !ok {
		t.Fatal("the latest decision is gone")
	}
	if _, ok := c.get([]byte("k0")); ok {
		t.Fatal("the first decision is still there")
	}
	// Inputs over maxCachedInput are decided afresh, never kept.
	big := make([]byte, maxCachedInput+1)
	c.put(big, Decision{AutonomyMode: Autopilot})
	if _, ok := c.get(big); ok {
		t.Fatal("an input over maxCachedInput was kept")
	}
	if _, ok := c.get(big[:maxCachedInput]); ok {
		t.Fatal("a prefix of it found a decision")
	}
	c.put(big[:maxCachedInput], Decision{AutonomyMode: Autopilot})
	if _, ok := c.get(big[:maxCachedInput]); !ok {
		t.Fatal("an input of maxCachedInput bytes was not kept")
	}
}

// A policy that reads the clock (or the network, or a random number) may
// decide one input two ways, so its decisions are never remembered.
func TestNondeterministicPolicyNotCached(t *testing.T) {
	cases := []struct {
		name, rule string
		want       string
	}{
		{"clock", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": [sprintf("%d", [time.now_ns()])]}`, "time.now_ns"},
		{"nested call", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": [t]} if { t := sprintf("%d", [rand.intn("x", 10)]) }`, "rand.intn"},
		{"deterministic", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": [upper("ok")]}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ast.ParseModuleWithOpts("p.rego", "package capkernel\n"+c.rule, ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				t.Fatal(err)
			}
			if got := nondeterministic([]*ast.Module{m}); got != c.want {
				t.Fatalf("nondeterministic = %q, want %q", got, c.want)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte("package capkernel\n"+c.rule+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if (e.cache == nil) != (c.want != "") {
				t.Fatalf("cache = %v for a policy calling %q", e.cache, c.want)
			}
			if _, err := e.Decide(context.Background(), benchInput); err != nil {
				t.Fatal(err)
			}
		})
	}
}
