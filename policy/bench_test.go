package policy

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
)

var benchInput = &Input{
	ToolID: "fs.write", SideEffect: "WRITE", AgentID: "agent-1",
	Resources: []Resource{{Kind: "fs", Op: "write", Path: "notes/today.md", RealPath: "notes/today.md", Exists: true}},
}

// BenchmarkDecide is the kernel's path: the query prepared once at Load.
func BenchmarkDecide(b *testing.B) {
	e, err := Load(context.Background(), "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Decide(context.Background(), benchInput); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecideUnprepared is the baseline: the same question asked by
// compiling the bundle for each call.
func BenchmarkDecideUnprepared(b *testing.B) {
	bd, err := readBundle("")
	if err != nil {
		b.Fatal(err)
	}
	opts := []func(*rego.Rego){rego.Query(Query)}
	for _, f := range bd.files {
		if f.path == "capkernel.rego" {
			opts = append(opts, rego.Module(f.path, string(f.content)))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		rs, err := rego.New(append(opts, rego.Input(benchInput))...).Eval(context.Background())
		if err != nil || len(rs) != 1 {
			b.Fatal(err)
		}
	}
}
