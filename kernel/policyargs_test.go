package kernel

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
