package syscalls

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/netproxy"
	"github.com/capkernel/capkernel/sandbox"
)

// ExecOptions configure proc.exec (see RegisterExec).
type ExecOptions struct {
	// Sandbox runs the commands; nil fails every call closed.
	Sandbox *sandbox.Sandbox
	// EnvAllow lists the environment variable names a call may set; every
	// other name is invalid_args. The sandbox's environment is otherwise
	// PATH (sandbox.DefaultPath), HOME=/tmp and LANG=C.UTF-8, which a call
	// may override only when allowed.
	EnvAllow []string
	// DefaultTimeout applies when a call gives no timeout_s (default 60 s);
	// MaxTimeout caps timeout_s (default 10 min).
	DefaultTimeout, MaxTimeout time.Duration
	// MaxOutput caps the bytes of stdout and of stderr kept (default 1 MiB each).
	MaxOutput int64
	// FileSize is RLIMIT_FSIZE (default 256 MiB); Processes the process
	// limit (default 256).
	FileSize  int64
	Processes int
	// DeltaFiles and DeltaBytes bound the delta (defaults 10,000 entries,
	// 256 MiB).
	DeltaFiles int
	DeltaBytes int64
	// ProxyDir is where the allowlist posture's proxy sockets go (default
	// os.TempDir()).
	ProxyDir string
	// Lookup resolves host names for the allowlist proxy (nil: the system
	// resolver).
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

type execSys struct{ o *ExecOptions }

// ExecID is proc.exec's syscall id.
const ExecID = "proc.exec"

func (e *execSys) Definition() Definition {
	return Definition{
		ID: ExecID,
		Description: "Run a command (argv, no shell unless argv names one) in a sandbox that sees only the capability token's file system roots. " +
			"Writes to read-write roots are staged and applied atomically when the call commits (commit_on \"always\", the default, or \"success\": only on exit code 0); " +
			"the result has the exit code, stdout and stderr (capped, with truncated flags), duration, CPU time and the delta of files written with their blake3 hashes. " +
			"network is \"off\" (default), \"allowlist\" (HTTP(S)_PROXY admitting the token's net patterns) or \"full\".",
		SideEffect: Execute,
		SelfTimed:  true,
		Gated:      true,
		Timeout:    e.o.MaxTimeout + 2*sandbox.DefaultKillGrace + time.Minute,
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"argv":{"type":"array","items":{"type":"string"},"minItems":1,"description":"The command and its arguments; argv[0] is looked up in PATH."},
			"cwd":{"type":"string","description":"Working directory, in a token root (relative paths are relative to the first root; default the first root)."},
			"env":{"type":"object","additionalProperties":true,"description":"Environment variables (string values); only names the kernel's exec_env_allow lists."},
			"stdin":{"type":"string","description":"Text on the command's standard input (default none)."},
			"timeout_s":{"type":"integer","minimum":1,"description":"Wall-clock limit in seconds: SIGTERM, then SIGKILL after a 3 s grace (default 60)."},
			"commit_on":{"type":"string","enum":["always","success"],"description":"Commit the files written always (default) or only when the exit code is 0."},
			"network":{"type":"string","enum":["off","allowlist","full"],"description":"Network posture (default off)."}},
			"required":["argv"],"additionalProperties":false}`),
		Reach: func(args json.RawMessage) (Reach, error) {
			var a execArgs
			if err := decodeArgs(args, &a); err != nil {
				return Reach{}, err
			}
			dir := a.Cwd
			if dir == "" {
				dir = "."
			}
			return Reach{Workspace: true, Dir: dir, Network: a.Network}, nil
		},
	}
}

type execArgs struct {
	Argv     []string       `json:"argv"`
	Cwd      string         `json:"cwd"`
	Env      map[string]any `json:"env"`
	Stdin    *string        `json:"stdin"`
	TimeoutS int64          `json:"timeout_s"`
	CommitOn string         `json:"commit_on"`
	Network  string         `json:"network"`
}

// DeltaEntry is one change of proc.exec's delta as its result reports it.
type DeltaEntry struct {
	Op   string `json:"op"` // write, mkdir, delete
	Root string `json:"root"`
	Path string `json:"path"` // relative to root
	Hash string `json:"hash,omitempty"`
	Size int64  `json:"size,omitempty"`
	Mode string `json:"mode,omitempty"`
}

func (e *execSys) Execute(ctx context.Context, c *Call) (Output, error) {
	var a execArgs
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	g := c.Grant
	if g == nil || g.Workspace == nil || g.Dir == nil {
		return Output{}, errors.New("proc.exec: no file system grant")
	}
	if e.o.Sandbox == nil {
		return Output{}, sandbox.ErrUnavailable
	}
	env := map[string]string{"HOME": "/tmp", "LANG": "C.UTF-8"}
	for k, v := range a.Env {
		s, ok := v.(string)
		if !ok {
			return Output{}, argsError("env %s: value must be a string", k)
		}
		if !slices.Contains(e.o.EnvAllow, k) {
			return Output{}, argsError("env %s: not in the kernel's exec_env_allow list %v", k, e.o.EnvAllow)
		}
		env[k] = s
	}
	timeout := e.o.DefaultTimeout
	if a.TimeoutS > 0 {
		timeout = time.Duration(a.TimeoutS) * time.Second
	}
	if a.TimeoutS > int64(e.o.MaxTimeout/time.Second) {
		return Output{}, argsError("timeout_s %d exceeds the kernel's limit of %d", a.TimeoutS, int64(e.o.MaxTimeout/time.Second))
	}
	if !g.Dir.IsDir {
		return Output{}, argsError("cwd %q is not an existing directory", a.Cwd)
	}
	prof := sandbox.Profile{Env: env, Limits: sandbox.Limits{
		FileSize: e.o.FileSize, Processes: e.o.Processes, Stdout: e.o.MaxOutput, Stderr: e.o.MaxOutput,
		DeltaFiles: e.o.DeltaFiles, DeltaBytes: e.o.DeltaBytes,
	}}
	if left, ok := g.Left[BudgetCPUMillis]; ok {
		if left <= 0 {
			return Output{}, fail(FailBudget, "budget cpu_ms is spent")
		}
		prof.Limits.CPUTime = time.Duration(left) * time.Millisecond
	}
	if left, ok := g.Left[BudgetDiskWriteBytes]; ok && left < prof.Limits.DeltaBytes {
		// A larger delta could not commit anyway; fail it in the sandbox.
		prof.Limits.DeltaBytes = max(left, 0)
		if prof.Limits.DeltaBytes == 0 {
			prof.Limits.DeltaBytes = 1 // 0 would mean the default
		}
	}
	for _, r := range g.Roots {
		prof.Roots = append(prof.Roots, sandbox.Root{Path: r.Path, Writable: r.Writable})
	}
	var proxy *netproxy.Proxy
	switch g.Network {
	case "", NetOff:
		prof.Net = sandbox.NetOff
	case NetFull:
		prof.Net = sandbox.NetFull
	case NetAllowlist:
		budget, limited := g.Left[BudgetNetBytes]
		if limited && budget <= 0 {
			return Output{}, fail(FailBudget, "budget net_bytes is spent")
		}
		dir := e.o.ProxyDir
		if dir == "" || len(dir) > 64 {
			// A unix socket path holds at most 107 bytes.
			dir = os.TempDir()
		}
		sock, err := os.MkdirTemp(dir, "capk-proxy-")
		if err != nil {
			return Output{}, fmt.Errorf("proc.exec: proxy: %w", err)
		}
		defer os.RemoveAll(sock)
		guard := &netproxy.Guard{Explicit: g.NamesHost, Lookup: e.o.Lookup}
		proxy, err = netproxy.Listen(filepath.Join(sock, "proxy.sock"), netproxy.Options{
			Allow: g.AllowsHost, ByteBudget: budget, Dial: guard.DialContext,
		})
		if err != nil {
			return Output{}, fmt.Errorf("proc.exec: proxy: %w", err)
		}
		defer proxy.Close()
		prof.Net, prof.ProxySocket = sandbox.NetAllowlist, proxy.SocketPath()
	default:
		return Output{}, argsError("network %q is not off, allowlist or full", g.Network)
	}
	// The roots are bound at the paths the token names them by.
	cmd := sandbox.Command{Argv: a.Argv, Dir: filepath.Join(g.Dir.RootPath, filepath.FromSlash(g.Dir.Rel)), Timeout: timeout, Gate: c.Gate, Spare: c.After}
	if a.Stdin != nil {
		cmd.Stdin = []byte(*a.Stdin)
	}
	res, err := e.o.Sandbox.Run(ctx, prof, cmd)
	reached := g.Network == NetFull
	if proxy != nil {
		proxy.Close()
		c.Note("net_connections", proxy.Records())
		c.Note("net_connections_dropped", proxy.Dropped())
		c.Charge(BudgetNetBytes, proxy.BytesUsed())
		reached = proxy.Reached()
	}
	out, err := e.finish(ctx, c, g, &a, timeout, res, err, proxy)
	if err != nil && reached {
		return Output{}, reachedFailure(a.Argv[0], g.Network, err)
	}
	return out, err
}

// finish makes proc.exec's result of the sandbox's run res (or its error
// runErr): the failure of a command that did not finish well, or its delta
// staged and its output.
func (e *execSys) finish(ctx context.Context, c *Call, g *Grant, a *execArgs, timeout time.Duration, res *sandbox.Result, runErr error, proxy *netproxy.Proxy) (Output, error) {
	if err := runErr; err != nil {
		if ctx.Err() != nil {
			return Output{}, ctxFailure(ctx, err)
		}
		return Output{}, fmt.Errorf("proc.exec: %w", err)
	}
	// The staging goes once the delta is staged (its content copied into
	// the call's stage): in the background, while the kernel records the
	// call, where it can.
	defer c.Cleanup(func() { res.Close() })
	cpuMS := int64(math.Ceil(float64(res.CPUTime()) / float64(time.Millisecond)))
	c.Charge(BudgetCPUMillis, cpuMS)
	switch {
	case res.TimedOut:
		return Output{}, fail(FailTimeout, "proc.exec %q did not finish within %s: SIGTERM, then SIGKILL after the grace; nothing it wrote is applied", a.Argv[0], timeout)
	case res.Cancelled:
		return Output{}, fail(FailCancelled, "proc.exec %q was cancelled: SIGTERM, then SIGKILL after the grace; nothing it wrote is applied", a.Argv[0])
	case res.LimitExceeded != "":
		return Output{}, fmt.Errorf("proc.exec %q exceeded the %s limit (stopped by the kernel or refused by it); nothing it wrote is applied", a.Argv[0], res.LimitExceeded)
	case proxy != nil && proxy.BudgetExceeded():
		return Output{}, fail(FailBudget, "proc.exec %q exceeded the net_bytes budget; nothing it wrote is applied", a.Argv[0])
	case res.DeltaErr != nil:
		if errors.Is(res.DeltaErr, sandbox.ErrDeltaTooLarge) {
			if _, ok := g.Left[BudgetDiskWriteBytes]; ok {
				return Output{}, fail(FailBudget, "proc.exec %q: %v (disk_write_bytes left: %d); nothing it wrote is applied", a.Argv[0], res.DeltaErr, g.Left[BudgetDiskWriteBytes])
			}
		}
		return Output{}, fmt.Errorf("proc.exec %q: %w; nothing it wrote is applied", a.Argv[0], res.DeltaErr)
	case res.ExitCode != 0 && a.CommitOn == "success":
		return Output{}, fmt.Errorf("proc.exec %q exited with status %d and commit_on is \"success\": nothing it wrote is applied; stderr: %s",
			a.Argv[0], res.ExitCode, tail(res.Stderr, 2048))
	}
	delta, err := stageDelta(c, g, res.Delta)
	if err != nil {
		return Output{}, err
	}
	out := map[string]any{
		"exit_code": res.ExitCode, "stdout_truncated": res.StdoutTruncated, "stderr_truncated": res.StderrTruncated,
		"duration_ms": res.Duration.Milliseconds(), "cpu_ms": cpuMS, "delta": delta, "network": netOr(g.Network),
		"staging": res.Staging.String(),
	}
	if res.Signal != "" {
		out["signal"] = res.Signal
	}
	putText(out, "stdout", res.Stdout)
	putText(out, "stderr", res.Stderr)
	if proxy != nil {
		out["net_bytes"] = proxy.BytesUsed()
	}
	return output(out)
}

// reachedFailure is the failure of a command that had reached the
// network (any connection under the full posture; one the allowlist
// proxy made) and then failed: outcome_unknown, as for a request that was
// sent and then failed (net.fetch), so that its idempotency key keeps the
// outcome and a repeat never runs the command again. Nothing it wrote is
// applied either way.
func reachedFailure(argv0, posture string, err error) *Failure {
	class := "execution_error"
	var f *Failure
	var ae *ArgsError
	switch {
	case errors.As(err, &f):
		class, err = f.Class, errors.New(f.Message)
	case errors.As(err, &ae):
		class = "invalid_args"
	}
	return fail(FailUnknown, "%s: %v; proc.exec %q had reached the network (posture %s), so what it did there may have happened: it will not run again with this idempotency key", class, err, argv0, posture)
}

// stageDelta stages the sandbox's delta through the call's stager, in the
// delta's order (deletions, then directories, then files), each path
// resolved through the token's workspace like any write.
func stageDelta(c *Call, g *Grant, d *sandbox.Delta) ([]DeltaEntry, error) {
	out := []DeltaEntry{}
	if d.Empty() {
		return out, nil
	}
	ts, ok := c.Stage.(TreeStager)
	if !ok {
		return nil, errors.New("proc.exec: the kernel's stager cannot stage a delta")
	}
	for _, ch := range d.Changes {
		access := AccessWrite
		if ch.Kind == sandbox.Deleted {
			access = AccessDelete
		}
		r, err := g.Workspace.resolveAnySize(ch.Path(), access)
		if err != nil {
			return nil, fmt.Errorf("proc.exec: delta entry %s: %w", ch.Path(), err)
		}
		ent := DeltaEntry{Root: r.RootPath, Path: r.Rel}
		switch {
		case ch.Kind == sandbox.Deleted:
			if !r.Exists {
				continue // under a directory deleted already
			}
			ent.Op = "delete"
			err = ts.Delete(r)
		case ch.Type == sandbox.TypeDir:
			if ch.Kind != sandbox.Added {
				continue // permission changes of directories are not applied
			}
			ent.Op, ent.Mode = "mkdir", fmt.Sprintf("0%o", ch.Mode.Perm())
			err = ts.Mkdir(r, ch.Mode)
		case ch.Type == sandbox.TypeFile:
			var f *os.File
			if f, err = os.Open(ch.Source); err != nil {
				return nil, fmt.Errorf("proc.exec: delta entry %s: %w", ch.Path(), err)
			}
			ent.Op, ent.Size, ent.Mode = "write", ch.Size, fmt.Sprintf("0%o", ch.Mode.Perm())
			ent.Hash, err = ts.WriteFrom(r, f, ch.Mode)
			f.Close()
		default:
			return nil, fmt.Errorf("proc.exec: delta entry %s: %s is not staged", ch.Path(), ch.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("proc.exec: staging %s: %w", ch.Path(), err)
		}
		out = append(out, ent)
	}
	return out, nil
}

func netOr(n string) string {
	if n == "" {
		return NetOff
	}
	return n
}

func putText(out map[string]any, key string, b []byte) {
	if utf8.Valid(b) {
		out[key] = string(b)
		return
	}
	out[key+"_base64"] = base64.StdEncoding.EncodeToString(b)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func ctxFailure(ctx context.Context, err error) *Failure {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fail(FailTimeout, "%v", err)
	}
	return fail(FailCancelled, "%v", err)
}

// Budget names, as capability tokens name them.
const (
	BudgetCPUMillis      = captoken.BudgetCPUMillis
	BudgetDiskWriteBytes = captoken.BudgetDiskWriteBytes
	BudgetNetBytes       = captoken.BudgetNetBytes
)

// RegisterExec registers proc.exec with o (defaults filled in).
func RegisterExec(r *Registry, o ExecOptions) error {
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 60 * time.Second
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = 10 * time.Minute
	}
	if o.MaxOutput <= 0 {
		o.MaxOutput = 1 << 20
	}
	if o.FileSize <= 0 {
		o.FileSize = 256 << 20
	}
	if o.DeltaBytes <= 0 {
		o.DeltaBytes = 256 << 20
	}
	return r.Register(func() Syscall { return &execSys{o: &o} })
}
