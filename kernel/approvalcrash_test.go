package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// TestApprovedCrashChild is the child of TestRecoveredCallKeepsApproval:
// it approves a gated write as alice, then dies at the crash point
// "staged", after the call was prepared.
func TestApprovedCrashChild(t *testing.T) {
	data := os.Getenv("CAPK_APPROVED_DATA")
	if data == "" {
		t.Skip("run by TestRecoveredCallKeepsApproval")
	}
	k, err := Open(context.Background(), Config{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	var env Envelope
	if err := json.Unmarshal([]byte(os.Getenv("CAPK_ENVELOPE")), &env); err != nil {
		t.Fatal(err)
	}
	crashHook = func(p string) {
		if p == "staged" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	go k.Invoke(context.Background(), &env)
	alice, err := k.Mint(TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if l := k.Approvals(false); len(l) > 0 {
			if _, err := k.Decide(l[0].ID, alice.Token, "allow", "reviewed by alice"); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Minute)
	t.Fatal("survived the crash point")
}

// TestRecoveredCallKeepsApproval: the record crash recovery writes for an
// approved call that was prepared names its approval (id, state, who,
// why) and the policy it was decided under, not the one the restart
// loaded (rev10-approve F4).
func TestRecoveredCallKeepsApproval(t *testing.T) {
	h := newHarness(t)
	env := Envelope{ToolID: "fs.write", Args: json.RawMessage(`{"path":"notes.txt","content":"new"}`), AgentID: h.agent,
		CapabilityToken: h.token, CapabilityTokenID: h.jti, IdempotencyKey: "k", OperationID: newID(), AutonomyMode: "soft_gate", PolicyHash: h.k.PolicyHash()}
	b, _ := json.Marshal(env)
	h.k.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestApprovedCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPK_APPROVED_DATA="+h.data, "CAPK_ENVELOPE="+string(b))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed at staged: %v\n%s", err, out)
	}
	// Restarted under another policy: the default with one more
	// sensitive path.
	pol := t.TempDir()
	for _, f := range []string{"capkernel.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("..", "policy", "rego", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "data.json" {
			b = []byte(strings.Replace(string(b), `"Dockerfile"]`, `"Dockerfile", "secrets.env"]`, 1))
		}
		if err := os.WriteFile(filepath.Join(pol, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.open(func(c *Config) { c.PolicyDir = pol })
	if h.k.PolicyHash() == env.PolicyHash {
		t.Fatal("the restart's policy is the call's: the test changes nothing")
	}
	for _, a := range h.audits(0) {
		if a.OperationID != env.OperationID {
			continue
		}
		if a.TxOutcome != RolledBack || a.ApprovalID == "" || a.ApprovalState != ApprovalAllowed || a.ApprovedBy != "alice" || a.ApprovalReason != "reviewed by alice" || a.PolicyHash != env.PolicyHash {
			t.Fatalf("recovered record: outcome %s, approval %q %q by %q (%q), policy %s; want rolled back, allowed by alice, policy %s",
				a.TxOutcome, a.ApprovalID, a.ApprovalState, a.ApprovedBy, a.ApprovalReason, a.PolicyHash, env.PolicyHash)
		}
		return
	}
	t.Fatal("no recovered record of the call")
}
