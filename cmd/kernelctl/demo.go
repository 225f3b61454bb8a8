package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/receipts"
)

func demoCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "demo [--data DIR | --server URL]",
		Short: "Run a scripted agent session through the kernel and verify the ledger",
		Long: `demo makes a small workspace, mints capability tokens and runs a scripted
agent session through the kernel: reads, a write, a patch, a denied read of .env,
a ../ escape, a replayed write, a stale precondition and an over-budget call.
It prints one line per call and ends with the ledger and replay verifications.

By default it runs the kernel in this process on a temporary data dir (--data
keeps one). With --server it drives a running kernel over HTTP instead (the
admin credential from --admin-token or env CAPKERNEL_ADMIN_TOKEN mints the
tokens); the workspace is made beside a temporary dir on this machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if t.data != "" && t.server != "" {
				return &usageError{errors.New("demo: give --data or --server, not both")}
			}
			if t.policy != "" && t.server != "" {
				return &usageError{errors.New("demo --policy: the kernel at " + t.server + " runs under the policy it was started with; --policy chooses the bundle of a kernel opened in this process")}
			}
			if t.server != "" {
				if err := checkServerURL("--server", t.server); err != nil {
					return err
				}
			}
			tmp, err := os.MkdirTemp("", "capkernel-demo-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			ws := filepath.Join(tmp, "workspace")
			var b demoKernel
			var where string
			if t.data != "" {
				// A kernel running on --data is driven through its
				// control socket.
				if c, ok := httpapi.ControlClient(t.data); ok {
					t.socket = c
				}
			}
			if t.socket != nil {
				b = remoteDemo{t.socket}
				where = fmt.Sprintf("data dir  %s, of the kernel running on it (driven through its control socket; kept)\nworkspace %s (temporary: removed when the demo ends)", t.data, ws)
			} else if t.remote() {
				c, err := t.adminClient()
				if err != nil {
					return err
				}
				b = remoteDemo{c}
				where = fmt.Sprintf("history   in the data dir of the kernel at %s (kernelctl receipts list --server %s)\nworkspace %s (temporary: removed when the demo ends)", t.server, t.server, ws)
			} else {
				data := t.data
				if data == "" {
					data = filepath.Join(tmp, "data")
					where = fmt.Sprintf("data dir  %s (temporary: removed when the demo ends;\n          kernelctl demo --data DIR keeps it, to inspect afterwards with kernelctl receipts list --data DIR)\nworkspace %s (temporary too)", data, ws)
				} else {
					if data, err = filepath.Abs(data); err != nil {
						return err
					}
					ws = filepath.Join(filepath.Dir(data), "demo-workspace-"+filepath.Base(data))
					where = fmt.Sprintf("data dir  %s (kept: kernelctl receipts list --data %s, ledger verify --data %s)\nworkspace %s (kept)", data, data, data, ws)
				}
				if _, err := os.Stat(filepath.Join(data, kernel.ConfigFile)); err != nil {
					if _, err := kernel.Init(data); err != nil {
						return err
					}
				}
				t.data = data
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				b = localDemo{k}
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), b, ws, where)
		},
	}
	cmd.Flags().StringVar(&t.data, "data", "", "data dir (created if missing; default: a temporary dir)")
	cmd.Flags().StringVar(&t.server, "server", "", "URL of a running kernel to drive instead")
	cmd.Flags().StringVar(&t.adminFile, "admin-token", "", "file holding the admin credential, for --server (default: env CAPKERNEL_ADMIN_TOKEN)")
	t.addPolicy(cmd)
	return cmd
}

// demoKernel is what the demo drives: a kernel in this process or a server.
type demoKernel interface {
	ID(ctx context.Context) (id, policyHash string, err error)
	Mint(ctx context.Context, req kernel.TokenRequest) (*kernel.MintedToken, error)
	Call(ctx context.Context, envelope []byte) (*kernel.Result, error)
	Verify(ctx context.Context) (kernel.LedgerCheck, error)
	ReplayVerify(ctx context.Context) (*kernel.ReplayReport, error)
	Bundle(ctx context.Context, receiptID string) (*receipts.Logged, error)
	JWKS(ctx context.Context) ([]byte, error)
	Approvals(ctx context.Context) ([]kernel.ApprovalRequest, error)
	Decide(ctx context.Context, id, approverToken, decision, reason string) error
	Attenuate(ctx context.Context, req kernel.AttenuateRequest) (*kernel.MintedToken, error)
}

type localDemo struct{ k *kernel.Kernel }

func (l localDemo) ID(context.Context) (string, string, error) {
	return l.k.ID(), l.k.PolicyHash(), nil
}
func (l localDemo) Mint(_ context.Context, req kernel.TokenRequest) (*kernel.MintedToken, error) {
	return l.k.Mint(req)
}
func (l localDemo) Call(ctx context.Context, env []byte) (*kernel.Result, error) {
	return l.k.InvokeJSON(ctx, env), nil
}
func (l localDemo) Verify(context.Context) (kernel.LedgerCheck, error) {
	return l.k.Inspector().Verify(nil)
}
func (l localDemo) Bundle(_ context.Context, id string) (*receipts.Logged, error) {
	return l.k.Inspector().Bundle(id)
}
func (l localDemo) JWKS(context.Context) ([]byte, error) { return l.k.JWKS() }
func (l localDemo) Approvals(context.Context) ([]kernel.ApprovalRequest, error) {
	return l.k.Approvals(false), nil
}
func (l localDemo) Decide(_ context.Context, id, tok, decision, reason string) error {
	_, err := l.k.Decide(id, tok, decision, reason)
	return err
}
func (l localDemo) Attenuate(ctx context.Context, req kernel.AttenuateRequest) (*kernel.MintedToken, error) {
	return l.k.Attenuate(ctx, req)
}
func (l localDemo) ReplayVerify(context.Context) (*kernel.ReplayReport, error) {
	return l.k.Inspector().ReplayVerify()
}

type remoteDemo struct{ c *httpapi.Client }

// ID names the kernel by the origin of its checkpoints (its kernel id),
// else by its address (a fresh kernel has signed none yet).
func (r remoteDemo) ID(ctx context.Context) (string, string, error) {
	h, err := r.c.PolicyHash(ctx)
	id := r.c.BaseURL
	if cp, err := r.c.Checkpoint(ctx, false); err == nil && cp.Origin != "" {
		id = cp.Origin
	}
	return id, h, err
}
func (r remoteDemo) Mint(ctx context.Context, req kernel.TokenRequest) (*kernel.MintedToken, error) {
	return r.c.Mint(ctx, req)
}

// Call sends the envelope with its capability token as the bearer, never
// the admin credential, which the API refuses on calls (and which the
// control socket lends a request that carries no credential).
func (r remoteDemo) Call(ctx context.Context, env []byte) (*kernel.Result, error) {
	var e struct {
		Token string `json:"capability_token"`
	}
	json.Unmarshal(env, &e)
	res, _, err := (&httpapi.Client{BaseURL: r.c.BaseURL, HTTP: r.c.HTTP, Credential: e.Token}).Call(ctx, env)
	return res, err
}
func (r remoteDemo) Bundle(ctx context.Context, id string) (*receipts.Logged, error) {
	return r.c.Bundle(ctx, id)
}
func (r remoteDemo) JWKS(ctx context.Context) ([]byte, error) { return r.c.JWKS(ctx) }
func (r remoteDemo) Approvals(ctx context.Context) ([]kernel.ApprovalRequest, error) {
	return r.c.Approvals(ctx, false)
}
func (r remoteDemo) Decide(ctx context.Context, id, tok, decision, reason string) error {
	_, err := (&httpapi.Client{BaseURL: r.c.BaseURL, HTTP: r.c.HTTP, Credential: tok}).Decide(ctx, id, decision, reason)
	return err
}
func (r remoteDemo) Verify(ctx context.Context) (kernel.LedgerCheck, error) {
	return r.c.VerifyLedger(ctx)
}

// Attenuate sends the parent token as the only credential.
func (r remoteDemo) Attenuate(ctx context.Context, req kernel.AttenuateRequest) (*kernel.MintedToken, error) {
	return (&httpapi.Client{BaseURL: r.c.BaseURL, HTTP: r.c.HTTP}).Attenuate(ctx, req)
}
func (r remoteDemo) ReplayVerify(ctx context.Context) (*kernel.ReplayReport, error) {
	return r.c.ReplayVerify(ctx)
}

// session is the demo agent: one identity, one token, one workspace.
type session struct {
	k          demoKernel
	policyHash string
	out        io.Writer
	agent      string
	token      string
	jti        string
	n          int
	fails      int
}

// call sends one envelope and prints its result in one line; want is the
// expected error class ("" for success), and a surprise counts as a failure.
func (s *session) call(ctx context.Context, what, tool string, args any, key string, pre []map[string]any, want string) *kernel.Result {
	s.n++
	a, _ := json.Marshal(args)
	env := map[string]any{
		"tool_id": tool, "args": json.RawMessage(a), "agent_id": s.agent,
		"capability_token": s.token, "capability_token_id": s.jti,
		"policy_hash": s.policyHash, "task_class": "demo",
		"provenance": map[string]any{"session_id": "demo-session", "turn_id": fmt.Sprint(s.n)},
	}
	if key != "" {
		env["idempotency_key"] = key
	}
	if pre != nil {
		env["precondition_refs"] = pre
	}
	raw, _ := json.Marshal(env)
	r, err := s.k.Call(ctx, raw)
	if err != nil {
		r = &kernel.Result{ToolID: tool, Status: kernel.StatusError, Error: &kernel.Error{Class: "transport", Message: err.Error()}}
	}
	got, detail := "", summary(r)
	if r.Error != nil {
		got = r.Error.Class
	}
	mark := "ok  "
	if got != want {
		mark = "FAIL"
		s.fails++
	}
	fmt.Fprintf(s.out, demoRow, mark, fmt.Sprint(s.n), what, tool, r.Status, orDash(got), r.TxOutcome, r.AutonomyMode, fmt.Sprint(r.LedgerSeq), detail)
	return r
}

// demoRow is the format of a call's line and of the header.
const demoRow = "%-5s %2s %-38s %-10s %-6s %-25s %-11s %-9s %4s  %s\n"

// demoLegend explains the columns to someone who has never seen the
// kernel.
const demoLegend = `Each line is one call the scripted agent sends through the kernel. Columns:
  CHECK   ok when the kernel did what the script expects (a refusal can be ok), else FAIL
  #       the call's number; WHAT the agent tries; TOOL the syscall it names
  STATUS  ok or error; ERROR the error class (- for none)
  TX      the transaction's outcome: committed (its effect was applied), no_op (nothing
          to apply: a read, or a refusal before anything ran), rolled_back
  MODE    the autonomy mode the policy decided: autopilot runs unattended, soft_gate
          waits for an approver, escalated for a senior one, no_go is refused
  SEQ     the ledger entry holding the call's signed receipt
  RESULT  what came back, or why not (cut with … where long)

`

func summary(r *kernel.Result) string {
	if r.Error != nil {
		return ellipsize(r.Error.Message, 70)
	}
	var parts []string
	if r.Replayed {
		parts = append(parts, "replayed=true")
	}
	var res map[string]any
	json.Unmarshal(r.Result, &res)
	for _, f := range []string{"text", "size", "truncated", "version", "exit_code"} {
		if v, ok := res[f]; ok {
			parts = append(parts, fmt.Sprintf("%s=%v", f, v))
		}
	}
	if e, ok := res["entries"].([]any); ok {
		parts = append(parts, fmt.Sprintf("entries=%d", len(e)))
	}
	if d, ok := res["delta"].([]any); ok {
		parts = append(parts, fmt.Sprintf("files_changed=%d", len(d)))
	}
	return strings.Join(parts, " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// runDemo runs the scripted session on k in workspace ws; where says
// where the session's history and workspace are kept, if at all.
func runDemo(ctx context.Context, out io.Writer, k demoKernel, ws, where string) error {
	if err := seedWorkspace(ws); err != nil {
		return err
	}
	id, policyHash, err := k.ID(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "kernel    %s\npolicy    %s\n%s\n\n%s", id, policyHash, where, demoLegend)
	fmt.Fprintf(out, demoRow, "CHECK", "#", "WHAT", "TOOL", "STATUS", "ERROR", "TX", "MODE", "SEQ", "RESULT")

	mint := func(agent string, budgets map[string]int64) (*session, error) {
		t, err := k.Mint(ctx, kernel.TokenRequest{
			AgentID: agent, Tools: []string{"echo", "fs.*", "kv.*", "proc.exec"},
			FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}, KV: []captoken.KVScope{{Keys: agent + "/*", Mode: "rw"}}, Budgets: budgets,
		})
		if err != nil {
			return nil, err
		}
		return &session{k: k, policyHash: policyHash, out: out, agent: agent, token: t.Token, jti: t.ID}, nil
	}
	s, err := mint("demo-agent", map[string]int64{"calls": 100, "disk_write_bytes": 1 << 20})
	if err != nil {
		return err
	}
	// Keys unique to this run: the token id's random tail (its head is
	// the time in ms, the same for runs ~65 s apart in its first 8 digits,
	// whose keys would then replay the earlier run's answers).
	key := func(name string) string { return name + "-" + s.jti[len(s.jti)-12:] }

	s.call(ctx, "say hello", "echo", map[string]any{"text": "hello, kernel"}, "", nil, "")
	s.call(ctx, "list the workspace", "fs.list", map[string]any{"path": "."}, "", nil, "")
	s.call(ctx, "read README.md", "fs.read", map[string]any{"path": "README.md"}, "", nil, "")
	w := s.call(ctx, "write notes.txt", "fs.write", map[string]any{"path": "notes.txt", "content": "status: draft\n"}, key("w1"), nil, "")
	fresh := digest.Sum([]byte("status: draft\n"))
	s.call(ctx, "patch notes.txt (fresh precondition)", "fs.patch", map[string]any{"path": "notes.txt", "old": "draft", "new": "reviewed"}, key("p1"),
		[]map[string]any{{"ref": "fs:notes.txt", "hash": fresh}}, "")
	s.call(ctx, "read .env (a secret)", "fs.read", map[string]any{"path": ".env"}, "", nil, kernel.ErrPolicyDenied)
	s.call(ctx, "read ../outside.txt (escape)", "fs.read", map[string]any{"path": "../outside.txt"}, "", nil, kernel.ErrScopeDenied)
	r := s.call(ctx, "replay the write of notes.txt", "fs.write", map[string]any{"path": "notes.txt", "content": "status: draft\n"}, key("w1"), nil, "")
	if !r.Replayed || r.OperationID != w.OperationID {
		s.fails++
		fmt.Fprintln(out, "FAIL    the replay did not return the original outcome")
	}
	s.call(ctx, "write with a stale precondition", "fs.write", map[string]any{"path": "notes.txt", "content": "overwritten\n"}, key("w2"),
		[]map[string]any{{"ref": "fs:notes.txt", "hash": fresh}}, kernel.ErrPreconditionFailed)
	s.call(ctx, "write without idempotency key", "fs.write", map[string]any{"path": "x.txt", "content": "x"}, "", nil, kernel.ErrIdempotencyKeyRequired)
	s.call(ctx, "put a kv entry", "kv.put", map[string]any{"key": "demo-agent/progress", "value": map[string]any{"step": 1}}, key("kv1"), nil, "")
	s.call(ctx, "run a tool the kernel lacks", "web.search", map[string]any{"query": "capkernel"}, "", nil, kernel.ErrToolNotFound)
	// EXECUTE needs a human by default: a reviewer approves the build
	// while the call waits; it runs in the sandbox and its write commits.
	reviewer, err := k.Mint(ctx, kernel.TokenRequest{AgentID: "demo-reviewer", Role: captoken.RoleApprover})
	if err != nil {
		return err
	}
	approved := make(chan string, 1)
	go func() { approved <- approveNext(ctx, k, reviewer.Token, "proc.exec") }()
	s.call(ctx, "build in the sandbox (approved)", "proc.exec", map[string]any{"argv": []string{"sh", "-c", "cat README.md > build.txt"}}, key("x1"), nil, "")
	if who := <-approved; who != "" {
		fmt.Fprintf(out, "         %s\n", who)
	}

	tight, err := mint("demo-agent-tight", map[string]int64{"calls": 2})
	if err != nil {
		return err
	}
	tight.n = s.n
	tight.call(ctx, "tight token: call 1 of 2", "echo", map[string]any{"text": "one"}, "", nil, "")
	tight.call(ctx, "tight token: call 2 of 2", "echo", map[string]any{"text": "two"}, "", nil, "")
	tight.call(ctx, "tight token: call 3 (over budget)", "echo", map[string]any{"text": "three"}, "", nil, kernel.ErrBudgetExceeded)

	// Delegation: the agent hands a sub-agent a narrower token (its own
	// token is the authority); the kernel refuses to let it widen.
	if _, err := k.Attenuate(ctx, kernel.AttenuateRequest{Parent: s.token, AgentID: "demo-agent/subagent", Tools: []string{"*"}}); err == nil {
		s.fails++
		fmt.Fprintln(out, "FAIL    a delegation granting every tool was signed")
	} else {
		fmt.Fprintf(out, "ok       delegation asking for every tool refused: %s\n", ellipsize(unstutter(err.Error(), "attenuate", ""), 90))
	}
	child, err := k.Attenuate(ctx, kernel.AttenuateRequest{Parent: s.token, AgentID: "demo-agent/subagent", Tools: []string{"fs.read"}, Budgets: map[string]int64{"calls": 5}, TTLSeconds: 600})
	if err != nil {
		return err
	}
	sub := &session{k: k, policyHash: policyHash, out: out, agent: child.AgentID, token: child.Token, jti: child.ID, n: tight.n}
	fmt.Fprintf(out, "ok       delegated to %s: fs.read only, 5 calls, 10 min, parent %s\n", child.AgentID, ellipsize(child.Cap.Parent, 9))
	sub.call(ctx, "sub-agent reads notes.txt", "fs.read", map[string]any{"path": "notes.txt"}, "", nil, "")
	sub.call(ctx, "sub-agent writes (not delegated)", "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, key("sub1"), nil, kernel.ErrPermissionDenied)

	content, err := os.ReadFile(filepath.Join(ws, "notes.txt"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nnotes.txt now holds %q\n", content)
	check, err := k.Verify(ctx)
	switch {
	case err != nil:
		return err
	case !check.Intact:
		return fmt.Errorf("ledger TAMPERED: %s", check.Reason)
	}
	fmt.Fprintf(out, "ledger intact: %d entries, %d signed checkpoints, root %s\n", check.Entries, check.Checkpoints, ellipsize(check.Root, 24))
	if err := showBundle(ctx, k, out, w); err != nil {
		return err
	}
	rep, err := k.ReplayVerify(ctx)
	if err != nil {
		return err
	}
	if len(rep.Problems) > 0 {
		return fmt.Errorf("replay verification found %d problems, the first: %s", len(rep.Problems), rep.Problems[0].Detail)
	}
	fmt.Fprintf(out, "replays proven: %d keys, %d committed, %d replays, %d calls audited\n", rep.Keys, rep.Committed, rep.Replays, rep.Calls)
	if fails := s.fails + tight.fails + sub.fails; fails > 0 {
		return fmt.Errorf("demo: %d calls did not behave as expected", fails)
	}
	return nil
}

// seedWorkspace makes the demo's workspace, with a secret in .env and a
// file just outside it that a ../ escape would reach.
func seedWorkspace(ws string) error {
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		filepath.Join(ws, "README.md"):                 "# demo workspace\nAn agent works here through capkernel.\n",
		filepath.Join(ws, ".env"):                      "API_KEY=do-not-leak\n",
		filepath.Join(filepath.Dir(ws), "outside.txt"): "outside the workspace\n",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// showBundle verifies the receipt r came with (its audit entry, inclusion
// proof and the checkpoint of its group commit) as an outsider would, with
// the JWKS alone, then the same receipt proven under the latest checkpoint.
func showBundle(ctx context.Context, k demoKernel, out io.Writer, r *kernel.Result) error {
	jwks, err := k.JWKS(ctx)
	if err != nil {
		return err
	}
	b, err := k.Bundle(ctx, r.ReceiptID)
	if err != nil {
		return err
	}
	for _, rc := range []struct {
		what string
		r    *receipts.Logged
	}{{"as answered", r.Receipt}, {"proven under the latest checkpoint", b}} {
		raw, err := json.Marshal(rc.r)
		if err != nil {
			return err
		}
		c, err := kernel.VerifyBundle(raw, jwks)
		if err != nil {
			return fmt.Errorf("receipt of the write (%s): %w", rc.what, err)
		}
		fmt.Fprintf(out, "receipt %s of the write, %s: verified offline (audit entry seq %d, inclusion proof of %d hashes, checkpoint of %d entries signed by the kernel's key)\n",
			c.Receipt.ReceiptID, rc.what, c.Receipt.LedgerSeq, len(rc.r.Inclusion.Proof), c.Checkpoint.Size)
	}
	return nil
}

// approveNext waits for the next approval request for tool and allows it
// as the reviewer; it says what it did.
func approveNext(ctx context.Context, k demoKernel, reviewer, tool string) string {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		list, err := k.Approvals(ctx)
		if err != nil {
			return "approvals: " + err.Error()
		}
		for _, a := range list {
			if a.ToolID == tool {
				if err := k.Decide(ctx, a.ID, reviewer, "allow", "build step reviewed"); err != nil {
					return "approve: " + err.Error()
				}
				return fmt.Sprintf("(demo-reviewer approved %s %s: %s)", a.Mode, a.ID, strings.Join(a.ProjectedEffects, "; "))
			}
		}
	}
	return "no approval request arrived within a minute"
}
