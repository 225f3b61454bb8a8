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

// TestErrorMessages: a refusal says what is wrong in one line (the kernel
// prints errors on one line, and quotes a message that has line breaks):
// a value of the wrong type by its JSON type, OPA's multi-line errors as
// "; "-separated lines, a bundle that defines no decision at load.
func TestErrorMessages(t *testing.T) {
	cases := []struct {
		name, rego string
		load       bool // the error is Load's, not Decide's
		want       string
	}{
		{"score a string", `decision := {"autonomy_mode": "autopilot", "risk_score": "0.1", "risk_basis": []}`, false,
			`policy: risk_score is the string "0.1", not a number in [0,1]`},
		{"score absent", `decision := {"autonomy_mode": "autopilot", "risk_basis": []}`, false,
			`policy: risk_score is absent, not a number in [0,1]`},
		{"score out of range", `decision := {"autonomy_mode": "autopilot", "risk_score": 1.5, "risk_basis": []}`, false,
			`policy: risk_score 1.5 is outside [0,1]`},
		{"mode a number", `decision := {"autonomy_mode": 1, "risk_score": 0, "risk_basis": []}`, false,
			`policy: autonomy_mode is the number 1, not one of autopilot, soft_gate, escalated, no_go`},
		{"basis a string", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": "x"}`, false,
			`policy: risk_basis is the string "x", not a list of strings`},
		{"basis holds a number", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": ["a", 2]}`, false,
			`policy: risk_basis[1] is the number 2, not a string`},
		{"net_full a string", `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": [], "net_full": "true"}`, false,
			`policy: net_full is the string "true", not a boolean`},
		{"decision a string", `decision := "autopilot"`, false,
			`policy: data.capkernel.decision is the string "autopilot", not an object`},
		{"conflict", "decision := {\"autonomy_mode\": \"autopilot\", \"risk_score\": 0, \"risk_basis\": []} if true\ndecision := {\"autonomy_mode\": \"no_go\", \"risk_score\": 0, \"risk_basis\": []} if true", false,
			`p.rego:3: eval_conflict_error: rule data.capkernel.decision produced conflicting values: {"autonomy_mode": "autopilot", "risk_basis": [], "risk_score": 0} at p.rego:2; {"autonomy_mode": "no_go", "risk_basis": [], "risk_score": 0} at p.rego:3`},
		{"parse error", "decision := {\n", true,
			`: p.rego:4: rego_parse_error: unexpected eof token; p.rego:4: rego_parse_error: unexpected eof token: expected rule value term`},
		{"no decision rule", `desicion := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": []}`, true,
			`: no rule defines data.capkernel.decision (a rule named decision in package capkernel); every call would be refused`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", "package capkernel\n"+c.rego+"\n")
			e, err := Load(context.Background(), dir)
			if err == nil && !c.load {
				_, err = e.Decide(context.Background(), &Input{SideEffect: "READ"})
			} else if c.load != (err != nil) {
				t.Fatalf("Load: %v, want an error: %v", err, c.load)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.ContainsAny(err.Error(), "\n\t") {
				t.Fatalf("error %q, want one line holding %q", err, c.want)
			}
		})
	}
}

// A bundle whose package is misspelt, or that holds data alone, defines no
// decision: it is refused at load, not answered undefined on every call.
func TestNoDecisionRefusedAtLoad(t *testing.T) {
	cases := map[string]map[string]string{
		"misspelt package": {"p.rego": "package capkernal\ndecision := {\"autonomy_mode\": \"autopilot\", \"risk_score\": 0, \"risk_basis\": []}\n"},
		"data alone":       {"data.json": `{"capkernel": {"config": {}}}`},
		"tests alone":      {"p_test.rego": "package capkernel\ntest_x if true\n"},
		"other rule ref":   {"p.rego": "package capkernel\ndecisions[k] := 1 if some k in [\"a\"]\n"},
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, content := range files {
				write(t, dir, f, content)
			}
			if _, err := Load(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "no rule defines data.capkernel.decision") {
				t.Fatalf("Load: %v, want the missing decision named", err)
			}
		})
	}
	defines := map[string]string{
		"ref head":    "package capkernel\ndecision.autonomy_mode := \"autopilot\"\ndecision.risk_score := 0\ndecision.risk_basis := []\n",
		"sub-package": "package capkernel.decision\nautonomy_mode := \"autopilot\"\nrisk_score := 0\nrisk_basis := []\n",
	}
	for name, src := range defines {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", src)
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if d, err := e.Decide(context.Background(), &Input{}); err != nil || d.AutonomyMode != Autopilot {
				t.Fatalf("decided %+v, %v", d, err)
			}
		})
	}
}

// TestDataFileStrict: a bundle's data file is one JSON value with no
// member named twice, or the bundle is refused at load naming the file;
// `opa test` reading the same bytes refuses them too.
func TestDataFileStrict(t *testing.T) {
	cases := map[string]struct{ data, want string }{
		"second value":   {`{"capkernel":{"config":{"risk":0.1}}}` + "\n" + `{"capkernel":{"config":{"risk":5}}}`, "data file data.json: malformed JSON"},
		"trailing text":  {`{"capkernel":{}} x`, "data file data.json: malformed JSON"},
		"duplicate name": {`{"capkernel":{"config":{"allow_net_full":false,"allow_net_full":true}}}`, `data file data.json: duplicate member name "allow_net_full" in /capkernel/config`},
		"escaped twin":   {`{"capkernel":{"a":1,"\u0061":2}}`, `duplicate member name "a"`},
		"not an object":  {`[1]`, "data file data.json: holds an array of 1, not an object"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", "package capkernel\ndecision := {\"autonomy_mode\": \"autopilot\", \"risk_score\": 0, \"risk_basis\": []}\n")
			write(t, dir, "data.json", c.data)
			_, err := Load(context.Background(), dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load: %v, want an error holding %q", err, c.want)
			}
			if _, err := Test(context.Background(), dir); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Test: %v, want an error holding %q", err, c.want)
			}
		})
	}
}

// copyDefault writes the default bundle into a new directory, with each
// file of edit replaced by the function of its old content.
func copyDefault(t *testing.T, edit map[string]func(string) string) string {
	t.Helper()
	b, err := readBundle("")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range b.files {
		content := string(f.content)
		if fn, ok := edit[f.path]; ok {
			content = fn(content)
		}
		write(t, dir, f.path, content)
	}
	return dir
}

// TestDefaultBundleFailsClosed: the default bundle, extended as
// docs/policy.md says, refuses a call it cannot decide as written rather
// than dropping what it cannot read: a finding whose mode is no mode
// refuses the call, and settings of the wrong type refuse the bundle at
// load, naming the setting.
func TestDefaultBundleFailsClosed(t *testing.T) {
	kv := &Input{ToolID: "kv.put", SideEffect: "WRITE", AgentID: "a", Resources: []Resource{{Kind: "kv", Op: "write", Key: "deploy/prod"}}}
	rules := []struct{ name, rule, basis string }{
		{"mode a setting", `findings contains {"mode": "deny", "risk": 1.0, "basis": "deploy keys are off limits"} if {
	some r in input.resources
	startswith(r.key, "deploy/")
}`, `malformed finding {"basis": "deploy keys are off limits", "mode": "deny", "risk": 1.0}`},
		{"no mode", `findings contains {"risk": 1.0, "basis": "deploy keys"} if true`, `malformed finding {"basis": "deploy keys", "risk": 1.0}`},
	}
	for _, c := range rules {
		t.Run(c.name, func(t *testing.T) {
			dir := copyDefault(t, map[string]func(string) string{"capkernel.rego": func(s string) string { return s + "\n" + c.rule + "\n" }})
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), kv)
			if err != nil || d.AutonomyMode != NoGo || len(d.RiskBasis) == 0 || !strings.HasPrefix(d.RiskBasis[0], c.basis) {
				t.Fatalf("decided %+v, %v; want no_go naming %s", d, err, c.basis)
			}
		})
	}
	data := []struct{ name, from, to, want string }{
		{"sensitive_paths a string", `"sensitive_paths": [".git/", ".github/", ".gitlab-ci.yml", ".ci/", "Makefile", "Dockerfile"]`, `"sensitive_paths": ".git/"`,
			`config.sensitive_paths is the string ".git/", not a list of strings`},
		{"allow_net_full a string", `"allow_net_full": false`, `"allow_net_full": "false"`, `config.allow_net_full is the string "false", not a boolean`},
		{"unknown setting", `"WRITE": "auto"`, `"WRITE": "ask"`, `config.confirmation.default["WRITE"] is the string "ask", not one of`},
		{"misspelt member", `"per_tool": {}`, `"per-tool": {}`, `config.confirmation has the member "per-tool"`},
		{"trusted_workspaces a string", `"trusted_workspaces": []`, `"trusted_workspaces": "/srv/ws"`, `config.confirmation.trusted_workspaces is the string "/srv/ws", not a list of strings`},
	}
	for _, c := range data {
		t.Run(c.name, func(t *testing.T) {
			dir := copyDefault(t, map[string]func(string) string{"data.json": func(s string) string {
				if !strings.Contains(s, c.from) {
					t.Fatalf("data.json has no %s", c.from)
				}
				return strings.Replace(s, c.from, c.to, 1)
			}})
			_, err := Load(context.Background(), dir)
			if err == nil || !strings.Contains(err.Error(), "the bundle's data does not fit its rules (data.capkernel.config_errors): "+c.want) {
				t.Fatalf("Load: %v, want the data refused naming %s", err, c.want)
			}
		})
	}
}
