// Package conformance is a black-box conformance suite for the capability
// API of a transactional syscall kernel: TOOL-01 (call and result
// envelopes, audit records, the §6 invariants), the acceptance criteria of
// seed 000 §9, the dispatcher test list of seed 002 and the error classes,
// receipts and ledger proofs of DESIGN.md.
//
// The suite talks only HTTP to a kernel endpoint (the API of docs/http.md):
// it mints the tokens it needs with the admin credential (POST /v1/tokens),
// makes calls (POST /v1/syscalls) and checks the answers against the ledger
// entries, receipts, checkpoints and proofs the endpoint serves. It never
// reaches into a kernel's internals, so another implementation of the same
// API can be tested with it. The only thing it needs besides HTTP is a
// workspace: a directory on a file system the kernel sees at the same path
// (the same host), which the tokens it mints grant as their fs root.
//
// Run runs the cases and returns a Report; docs/conformance.md lists every
// case with the clause it checks.
package conformance

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"
)

// Version names the suite's version; a Report carries it so results say
// what they were run against. It changes whenever a case is added,
// removed or changes what it checks.
const Version = "capkernel-conformance/1.1.0"

// Config says where and what to run.
type Config struct {
	// Server is the kernel endpoint's base URL, e.g. "http://127.0.0.1:7070".
	Server string
	// AdminToken is the admin credential, used only to mint and revoke
	// tokens and to read history.
	AdminToken string
	// Workspace is a directory the kernel can see at the same path (the
	// same host or a shared mount). The suite makes a fresh subdirectory
	// in it per run and grants it to the tokens it mints. Empty means a
	// new temporary directory, which works when the kernel runs on this
	// host.
	Workspace string
	// Run selects cases by id; nil runs every case. A Run that selects no
	// case is an error of the run (Report.Error): a mistyped pattern in CI
	// would otherwise pass with nothing checked.
	Run *regexp.Regexp
	// HTTP is the client used; nil means one with a 2-minute timeout.
	HTTP *http.Client
	// Started, if not nil, is called once setup found the endpoint usable,
	// before the first case, with what the run will do.
	Started func(Plan)
	// Done, if not nil, is called with each case's result as it ends.
	Done func(CaseResult)
}

// Plan is what a run will do, known once setup has probed the endpoint.
type Plan struct {
	// Cases is how many cases will run.
	Cases int `json:"cases"`
	// Estimate is about how long they take against a kernel on this host.
	Estimate time.Duration `json:"estimate_ns"`
	// Workspace is the run's directory, which the kernel must see.
	Workspace string `json:"workspace"`
	// ApprovalTimeout is how long the endpoint holds a gated call for a
	// decision (0: it has no approval API).
	ApprovalTimeout time.Duration `json:"approval_timeout_ns"`
	// Notes say what the endpoint lacks and which cases will skip for it.
	Notes []string `json:"notes,omitempty"`
}

// perCase is about how long an ordinary case takes against a kernel on
// this host (a few calls, each audited and signed, and the ledger reads
// that check them): 153 cases took 12.5 s on a loaded 2-core machine,
// with margin.
const perCase = 150 * time.Millisecond

// Status is the outcome of one case.
type Status string

// Outcomes of a case.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Evidence is one exchange or ledger record a case looked at.
type Evidence struct {
	// Label says what this is ("call", "ledger entry", …).
	Label string `json:"label"`
	// Request is the request line and body (tokens shortened).
	Request string `json:"request,omitempty"`
	// Status is the HTTP status of the answer.
	Status int `json:"status,omitempty"`
	// Response is the answer's body (shortened when long).
	Response string `json:"response,omitempty"`
	// Entry is a ledger entry record, when the evidence is one.
	Entry json.RawMessage `json:"entry,omitempty"`
}

// CaseResult is the result of one case.
type CaseResult struct {
	ID       string        `json:"id"`
	Group    string        `json:"group"`
	Clause   string        `json:"clause"`
	Title    string        `json:"title"`
	Status   Status        `json:"status"`
	Message  string        `json:"message,omitempty"`
	Duration time.Duration `json:"duration_ns"`
	Evidence []Evidence    `json:"evidence,omitempty"`
}

// Report is the result of a run.
type Report struct {
	Version   string        `json:"version"`
	Server    string        `json:"server"`
	Workspace string        `json:"workspace"`
	Started   time.Time     `json:"started"`
	Duration  time.Duration `json:"duration_ns"`
	Passed    int           `json:"passed"`
	Failed    int           `json:"failed"`
	Skipped   int           `json:"skipped"`
	Cases     []CaseResult  `json:"cases"`
	// Error is set when the run could not start (no endpoint, a wrong
	// admin credential, no workspace); Cases is then empty.
	Error string `json:"error,omitempty"`
}

// Summary is the one-line summary of the run:
// "conformance: N passed, N failed, N skipped".
func (r Report) Summary() string {
	return fmt.Sprintf("conformance: %d passed, %d failed, %d skipped", r.Passed, r.Failed, r.Skipped)
}

// OK reports whether the run started and no case failed.
func (r Report) OK() bool { return r.Error == "" && r.Failed == 0 }

// Case is one conformance case.
type Case struct {
	// ID is unique and stable, e.g. "TOOL01-INV-NOBYPASS-003".
	ID string
	// Group is the area: "TOOL-01 §6 no bypass", "DESIGN error classes", ….
	Group string
	// Clause names the seed (or DESIGN.md) and section checked.
	Clause string
	// Title says what the case checks, in one line.
	Title string
	run   func(t *T)
}

// Cases returns every case of the suite, in run order.
func Cases() []Case {
	var all []Case
	for _, g := range groups {
		all = append(all, g()...)
	}
	return all
}

// groups lists the case tables in run order (cases_*.go).
var groups = []func() []Case{
	noBypassCases, auditCases, policyCases, delegationCases, txnCases, replayCases,
	envelopeCases, recordCases, receiptCases, ledgerCases, errorCases,
	seed000Cases, seed002Cases,
}

// Run runs the selected cases against cfg.Server, one after another, and
// returns the report. It returns early (Report.Error set) only when
// cfg.Run selects no case (before it contacts the endpoint) or the
// endpoint cannot be used at all.
func Run(ctx context.Context, cfg Config) (rep Report) {
	rep = Report{Version: Version, Server: cfg.Server, Started: time.Now().UTC()}
	defer func() { rep.Duration = time.Since(rep.Started) }()
	var cases []Case
	for _, c := range Cases() {
		if cfg.Run == nil || cfg.Run.MatchString(c.ID) {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		rep.Error = fmt.Sprintf("conformance: no case id matches %q (the ids are in docs/conformance.md)", cfg.Run)
		return rep
	}
	env, err := setup(ctx, cfg)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	rep.Workspace = env.ws
	if env.tmp != "" {
		defer os.RemoveAll(env.tmp)
	}
	if cfg.Started != nil {
		cfg.Started(env.plan(cases))
	}
	for _, c := range cases {
		if ctx.Err() != nil {
			break
		}
		res := runCase(ctx, env, c)
		if cfg.Done != nil {
			cfg.Done(res)
		}
		switch res.Status {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		case Skip:
			rep.Skipped++
		}
		rep.Cases = append(rep.Cases, res)
	}
	return rep
}

// stop is the panic value that ends a case early (Failf, Skipf).
type stop struct{}

func runCase(ctx context.Context, env *env, c Case) (res CaseResult) {
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	t := &T{ctx: cctx, env: env, id: c.ID}
	start := time.Now()
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(stop); !ok {
					t.status, t.msg = Fail, fmt.Sprintf("case panicked: %v\n%s", v, debug.Stack())
				}
			}
		}()
		c.run(t)
	}()
	if t.status == "" {
		t.status = Pass
	}
	res = CaseResult{ID: c.ID, Group: c.Group, Clause: c.Clause, Title: c.Title, Status: t.status,
		Message: t.msg, Duration: time.Since(start), Evidence: t.evidence}
	return res
}

// T is the handle a case runs with: HTTP helpers that record evidence, and
// Failf / Skipf / Logf.
type T struct {
	ctx      context.Context
	env      *env
	id       string
	mu       sync.Mutex
	status   Status
	msg      string
	notes    []string
	evidence []Evidence
}

// Failf fails the case and ends it.
func (t *T) Failf(format string, args ...any) {
	t.mu.Lock()
	t.status = Fail
	t.msg = joinMsg(fmt.Sprintf(format, args...), t.notes)
	t.mu.Unlock()
	panic(stop{})
}

// Skipf skips the case with a reason and ends it.
func (t *T) Skipf(format string, args ...any) {
	t.mu.Lock()
	t.status = Skip
	t.msg = fmt.Sprintf(format, args...)
	t.mu.Unlock()
	panic(stop{})
}

// Logf adds a note to the case's message (shown when it fails).
func (t *T) Logf(format string, args ...any) {
	t.mu.Lock()
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
	t.mu.Unlock()
}

func joinMsg(msg string, notes []string) string {
	if len(notes) == 0 {
		return msg
	}
	return msg + " (" + strings.Join(notes, "; ") + ")"
}

func (t *T) addEvidence(e Evidence) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.evidence) < maxEvidence {
		t.evidence = append(t.evidence, e)
	}
}

const maxEvidence = 24

// env is what every case of a run shares.
type env struct {
	cfg        Config
	h          *http.Client
	base       string
	admin      string
	runID      string
	ws         string // this run's workspace root (absolute)
	tmp        string // the temporary workspace the suite made, removed after the run
	policyHash string
	tools      map[string]bool // syscalls the endpoint lists for a "*" token
	wsVisible  bool
	wsProblem  string
	// approvalTimeout is how long the endpoint holds a gated call for a
	// decision (0: no approval API, or not measured).
	approvalTimeout time.Duration
	mu              sync.Mutex
	tokens          map[string]*Token
	jwks            map[string]ed25519.PublicKey
	jwksDoc         []byte // the JWKS document jwks was read from
}

// setup checks the endpoint can be used and prepares what the cases
// share; on error it removes the temporary workspace it made.
func setup(ctx context.Context, cfg Config) (*env, error) {
	e, err := prepare(ctx, cfg)
	if err != nil && e != nil && e.tmp != "" {
		os.RemoveAll(e.tmp)
	}
	if err != nil {
		return nil, err
	}
	return e, nil
}

func prepare(ctx context.Context, cfg Config) (*env, error) {
	if cfg.Server == "" {
		return nil, fmt.Errorf("conformance: no server URL")
	}
	if cfg.AdminToken == "" {
		return nil, fmt.Errorf("conformance: no admin credential")
	}
	e := &env{cfg: cfg, h: cfg.HTTP, base: strings.TrimRight(cfg.Server, "/"), admin: cfg.AdminToken, tokens: map[string]*Token{}}
	if e.h == nil {
		e.h = &http.Client{Timeout: 2 * time.Minute}
	}
	var b [6]byte
	rand.Read(b[:])
	e.runID = hex.EncodeToString(b[:])
	root := cfg.Workspace
	if root == "" {
		d, err := os.MkdirTemp("", "capkernel-conformance-")
		if err != nil {
			return e, fmt.Errorf("conformance: workspace: %w", err)
		}
		root, e.tmp = d, d
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return e, fmt.Errorf("conformance: workspace: %w", err)
	}
	// Resolve symlinks: the kernel's roots are real paths.
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	e.ws = filepath.Join(root, "run-"+e.runID)
	if err := os.MkdirAll(e.ws, 0o755); err != nil {
		return e, fmt.Errorf("conformance: workspace: %w", err)
	}
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	if _, err := e.getJSON(ctx, "/v1/policy", "", &pol); err != nil {
		return e, fmt.Errorf("conformance: GET /v1/policy: %w", err)
	}
	if pol.PolicyHash == "" {
		return e, fmt.Errorf("conformance: GET /v1/policy answered no policy_hash")
	}
	e.policyHash = pol.PolicyHash
	// The admin credential must mint.
	full, err := e.mint(ctx, TokenRequest{AgentID: e.agent("probe"), Tools: []string{"*"}, FS: []FSRoot{{Path: e.ws, Mode: "rw"}}})
	if err != nil {
		return e, fmt.Errorf("conformance: minting a token with the admin credential: %w", err)
	}
	e.tokens["probe"] = full
	// What the endpoint offers.
	e.tools = map[string]bool{}
	var list []map[string]any
	if status, err := e.getJSON(ctx, "/v1/syscalls?format=mcp", full.Token, &list); err != nil || status != 200 {
		return e, fmt.Errorf("conformance: GET /v1/syscalls?format=mcp: %d %v", status, err)
	}
	for _, d := range list {
		if n, ok := d["name"].(string); ok {
			e.tools[n] = true
		}
	}
	// Can the kernel see the workspace? Write a file here, read it there.
	marker := "conformance-" + e.runID
	if err := os.WriteFile(filepath.Join(e.ws, ".probe"), []byte(marker), 0o644); err != nil {
		return e, fmt.Errorf("conformance: workspace: %w", err)
	}
	status, res, err := e.rawCall(ctx, e.envelope(full, "fs.read", map[string]any{"path": ".probe"}, nil))
	switch {
	case err != nil:
		return e, fmt.Errorf("conformance: POST /v1/syscalls: %w", err)
	case status == 200 && strings.Contains(string(res.Result), marker):
		e.wsVisible = true
	default:
		e.wsProblem = fmt.Sprintf("the kernel cannot read the workspace %s (fs.read answered %d %s): run the kernel on this host or pass a directory it sees at the same path", e.ws, status, res.errClass())
	}
	if e.approvalTimeout, err = e.probeApprovalTimeout(ctx); err != nil {
		return e, fmt.Errorf("conformance: measuring the approval timeout: %w", err)
	}
	return e, nil
}

// timeoutCases are the cases that wait out the endpoint's approval
// timeout (see approvalTimeout).
var timeoutCases = map[string]bool{"DESIGN-ERR-012": true, "SEED002-CONFIRM-002": true}

// plan says what running cases against e will do.
func (e *env) plan(cases []Case) Plan {
	p := Plan{Cases: len(cases), Workspace: e.ws, ApprovalTimeout: e.approvalTimeout}
	waits := 0
	for _, c := range cases {
		p.Estimate += perCase
		if timeoutCases[c.ID] {
			waits++
		}
	}
	switch {
	case waits == 0:
	case e.approvalTimeout == 0:
		p.Notes = append(p.Notes, "the endpoint has no approval API: the approval cases check that gated calls fail closed")
	case e.approvalTimeout > maxApprovalWait:
		p.Notes = append(p.Notes, fmt.Sprintf("the endpoint's approval timeout is %s: the %d approval_timeout case(s) skip (they wait at most %s; kernelctl serve --approval-timeout 3s runs them)", e.approvalTimeout, waits, maxApprovalWait))
	default:
		p.Estimate += time.Duration(waits) * e.approvalTimeout
	}
	if !e.wsVisible {
		p.Notes = append(p.Notes, "the file cases skip: "+e.wsProblem)
	}
	return p
}

// agent returns a run-unique agent id.
func (e *env) agent(name string) string { return "conf-" + e.runID + "-" + name }

// sortedTools lists the endpoint's syscalls.
func (e *env) sortedTools() []string {
	out := make([]string, 0, len(e.tools))
	for n := range e.tools {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
