package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
	"github.com/capkernel/capkernel/sandbox"
)

// agentExit is the exit status of an agent that ended unsuccessfully:
// kernelctl run exits with it.
type agentExit int

func (e agentExit) Error() string { return fmt.Sprintf("the agent exited with status %d", int(e)) }

// kernelInvoker runs envelopes in an embedded kernel.
// clientHandles is the HandleSource of a bearer token over the HTTP API.
type clientHandles struct{ c *httpapi.Client }

func (h clientHandles) Handles(ctx context.Context, session string) ([]kernel.Handle, error) {
	return h.c.SessionHandles(ctx, session)
}

func (h clientHandles) EndSession(ctx context.Context, session string) error {
	_, err := h.c.EndSession(ctx, session)
	return err
}

type kernelInvoker struct{ k *kernel.Kernel }

func (i kernelInvoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return i.k.InvokeJSON(ctx, env), nil
}

// clientInvoker runs envelopes in a served kernel.
type clientInvoker struct{ c *httpapi.Client }

func (i clientInvoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	r, _, err := i.c.Call(ctx, env)
	return r, err
}

// policyFollower runs envelopes through a served kernel that may restart
// under another policy while the runner or gateway in front of it lives
// on. Those put in every envelope the policy hash the kernel had when they
// started (they choose no policy of their own: the kernel's policy governs
// the agent, whichever it is), so without this every call after such a
// restart was refused policy_mismatch until they were restarted too.
//
// A call refused policy_mismatch (audited as refused: nothing of it ran)
// makes the follower read the kernel's policy hash; when it is another
// than the one the call carried, the call is sent again, once, with it and
// its answer is the call's; later calls carry it from the start. The
// follower tells the operator on notice.
type policyFollower struct {
	invoker runner.Invoker
	// fetch returns the kernel's active policy hash.
	fetch func(ctx context.Context) (string, error)
	// notice is told each change of policy the follower takes up.
	notice func(from, to string)
	// start is the hash the envelopes come with.
	start string

	mu      sync.Mutex
	current string // the hash they go with
}

func newPolicyFollower(inv runner.Invoker, start string, fetch func(context.Context) (string, error), notice func(from, to string)) *policyFollower {
	return &policyFollower{invoker: inv, fetch: fetch, notice: notice, start: start, current: start}
}

func (f *policyFollower) hash() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current
}

// Invoke sends env with the current policy hash and, when the kernel
// answers policy_mismatch and its policy is another by now, once more
// with that one.
func (f *policyFollower) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	sent := f.hash()
	if sent != f.start {
		if e, err := withPolicyHash(env, sent); err == nil {
			env = e
		}
	}
	res, err := f.invoker.Invoke(ctx, env)
	if err != nil || res.Status == kernel.StatusOK || res.Error == nil || res.Error.Class != kernel.ErrPolicyMismatch {
		return res, err
	}
	now, ferr := f.fetch(ctx)
	if ferr != nil || now == "" || now == sent {
		return res, nil
	}
	retry, merr := withPolicyHash(env, now)
	if merr != nil {
		return res, nil
	}
	f.mu.Lock()
	from := f.current
	changed := from != now
	f.current = now
	f.mu.Unlock()
	if changed && f.notice != nil {
		f.notice(from, now)
	}
	return f.invoker.Invoke(ctx, retry)
}

// withPolicyHash returns envelope env with its policy_hash member set to h,
// its other members' values as they were (no HTML escaping added).
func withPolicyHash(env []byte, h string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(env, &m); err != nil {
		return nil, err
	}
	v, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	m["policy_hash"] = v
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// agentKernel is a capability token's way into a kernel, embedded (--data)
// or served (--server): what kernelctl run and kernelctl mcp act through.
type agentKernel struct {
	token, sub, jti string
	policyHash      string
	invoker         runner.Invoker
	// tools returns the definitions of the syscalls the token may call.
	tools func(ctx context.Context, format string) (json.RawMessage, error)
	// handles, for a token in handle mode, are its sessions' tool
	// handles; nil otherwise.
	handles runner.HandleSource
	close   func()
}

// agentKernel reads the token in tokenFile, opens t's kernel and verifies
// the token there, so a verb fails at once, with the reason, on a token
// that would only have its calls refused.
func (t *target) agentKernel(ctx context.Context, verb, tokenFile string, stderr io.Writer) (*agentKernel, error) {
	if tokenFile == "" {
		return nil, &usageError{fmt.Errorf("%s: --token FILE (or - for stdin) is required", verb)}
	}
	tok, err := readToken("--token", tokenFile)
	if err != nil {
		return nil, err
	}
	ak := &agentKernel{token: tok, close: func() {}}
	if ak.sub, ak.jti, err = peekToken(tok); err != nil {
		return nil, err
	}
	if t.remote() {
		c := t.client("")
		if ak.policyHash, err = c.PolicyHash(ctx); err != nil {
			return nil, err
		}
		in, err := c.InspectToken(ctx, tok)
		if err != nil {
			return nil, err
		} else if !in.Valid {
			return nil, fmt.Errorf("%s: %s: %s", verb, in.Class, in.Reason)
		}
		// Calls go with the agent's token as the bearer too: over the
		// control socket a request without one is the admin's, which
		// makes no calls.
		bearer := t.client(tok)
		ak.invoker = newPolicyFollower(clientInvoker{bearer}, ak.policyHash, c.PolicyHash, func(from, to string) {
			fmt.Fprintf(stderr, "kernelctl %s: the kernel's policy changed from %s to %s; calls now go under it (the one refused policy_mismatch on the change was sent again)\n", verb, from, to)
		})
		ak.tools = bearer.Tools
		if in.Claims != nil && in.Claims.Cap.Handles {
			ak.handles = clientHandles{bearer}
		}
		return ak, nil
	}
	k, err := t.openKernel(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := k.VerifyBearer(tok); err != nil {
		k.Close()
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	// The kernel lives in this process for as long as the agent or the
	// MCP client: its control socket lets kernelctl verbs given --data
	// (approvals above all) reach it meanwhile.
	ctl, err := httpapi.ServeControl(k, t.data)
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	ak.policyHash, ak.invoker = k.PolicyHash(), kernelInvoker{k}
	ak.close = func() {
		k.Drain()
		ctl.Close()
		k.Close()
	}
	ak.tools = func(_ context.Context, format string) (json.RawMessage, error) { return k.Tools(tok, format) }
	if vt, err := k.VerifyBearer(tok); err == nil && vt.Claims.Cap.Handles {
		ak.handles = runner.KernelHandles(k, tok, ak.jti)
	}
	return ak, nil
}

func runCmd() *cobra.Command {
	var t target
	var tokenFile string
	var readOnly []string
	var noSandbox bool
	cmd := &cobra.Command{
		Use:   "run --data DIR|--server URL --token FILE [--ro PATH]... [--no-sandbox] -- CMD [ARG]...",
		Short: "Run an agent process whose only way to act is tool calls through the kernel",
		Long: `run starts CMD as an agent: in a bubblewrap sandbox with no network, a
private empty working directory, read-only system directories, CMD itself and
the --ro paths, and nothing of the token's file trees. Its one way to act is
the runner channel: JSON lines on the inherited file descriptor named by
CAPKERNEL_IPC_FD (6 in the sandbox, 3 with --no-sandbox):

  → {"op":"tool_call","tool_call_id":"c1","tool":"fs.read","args":{"path":"a.txt"}}
  ← {"op":"tool_response","tool_call_id":"c1","ok":true,"result":{…},"receipt_id":"…"}

Every tool_call is a call envelope under --token, governed, audited and
receipted by the kernel; several may be in flight, matched by tool_call_id.
A malformed line is answered invalid_args, and audited as the run's own
refused call (never sent on as it came); a crashing or
garbage-writing agent cannot hurt the kernel. run exits with the agent's
status once every call it made has been answered. See docs/runner.md.

--no-sandbox runs CMD as a plain child process with the channel, for
machines without bubblewrap; the agent then has the user's ambient authority.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := t.check("run"); err != nil {
				return err
			}
			// --ro, as every path on the command line, is relative to
			// the working directory; the sandbox binds absolute paths.
			for i, p := range readOnly {
				abs, err := filepath.Abs(p)
				if err != nil {
					return usagef("--ro %s: %v", p, err)
				}
				readOnly[i] = abs
			}
			if !noSandbox {
				if err := checkReadOnly(readOnly, t.data, tokenFile); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ak, err := t.agentKernel(ctx, "run", tokenFile, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer ak.close()
			s := &runner.Session{Invoker: ak.invoker, Token: ak.token, TokenID: ak.jti, AgentID: ak.sub, PolicyHash: ak.policyHash, ID: uuid.Must(uuid.NewV7()).String(), Handles: ak.handles}
			return runAgent(ctx, cmd, s, argv, readOnly, noSandbox, t.stagingDir())
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&tokenFile, "token", "", "file holding the agent's capability token (- for stdin)")
	cmd.Flags().StringArrayVar(&readOnly, "ro", nil, "host path the agent may read, bound read-only at the same (absolute) path; relative to the working directory (repeatable)")
	cmd.Flags().BoolVar(&noSandbox, "no-sandbox", false, "run the agent as a plain child process (it keeps the user's authority)")
	return cmd
}

// runAgent starts the agent with its end of a socketpair, serves the
// other end until the agent is gone and its calls are answered, and
// returns the agent's status.
func runAgent(ctx context.Context, cmd *cobra.Command, s *runner.Session, argv, readOnly []string, noSandbox bool, staging string) error {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("run: channel: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "runner"), os.NewFile(uintptr(fds[1]), "agent")
	defer ours.Close()
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.WithoutCancel(ctx), ours, ours) }()

	code, err := startAgent(ctx, cmd, s, theirs, argv, readOnly, noSandbox, staging)
	// Every holder of the agent's end is gone once the agent (and, in
	// the sandbox, everything it started) has ended: closing ours makes
	// the channel end after the lines already written are read.
	theirs.Close()
	if serr := <-served; serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return agentExit(code)
	}
	return nil
}

// startAgent runs the agent; sandboxed, its staging (what it writes in
// its working directory) goes under staging ("": the temp dir) and is
// removed when it ends.
func startAgent(ctx context.Context, cmd *cobra.Command, s *runner.Session, channel *os.File, argv, readOnly []string, noSandbox bool, staging string) (int, error) {
	if noSandbox {
		c := exec.CommandContext(ctx, argv[0], argv[1:]...)
		c.Env = append(agentEnviron(os.Environ()), "CAPKERNEL_IPC_FD=3", "CAPKERNEL_SESSION_ID="+s.ID)
		c.ExtraFiles = []*os.File{channel}
		c.Stdout, c.Stderr = rawOut(cmd), rawErr(cmd) // the agent's own output
		err := c.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), nil
		}
		return 0, err
	}
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, fmt.Errorf("run: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return 0, err
	}
	scratch, err := os.MkdirTemp("", "capkernel-agent-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(scratch)
	sb := sandbox.New(sandbox.Options{StagingDir: staging})
	defer sb.Close()
	p := sandbox.Profile{
		Roots: []sandbox.Root{{Path: scratch, Writable: true}},
		Env: map[string]string{
			"CAPKERNEL_IPC_FD": strconv.Itoa(sandbox.ChannelFD), "CAPKERNEL_SESSION_ID": s.ID,
			"HOME": scratch, "PATH": sandbox.DefaultPath,
		},
		ReadOnly: append([]string{bin}, readOnly...),
	}
	res, err := sb.Run(ctx, p, sandbox.Command{
		Argv: append([]string{bin}, argv[1:]...), Dir: scratch, Channel: channel,
		Stdout: rawOut(cmd), Stderr: rawErr(cmd), // the agent's own output
	})
	if err != nil {
		return 0, fmt.Errorf("run: %w", err)
	}
	// The working directory's writes are discarded: nothing applies them.
	if err := res.Close(); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl run: removing the agent's staging: %v\n", err)
	}
	return res.ExitCode, nil
}

// stagingDir is where a sandboxed agent's writes are staged: the data
// dir's sandbox dir, whose leftovers of a killed run the kernel removes
// when it opens (kernel.Config.SandboxDir); "" (the temp dir) for
// --server, where no data dir is at hand.
func (t *target) stagingDir() string {
	if t.data == "" {
		return ""
	}
	dir, err := filepath.Abs(filepath.Join(t.data, "sandbox"))
	if err != nil {
		return ""
	}
	return dir
}

// agentEnviron is env without what would let the agent reach the kernel
// past its token: kernelctl's own settings (CAPKERNEL_*: the admin
// credential, the server, the data dir). The rest of the user's
// environment is the agent's, as --no-sandbox says.
func agentEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CAPKERNEL_") {
			out = append(out, kv)
		}
	}
	return out
}
