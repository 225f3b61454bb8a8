package policy

import (
	"context"
	"strings"
	"testing"
)

// findingsBundle is a bundle in the default bundle's findings style: the
// decision takes the strictest finding. Its second finding refuses the
// call when extra holds; extra is where each case puts a rule body that
// fails at evaluation.
const findingsBundle = `package capkernel

findings contains {"mode": "autopilot", "risk": 0.3, "basis": "write"} if true

findings contains {"mode": "no_go", "risk": 1.0, "basis": "blocked"} if {
	some r in input.resources
	%s
}

rank := {"autopilot": 0, "soft_gate": 1, "escalated": 2, "no_go": 3}

modes := ["autopilot", "soft_gate", "escalated", "no_go"]

decision := {
	"autonomy_mode": modes[max([rank[f.mode] | some f in findings])],
	"risk_score": max([f.risk | some f in findings]),
	"risk_basis": [f.basis | some f in findings],
}
`

// TestBuiltinErrorFailsClosed: a rule whose builtin fails at evaluation
// (a bad pattern from the bundle's data, a conversion, a division) does
// not drop out of the decision, which would let the rules that remain
// decide the call: the evaluation fails, naming file, line and builtin,
// and the kernel makes that a no_go. Nor is the failure remembered: the
// same input fails again, and never turns into a remembered decision.
func TestBuiltinErrorFailsClosed(t *testing.T) {
	cases := []struct {
		name, body, data, want string
	}{
		{"regex from data", `regex.match(data.capkernel.config.blocked, r.path)`, `{"capkernel":{"config":{"blocked":"^(prod|secrets/"}}}`,
			"p.rego:7: eval_builtin_error: regex.match: error parsing regexp: missing closing )"},
		{"to_number", `to_number(r.path) > 1`, "", "p.rego:7: eval_builtin_error: to_number: strconv.ParseFloat"},
		{"division by zero", `count(r.path) / 0 > 1`, "", "p.rego:7: eval_builtin_error: div: divide by zero"},
		{"json.unmarshal", `json.unmarshal(r.path).x`, "", "p.rego:7: eval_builtin_error: json.unmarshal:"},
		{"negated", `not regex.match("(", r.path)`, "", "p.rego:7: eval_builtin_error: regex.match: error parsing regexp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", strings.Replace(findingsBundle, "%s", c.body, 1))
			if c.data != "" {
				write(t, dir, "data.json", c.data)
			}
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			in := &Input{ToolID: "fs.write", SideEffect: "WRITE", Resources: []Resource{{Kind: "fs", Op: "write", Path: "secrets/x"}}}
			for range 2 {
				d, err := e.Decide(context.Background(), in)
				if err == nil {
					t.Fatalf("decided %+v, want an evaluation error", d)
				}
				if !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %q, want it to name %q", err, c.want)
				}
			}
			if e.cache == nil || len(e.cache.cur)+len(e.cache.old) != 0 || e.cache.hits != 0 {
				t.Fatalf("the decision cache remembered a failed evaluation")
			}
		})
	}
}
