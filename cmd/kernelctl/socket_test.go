package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
)

// A soft_gate call through `kernelctl mcp --data DIR` (an in-process
// kernel, a real MCP client) waits for an approval, and kernelctl verbs
// given the same --data reach that kernel through its control socket:
// they list the approval, approve it with an approver token, read the
// receipt. The socket is 0600 while the kernel runs and gone after.
func TestControlSocketApprovesMCPCall(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(ws, 0o755)
	// CAPKERNEL_SERVER in the environment must not pull --data verbs
	// elsewhere (the flag wins).
	t.Setenv("CAPKERNEL_SERVER", "http://127.0.0.1:1")
	tokFile, aliceFile := filepath.Join(dir, "agent.token"), filepath.Join(dir, "alice.token")
	os.WriteFile(tokFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a1", "--tools", "fs.*", "--fs", ws+":rw")), 0o600)
	os.WriteFile(aliceFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "alice", "--approver")), 0o600)

	// No kernel running: the control verbs say so (exit 1), not "use --server".
	if _, stderr, code := run(t, "approvals", "list", "--data", data); code != 1 || !strings.Contains(stderr, "no kernel is running") {
		t.Fatalf("approvals list with no kernel: exit %d %s", code, stderr)
	}

	cs := mcpSession(t, false, "--data", data, "--token", tokFile)
	sock := filepath.Join(data, httpapi.ControlSocket)
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		t.Fatalf("control socket %s: %v %v", sock, fi.Mode(), err)
	}

	type answer struct {
		r   *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fs.write", Arguments: map[string]any{"path": "Makefile", "content": "approved"}})
		done <- answer{r, err}
	}()

	// The pending approval, listed through the socket (no credential).
	var pending []kernel.ApprovalRequest
	for deadline := time.Now().Add(30 * time.Second); len(pending) == 0; {
		if err := json.Unmarshal([]byte(mustRun(t, "approvals", "list", "--data", data, "--json")), &pending); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no pending approval for the gated write")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pending[0].AgentID != "a1" || pending[0].ToolID != "fs.write" {
		t.Fatalf("pending approval %+v", pending[0])
	}
	// Deciding still needs an approver token: the socket's admin
	// authority does not decide calls.
	if _, stderr, code := run(t, "approvals", "approve", pending[0].ID, "--data", data); code != 2 || !strings.Contains(stderr, "--token") {
		t.Fatalf("approve without a token: exit %d %s", code, stderr)
	}
	out := mustRun(t, "approvals", "approve", pending[0].ID, "--token", aliceFile, "--data", data, "--reason", "looks fine")
	if !strings.Contains(out, "allowed by alice") {
		t.Fatalf("approve: %s", out)
	}
	a := <-done
	if a.err != nil || a.r.IsError {
		t.Fatalf("the approved call: %+v %v", a.r, a.err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "Makefile")); string(b) != "approved" {
		t.Fatalf("Makefile %q after approval", b)
	}
	rid := resultMeta(a.r, mcpgateway.MetaReceiptID)
	if out := mustRun(t, "receipts", "show", rid, "--data", data); !strings.Contains(out, "alice") || !strings.Contains(out, "looks fine") {
		t.Fatalf("receipt through the socket lacks the approver:\n%s", out)
	}
	mustRun(t, "ledger", "verify", "--data", data)
	mustRun(t, "token", "revoke", tokenID(t, aliceFile), "--data", data, "--reason", "done")

	// The gateway stops: the socket goes, --data verbs open the dir again.
	cs.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Lstat(sock); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the control socket outlived kernelctl mcp")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The dir is free once the process has exited; ledger verify then
	// opens it read-only.
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, stderr, code := run(t, "ledger", "verify", "--data", data)
		if code == 0 {
			break
		}
		if !strings.Contains(stderr, "locked") || time.Now().After(deadline) {
			t.Fatalf("ledger verify after the gateway stopped: exit %d %s", code, stderr)
		}
	}
}

// A stale socket file left by a kernel that died is replaced by the next
// kernel, and a --data verb ignores it while no kernel runs.
func TestControlSocketStale(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	mustRun(t, "token", "mint", "--data", data, "--agent", "a", "--tools", "echo")
	os.WriteFile(filepath.Join(data, httpapi.ControlSocket), nil, 0o600)
	if out := mustRun(t, "ledger", "head", "--data", data); !strings.Contains(out, "size") {
		t.Fatalf("ledger head beside a stale socket: %s", out)
	}
	s := startServerArgs(t, data)
	out := mustRun(t, "ledger", "head", "--data", data, "--json")
	var h httpapi.Head
	if err := json.Unmarshal([]byte(out), &h); err != nil || h.Size == 0 {
		t.Fatalf("ledger head through the socket: %s %v", out, err)
	}
	_ = s
}

// tokenID reads the jti of the token in file.
func tokenID(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command(kernelctl, "token", "inspect", file, "--data", filepath.Join(filepath.Dir(file), "data"), "--json").Output()
	if err != nil {
		t.Fatalf("token inspect %s: %v", file, err)
	}
	var in httpapi.TokenInspection
	if err := json.Unmarshal(out, &in); err != nil {
		t.Fatal(err)
	}
	return in.Claims.ID
}

// kernelctl call --data DIR of a running kernel goes through the control
// socket with the capability token as the bearer (a request without one
// would act as the admin, whom calls refuse), an --async call too. A call the kernel holds for
// an approval says so on stderr at once, with its operation and approval
// ids, and ends once an approver decides. The demo runs there too.
func TestCallThroughControlSocket(t *testing.T) {
	sv := initServed(t)
	data := sv.server.data
	dir := t.TempDir()
	tokFile, gatedFile, aliceFile := filepath.Join(dir, "a.token"), filepath.Join(dir, "g.token"), filepath.Join(dir, "alice.token")
	os.WriteFile(tokFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a1", "--tools", "echo")), 0o600)
	os.WriteFile(gatedFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a2", "--tools", "echo", "--autonomy", "soft_gate")), 0o600)
	os.WriteFile(aliceFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "alice", "--approver")), 0o600)

	if out := mustRun(t, "call", "echo", "--token", tokFile, "--arg", "text=hi", "--data", data); !strings.HasPrefix(out, "echo ok") {
		t.Fatalf("call over the control socket: %s", out)
	}
	// --async sends the token as the bearer too: it prints the operation
	// id, and wait prints the call's result.
	op := strings.TrimSpace(mustRun(t, "call", "echo", "--token", tokFile, "--arg", "text=later", "--async", "--data", data))
	if out := mustRun(t, "wait", op, "--data", data); !strings.HasPrefix(out, "echo ok") || !strings.Contains(out, "later") {
		t.Fatalf("wait %s over the control socket: %s", op, out)
	}

	cmd, out, _, m := startHeldCall(t, gatedFile, data, `\(soft_gate, needs an approver with role approver; decide by `)
	mustRun(t, "approvals", "approve", m[2], "--token", aliceFile, "--data", data)
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), "echo ok") || !strings.Contains(out.String(), "operation="+m[1]) {
		t.Fatalf("the approved call: %v\n%s", err, out.String())
	}

	// The demo drives the running kernel the same way.
	if demo := mustRun(t, "demo", "--data", data); demoFailed.MatchString(demo) || !strings.Contains(demo, "ledger intact") ||
		!strings.Contains(demo, "through its control socket") {
		t.Fatalf("demo --data of a running kernel:\n%s", demo)
	}
}

// kernelctl call --data DIR of a stopped kernel runs the kernel in its own
// process and serves its control socket while the call runs, so a call held
// for an approval is announced and can be decided from another terminal.
func TestCallHeldOnStoppedDataDir(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	gatedFile, aliceFile := filepath.Join(dir, "g.token"), filepath.Join(dir, "alice.token")
	os.WriteFile(gatedFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a2", "--tools", "echo", "--autonomy", "soft_gate")), 0o600)
	os.WriteFile(aliceFile, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "alice", "--approver")), 0o600)

	cmd, out, stderr, m := startHeldCall(t, gatedFile, data, "")
	mustRun(t, "approvals", "deny", m[2], "--token", aliceFile, "--data", data, "--reason", "not now")
	rest, _ := io.ReadAll(stderr)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), "error approval_denied") ||
		!strings.Contains(string(rest), "approval "+m[2]+": denied by alice") {
		t.Fatalf("the denied call: %v\n%s%s", err, out.String(), rest)
	}
	if _, err := os.Lstat(filepath.Join(data, httpapi.ControlSocket)); !os.IsNotExist(err) {
		t.Errorf("the control socket outlived the call: %v", err)
	}
}

// startHeldCall starts kernelctl call echo under the soft_gate token in
// tokenFile on data and reads its announcement, before anyone decides:
// "operation OP waits for approval ID " followed by more, a regexp. m
// holds the line's match (m[1] the operation, m[2] the approval); the
// call's stdout collects in out, and stderr is the rest of its stderr.
func startHeldCall(t *testing.T, tokenFile, data, more string) (cmd *exec.Cmd, out *strings.Builder, stderr io.Reader, m []string) {
	t.Helper()
	cmd = exec.Command(kernelctl, "call", "echo", "--token", tokenFile, "--arg", "text=held", "--data", data)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	out = &strings.Builder{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 4096)
	n, _ := pipe.Read(line)
	m = regexp.MustCompile(`^operation (\S+) waits for approval (\S+) ` + more).FindStringSubmatch(string(line[:n]))
	if m == nil {
		cmd.Process.Kill()
		t.Fatalf("a held call said %q", line[:n])
	}
	return cmd, out, pipe, m
}
