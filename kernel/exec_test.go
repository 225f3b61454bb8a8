package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/sandbox"
	"github.com/capkernel/capkernel/txn"
)

// execPolicy writes a copy of the default policy bundle whose data.json
// lets EXECUTE and NETWORK calls run on autopilot and allows the full
// network posture, so the sandbox tests reach execution (the default
// bundle soft-gates them, and this kernel has no approval channel yet).
func execPolicy(t testing.TB) func(*Config) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"capkernel.rego", "capkernel_test.rego"} {
		b, err := os.ReadFile(filepath.Join("..", "policy", "rego", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data := `{"capkernel":{"config":{"sensitive_paths":[".git/"],"confirmation":{"default":{"EXECUTE":"auto","NETWORK":"auto"}},"allow_net_full":true}}}`
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(c *Config) { c.PolicyDir = dir }
}

// testLookup resolves every name ending in .test to 127.0.0.1 and
// anything else through the system resolver.
func testLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if strings.HasSuffix(host, ".test") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

func newExecHarness(t testing.TB, cfg ...func(*Config)) *harness {
	t.Helper()
	if err := sandbox.Available(); err != nil {
		t.Fatalf("%v (make test installs it: apt-get install -y bubblewrap)", err)
	}
	opts := append([]func(*Config){execPolicy(t), func(c *Config) { c.NetLookup = testLookup }}, cfg...)
	return newHarness(t, opts...)
}

// execArgs builds proc.exec args.
func execArgs(argv ...string) map[string]any { return map[string]any{"argv": argv} }

func with(m map[string]any, kv ...any) map[string]any {
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

type execResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	DurationMS      int64  `json:"duration_ms"`
	CPUMS           int64  `json:"cpu_ms"`
	Network         string `json:"network"`
	Delta           []struct {
		Op, Root, Path, Hash, Mode string
		Size                       int64
	} `json:"delta"`
}

func decodeExec(t testing.TB, r *Result) execResult {
	t.Helper()
	mustOK(t, r)
	var e execResult
	if err := json.Unmarshal(r.Result, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// snapshot is every entry under root (type, mode, content), to compare a
// tree byte for byte.
func snapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + digest.Sum(b)
		}
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t testing.TB, before, after map[string]string) {
	t.Helper()
	var diff []string
	for k, v := range before {
		if after[k] != v {
			diff = append(diff, fmt.Sprintf("%s: %q -> %q", k, v, after[k]))
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: new %q", k, v))
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("workspace changed:\n%s", strings.Join(diff, "\n"))
	}
}

// loopbackServer serves "hello from <name>" on 127.0.0.1 and returns its port.
func loopbackServer(t testing.TB, name string) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", name)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	return n
}

func TestExecCommitsDelta(t *testing.T) {
	h := newExecHarness(t)
	h.write("in.txt", "hello\n")
	h.write("gone.txt", "bye\n")
	h.write("keep/old.txt", "old\n")
	before := h.headSize()
	r := h.invoke("proc.exec", execArgs("sh", "-c",
		"cat in.txt; echo err >&2; echo new > out.txt; mkdir -p d/e; printf x > d/e/f.txt; echo changed > keep/old.txt; rm gone.txt"), key("commit"))
	e := decodeExec(t, r)
	if e.ExitCode != 0 || e.Stdout != "hello\n" || e.Stderr != "err\n" || r.TxOutcome != Committed || r.CommitDeltaID == "" {
		t.Fatalf("result %+v %+v", r, e)
	}
	if h.read("out.txt") != "new\n" || h.read("d/e/f.txt") != "x" || h.read("keep/old.txt") != "changed\n" {
		t.Fatal("delta not applied")
	}
	if _, err := os.Stat(filepath.Join(h.ws, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("gone.txt still there: %v", err)
	}
	assertNoStaging(t, h.ws)
	// The result's delta names every change with the content's hash.
	got := map[string]string{}
	for _, d := range e.Delta {
		got[d.Op+" "+d.Path] = d.Hash
	}
	want := map[string]string{
		"write out.txt": digest.Sum([]byte("new\n")), "write d/e/f.txt": digest.Sum([]byte("x")),
		"write keep/old.txt": digest.Sum([]byte("changed\n")), "mkdir d": "", "mkdir d/e": "", "delete gone.txt": "",
	}
	for k, v := range want {
		if h, ok := got[k]; !ok || h != v {
			t.Errorf("delta %q: got %q (present %v), want %q; delta %+v", k, h, ok, v, e.Delta)
		}
	}
	if len(got) != len(want) {
		t.Errorf("delta has %d entries, want %d: %+v", len(got), len(want), e.Delta)
	}
	// The ledger's delta is the same, under commit_delta_id, with hashes.
	var delta txn.Delta
	h.k.View(func(tx *bbolt.Tx) error { return json.Unmarshal(txn.GetDelta(tx, r.CommitDeltaID), &delta) })
	hashes := map[string]string{}
	for _, c := range delta.Changes {
		hashes[c.Op+" "+c.Path] = c.NewHash
	}
	for k, v := range want {
		if hashes[k] != v {
			t.Errorf("ledger delta %q: %q, want %q (%+v)", k, hashes[k], v, delta.Changes)
		}
	}
	a := h.audits(before)
	if len(a) != 1 || a[0].TxOutcome != Committed || a[0].CommitDeltaID != r.CommitDeltaID || a[0].PolicyInput.SideEffect != "EXECUTE" {
		t.Fatalf("audit %+v", a)
	}
	// A repeat is replayed, not run again.
	h.write("out.txt", "by hand\n")
	again := h.invoke("proc.exec", execArgs("sh", "-c",
		"cat in.txt; echo err >&2; echo new > out.txt; mkdir -p d/e; printf x > d/e/f.txt; echo changed > keep/old.txt; rm gone.txt"), key("commit"))
	if !again.Replayed || h.read("out.txt") != "by hand\n" {
		t.Fatalf("repeat ran again: %+v", again)
	}
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) > 0 {
		t.Fatalf("replay verify: %v %+v", err, rep)
	}
}

// TestExecRollsBack: every way a call can fail leaves the workspace
// byte-identical.
func TestExecRollsBack(t *testing.T) {
	const script = "echo new > a.txt; mkdir d; echo x > d/f; rm b.txt; "
	tests := []struct {
		name  string
		args  map[string]any
		caps  func(*captoken.Capability)
		class string
	}{
		{"nonzero exit with commit_on success", with(execArgs("sh", "-c", script+"exit 3"), "commit_on", "success"), nil, ErrExecution},
		{"timeout", with(execArgs("sh", "-c", script+"sleep 100"), "timeout_s", 1), nil, ErrTimeout},
		{"disk_write_bytes budget", execArgs("sh", "-c", script+"head -c 5000 /dev/zero > big"),
			func(c *captoken.Capability) { c.Budgets = map[string]int64{"disk_write_bytes": 1000} }, ErrBudgetExceeded},
		{"cpu_ms budget spent", execArgs("sh", "-c", script),
			func(c *captoken.Capability) { c.Budgets = map[string]int64{"cpu_ms": 0} }, ErrBudgetExceeded},
		{"symlink in the delta", execArgs("sh", "-c", script+"ln -s /etc/passwd link"), nil, ErrExecution},
		{"precondition", with(execArgs("sh", "-c", script), "cwd", "."), nil, ErrPreconditionFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t)
			h.write("a.txt", "old\n")
			h.write("b.txt", "b\n")
			cp := captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}}
			if tc.caps != nil {
				tc.caps(&cp)
			}
			h.token, h.jti = h.mint(h.agent, cp)
			mods := []func(*Envelope){key("k")}
			if tc.class == ErrPreconditionFailed {
				mods = append(mods, func(e *Envelope) {
					e.PreconditionRefs = []txn.Precondition{{Ref: "fs:a.txt", Hash: digest.Sum([]byte("not the content"))}}
				})
			}
			snap := snapshot(t, h.ws)
			start := time.Now()
			r := h.invoke("proc.exec", tc.args, mods...)
			if errClass(r) != tc.class || r.TxOutcome == Committed {
				t.Fatalf("class %q outcome %s (%+v), want %s", errClass(r), r.TxOutcome, r.Error, tc.class)
			}
			if tc.class == ErrTimeout && time.Since(start) > 1*time.Second+3*time.Second+2*time.Second {
				t.Fatalf("timeout took %s: SIGTERM at 1 s, SIGKILL 3 s later", time.Since(start))
			}
			sameTree(t, snap, snapshot(t, h.ws))
			entries, _ := os.ReadDir(h.k.cfg.SandboxDir)
			for _, e := range entries {
				if !strings.HasPrefix(e.Name(), "capsandbox-etc-") {
					t.Errorf("sandbox staging left behind: %s", e.Name())
				}
			}
		})
	}
}

func TestExecIsolation(t *testing.T) {
	h := newExecHarness(t)
	dir := filepath.Dir(h.ws)
	home := filepath.Join(dir, "home")
	ro := filepath.Join(dir, "ro")
	for _, d := range []string{filepath.Join(home, ".ssh"), ro} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "-----BEGIN FAKE PRIVATE KEY-----"
	os.WriteFile(filepath.Join(home, ".ssh", "id_rsa"), []byte(secret), 0o644)
	os.WriteFile(filepath.Join(home, ".env"), []byte("TOKEN=secret"), 0o644)
	os.WriteFile(filepath.Join(ro, "f.txt"), []byte("ro"), 0o644)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}, {Path: home, Mode: "rw"}, {Path: ro, Mode: "r"}}})
	port := loopbackServer(t, "host")
	snapRO, snapHome := snapshot(t, ro), snapshot(t, home)
	tests := []struct {
		name string
		argv []string
		leak string // must not appear in stdout
		// lands in the sandbox's private /tmp (the roots' parents are made
		// there): it may succeed, but nothing reaches the host
		private bool
	}{
		{"fake ssh key in a root", []string{"cat", filepath.Join(home, ".ssh", "id_rsa")}, secret, false},
		{".env in a root", []string{"cat", filepath.Join(home, ".env")}, "TOKEN", false},
		{"/etc/shadow", []string{"cat", "/etc/shadow"}, "root:", false},
		{"write to a read-only root", []string{"sh", "-c", "echo x > " + filepath.Join(ro, "f.txt")}, "", false},
		{"write outside every root", []string{"sh", "-c", "echo x > " + filepath.Join(dir, "outside.txt")}, "", true},
		{"write to /usr", []string{"sh", "-c", "echo x > /usr/evil"}, "", false},
		{"host home is not there", []string{"ls", "/root"}, "", false},
		{"network off: connect refused", []string{"curl", "-sS", "--max-time", "5", "http://127.0.0.1:" + strconv.Itoa(port) + "/"}, "hello", false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.invoke("proc.exec", execArgs(tc.argv...), key(fmt.Sprint("iso", i)))
			e := decodeExec(t, r)
			if e.ExitCode == 0 && !tc.private {
				t.Fatalf("%v succeeded: %+v", tc.argv, e)
			}
			if tc.name == "network off: connect refused" && !strings.Contains(e.Stderr, "onnect") {
				t.Fatalf("network off: %q", e.Stderr)
			}
			if tc.leak != "" && strings.Contains(e.Stdout, tc.leak) {
				t.Fatalf("leaked: %q", e.Stdout)
			}
			if len(e.Delta) != 0 {
				t.Fatalf("delta %+v", e.Delta)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "outside.txt")); !os.IsNotExist(err) {
		t.Fatal("wrote outside the roots")
	}
	sameTree(t, snapRO, snapshot(t, ro))
	sameTree(t, snapHome, snapshot(t, home))
	// A cwd outside the roots never runs.
	r := h.invoke("proc.exec", with(execArgs("true"), "cwd", dir), key("cwd"))
	if errClass(r) != ErrScopeDenied {
		t.Fatalf("cwd outside: %+v", r.Error)
	}
	// A secret directory as cwd is the policy's no_go.
	r = h.invoke("proc.exec", with(execArgs("true"), "cwd", filepath.Join(home, ".ssh")), key("cwd2"))
	if errClass(r) != ErrPolicyDenied {
		t.Fatalf("cwd in .ssh: %+v", r.Error)
	}
}

func TestExecEnvAllowlist(t *testing.T) {
	h := newExecHarness(t, func(c *Config) { c.ExecEnvAllow = []string{"GREETING"} })
	e := decodeExec(t, h.invoke("proc.exec", with(execArgs("sh", "-c", "echo $GREETING; env | sort"), "env", map[string]any{"GREETING": "hi"}), key("e1")))
	if !strings.HasPrefix(e.Stdout, "hi\n") || strings.Contains(e.Stdout, "CAPK") || strings.Contains(e.Stdout, "GOEXPERIMENT") {
		t.Fatalf("environment %q", e.Stdout)
	}
	r := h.invoke("proc.exec", with(execArgs("true"), "env", map[string]any{"LD_PRELOAD": "/x.so"}), key("e2"))
	if errClass(r) != ErrInvalidArgs || !strings.Contains(r.Error.Message, "exec_env_allow") {
		t.Fatalf("disallowed env: %+v", r.Error)
	}
	if errClass(h.invoke("proc.exec", execArgs("true"))) != ErrIdempotencyKeyRequired {
		t.Fatal("proc.exec without a key")
	}
}

func TestExecLimits(t *testing.T) {
	h := newExecHarness(t, func(c *Config) { c.ExecMaxOutput = 64 << 10; c.ExecProcesses = 64 })
	t.Run("runaway output", func(t *testing.T) {
		e := decodeExec(t, h.invoke("proc.exec", execArgs("sh", "-c", "head -c 50000000 /dev/zero | tr '\\0' a; head -c 200000 /dev/zero | tr '\\0' b >&2"), key("out")))
		if len(e.Stdout) != 64<<10 || !e.StdoutTruncated || len(e.Stderr) != 64<<10 || !e.StderrTruncated {
			t.Fatalf("stdout %d truncated %v, stderr %d truncated %v", len(e.Stdout), e.StdoutTruncated, len(e.Stderr), e.StderrTruncated)
		}
	})
	t.Run("fork bomb", func(t *testing.T) {
		start := time.Now()
		r := h.invoke("proc.exec", with(execArgs("sh", "-c", "b() { b | b & }; b; sleep 30"), "timeout_s", 20), key("bomb"))
		if r.Status == StatusOK || time.Since(start) > 15*time.Second {
			t.Fatalf("fork bomb: %s after %s (%+v)", r.Status, time.Since(start), r.Error)
		}
		if !strings.Contains(r.Error.Message, "processes") {
			t.Fatalf("fork bomb: %+v", r.Error)
		}
	})
	t.Run("sleep 100 dies within the grace", func(t *testing.T) {
		// The sleep's argument names this test process: copies of the
		// test running in parallel sleep on other arguments.
		marker := fmt.Sprintf("100.5%07d", os.Getpid())
		start := time.Now()
		r := h.invoke("proc.exec", with(execArgs("sleep", marker), "timeout_s", 1), key("sleep"))
		if errClass(r) != ErrTimeout || r.TxOutcome != RolledBack {
			t.Fatalf("%+v", r)
		}
		// What shows the kill is that the call did not wait for the
		// sleep's 100 s (and that no sleep is left); a tighter wall-clock
		// bound would only measure the machine's load.
		if d := time.Since(start); d >= 100*time.Second {
			t.Fatalf("took %s: waited for the sleep", d)
		}
		if pids := procsWith(marker); len(pids) > 0 {
			t.Fatalf("sleep survived: %v", pids)
		}
	})
	t.Run("cancellation", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		marker := fmt.Sprintf("100.7%07d", os.Getpid())
		start := time.Now()
		r := h.k.Invoke(ctx, h.env("proc.exec", execArgs("sh", "-c", "echo x > c.txt; exec sleep "+marker), key("cancel")))
		// Returning before the sleep's 100 s shows the cancellation
		// killed it rather than waited for it.
		if c := errClass(r); (c != ErrCancelled && c != ErrTimeout) || r.TxOutcome != RolledBack || time.Since(start) >= 100*time.Second {
			t.Fatalf("%s after %s: %+v", c, time.Since(start), r)
		}
		if pids := procsWith(marker); len(pids) > 0 {
			t.Fatalf("sleep survived: %v", pids)
		}
		if _, err := os.Stat(filepath.Join(h.ws, "c.txt")); !os.IsNotExist(err) {
			t.Fatal("cancelled call's write applied")
		}
	})
}

// procsWith lists the pids whose command line contains s.
func procsWith(s string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) && !strings.Contains(string(b), "-test.") {
			out = append(out, pid)
		}
	}
	return out
}

func TestExecNetworkAllowlist(t *testing.T) {
	h := newExecHarness(t)
	port := loopbackServer(t, "allowed")
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Net: []string{"allowed.test"}})
	url := func(host string) string { return fmt.Sprintf("http://%s:%d/", host, port) }
	before := h.headSize()
	e := decodeExec(t, h.invoke("proc.exec", with(execArgs("sh", "-c",
		"curl -sS --max-time 10 "+url("allowed.test")+"; echo; curl -s --max-time 10 -o /dev/null -w '%{http_code}' "+url("denied.test")),
		"network", "allowlist"), key("net")))
	if e.Stdout != "hello from allowed\n403" || e.Network != "allowlist" {
		t.Fatalf("stdout %q stderr %q", e.Stdout, e.Stderr)
	}
	a := h.audits(before)
	if len(a) != 1 {
		t.Fatalf("%d audit records", len(a))
	}
	var recs []struct {
		Host      string `json:"host"`
		Port      int    `json:"port"`
		Allowed   bool   `json:"allowed"`
		BytesDown int64  `json:"bytes_down"`
	}
	if err := json.Unmarshal(a[0].Notes["net_connections"], &recs); err != nil {
		t.Fatalf("notes %s: %v", a[0].Notes, err)
	}
	if len(recs) != 2 || recs[0].Host != "allowed.test" || !recs[0].Allowed || recs[0].BytesDown == 0 || recs[1].Host != "denied.test" || recs[1].Allowed {
		t.Fatalf("connections %+v", recs)
	}
	var used map[string]int64
	h.k.View(func(tx *bbolt.Tx) error {
		used, _ = txn.Remaining(tx, []txn.Account{{TokenID: h.jti, Limits: txn.Usage{"net_bytes": 1 << 40, "cpu_ms": 1 << 40}}})
		return nil
	})
	if used["net_bytes"] == 1<<40 || used["cpu_ms"] == 1<<40 {
		t.Fatalf("net_bytes and cpu_ms not charged: %v", used)
	}
	// A net_bytes budget smaller than the response cuts the connection
	// and fails the call.
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Net: []string{"allowed.test"}, Budgets: map[string]int64{"net_bytes": 40}})
	// The command had connected, so the call's outcome is unknown (its
	// key settled), the budget named.
	r := h.invoke("proc.exec", with(execArgs("curl", "-sS", "--max-time", "10", url("allowed.test")), "network", "allowlist"), key("net2"))
	if errClass(r) != ErrOutcomeUnknown || !strings.HasPrefix(r.Error.Message, ErrBudgetExceeded+": ") {
		t.Fatalf("over budget: %+v", r.Error)
	}
	// Without net patterns there is no allowlist.
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	if errClass(h.invoke("proc.exec", with(execArgs("true"), "network", "allowlist"), key("net3"))) != ErrScopeDenied {
		t.Fatal("allowlist without net patterns")
	}
}

// TestExecNetworkSettlesKey: a command that reached the network and then
// failed may have acted there, so its call ends outcome_unknown with its
// key settled (a repeat never runs it again) and nothing it wrote
// applied; one that reached nothing fails as usual, its key free.
func TestExecNetworkSettlesKey(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "charged")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	charge := "curl -sS --max-time 10 http://allowed.test:" + port + "/ >/dev/null; "
	for _, tc := range []struct {
		name, network, script string
		net                   []string
		hits                  int32
		class                 string
	}{
		{"allowlist, connected", "allowlist", charge + "echo x > f.txt; exit 3", []string{"allowed.test"}, 1, ErrOutcomeUnknown},
		{"allowlist, connection refused by the proxy", "allowlist", "curl -s --max-time 10 http://denied.test:" + port + "/; echo x > f.txt; exit 3", []string{"allowed.test"}, 0, ErrExecution},
		{"allowlist, nothing reached", "allowlist", "echo x > f.txt; exit 3", []string{"allowed.test"}, 0, ErrExecution},
		{"full", "full", "echo x > f.txt; exit 3", []string{"*"}, 0, ErrOutcomeUnknown},
		{"off", "off", "echo x > f.txt; exit 3", nil, 0, ErrExecution},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			h := newExecHarness(t)
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
				FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Net: tc.net})
			args := with(execArgs("sh", "-c", tc.script), "network", tc.network, "commit_on", "success")
			first := h.invoke("proc.exec", args, key("pay"))
			if errClass(first) != tc.class || first.TxOutcome != RolledBack {
				t.Fatalf("first: %s %s %+v", errClass(first), first.TxOutcome, first.Error)
			}
			if tc.class == ErrOutcomeUnknown && !strings.HasPrefix(first.Error.Message, ErrExecution+": ") {
				t.Fatalf("the message does not name the failure: %s", first.Error.Message)
			}
			if _, err := os.Stat(filepath.Join(h.ws, "f.txt")); !os.IsNotExist(err) {
				t.Fatalf("a failed command's write was applied: %v", err)
			}
			again := h.invoke("proc.exec", args, key("pay"))
			settled := tc.class == ErrOutcomeUnknown
			if errClass(again) != tc.class || again.Replayed != settled || (again.OperationID == first.OperationID) != settled {
				t.Fatalf("repeat: %s replayed %v, first %s: %+v", errClass(again), again.Replayed, first.OperationID, again)
			}
			if n := hits.Load(); n != tc.hits {
				t.Fatalf("the server was called %d times, want %d", n, tc.hits)
			}
			if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) > 0 {
				t.Fatalf("replay verify: %v %+v", err, rep)
			}
		})
	}
}

func TestExecNetworkFull(t *testing.T) {
	port := loopbackServer(t, "host")
	argv := execArgs("curl", "-sS", "--max-time", "10", "http://127.0.0.1:"+strconv.Itoa(port)+"/")
	full := with(argv, "network", "full")
	tests := []struct {
		name   string
		net    []string
		policy bool // the test policy (allow_net_full) rather than one without it
		class  string
	}{
		{"star and policy", []string{"*"}, true, ""},
		{"no star", []string{"127.0.0.1"}, true, ErrScopeDenied},
		{"policy does not allow", []string{"*"}, false, ErrPolicyDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h *harness
			if tc.policy {
				h = newExecHarness(t)
			} else {
				h = newExecHarness(t, func(c *Config) {
					dir := t.TempDir()
					for _, f := range []string{"capkernel.rego"} {
						b, _ := os.ReadFile(filepath.Join("..", "policy", "rego", f))
						os.WriteFile(filepath.Join(dir, f), b, 0o644)
					}
					os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"capkernel":{"config":{"sensitive_paths":[],"confirmation":{"default":{"EXECUTE":"auto"}}}}}`), 0o644)
					c.PolicyDir = dir
				})
			}
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Net: tc.net})
			r := h.invoke("proc.exec", full, key("full"))
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if tc.class == "" {
				if e := decodeExec(t, r); e.Stdout != "hello from host" || e.Network != "full" {
					t.Fatalf("%+v", e)
				}
			}
		})
	}
}

func TestExecWithoutBwrap(t *testing.T) {
	h := newExecHarness(t, func(c *Config) { c.Bwrap = "/nonexistent/bwrap" })
	h.write("a.txt", "a")
	snap := snapshot(t, h.ws)
	r := h.invoke("proc.exec", execArgs("sh", "-c", "echo x > a.txt"), key("nobwrap"))
	if errClass(r) != ErrExecution || !strings.Contains(r.Error.Message, "sandbox unavailable: install bubblewrap") || r.TxOutcome != RolledBack {
		t.Fatalf("%+v", r)
	}
	sameTree(t, snap, snapshot(t, h.ws))
}

func TestExecCommitOn(t *testing.T) {
	tests := []struct {
		commitOn string
		exit     int
		applied  bool
	}{
		{"", 0, true},
		{"", 1, true},
		{"always", 2, true},
		{"success", 0, true},
		{"success", 1, false},
	}
	h := newExecHarness(t)
	for i, tc := range tests {
		t.Run(fmt.Sprintf("%q exit %d", tc.commitOn, tc.exit), func(t *testing.T) {
			name := fmt.Sprintf("f%d.txt", i)
			args := execArgs("sh", "-c", fmt.Sprintf("echo %d > %s; exit %d", i, name, tc.exit))
			if tc.commitOn != "" {
				args["commit_on"] = tc.commitOn
			}
			r := h.invoke("proc.exec", args, key(name))
			_, err := os.Stat(filepath.Join(h.ws, name))
			if applied := err == nil; applied != tc.applied || (r.TxOutcome == Committed) != tc.applied {
				t.Fatalf("applied %v, outcome %s (%+v)", applied, r.TxOutcome, r.Error)
			}
			if tc.applied {
				if e := decodeExec(t, r); e.ExitCode != tc.exit {
					t.Fatalf("exit %d", e.ExitCode)
				}
			} else if errClass(r) != ErrExecution || !strings.Contains(r.Error.Message, fmt.Sprintf("status %d", tc.exit)) {
				t.Fatalf("%+v", r.Error)
			}
		})
	}
}

// TestExecCwd: cwd is resolved in the roots and the command runs there,
// also when the token names its root through a symlink.
func TestExecCwd(t *testing.T) {
	h := newExecHarness(t)
	link := filepath.Join(filepath.Dir(h.ws), "link")
	if err := os.Symlink(h.ws, link); err != nil {
		t.Fatal(err)
	}
	h.write("sub/keep", "")
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: link, Mode: "rw"}}})
	tests := []struct{ cwd, want string }{
		{"", link},
		{".", link},
		{"sub", filepath.Join(link, "sub")},
		{filepath.Join(link, "sub"), filepath.Join(link, "sub")},
	}
	for i, tc := range tests {
		args := execArgs("sh", "-c", fmt.Sprintf("pwd; echo %d > out%d", i, i))
		if tc.cwd != "" {
			args["cwd"] = tc.cwd
		}
		e := decodeExec(t, h.invoke("proc.exec", args, key(fmt.Sprint("cwd", i))))
		if e.Stdout != tc.want+"\n" {
			t.Fatalf("cwd %q: pwd %q, want %q", tc.cwd, e.Stdout, tc.want)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(tc.want, link), "/")
		if got := h.read(filepath.Join(rel, fmt.Sprint("out", i))); got != fmt.Sprintf("%d\n", i) {
			t.Fatalf("cwd %q: out%d = %q", tc.cwd, i, got)
		}
	}
	if r := h.invoke("proc.exec", with(execArgs("true"), "cwd", "missing"), key("cwd-missing")); errClass(r) != ErrInvalidArgs {
		t.Fatalf("missing cwd: %+v", r.Error)
	}
}

// TestExecCPUBudget: RLIMIT_CPU comes from what is left of cpu_ms, and the
// CPU time used is charged: a busy loop is stopped by the limit, and the
// call, over budget, is rolled back.
func TestExecCPUBudget(t *testing.T) {
	h := newExecHarness(t)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Budgets: map[string]int64{"cpu_ms": 1500}})
	snap := snapshot(t, h.ws)
	start := time.Now()
	r := h.invoke("proc.exec", with(execArgs("sh", "-c", "echo x > spin.txt; while :; do :; done"), "timeout_s", 30), key("spin"))
	if errClass(r) != ErrBudgetExceeded || r.TxOutcome != RolledBack {
		t.Fatalf("%+v", r.Error)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the busy loop ran %s", d)
	}
	sameTree(t, snap, snapshot(t, h.ws))
	var left txn.Usage
	h.k.View(func(tx *bbolt.Tx) error {
		left, _ = txn.Remaining(tx, []txn.Account{{TokenID: h.jti, Limits: txn.Usage{"cpu_ms": 1500}}})
		return nil
	})
	if left["cpu_ms"] != 0 {
		t.Fatalf("cpu_ms left %d: the CPU time was not charged", left["cpu_ms"])
	}
	if r := h.invoke("proc.exec", execArgs("true"), key("after")); errClass(r) != ErrBudgetExceeded {
		t.Fatalf("with the budget spent: %+v", r.Error)
	}
}

// TestExecReplacesPaths: a command may replace a directory with a file or
// a file with a directory at the same path in one call; the delta applies
// whole (it used to fail resolving d/y under the file d).
func TestExecReplacesPaths(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		setup        map[string]string // path -> content; "" a directory
		want         map[string]string // path -> content after, "" a directory
	}{
		{"directory to file", "rm -r d && echo new > d", map[string]string{"d": "", "d/old.txt": "old"}, map[string]string{"d": "new\n"}},
		{"file to directory", "rm d && mkdir d && echo new > d/y", map[string]string{"d": "old"}, map[string]string{"d": "", "d/y": "new\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t)
			for p, c := range tc.setup {
				if c == "" {
					os.MkdirAll(filepath.Join(h.ws, p), 0o755)
				} else {
					h.write(p, c)
				}
			}
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			// Deleting a directory is escalated (docs/policy.md), for a
			// command's delta too: the call asks for that mode, and an
			// escalation approver allows it before it runs.
			a, res := h.gated("proc.exec", execArgs("sh", "-c", tc.script), key("replace"), func(e *Envelope) { e.AutonomyMode = policy.Escalated })
			if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleEscalation), "allow", "replace it"); err != nil {
				t.Fatal(err)
			}
			r := <-res
			mustOK(t, r)
			if r.TxOutcome != Committed {
				t.Fatalf("outcome %s", r.TxOutcome)
			}
			for p, c := range tc.want {
				fi, err := os.Stat(filepath.Join(h.ws, p))
				if err != nil {
					t.Fatal(err)
				}
				if c == "" && !fi.IsDir() || c != "" && h.read(p) != c {
					t.Fatalf("%s after the call: dir %v, content %q; want %q", p, fi.IsDir(), h.read(p), c)
				}
			}
		})
	}
}

// TestExecDeltaDecided: what a command changed is decided by the policy
// before it commits, as if each path were written or deleted by its own
// call: a secret is refused whatever the mode, a sensitive path needs an
// approved call, a deleted directory an escalated one; refused, nothing
// of the command's changes is applied.
func TestExecDeltaDecided(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		mode         string // the call's requested mode: "" (autopilot under the test policy), soft_gate, escalated
		class        string
	}{
		{"a plain write", "echo x > out.txt", "", ""},
		{"a new .env file", "mkdir -p sub && echo SECRET=1 > sub/.env.local", "", ErrPolicyDenied},
		{"a new key", "mkdir -p keys && echo k > keys/new.pem", "soft_gate", ErrPolicyDenied},
		{"a git hook under autopilot", "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit", "", ErrPolicyDenied},
		{"a git hook, approved", "mkdir -p .git/hooks && echo hook > .git/hooks/pre-commit", "soft_gate", ""},
		{"a deleted directory under soft_gate", "rm -r build && echo x > out.txt", "soft_gate", ErrPolicyDenied},
		{"a deleted directory, escalated", "rm -r build", "escalated", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t)
			h.write("build/old.o", "o")
			os.MkdirAll(filepath.Join(h.ws, ".git"), 0o755)
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			before := snapshot(t, h.ws)
			args := execArgs("sh", "-c", tc.script)
			var r *Result
			if tc.mode == "" {
				r = h.invoke("proc.exec", args, key("d"))
			} else {
				role := captoken.RoleApprover
				if tc.mode == policy.Escalated {
					role = captoken.RoleEscalation
				}
				a, res := h.gated("proc.exec", args, key("d"), func(e *Envelope) { e.AutonomyMode = tc.mode })
				if _, err := h.k.Decide(a.ID, h.approver("carol", role), "allow", "ok"); err != nil {
					t.Fatal(err)
				}
				r = <-res
			}
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if tc.class == "" {
				if r.TxOutcome != Committed {
					t.Fatalf("outcome %s", r.TxOutcome)
				}
				return
			}
			if r.TxOutcome != RolledBack || !strings.Contains(r.Error.Message, "nothing of them is applied") {
				t.Fatalf("refused: outcome %s, %s", r.TxOutcome, r.Error.Message)
			}
			sameTree(t, before, snapshot(t, h.ws))
		})
	}
}

// TestExecDeltaNotSessionConfirmed: a proc.exec the session's user
// confirmed (the policy lets EXECUTE be) may not write under a sensitive
// path, which the policy keeps for an approver (docs/policy.md, Session
// confirmation), as it would for fs.write; a plain write commits.
func TestExecDeltaNotSessionConfirmed(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "policy", "rego", "capkernel.rego"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "capkernel.rego"), b, 0o644)
	os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"capkernel":{"config":{"sensitive_paths":[".git/"],"confirmation":{"default":{"EXECUTE":"prompt"},"session":{"EXECUTE":true}}}}}`), 0o644)
	for _, tc := range []struct {
		name, script, class string
	}{
		{"a git hook", "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit", ErrPolicyDenied},
		{"a plain write", "echo x > out.txt", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t, func(c *Config) { c.PolicyDir = dir })
			os.MkdirAll(filepath.Join(h.ws, ".git"), 0o755)
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			before := snapshot(t, h.ws)
			a, res := h.gated("proc.exec", execArgs("sh", "-c", tc.script), key("s"), session("sess-1"))
			if !a.SessionConfirm {
				t.Fatalf("the call may not be confirmed in its session: %+v", a)
			}
			if _, err := h.k.ConfirmInSession(a.ID, h.token, "sess-1", "allow", "ok"); err != nil {
				t.Fatal(err)
			}
			r := <-res
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if tc.class != "" {
				sameTree(t, before, snapshot(t, h.ws))
			}
		})
	}
}

// A descriptor the kernel's process inherited open reaches no command:
// the sandbox marks them close-on-exec (a command wrote through one to a
// file outside its roots: found by review). The kernel runs in a child
// process that inherits fd 20 open, as from a shell's redirection (fds
// 0–9 the chain's own start reassigns).
func TestExecInheritsNoDescriptor(t *testing.T) {
	if os.Getenv("CAPK_INHERITED_FD") != "" {
		h := newExecHarness(t)
		h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
		r := h.invoke("proc.exec", execArgs("sh", "-c", "echo escaped > /proc/self/fd/20"), key("fd"))
		t.Logf("the command: %+v", r.Error)
		return
	}
	outside := filepath.Join(t.TempDir(), "outside.txt")
	f, err := os.Create(outside)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExecInheritsNoDescriptor$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPK_INHERITED_FD=1")
	cmd.ExtraFiles = make([]*os.File, 18) // fd 3+i in the child
	cmd.ExtraFiles[17] = f                // fd 20, inherited open
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(outside); len(b) != 0 {
		t.Fatalf("the command wrote %q through the kernel's inherited descriptor", b)
	}
}

// A command that deletes a directory holding a path hidden from it (a
// .env, a .ssh directory: each covered in the sandbox) is refused whole:
// applying the deletion would take the hidden path along (renaming such a
// directory and removing it deleted the host's .env and keys: found by
// review). Deleting around them (the hidden mounts stay, busy) commits
// what was deleted and leaves them.
func TestExecKeepsHiddenPaths(t *testing.T) {
	for _, tc := range []struct {
		script  string
		refused bool
	}{{"mv sub subX && rm -rf subX", true}, {"rm -rf sub", false}} {
		t.Run(tc.script, func(t *testing.T) {
			h := newExecHarness(t)
			h.write("sub/.env", "SECRET=1")
			h.write("sub/.ssh/id_rsa", "KEY")
			h.write("sub/notes.txt", "n")
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			r := h.invoke("proc.exec", execArgs("sh", "-c", tc.script), key("del"))
			if tc.refused && (r.TxOutcome == Committed || h.read("sub/notes.txt") != "n") {
				t.Fatalf("not refused whole: %+v", r)
			}
			if h.read("sub/.env") != "SECRET=1" || h.read("sub/.ssh/id_rsa") != "KEY" {
				t.Fatalf("a hidden path changed (%+v)", r.Error)
			}
		})
	}
}

// A kernel opened on a relative data dir (kernelctl serve --data D, as
// README allows) runs proc.exec: the sandbox's dirs under it are made
// absolute at Open, where bwrap, which changes its root, could not find a
// relative one.
func TestRelativeDataDir(t *testing.T) {
	h := newExecHarness(t, func(c *Config) {
		t.Chdir(filepath.Dir(c.DataDir))
		c.DataDir = filepath.Base(c.DataDir)
	})
	if !filepath.IsAbs(h.k.cfg.DataDir) || !filepath.IsAbs(h.k.cfg.SandboxDir) {
		t.Fatalf("data dir %q, sandbox dir %q: not absolute", h.k.cfg.DataDir, h.k.cfg.SandboxDir)
	}
	mustOK(t, h.invoke("proc.exec", with(execArgs("sh", "-c", "echo hi > made.txt"), "commit_on", "success"), key("rel")))
	if got := h.read("made.txt"); got != "hi\n" {
		t.Fatalf("made.txt = %q", got)
	}
}
