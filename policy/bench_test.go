package policy

import (
	"context"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

var benchInput = &Input{
	ToolID: "fs.write", SideEffect: "WRITE", AgentID: "agent-1",
	Resources: []Resource{{Kind: "fs", Op: "write", Path: "notes/today.md", RealPath: "notes/today.md", Exists: true}},
}

// BenchmarkDecide is the kernel's path: the query prepared once at Load.
// Cached asks the same question each time (a decision cache hit); Evaluated
// a new one each time, so the prepared query runs on every call.
//
//	GOEXPERIMENT=jsonv2 go test -run='^$' -bench=Decide ./policy/
func BenchmarkDecide(b *testing.B) {
	e, err := Load(context.Background(), "")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Decide(context.Background(), benchInput); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Evaluated", func(b *testing.B) {
		ins := make([]Input, b.N)
		for i := range ins {
			ins[i] = *benchInput
			ins[i].AgentID = fmt.Sprint("agent-", i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := e.Decide(context.Background(), &ins[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
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
	data, err := bd.data()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		rs, err := rego.New(append(opts, rego.Store(inmem.NewFromObject(data)), rego.Input(benchInput))...).Eval(context.Background())
		if err != nil || len(rs) != 1 {
			b.Fatal(err)
		}
	}
}
