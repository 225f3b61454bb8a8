package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
)

// policyKernel answers an envelope ok when its policy_hash is the active
// one, policy_mismatch otherwise, and keeps the hashes it was sent.
type policyKernel struct {
	active string
	mu     sync.Mutex
	sent   []string
}

func (k *policyKernel) Invoke(_ context.Context, env []byte) (*kernel.Result, error) {
	var e struct {
		PolicyHash string `json:"policy_hash"`
		Args       json.RawMessage
	}
	if err := json.Unmarshal(env, &e); err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.sent = append(k.sent, e.PolicyHash)
	k.mu.Unlock()
	if e.PolicyHash != k.active {
		return &kernel.Result{Status: kernel.StatusError, Error: &kernel.Error{Class: kernel.ErrPolicyMismatch}}, nil
	}
	return &kernel.Result{Status: kernel.StatusOK, Result: e.Args}, nil
}

func TestPolicyFollower(t *testing.T) {
	for _, tt := range []struct {
		name     string
		active   string // the kernel's policy when the calls come
		fetchErr error
		want     []string // the hashes the kernel is sent, over two calls
		class    string   // the answer to the calls ("" ok)
		notices  int
	}{
		{"unchanged", "p0", nil, []string{"p0", "p0"}, "", 0},
		{"changed: the first call is sent again, the second carries it", "p1", nil, []string{"p0", "p1", "p1"}, "", 1},
		{"the kernel unreachable for the policy: the refusal stands", "p1", errors.New("down"), []string{"p0", "p0"}, kernel.ErrPolicyMismatch, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := &policyKernel{active: tt.active}
			notices := 0
			f := newPolicyFollower(k, "p0", func(context.Context) (string, error) { return k.active, tt.fetchErr },
				func(from, to string) {
					if from != "p0" || to != tt.active {
						t.Errorf("notice %s -> %s", from, to)
					}
					notices++
				})
			for i := range 2 {
				env := []byte(`{"tool_id":"echo","args":{"text":"<a&b>"},"policy_hash":"p0"}`)
				res, err := f.Invoke(context.Background(), env)
				if err != nil {
					t.Fatal(err)
				}
				class := ""
				if res.Error != nil {
					class = res.Error.Class
				} else if string(res.Result) != `{"text":"<a&b>"}` {
					t.Errorf("call %d: args became %s", i, res.Result)
				}
				if class != tt.class {
					t.Errorf("call %d answered %q, want %q", i, class, tt.class)
				}
			}
			if strings.Join(k.sent, " ") != strings.Join(tt.want, " ") {
				t.Errorf("sent %v, want %v", k.sent, tt.want)
			}
			if notices != tt.notices {
				t.Errorf("%d notices, want %d", notices, tt.notices)
			}
		})
	}
}

// Calls racing into a policy change are each answered under the new
// policy, and the change is told once.
func TestPolicyFollowerConcurrent(t *testing.T) {
	k := &policyKernel{active: "p1"}
	var notices atomic.Int32
	f := newPolicyFollower(k, "p0", func(context.Context) (string, error) { return "p1", nil }, func(string, string) { notices.Add(1) })
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			res, err := f.Invoke(context.Background(), []byte(`{"tool_id":"echo","args":{},"policy_hash":"p0"}`))
			if err != nil || res.Status != kernel.StatusOK {
				t.Errorf("%+v, %v", res, err)
			}
		})
	}
	wg.Wait()
	if notices.Load() != 1 {
		t.Errorf("%d notices, want 1", notices.Load())
	}
}

// otherPolicy writes a bundle deciding as the default one does but with
// another policy hash.
func otherPolicy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "policy")
	os.MkdirAll(dir, 0o755)
	for _, f := range []string{"capkernel.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("../../policy/rego", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "capkernel.rego" {
			b = append(b, "\n# the operator's copy\n"...)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	return dir
}

// restartWithPolicy stops sv's serve and starts it again on the same
// address under the bundle in dir.
func restartWithPolicy(t *testing.T, sv *served, dir string) {
	t.Helper()
	sv.stop()
	sv.server = startServerArgs(t, sv.data, "--listen", strings.TrimPrefix(sv.url, "http://"), "--policy", dir)
}

// A running kernelctl mcp and kernelctl run follow the served kernel
// through a restart under another policy: the calls after it run under
// the new policy, where every one was refused policy_mismatch.
func TestAgentsFollowAPolicyChange(t *testing.T) {
	t.Run("mcp", func(t *testing.T) {
		sv := initServed(t)
		tok := mintCLI(t, sv.server, sv.admin, "--agent", "m1", "--tools", "echo")
		cs := mcpSession(t, false, "--server", sv.url, "--token", tok.file)
		ctx := context.Background()
		call := func(text string) *mcp.CallToolResult {
			t.Helper()
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := call("before"); r.IsError {
			t.Fatalf("before the change: %s", text(r))
		}
		restartWithPolicy(t, &sv, otherPolicy(t))
		for _, s := range []string{"after", "after again"} {
			if r := call(s); r.IsError || !strings.Contains(text(r), s) {
				t.Fatalf("%q after the change: %s", s, text(r))
			}
		}
		// The ledger holds the refusal the change caused, then the call
		// under the new policy.
		var list []kernel.ReceiptInfo
		json.Unmarshal([]byte(mustRun(t, "receipts", "list", "--data", sv.data, "--agent", "m1", "--json")), &list)
		var got []string
		for _, r := range list {
			got = append(got, r.Receipt.ErrorClass+"@"+r.Receipt.PolicyHash[:14])
		}
		old, now := list[0].Receipt.PolicyHash, list[len(list)-1].Receipt.PolicyHash
		want := []string{"@" + old[:14], kernel.ErrPolicyMismatch + "@" + now[:14], "@" + now[:14], "@" + now[:14]}
		if old == now || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("receipts of m1: %v, want %v", got, want)
		}
	})
	t.Run("run", func(t *testing.T) {
		sv := initServed(t)
		tok := mintCLI(t, sv.server, sv.admin, "--agent", "r1", "--tools", "echo")
		gate := filepath.Join(sv.dir, "go-on")
		script := `fd=$CAPKERNEL_IPC_FD
printf '%s\n' '{"op":"tool_call","tool_call_id":"c1","tool":"echo","args":{"text":"before"}}' >&$fd
IFS= read -r line <&$fd; echo "$line"
while [ ! -e "$1" ]; do sleep 0.05; done
printf '%s\n' '{"op":"tool_call","tool_call_id":"c2","tool":"echo","args":{"text":"after"}}' >&$fd
IFS= read -r line <&$fd; echo "$line"`
		cmd := exec.Command(kernelctl, "run", "--server", sv.url, "--token", tok.file, "--no-sandbox", "--", "/bin/sh", "-c", script, "agent", gate)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		lines := bufio.NewReader(stdout)
		answer := func(id string) runnerResponse {
			t.Helper()
			line, err := lines.ReadString('\n')
			var r runnerResponse
			if err != nil || json.Unmarshal([]byte(line), &r) != nil || r.ToolCallID != id {
				t.Fatalf("answer to %s: %q %v (stderr %s)", id, line, err, stderr.String())
			}
			return r
		}
		if r := answer("c1"); !r.OK {
			t.Fatalf("c1 before the change: %+v", r)
		}
		restartWithPolicy(t, &sv, otherPolicy(t))
		os.WriteFile(gate, nil, 0o644)
		if r := answer("c2"); !r.OK {
			t.Fatalf("c2 after the change: %+v", r)
		}
		io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("run: %v: %s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "the kernel's policy changed from blake3:") {
			t.Errorf("run told the operator nothing of the change: %s", stderr.String())
		}
	})
}
