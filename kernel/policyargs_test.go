package kernel

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/policy"
)

// A policy that reads the args decides each call on its own args: the
// kernel remembers decisions without the args only for a policy that
// reads none (policy.Engine.ArgsFree), so a call that differs from a
// remembered one only in args is not answered with that decision.
func TestPolicyReadingArgsDecidesEachCall(t *testing.T) {
	dir := t.TempDir()
	rule := `package capkernel

decision := {"autonomy_mode": "no_go", "risk_score": 1, "risk_basis": ["danger in the text"]} if input.args.text == "danger"

decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": ["harmless"]} if input.args.text != "danger"
`
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.PolicyDir = dir })
	if h.k.policy.ArgsFree() {
		t.Fatal("a policy reading input.args.text is taken for one reading no args")
	}
	for _, c := range []struct {
		text string
		ok   bool
	}{{"hi", true}, {"danger", false}, {"hi again", true}, {"danger", false}} {
		r := h.invoke("echo", map[string]any{"text": c.text})
		if (r.Status == StatusOK) != c.ok {
			t.Fatalf("echo %q: %s %+v, want ok %v", c.text, r.Status, r.Error, c.ok)
		}
	}
}

// A call whose context ends while the policy evaluates is answered
// timeout (or cancelled), audited: the evaluation was cut short, not a
// policy error deciding no_go.
func TestPolicyEvaluationCutShort(t *testing.T) {
	dir := t.TempDir()
	rule := `package capkernel

decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": ["slow"]} if {
	count([x | some x in numbers.range(1, 1000000000)]) > 0
}
`
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.PolicyDir = dir })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := h.headSize()
	r := h.k.Invoke(ctx, h.env("echo", map[string]any{"text": "hi"}))
	if errClass(r) != ErrTimeout || r.TxOutcome != NoOp || !strings.Contains(r.Error.Message, "while it waited for its policy decision") {
		t.Fatalf("%s %s %+v, want timeout no_op while the policy decided", errClass(r), r.TxOutcome, r.Error)
	}
	if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != ErrTimeout {
		t.Fatalf("audit records %+v, want one timeout", a)
	}
}

// Args over maxPolicyArgs are left out of the policy input, and the input
// says so (args_omitted, args_size: the args' length as the envelope
// carried them), in the decision and in the audit record: a rule on the
// args is not undone by padding them. The default bundle, extended with a
// rule on echo's text as docs/policy.md says (the tool named in
// args_tools), escalates a padded call instead of running it.
func TestPolicyArgsOmittedSaid(t *testing.T) {
	const rule = `
findings contains {"mode": "no_go", "risk": 1.0, "basis": "launch code"} if {
	input.tool_id == "echo"
	contains(input.args.text, "0000-LAUNCH")
}
`
	dir := t.TempDir()
	for _, f := range []string{"capkernel.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("..", "policy", "rego", f))
		if err != nil {
			t.Fatal(err)
		}
		switch f {
		case "capkernel.rego":
			b = append(b, rule...)
		case "data.json":
			b = []byte(strings.Replace(string(b), `"args_tools": []`, `"args_tools": ["echo"]`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, func(c *Config) { c.PolicyDir = dir })
	pad := strings.Repeat("x", maxPolicyArgs)
	for _, c := range []struct {
		name, text string
		mode       string // the decided mode
		omitted    bool
	}{
		{"small", "code 0000-LAUNCH", policy.NoGo, false},
		{"small harmless", "hello", policy.Autopilot, false},
		{"padded", "code 0000-LAUNCH " + pad, policy.Escalated, true},
		{"padded harmless", "hello " + pad, policy.Escalated, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := h.headSize()
			var r *Result
			if c.mode == policy.Escalated {
				a, out := h.gated("echo", map[string]any{"text": c.text})
				if a.Mode != policy.Escalated || !slices.ContainsFunc(a.RiskBasis, func(b string) bool {
					return strings.HasPrefix(b, "args of ") && strings.HasSuffix(b, " bytes left out of the policy input, and a rule reads the args of echo")
				}) {
					t.Fatalf("approval request %s %q, want escalated for the args left out", a.Mode, a.RiskBasis)
				}
				if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleEscalation), "deny", "padded"); err != nil {
					t.Fatal(err)
				}
				r = <-out
			} else {
				r = h.invoke("echo", map[string]any{"text": c.text})
			}
			if r.AutonomyMode != c.mode {
				t.Fatalf("mode %s (%q), want %s", r.AutonomyMode, r.RiskBasis, c.mode)
			}
			audits := h.audits(before)
			if len(audits) == 0 {
				t.Fatal("no audit record")
			}
			in := audits[len(audits)-1].PolicyInput
			if in == nil || in.ArgsOmitted != c.omitted || (len(in.Args) == 0) != c.omitted || (in.ArgsSize > maxPolicyArgs) != c.omitted {
				t.Fatalf("audited policy input: args %d bytes, args_omitted %v, args_size %d; want omitted %v", len(in.Args), in.ArgsOmitted, in.ArgsSize, c.omitted)
			}
		})
	}
}
