package policy

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// A policy reads the input's args unless the input appears only as the
// head of references whose next key is a constant string other than
// "args": every way of reaching them counts, the input whole included.
func TestReadsArgs(t *testing.T) {
	const allow = `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": []}`
	for _, c := range []struct {
		name, rules string
		reads       bool
	}{
		{"the default's keys", `x if input.tool_id == "echo"
y if { some r in input.resources; r.path == "a" }`, false},
		{"a nested select", `x if input.resources[0].path == "a"`, false},
		{"input.args", `x if input.args.text == "danger"`, true},
		{`input["args"]`, `x if input["args"].text == "danger"`, true},
		{"a key chosen at evaluation", `x if { k := "args"; input[k].text == "danger" }`, true},
		{"the input whole", `x if { i := input; i.args.text == "danger" }`, true},
		{"iterating the input", `x if { some k, v in input; v.text == "danger" }`, true},
		{"the input as an argument", `x if count(input) > 3`, true},
		{"object.get of a key", `x if object.get(input, "side_effect", "") == "WRITE"`, false},
		{"object.get of a path", `x if object.get(input, ["network", "posture"], "") == "full"`, false},
		{"object.get of args", `x if object.get(input, "args", {}).text == "danger"`, true},
		{"object.get of an args path", `x if object.get(input, ["args", "text"], "") == "danger"`, true},
		{"object.get of a key chosen at evaluation", `x if { k := "args"; object.get(input, k, {}).text == "danger" }`, true},
		{"object.get of the input whole", `x if object.get(input, [], {}).args.text == "danger"`, true},
		{"object.get's default reading args", `x if object.get(input, "side_effect", input.args.x) == "WRITE"`, true},
		{"walking the input", `x if { walk(input, [p, v]); v == "danger" }`, true},
		{"args selecting further down", `x if input.resources[input.args.i].path == "a"`, true},
		{"a function's body", `f(r) := r.path if input.args.x
x if f(input.resources[0]) == "a"`, true},
		{"an import", "import input.args as a\nx if a.text == \"danger\"", true},
		{"an import of the input", "import input\nx if input.tool_id == \"echo\"", true},
		{"input as a name in data", `x if data.input.args == 1`, false},
		// rev-last2 #1: each was judged free of args, and the kernel
		// answered a call with args the policy refuses with another
		// call's decision.
		{"object.get of a path reading args further on", `x if object.get(input, ["tool_id", input.args.danger], "") == ""`, true},
		{"a rule head's reference reading args", "p[input.args.k].q := true\nx if p.y.q", true},
		{"a rule named object.get", "object.get(a, b, c) := a.args.danger\nx if object.get(input, \"tool_id\", \"\") == \"1\"", true},
		{"a with on object.get", "g(a, b, c) := a.args.danger\nx if { object.get(input, \"tool_id\", \"\") == \"1\" with object.get as g }", true},
		{"a with on the input", `x if { y with input as {"tool_id": "echo"} }
y if input.tool_id == "echo"`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := "package capkernel\n" + c.rules + "\n" + allow + "\n"
			m, err := ast.ParseModuleWithOpts("p.rego", src, ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				t.Fatal(err)
			}
			if got := readsArgs([]*ast.Module{m}); got != c.reads {
				t.Fatalf("readsArgs = %v, want %v", got, c.reads)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if e.ArgsFree() == c.reads {
				t.Fatalf("ArgsFree = %v for a policy that reads args: %v", e.ArgsFree(), c.reads)
			}
		})
	}
	e, err := Load(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if !e.ArgsFree() {
		t.Error("the default policy reads no args, yet its engine says it does")
	}
}

// Bundles of several modules whose decision depends on input.args.danger
// through an import that stands for the builtin object.get (rev-args: each
// was judged free of args, and a call with the dangerous args was answered
// with a harmless call's cached autopilot). Each is judged to read args,
// or at least decides the dangerous args alike with or without the cache.
func TestReadsArgsThroughImports(t *testing.T) {
	const decide = `
default decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": []}
decision := {"autonomy_mode": "no_go", "risk_score": 1, "risk_basis": ["danger"]} if danger
`
	for _, c := range []struct {
		name  string
		files map[string]string
	}{
		{"an import named object", map[string]string{
			"p.rego":   "package capkernel\nimport data.lib as object\ndanger if object.get(input, \"tool_id\", \"\") == true\n" + decide,
			"lib.rego": "package lib\nget(a, b, c) := a.args.danger\n",
		}},
		{"an import whose path ends in object", map[string]string{
			"p.rego":   "package capkernel\nimport data.lib.object\ndanger if object.get(input, \"tool_id\", \"\") == true\n" + decide,
			"lib.rego": "package lib.object\nget(a, b, c) := a.args.danger\n",
		}},
		{"an import of a rule named object", map[string]string{
			"p.rego":   "package capkernel\nimport data.lib.o as object\ndanger if object.get(input, [\"tool_id\"], \"\") == true\n" + decide,
			"lib.rego": "package lib\no.get(a, b, c) := a.args.danger\n",
		}},
		{"its own package imported as object", map[string]string{
			"p.rego": "package capkernel\nimport data.capkernel as object\nget(a, b, c) := a.args.danger\ndanger if object.get(input, \"tool_id\", \"\") == true\n" + decide,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, src := range c.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			bad := []byte(`{"agent_id":"a","args":{"danger":true},"resources":[],"side_effect":"READ","tool_id":"echo"}`)
			if d, err := e.DecideKeyed(ctx, bad, bad); err != nil || d.AutonomyMode != NoGo {
				t.Fatalf("the bundle does not refuse the dangerous args: %+v %v", d, err)
			}
			if e.ArgsFree() {
				t.Fatal("a bundle reading input.args through an import named object is taken for one reading none")
			}
		})
	}
}
