// Package policy asks OPA, embedded, for the autonomy mode and risk score of
// a call. A bundle (the embedded default in policy/rego, or a directory
// that replaces it) is compiled and its query prepared once, at Load; Decide
// only evaluates. The bundle is named by its policy hash (see Hash), which
// every call envelope must carry.
package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// Autonomy modes, from least to most strict.
const (
	Autopilot = "autopilot"
	SoftGate  = "soft_gate"
	Escalated = "escalated"
	NoGo      = "no_go"
)

var strictness = map[string]int{Autopilot: 0, SoftGate: 1, Escalated: 2, NoGo: 3}

// ValidMode reports whether m is one of the four modes.
func ValidMode(m string) bool {
	_, ok := strictness[m]
	return ok
}

// Stricter returns the stricter of two modes. "" counts as autopilot; an
// unknown mode counts as no_go (fail closed).
func Stricter(a, b string) string {
	norm := func(m string) string {
		switch {
		case m == "":
			return Autopilot
		case !ValidMode(m):
			return NoGo
		}
		return m
	}
	a, b = norm(a), norm(b)
	if strictness[b] > strictness[a] {
		return b
	}
	return a
}

// Resource is one thing a call touches, as the policy sees it.
type Resource struct {
	Kind     string `json:"kind"`                // "fs" | "kv" | "net"
	Op       string `json:"op"`                  // fs: read|list|stat|write|delete; kv: read|write; net: connect
	Path     string `json:"path,omitempty"`      // fs: slash path relative to the root, "." for the root
	RealPath string `json:"real_path,omitempty"` // fs: Path with symlinks inside the root resolved
	Root     string `json:"root,omitempty"`      // fs: the root directory
	// OtherPaths (fs) is RealPath as seen from each other root of the
	// token that holds it (its roots nest): the policy matches paths
	// against every name a file has, so that how a path is spelled, which
	// picks the root it resolves in, does not pick what the policy sees.
	OtherPaths []string `json:"other_paths,omitempty"`
	IsDir      bool     `json:"is_dir,omitempty"`
	Exists     bool     `json:"exists,omitempty"`
	Key        string   `json:"key,omitempty"` // kv
	Host       string   `json:"host,omitempty"`
	Port       int      `json:"port,omitempty"`
}

// Input is the document a decision is made on (input in Rego). The audit
// record keeps it, so any stretch of history can be decided again.
//
// ToolID, SideEffect, Resources, AgentID (verified against the token),
// Ceiling, Network, ResourcesUndeclared and the args markers are the
// kernel's; TaskClass, RequestedMode, CallerRiskScore, CallerRiskBasis,
// Provenance and Args are whatever the caller put in its envelope, so a
// rule may tighten on them but must not loosen on them.
type Input struct {
	ToolID          string     `json:"tool_id"`
	SideEffect      string     `json:"side_effect"`
	Resources       []Resource `json:"resources"`
	AgentID         string     `json:"agent_id"`
	TaskClass       string     `json:"task_class,omitempty"`
	RequestedMode   string     `json:"requested_mode,omitempty"`
	CallerRiskScore *float64   `json:"caller_risk_score,omitempty"`
	CallerRiskBasis []string   `json:"caller_risk_basis,omitempty"`
	Ceiling         string     `json:"autonomy_ceiling,omitempty"`
	// Args are the call's args when they are at most 16 KiB (the
	// kernel's bound on what it copies into every input and audit
	// record). Larger ones are left out, and ArgsOmitted and ArgsSize
	// (their length in bytes as the envelope carried them) say so: the
	// agent chooses the size, so a rule that decides on the args must
	// decide on their absence too, or padding the args undoes it.
	Args        json.RawMessage `json:"args,omitempty"`
	ArgsOmitted bool            `json:"args_omitted,omitempty"`
	ArgsSize    int             `json:"args_size,omitempty"`
	Provenance  json.RawMessage `json:"provenance,omitempty"`
	// Network is the network posture a call asks for (proc.exec), with the
	// token's net patterns; absent for calls that ask for none.
	Network *Network `json:"network,omitempty"`
	// ResourcesUndeclared marks a call of an upstream MCP tool that no
	// declaration covers: its resources are unknown (an opaque effect).
	ResourcesUndeclared bool `json:"resources_undeclared,omitempty"`
}

// Network is the network part of an Input.
type Network struct {
	Posture  string   `json:"posture"`  // off | allowlist | full
	Patterns []string `json:"patterns"` // the token's net patterns
}

// Decision is what the policy decides: data.capkernel.decision.
type Decision struct {
	AutonomyMode string   `json:"autonomy_mode"`
	RiskScore    float64  `json:"risk_score"`
	RiskBasis    []string `json:"risk_basis"`
	// NetFull is the optional net_full field: true lets a call use the
	// "full" network posture (the host's network). Absent means false.
	NetFull bool `json:"net_full,omitempty"`
	// SessionConfirm is the optional session_confirm field: true lets the
	// user of the session that made a soft_gate call decide it through
	// the agent's own client (MCP elicitation) instead of an approver.
	// The kernel ignores it for any other mode. Absent means false.
	SessionConfirm bool `json:"session_confirm,omitempty"`
}

// Query is the rule the kernel evaluates.
const Query = "data.capkernel.decision"

// Engine is a loaded bundle with its prepared query. It is safe for
// concurrent use.
type Engine struct {
	hash  string
	files []string
	query rego.PreparedEvalQuery
	// cache remembers decisions by input; nil when a rule calls a
	// nondeterministic builtin, so that every call is evaluated.
	cache *decisionCache
	// argsFree: no rule reads the input's args (readsArgs).
	argsFree bool
}

// Load compiles a bundle: the embedded default when dir is "", otherwise
// every file under dir, which replaces the default entirely. It refuses,
// with a one-line error naming the bundle, a bundle that does not parse or
// compile, a data file that is not one JSON object without duplicate
// member names, a bundle no rule of which can define Query, and one that
// defines ConfigErrorsQuery as anything but empty. Its decisions are
// evaluated with strict builtin errors: a builtin that fails fails the
// evaluation (Decide's error) rather than dropping the rule it is in.
func Load(ctx context.Context, dir string) (*Engine, error) {
	b, err := readBundle(dir)
	if err != nil {
		return nil, err
	}
	// Strict builtin errors: a builtin that fails (a bad pattern, a
	// conversion, a division by zero) fails the evaluation, so the call is
	// refused. OPA's default makes the failing expression undefined, which
	// drops the rule it is in: a refusing rule would drop out of the
	// decision and the rules that remain would let the call run.
	opts := []func(*rego.Rego){rego.Query(Query), rego.SetRegoVersion(ast.RegoV1), rego.StrictBuiltinErrors(true)}
	var modules []*ast.Module
	for _, f := range b.files {
		switch {
		case strings.HasSuffix(f.path, "_test.rego"):
			// Tests are part of the bundle (and its hash) but not of decisions.
		case strings.HasSuffix(f.path, ".rego"):
			m, err := ast.ParseModuleWithOpts(f.path, string(f.content), ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				return nil, fmt.Errorf("policy %s: %s", b.name, oneLine(err))
			}
			modules = append(modules, m)
			opts = append(opts, rego.ParsedModule(m))
		}
	}
	data, err := b.data()
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", b.name, err)
	}
	// A bundle that defines no decision (a misspelt package, a missing
	// rule) would refuse every call, each "undefined": it is refused here,
	// saying why.
	if !defines(modules, data, ast.MustParseRef(Query)) {
		return nil, fmt.Errorf("policy %s: no rule defines %s (a rule named decision in package capkernel); every call would be refused", b.name, Query)
	}
	// The store hands out AST values: no conversion of data on every read.
	store := inmem.NewFromObjectWithOpts(data, inmem.OptReturnASTValuesOnRead(true))
	// The compiler is the one rego.New would make, made here so that
	// checkConfig evaluates on the same compiled modules, not a second
	// compilation.
	compiler := ast.NewCompiler().WithDefaultRegoVersion(ast.RegoV1).WithUseTypeCheckAnnotations(true)
	opts = append(opts, rego.Store(store), rego.Compiler(compiler))
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %s", b.name, oneLine(err))
	}
	if defines(modules, data, ast.MustParseRef(ConfigErrorsQuery)) {
		if err := checkConfig(ctx, compiler, store); err != nil {
			return nil, fmt.Errorf("policy %s: %w", b.name, err)
		}
	}
	e := &Engine{hash: b.hash(), query: q, argsFree: !readsArgs(modules)}
	if nondeterministic(modules) == "" {
		e.cache = newDecisionCache()
	}
	for _, f := range b.files {
		e.files = append(e.files, f.path)
	}
	return e, nil
}

// Hash returns the bundle's policy hash.
func (e *Engine) Hash() string { return e.hash }

// Files returns the bundle's file paths, sorted.
func (e *Engine) Files() []string { return append([]string(nil), e.files...) }

// Decide evaluates the prepared query on in. It fails closed: an undefined
// decision, an unknown mode, a risk score that is not a number in [0,1] or
// a basis that is not a list of strings is an error, which the kernel turns
// into a no_go.
//
// A policy whose rules call no nondeterministic builtin decides the same
// input the same way every time, so its decisions are remembered by input
// (see decisionCache); errors are not remembered.
func (e *Engine) Decide(ctx context.Context, in *Input) (Decision, error) {
	key, err := json.Marshal(in)
	if err != nil {
		return Decision{}, fmt.Errorf("policy input: %w", err)
	}
	return e.DecideJSON(ctx, key)
}

// DecideJSON is Decide for an input encoded already: key is a JSON
// encoding of the Input (the kernel passes the canonical form it keeps in
// the audit record, so the input is encoded once per call). Equal inputs
// should be encoded alike for the decision cache to find them.
func (e *Engine) DecideJSON(ctx context.Context, key []byte) (Decision, error) {
	return e.DecideKeyed(ctx, key, key)
}

// ArgsFree reports whether no rule of the bundle reads the input's args
// (a syntactic test that errs towards reading them): then inputs that
// differ only in args are decided alike, and DecideKeyed may remember
// their decisions under the input without its args.
func (e *Engine) ArgsFree() bool { return e.argsFree }

// DecideKeyed is DecideJSON of the input in, remembered under key: in
// itself, or, when the bundle is ArgsFree, in without its "args" member
// (the decision of every input that differs from in only in args).
func (e *Engine) DecideKeyed(ctx context.Context, in, key []byte) (Decision, error) {
	if e.cache != nil {
		if d, ok := e.cache.get(key); ok {
			return d, nil
		}
	}
	v, err := ast.ValueFromReader(bytes.NewReader(in))
	if err != nil {
		return Decision{}, fmt.Errorf("policy input: %w", err)
	}
	rs, err := e.query.Eval(ctx, rego.EvalParsedInput(v))
	if err != nil {
		return Decision{}, fmt.Errorf("policy evaluation: %s", oneLine(err))
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return Decision{}, fmt.Errorf("policy: %s is undefined for this call", Query)
	}
	d, err := decode(rs[0].Expressions[0].Value)
	if err == nil && e.cache != nil {
		e.cache.put(key, d)
	}
	return d, err
}

// ConfigErrorsQuery is the rule Load evaluates, when the bundle defines
// it, to check the bundle's data: a set (or array) of strings, each saying
// what is wrong with the data's shape. The default bundle defines it.
const ConfigErrorsQuery = "data.capkernel.config_errors"

// defines reports whether a rule of modules, or the bundle's data, may
// define the document at ref: a rule whose full reference (package path
// and head) agrees with ref on every term both have, a variable term of a
// rule's head (p[k]) agreeing with anything, or data that holds the path.
func defines(modules []*ast.Module, data map[string]any, ref ast.Ref) bool {
	for _, m := range modules {
		for _, r := range m.Rules {
			rr := r.Ref()
			agrees := true
			for i := 0; i < len(rr) && i < len(ref); i++ {
				if _, isVar := rr[i].Value.(ast.Var); !(isVar && i > 0) && !rr[i].Equal(ref[i]) {
					agrees = false
					break
				}
			}
			if agrees {
				return true
			}
		}
	}
	var node any = data
	for _, t := range ref[1:] {
		obj, ok := node.(map[string]any)
		key, isString := t.Value.(ast.String)
		if !ok || !isString {
			return false
		}
		if node, ok = obj[string(key)]; !ok {
			return false
		}
	}
	return true
}

// checkConfig evaluates ConfigErrorsQuery once, on the compiled bundle,
// and returns an error listing what it holds, if anything. A bundle whose
// data a rule cannot read (a string where it iterates a list) would have
// that rule undefined, switched off, on every call; refusing it at load
// says what is wrong before any call is decided.
func checkConfig(ctx context.Context, c *ast.Compiler, store storage.Store) error {
	rs, err := rego.New(rego.Query(ConfigErrorsQuery), rego.Compiler(c), rego.Store(store), rego.StrictBuiltinErrors(true)).Eval(ctx)
	if err != nil {
		return fmt.Errorf("%s: %s", ConfigErrorsQuery, oneLine(err))
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil // undefined: nothing to say
	}
	list, ok := rs[0].Expressions[0].Value.([]any)
	if !ok {
		return fmt.Errorf("%s is %s, not a set of strings", ConfigErrorsQuery, describe(rs[0].Expressions[0].Value, true))
	}
	msgs := make([]string, 0, len(list))
	for i, m := range list {
		s, ok := m.(string)
		if !ok {
			return fmt.Errorf("%s holds %s at %d, not a string", ConfigErrorsQuery, describe(m, true), i)
		}
		msgs = append(msgs, s)
	}
	if len(msgs) == 0 {
		return nil
	}
	sort.Strings(msgs)
	return fmt.Errorf("the bundle's data does not fit its rules (%s): %s", ConfigErrorsQuery, strings.Join(msgs, "; "))
}

// oneLine returns err's message on one line, as the kernel's errors are:
// OPA's lists of parse or compile errors become "file:row: code: message"
// joined by "; ", without the excerpt of the source each adds on lines of
// its own, and any other line breaks (an evaluation conflict lists its
// values on lines of their own) become "; " too.
func oneLine(err error) string {
	var list ast.Errors
	if errors.As(err, &list) && len(list) > 0 {
		msgs := make([]string, 0, len(list))
		for _, e := range list {
			c := *e
			c.Details = nil
			msgs = append(msgs, flatten(c.Error()))
		}
		return strings.Join(msgs, "; ")
	}
	return flatten(err.Error())
}

// flatten joins the non-blank lines of s, trimmed: after a line ending in
// ":" with a space, otherwise with "; ".
func flatten(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteByte(' ')
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

func decode(v any) (Decision, error) {
	var d Decision
	obj, ok := v.(map[string]any)
	if !ok {
		return d, fmt.Errorf("policy: %s is %s, not an object", Query, describe(v, true))
	}
	mode, _ := obj["autonomy_mode"].(string)
	if !ValidMode(mode) {
		return d, fmt.Errorf("policy: autonomy_mode is %s, not one of autopilot, soft_gate, escalated, no_go", member(obj, "autonomy_mode"))
	}
	score, err := number(obj["risk_score"])
	if err != nil {
		return d, fmt.Errorf("policy: risk_score is %s, not a number in [0,1]", member(obj, "risk_score"))
	}
	if math.IsNaN(score) || score < 0 || score > 1 {
		return d, fmt.Errorf("policy: risk_score %v is outside [0,1]", obj["risk_score"])
	}
	basis, ok := obj["risk_basis"].([]any)
	if !ok {
		return d, fmt.Errorf("policy: risk_basis is %s, not a list of strings", member(obj, "risk_basis"))
	}
	d = Decision{AutonomyMode: mode, RiskScore: score, RiskBasis: make([]string, 0, len(basis))}
	if nf, ok := obj["net_full"]; ok {
		b, isBool := nf.(bool)
		if !isBool {
			return Decision{}, fmt.Errorf("policy: net_full is %s, not a boolean", describe(nf, true))
		}
		d.NetFull = b
	}
	if sc, ok := obj["session_confirm"]; ok {
		b, isBool := sc.(bool)
		if !isBool {
			return Decision{}, fmt.Errorf("policy: session_confirm is %s, not a boolean", describe(sc, true))
		}
		d.SessionConfirm = b
	}
	for i, b := range basis {
		s, ok := b.(string)
		if !ok {
			return Decision{}, fmt.Errorf("policy: risk_basis[%d] is %s, not a string", i, describe(b, true))
		}
		d.RiskBasis = append(d.RiskBasis, s)
	}
	return d, nil
}

// member describes the member name of obj, or says it is absent.
func member(obj map[string]any, name string) string {
	v, ok := obj[name]
	return describe(v, ok)
}

// describe names the JSON type of v, a value of a decision, and shows it
// when it is a scalar: `the string "0.1"` for what %v would print as the
// number 0.1. present is false for a member that is not there.
func describe(v any, present bool) string {
	switch v := v.(type) {
	case nil:
		if !present {
			return "absent"
		}
		return "null"
	case string:
		return "the string " + strconv.Quote(v)
	case bool:
		return "the boolean " + strconv.FormatBool(v)
	case json.Number, float64, int, int64:
		return fmt.Sprintf("the number %v", v)
	case []any:
		return fmt.Sprintf("an array of %d", len(v))
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

func number(v any) (float64, error) {
	switch n := v.(type) {
	case json.Number:
		return n.Float64()
	case float64:
		return n, nil
	case int:
		return float64(n), nil
	case int64:
		return float64(n), nil
	}
	return 0, fmt.Errorf("%T is not a number", v)
}
