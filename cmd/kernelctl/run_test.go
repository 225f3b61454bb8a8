package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// runFixture is a data dir, a workspace with notes.txt, and a token
// granting fs.* on it.
type runFixture struct {
	dir, data, ws, token string
}

func newRunFixture(t *testing.T) runFixture {
	t.Helper()
	dir := t.TempDir()
	f := runFixture{dir: dir, data: filepath.Join(dir, "data"), ws: filepath.Join(dir, "ws"), token: filepath.Join(dir, "agent.token")}
	if _, stderr, code := run(t, "init", "--data", f.data); code != 0 {
		t.Fatal(stderr)
	}
	os.MkdirAll(f.ws, 0o755)
	os.WriteFile(filepath.Join(f.ws, "notes.txt"), []byte("the notes\n"), 0o644)
	out, stderr, code := run(t, "token", "mint", "--data", f.data, "--agent", "agent-1", "--tools", "fs.*", "--fs", f.ws+":rw")
	if code != 0 {
		t.Fatal(stderr)
	}
	os.WriteFile(f.token, []byte(out), 0o600)
	return f
}

func requireBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap is required (make test installs it)")
	}
}

// The example agent, sandboxed, reads and writes through the kernel and
// is refused what its token does not grant; every call is in the ledger.
func TestRunExampleAgent(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	agent := filepath.Join(f.dir, "agent")
	if out, err := exec.Command("go", "build", "-o", agent, "../../examples/agent").CombinedOutput(); err != nil {
		t.Fatalf("building the example agent: %v\n%s", err, out)
	}
	out, stderr, code := run(t, "run", "--data", f.data, "--token", f.token, "--", agent)
	if code != 0 {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	for _, want := range []string{"fs.read: ok", `the notes\n`, "fs.write: ok", "proc.exec: refused permission_denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(f.ws, "agent-summary.txt")); err != nil || !strings.Contains(string(b), "notes.txt") {
		t.Fatalf("the agent's write did not land: %q, %v", b, err)
	}
	if out, stderr, code := run(t, "ledger", "verify", "--data", f.data); code != 0 {
		t.Fatalf("ledger verify after the run: %s %s", out, stderr)
	}
	// Three calls, three receipts.
	out, _, _ = run(t, "receipts", "list", "--data", f.data, "--agent", "agent-1")
	if n := strings.Count(out, "fs.read") + strings.Count(out, "fs.write") + strings.Count(out, "proc.exec"); n != 3 {
		t.Fatalf("receipts of the run:\n%s", out)
	}
}

// The sandboxed agent sees neither the token's files nor the network:
// its only way to reach them is the channel.
func TestRunAgentHasNoAmbientAuthority(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	script := `cat "$1"/notes.txt && echo READ-DIRECTLY; ls "$1" >/dev/null 2>&1 && echo LISTED; echo fd=$CAPKERNEL_IPC_FD`
	out, stderr, code := run(t, "run", "--data", f.data, "--token", f.token, "--", "/bin/sh", "-c", script, "agent", f.ws)
	if code != 0 || strings.Contains(out, "READ-DIRECTLY") || strings.Contains(out, "LISTED") || !strings.Contains(out, "fd=6") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
}

// run --ro takes a path relative to the working directory, as every path
// flag does, and binds it read-only at its absolute path.
func TestRunReadOnlyRelative(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	ro := filepath.Join(f.dir, "rodir")
	os.MkdirAll(ro, 0o755)
	os.WriteFile(filepath.Join(ro, "hint.txt"), []byte("read me\n"), 0o644)
	cmd := exec.Command(kernelctl, "run", "--data", f.data, "--token", f.token, "--ro", "./rodir", "--",
		"/bin/sh", "-c", `cat "$1"/hint.txt; echo x > "$1"/hint.txt 2>/dev/null && echo WROTE; true`, "agent", ro)
	cmd.Dir = f.dir
	out, stderr, code := runExec(t, cmd)
	if code != 0 || !strings.Contains(out, "read me") || strings.Contains(out, "WROTE") {
		t.Fatalf("run --ro ./rodir: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
}

// An agent writing garbage, then a good call, then dying by a signal with
// a call in flight: run answers what it can, exits with the agent's
// status, and the kernel's ledger verifies.
func TestRunGarbageAndCrashingAgent(t *testing.T) {
	requireBwrap(t)
	f := newRunFixture(t)
	script := `fd=$CAPKERNEL_IPC_FD
head -c 5000 /dev/urandom >&$fd; printf '\n' >&$fd
printf '%s\n' '{"op":"tool_call","tool_call_id":"good","tool":"fs.read","args":{"path":"notes.txt"}}' >&$fd
while IFS= read -r line <&$fd; do case "$line" in *'"good"'*) echo "$line"; break;; esac; done
printf '%s\n' '{"op":"tool_call","tool_call_id":"last","tool":"fs.list","args":{"path":"."}}' >&$fd
kill -KILL $$`
	out, stderr, code := run(t, "run", "--data", f.data, "--token", f.token, "--", "/bin/sh", "-c", script)
	if code == 0 {
		t.Fatalf("a killed agent: run exited 0\n%s\n%s", out, stderr)
	}
	if !strings.Contains(out, `"ok":true`) || !strings.Contains(out, "the notes") {
		t.Fatalf("the good call after the garbage:\nstdout:\n%s\nstderr:\n%s", out, stderr)
	}
	if out, stderr, code := run(t, "ledger", "verify", "--data", f.data); code != 0 {
		t.Fatalf("ledger verify after the crash: %s %s", out, stderr)
	}
}

// An agent that sends a call and exits without reading the answer leaves
// the channel reset, not closed: run still ends with the agent's status,
// and the call is answered in the ledger.
func TestRunAgentLeavesAnswersUnread(t *testing.T) {
	f := newRunFixture(t)
	script := `printf '%s\n' '{"op":"tool_call","tool_call_id":"u1","tool":"fs.read","args":{"path":"notes.txt"}}' >&$CAPKERNEL_IPC_FD; sleep 1; exit 4`
	for _, mode := range [][]string{{"--no-sandbox"}, nil} {
		if mode == nil {
			requireBwrap(t)
		}
		args := append(append([]string{"run", "--data", f.data, "--token", f.token}, mode...), "--", "/bin/sh", "-c", script)
		if _, stderr, code := run(t, args...); code != 4 {
			t.Fatalf("%v: exit %d, want the agent's 4: %s", mode, code, stderr)
		}
	}
	if out, _, _ := run(t, "receipts", "list", "--data", f.data, "--agent", "agent-1"); strings.Count(out, "fs.read") != 2 {
		t.Fatalf("receipts:\n%s", out)
	}
}

// Without bubblewrap, --no-sandbox runs the agent as a plain child with
// the channel on fd 3, in the user's environment less kernelctl's own
// settings (the admin credential among them).
func TestRunNoSandbox(t *testing.T) {
	f := newRunFixture(t)
	script := `printf '%s\n' '{"op":"tool_call","tool_call_id":"n1","tool":"fs.read","args":{"path":"notes.txt"}}' >&$CAPKERNEL_IPC_FD; head -n 1 <&$CAPKERNEL_IPC_FD; echo fd=$CAPKERNEL_IPC_FD; echo "admin=$CAPKERNEL_ADMIN_TOKEN user=$RUN_TEST_USER"; exit 3`
	cmd := exec.Command(kernelctl, "run", "--data", f.data, "--token", f.token, "--no-sandbox", "--", "/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN=ADMIN-SECRET", "RUN_TEST_USER=kept")
	out, stderr, code := runExec(t, cmd)
	if code != 3 || !strings.Contains(out, `"tool_call_id":"n1","ok":true`) || !strings.Contains(out, "fd=3") || !strings.Contains(out, "admin= user=kept") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
}

// Seed 000 §9 end to end: a shell agent in bubblewrap, through
// `kernelctl run --server`, makes the acceptance list's calls; each
// answer is as listed, the runner survives the failing one, and the
// kernel's event stream shows the calls dispatched and denied.
func TestRunAcceptanceOverServer(t *testing.T) {
	requireBwrap(t)
	sv := initServed(t)
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("the notes\n"), 0o644)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "acceptance", "--tools", "fs.read,echo", "--fs", ws+":r")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	kinds := map[string]int{}
	// Wait for the subscription: a first event of the agent's own proves it.
	go (&httpapi.Client{BaseURL: sv.url, Credential: sv.admin}).Events(ctx, kernel.EventFilter{AgentID: "acceptance"}, func(e kernel.Event) error {
		mu.Lock()
		kinds[e.Kind+" "+e.ToolID]++
		mu.Unlock()
		return nil
	}, nil)
	_, pb := sv.get("/v1/policy", "")
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	json.Unmarshal(pb, &pol)
	probes := 0
	for subscribed := false; !subscribed; {
		if probes++; probes > 200 {
			t.Fatal("the event stream never delivered a probe call's event")
		}
		sv.post(envelope(tok, pol.PolicyHash, "echo", map[string]any{"text": "probe"}, ""))
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		subscribed = kinds["tool.called echo"] > 0
		mu.Unlock()
	}
	mu.Lock()
	echoes := kinds["tool.called echo"]
	mu.Unlock()

	calls := []string{
		`{"op":"tool_call","tool_call_id":"granted","tool":"fs.read","args":{"path":"notes.txt"}}`,
		`{"op":"tool_call","tool_call_id":"denied","tool":"fs.write","args":{"path":"x","content":"x"}}`,
		`{"op":"tool_call","tool_call_id":"unknown","tool":"teleport","args":{}}`,
		`{"op":"tool_call","tool_call_id":"fs","tool":"fs.read","args":{"path":"/etc/hostname"}}`,
		`{"op":"tool_call","tool_call_id":"fails","tool":"fs.read","args":{"path":"missing.txt"}}`,
		`{"op":"tool_call","tool_call_id":"after","tool":"echo","args":{"text":"still serving"}}`,
	}
	script := `fd=$CAPKERNEL_IPC_FD; for c in "$@"; do printf '%s\n' "$c" >&$fd; done; head -n $# <&$fd`
	out, stderr, code := run(t, append([]string{"run", "--server", sv.url, "--token", tok.file, "--", "/bin/sh", "-c", script, "agent"}, calls...)...)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s\n%s", code, out, stderr)
	}
	want := map[string]string{"granted": "", "denied": "permission_denied", "unknown": "tool_not_found", "fs": "scope_denied", "fails": "execution_error", "after": ""}
	got := map[string]runnerResponse{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r runnerResponse
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("agent output line %q: %v", line, err)
		}
		got[r.ToolCallID] = r
	}
	for id, class := range want {
		r, ok := got[id]
		if !ok || r.OK != (class == "") || r.Error != class || r.ReceiptID == "" {
			t.Errorf("%s: %+v, want error %q with a receipt", id, r, class)
		}
	}
	if !strings.Contains(got["granted"].Result, "the notes") {
		t.Errorf("granted read returned %s", got["granted"].Result)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		ok := kinds["tool.called fs.read"] >= 1 && kinds["tool.denied fs.write"] >= 1 && kinds["tool.called echo"] > echoes
		snapshot := fmt.Sprint(kinds)
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events seen: %s", snapshot)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type runnerResponse struct {
	ToolCallID string          `json:"tool_call_id"`
	OK         bool            `json:"ok"`
	RawResult  json.RawMessage `json:"result"`
	Result     string          `json:"-"`
	Error      string          `json:"error"`
	ReceiptID  string          `json:"receipt_id"`
}

func (r *runnerResponse) UnmarshalJSON(b []byte) error {
	type plain runnerResponse
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	r.Result = string(r.RawResult)
	return nil
}
