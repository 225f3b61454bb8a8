package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
)

// approver mints an approver token of role for person.
func (h *harness) approver(person, role string) string {
	h.t.Helper()
	m, err := h.k.Mint(TokenRequest{AgentID: person, Role: role})
	if err != nil {
		h.t.Fatal(err)
	}
	return m.Token
}

// gated starts call in the background and returns its pending approval
// (from the tool.confirmation_requested event) and the channel of its
// result.
func (h *harness) gated(tool string, args any, mods ...func(*Envelope)) (ApprovalRequest, <-chan *Result) {
	h.t.Helper()
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationRequested}}, 16)
	defer sub.Close()
	out := make(chan *Result, 1)
	env := h.env(tool, args, mods...)
	if env.OperationID == "" {
		env.OperationID = newID()
	}
	go func() { out <- h.k.Invoke(context.Background(), env) }()
	select {
	case e := <-sub.C:
		if e.Approval == nil || e.OperationID != env.OperationID {
			h.t.Fatalf("confirmation event %+v", e)
		}
		return *e.Approval, out
	case r := <-out:
		h.t.Fatalf("the call ended without asking for an approval: %+v", r)
	case <-time.After(30 * time.Second):
		h.t.Fatal("no confirmation request")
	}
	return ApprovalRequest{}, nil
}

func (h *harness) ledgerKinds(kind string) []ledger.Entry { return h.entries(kind, 0) }

func TestApprovalAllowDenyTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 2 * time.Second })
	alice := h.approver("alice", captoken.RoleApprover)

	// allow: the write happens, and the approver and reason reach the
	// ledger, the audit record and the receipt.
	a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "all:\n"}, key("w1"))
	if a.State != ApprovalPending || a.Mode != "soft_gate" || a.RequiredRole != captoken.RoleApprover || len(a.ProjectedEffects) != 1 {
		t.Fatalf("request %+v", a)
	}
	if want := "write fs:" + h.ws + "/Makefile"; a.ProjectedEffects[0] != want {
		t.Fatalf("effects %q, want %q", a.ProjectedEffects, want)
	}
	if _, err := h.k.Decide(a.ID, alice, "allow", "looks right"); err != nil {
		t.Fatal(err)
	}
	r := <-res
	mustOK(t, r)
	if h.read("Makefile") != "all:\n" || r.TxOutcome != Committed {
		t.Fatalf("allowed write: %+v", r)
	}
	audit := h.audits(r.LedgerSeq)[0]
	if audit.ApprovalID != a.ID || audit.ApprovedBy != "alice" || audit.ApprovalReason != "looks right" || audit.ApprovalState != ApprovalAllowed {
		t.Fatalf("audit record: %+v", audit)
	}
	rc := verifyReceipt(t, h.k, r)
	if rc.ApprovalID != a.ID || rc.ApprovalState != ApprovalAllowed || rc.ApprovedBy != "alice" || rc.ApprovalReason != "looks right" {
		t.Fatalf("receipt %+v", rc)
	}

	// deny: nothing happens.
	a, res = h.gated("fs.write", map[string]any{"path": "Makefile", "content": "evil\n"}, key("w2"))
	if _, err := h.k.Decide(a.ID, alice, "deny", "no"); err != nil {
		t.Fatal(err)
	}
	r = <-res
	if errClass(r) != ErrApprovalDenied || h.read("Makefile") != "all:\n" {
		t.Fatalf("denied write: %q, file %q", errClass(r), h.read("Makefile"))
	}
	// Its receipt says alice denied it, not that she approved it
	// (rev10-approve F5).
	if rc := verifyReceipt(t, h.k, r); rc.ApprovalState != ApprovalDenied || rc.ApprovedBy != "alice" {
		t.Fatalf("denied call's receipt: %+v", rc)
	}

	// timeout: nobody answers; a late answer is a conflict.
	a, res = h.gated("fs.write", map[string]any{"path": "Makefile", "content": "late\n"}, key("w3"))
	if r := <-res; errClass(r) != ErrApprovalTimeout || h.read("Makefile") != "all:\n" {
		t.Fatalf("unanswered write: %q", errClass(r))
	}
	if got, err := h.k.Decide(a.ID, alice, "allow", "too late"); !errors.Is(err, ErrApprovalConflict) || got.State != ApprovalExpired {
		t.Fatalf("late decision: %+v, %v", got, err)
	}

	// Every request and decision is in the ledger.
	if n, m := len(h.ledgerKinds(KindApprovalRequested)), len(h.ledgerKinds(KindApprovalDecided)); n != 3 || m != 3 {
		t.Fatalf("%d requests and %d decisions in the ledger", n, m)
	}
	mustVerify(t, h.k.Inspector())
}

// Two approvers racing: exactly one decision is recorded and acted on.
func TestApprovalFirstDecisionWins(t *testing.T) {
	h := newHarness(t)
	alice, bob := h.approver("alice", captoken.RoleApprover), h.approver("bob", captoken.RoleApprover)
	for round := range 10 {
		a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("k"+string(rune('a'+round))))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, tok := range []string{alice, bob} {
			wg.Go(func() { _, errs[i] = h.k.Decide(a.ID, tok, []string{"allow", "deny"}[i], "race") })
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrApprovalConflict):
				t.Fatal(err)
			}
		}
		r := <-res
		decided := 0
		for _, e := range h.ledgerKinds(KindApprovalDecided) {
			var req ApprovalRequest
			json.Unmarshal(e.Body, &req)
			if req.ID == a.ID {
				decided++
				if (req.State == ApprovalAllowed) != (r.Status == StatusOK) {
					t.Fatalf("recorded %s but the call ended %s", req.State, r.Status)
				}
			}
		}
		if won != 1 || decided != 1 {
			t.Fatalf("round %d: %d decisions won, %d recorded", round, won, decided)
		}
	}
}

// Who may decide: escalated calls need the escalation role; nobody
// approves their own calls; agent tokens approve nothing. Each refused
// attempt is in the ledger.
func TestApprovalRoles(t *testing.T) {
	h := newHarness(t)
	h.write("dir/x", "x")
	a, res := h.gated("fs.delete", map[string]any{"path": "dir"}, key("d"))
	if a.Mode != "escalated" || a.RequiredRole != captoken.RoleEscalation {
		t.Fatalf("request %+v", a)
	}
	self, _ := h.k.Mint(TokenRequest{AgentID: h.agent, Role: captoken.RoleEscalation})
	for name, tok := range map[string]string{
		"plain approver":        h.approver("alice", captoken.RoleApprover),
		"the calling agent":     self.Token,
		"an agent's token":      h.token,
		"garbage":               "not-a-token",
		"another kernel's role": forgeApprover(t),
	} {
		if _, err := h.k.Decide(a.ID, tok, "allow", "let me"); !errors.Is(err, ErrApprovalForbidden) {
			t.Fatalf("%s: %v, want forbidden", name, err)
		}
	}
	if n := len(h.ledgerKinds(KindApprovalRefused)); n != 5 {
		t.Fatalf("%d refused attempts in the ledger, want 5", n)
	}
	if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleEscalation), "allow", "ok"); err != nil {
		t.Fatal(err)
	}
	mustOK(t, <-res)
	// Once decided, the same attempts are refused the same way (not told
	// the decided request, which a plain approver never sees) and
	// recorded; a rightful one learns who decided first (rev10-approve F10).
	for name, tok := range map[string]string{"plain approver": h.approver("alice", captoken.RoleApprover), "the calling agent": self.Token} {
		if got, err := h.k.Decide(a.ID, tok, "deny", "late"); !errors.Is(err, ErrApprovalForbidden) || got.ID != "" {
			t.Fatalf("%s on the decided approval: %+v, %v; want forbidden, no request", name, got, err)
		}
	}
	if n := len(h.ledgerKinds(KindApprovalRefused)); n != 7 {
		t.Fatalf("%d refused attempts in the ledger, want 7", n)
	}
	if got, err := h.k.Decide(a.ID, h.approver("erin", captoken.RoleEscalation), "deny", "late"); !errors.Is(err, ErrApprovalConflict) || got.DecidedBy != "carol" {
		t.Fatalf("escalation approver on the decided approval: %+v, %v; want a conflict naming carol", got, err)
	}
	// An id naming no approval is not found (a credential that decides
	// nothing is told so), and nothing is recorded: anyone could otherwise
	// write an id of their choosing into the ledger (rev-audit #1,
	// rev-console #7).
	head := h.headSize()
	for _, c := range []struct {
		name, tok string
		want      error
	}{
		{"an approver", h.approver("carol", captoken.RoleEscalation), ErrNotFound},
		{"garbage", "not-a-token", ErrApprovalForbidden},
		{"none", "", ErrApprovalForbidden},
		{"an auditor's", h.approver("dave", captoken.RoleAuditor), ErrApprovalForbidden},
		{"the admin's", AdminPrefix + "x", ErrApprovalForbidden},
	} {
		for _, id := range []string{"no-such-id", strings.Repeat("x", 60<<10)} {
			if _, err := h.k.Decide(id, c.tok, "allow", ""); !errors.Is(err, c.want) {
				t.Fatalf("unknown id of %d bytes, %s token: %v, want %v", len(id), c.name, err, c.want)
			}
		}
	}
	if got := h.headSize(); got != head {
		t.Fatalf("decisions on unknown ids wrote %d ledger entries", got-head)
	}
	if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleEscalation), "maybe", ""); err == nil {
		t.Fatal("decision maybe accepted")
	}
}

// TestApprovalNotBySubAgentsParent: a sub-agent speaks for its parent, so
// the parent's approver token may not approve the sub-agent's call (nor a
// deeper one's); a sibling's may.
func TestApprovalNotBySubAgentsParent(t *testing.T) {
	h := newHarness(t)
	h.write("dir/x", "x")
	child := h.attenuate(AttenuateRequest{Parent: h.token, AgentID: h.agent + "/helper"})
	grandchild := h.attenuate(AttenuateRequest{Parent: child.Token, AgentID: child.AgentID + "/deeper"})
	for _, tc := range []struct {
		name, approver string
		caller         *MintedToken
		allowed        bool
	}{
		{"parent of the caller", h.agent, child, false},
		{"grandparent of the caller", h.agent, grandchild, false},
		{"the caller itself", child.AgentID, child, false},
		{"a sibling", h.agent + "/other", child, true},
		{"a name sharing the prefix", h.agent + "-x", child, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, res := h.gated("fs.delete", map[string]any{"path": "dir"}, key(newID()), as(tc.caller))
			_, err := h.k.Decide(a.ID, h.approver(tc.approver, captoken.RoleEscalation), "deny", "checked")
			if tc.allowed != (err == nil) || (!tc.allowed && !errors.Is(err, ErrApprovalForbidden)) {
				t.Fatalf("decision by %s on %s's call: %v", tc.approver, tc.caller.AgentID, err)
			}
			if err != nil {
				if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleEscalation), "deny", "cleanup"); err != nil {
					t.Fatal(err)
				}
			}
			if r := <-res; errClass(r) != ErrApprovalDenied {
				t.Fatalf("the call: %+v", r.Error)
			}
		})
	}
}

func forgeApprover(t *testing.T) string {
	t.Helper()
	other := newHarness(t)
	m, err := other.k.Mint(TokenRequest{AgentID: "mallory", Role: captoken.RoleEscalation})
	if err != nil {
		t.Fatal(err)
	}
	return m.Token
}

// An approval is re-checked before the call runs: a token revoked while
// the call waited, or an approval that expired, fails closed; and it
// never carries over to another call.
func TestApprovalRecheck(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 2 * time.Second })
	alice := h.approver("alice", captoken.RoleApprover)
	a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("r1"))
	if err := h.k.Revoke(context.Background(), h.jti, "leaked"); err != nil {
		t.Fatal(err)
	}
	h.k.Decide(a.ID, alice, "allow", "ok")
	if r := <-res; errClass(r) != ErrApprovalDenied {
		t.Fatalf("revoked while waiting: %q", errClass(r))
	}
	if _, err := h.k.Inspector().Receipts(ReceiptFilter{}); err != nil {
		t.Fatal(err)
	}
	// So does a sub-agent's call whose parent or grandparent token was
	// revoked while it waited (rev-console #2: only the token's own id was
	// checked, and the call ran); nothing is written.
	for _, revoke := range []string{"parent", "grandparent"} {
		h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 5 * time.Second })
		child := h.attenuate(AttenuateRequest{Parent: h.token, AgentID: h.agent + "/helper"})
		grandchild := h.attenuate(AttenuateRequest{Parent: child.Token, AgentID: child.AgentID + "/deeper"})
		a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("r-"+revoke), as(grandchild))
		jti := map[string]string{"parent": child.ID, "grandparent": h.jti}[revoke]
		if err := h.k.Revoke(context.Background(), jti, "leaked"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.k.Decide(a.ID, h.approver("alice", captoken.RoleApprover), "allow", "ok"); err != nil {
			t.Fatal(err)
		}
		if r := <-res; errClass(r) != ErrApprovalDenied || !strings.Contains(r.Error.Message, jti) {
			t.Fatalf("%s revoked while waiting: %+v", revoke, r.Error)
		}
		if _, err := os.Stat(filepath.Join(h.ws, "Makefile")); !os.IsNotExist(err) {
			t.Fatalf("%s revoked: the call wrote: %v", revoke, err)
		}
	}

	// So does a call whose token expired while it waited (rev-key #2:
	// only revocation was re-checked, and the call committed).
	clk := &clock{t: time.Now()}
	he := newHarness(t, func(c *Config) { c.ApprovalTimeout = 30 * time.Second; c.Now = clk.now })
	short := he.attenuate(AttenuateRequest{Parent: he.token, AgentID: he.agent, TTLSeconds: 60})
	a, res = he.gated("fs.write", map[string]any{"path": "Makefile", "content": "after expiry"}, key("r-exp"), as(short))
	clk.add(5 * time.Minute)
	if _, err := he.k.Decide(a.ID, he.approver("alice", captoken.RoleApprover), "allow", "ok"); err != nil {
		t.Fatal(err)
	}
	if r := <-res; errClass(r) != ErrApprovalDenied || !strings.Contains(r.Error.Message, "expired") {
		t.Fatalf("token expired while waiting: %+v", r.Error)
	}
	if _, err := os.Stat(filepath.Join(he.ws, "Makefile")); !os.IsNotExist(err) {
		t.Fatalf("token expired: the call wrote: %v", err)
	}

	h2 := newHarness(t, func(c *Config) { c.ApprovalTimeout = 2 * time.Second; c.ApprovalValidity = time.Nanosecond })
	a, res = h2.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("r2"))
	h2.k.Decide(a.ID, h2.approver("alice", captoken.RoleApprover), "allow", "ok")
	if r := <-res; errClass(r) != ErrApprovalDenied {
		t.Fatalf("expired approval: %q", errClass(r))
	}
	if _, err := h2.k.Decide(a.ID, h2.approver("bob", captoken.RoleApprover), "allow", "again"); !errors.Is(err, ErrApprovalConflict) {
		t.Fatalf("re-deciding: %v", err)
	}

	// The same action again asks again: approvals are not reusable.
	h3 := newHarness(t, func(c *Config) { c.ApprovalTimeout = 2 * time.Second })
	alice = h3.approver("alice", captoken.RoleApprover)
	a1, res := h3.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("same"))
	h3.k.Decide(a1.ID, alice, "allow", "once")
	mustOK(t, <-res)
	a2, res := h3.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("other"))
	if a2.ID == a1.ID {
		t.Fatal("a second call reused the first call's approval")
	}
	if r := <-res; errClass(r) != ErrApprovalTimeout {
		t.Fatalf("second call: %q", errClass(r))
	}
	// The replay of the approved call needs no approval: it does nothing.
	if r := h3.invoke("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("same")); !r.Replayed {
		t.Fatalf("replay: %+v", r)
	}
}

// TestDecidedApprovalsKeepNoContent: an approver reads a pending call's
// arguments to decide it; once decided, the list of recent decisions every
// approver can read holds nothing of what the call carried, allowed,
// denied or expired (the content is the call's audit payload then).
func TestDecidedApprovalsKeepNoContent(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 2 * time.Second })
	alice := h.approver("alice", captoken.RoleApprover)
	const secret = "pin-4711-secret"
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationResolved}}, 8)
	defer sub.Close()
	for i, decision := range []string{"allow", "deny", ""} {
		a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": secret}, key(fmt.Sprint("w", i)))
		if !strings.Contains(a.InputSummary, secret) {
			t.Fatalf("pending request %+v: the approver does not see the content", a)
		}
		if decision != "" {
			if _, err := h.k.Decide(a.ID, alice, decision, "ok"); err != nil {
				t.Fatal(err)
			}
		}
		<-res
		if e := <-sub.C; e.Approval == nil || e.Approval.InputSummary != "" || e.Approval.ArgsHash != "" {
			t.Fatalf("decided (%q): the resolved event holds the call's content: %+v", decision, e.Approval)
		}
		if late, err := h.k.Decide(a.ID, alice, "allow", "late"); err == nil || late.InputSummary != "" || late.ArgsHash != "" {
			t.Fatalf("decided (%q): a late decision's answer %+v, %v", decision, late, err)
		}
		listed, err := json.Marshal(h.k.Approvals(true))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(listed), secret) || strings.Contains(string(listed), a.ArgsHash) {
			t.Fatalf("decided (%q) requests hold the call's content: %s", decision, listed)
		}
	}
}

// An approver's view of a waiting write reads the files it would change
// without waiting on them: a FIFO at the path (any process can put one
// there) is shown as there but unreadable, at once, instead of holding
// the view until a writer comes (rev-console #6).
func TestApprovalDetailOfFIFO(t *testing.T) {
	h := newHarness(t)
	if err := syscall.Mkfifo(filepath.Join(h.ws, "Makefile"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("fifo"))
	detail := make(chan ApprovalDetail, 1)
	go func() {
		d, err := h.k.ApprovalDetail(a.ID)
		if err != nil {
			t.Error(err)
		}
		detail <- d
	}()
	select {
	case d := <-detail:
		if len(d.Files) != 1 || !d.Files[0].Exists || !d.Files[0].Binary || d.Files[0].Content != "" {
			t.Fatalf("the FIFO shown as %+v", d.Files)
		}
	case <-time.After(10 * time.Second):
		// Unblock the view so the test can end.
		if f, err := os.OpenFile(filepath.Join(h.ws, "Makefile"), os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("the view of a write to a FIFO did not answer in 10 s")
	}
	if _, err := h.k.Decide(a.ID, h.approver("alice", captoken.RoleApprover), "deny", "cleanup"); err != nil {
		t.Fatal(err)
	}
	<-res
}

// An approver is shown where a write lands, not how the agent spelled it:
// a path through "..", hidden characters or a linked directory is shown
// resolved (rev-console #3: "README.md\x1b[8m/../.github/workflows/ci.yml"
// showed as "write fs:README.md" in a terminal, and the approved write
// went to the workflow).
func TestApprovalEffectsResolved(t *testing.T) {
	h := newHarness(t)
	relink(t, h.ws, "linked", ".")
	for _, c := range []struct{ spelled, lands string }{
		{"README.md\x1b[8m/../Makefile", "Makefile"},
		{"docs/../Makefile", "Makefile"},
		{"linked/Makefile", "Makefile"},
	} {
		a, res := h.gated("fs.write", map[string]any{"path": c.spelled, "content": "x"}, key(newID()))
		if want := "write fs:" + h.ws + "/" + c.lands; len(a.ProjectedEffects) != 1 || a.ProjectedEffects[0] != want {
			t.Errorf("%q: effects %q, want %q", c.spelled, a.ProjectedEffects, want)
		}
		h.k.Decide(a.ID, h.approver("alice", captoken.RoleApprover), "deny", "cleanup")
		<-res
	}
}

// An approved write lands where the approver was shown, or not at all: a
// directory on its path replaced by a link while the call waited (outside
// the kernel) fails the re-check before anything is staged (rev-key #1:
// the write followed the link into .github/workflows).
func TestApprovalPathMovedWhileWaiting(t *testing.T) {
	h := newHarness(t)
	h.write(".ci/README.md", "ci notes")
	h.write(".github/workflows/keep.yml", "keep")
	a, res := h.gated("fs.write", map[string]any{"path": ".ci/build.yml", "content": "evil"}, key(newID()))
	if err := os.RemoveAll(filepath.Join(h.ws, ".ci")); err != nil {
		t.Fatal(err)
	}
	relink(t, h.ws, ".ci", ".github/workflows")
	if _, err := h.k.Decide(a.ID, h.approver("alice", captoken.RoleApprover), "allow", "ok"); err != nil {
		t.Fatal(err)
	}
	if r := <-res; errClass(r) != ErrApprovalDenied || !strings.Contains(r.Error.Message, ".github/workflows/build.yml") {
		t.Fatalf("the call: %+v", r.Error)
	}
	if _, err := os.Stat(filepath.Join(h.ws, ".github/workflows/build.yml")); !os.IsNotExist(err) {
		t.Fatalf("the approved write landed in .github/workflows: %v", err)
	}
}

// TestPendingApprovalsBounded: one agent with its sub-agents holds at
// most MaxPendingApprovalsPerAgent pending approval requests, synchronous
// calls included (only background calls were counted): one more is
// refused at once, concurrency_exceeded and audited, while another
// agent's request still goes to the approvers; a decision frees a place.
func TestPendingApprovalsBounded(t *testing.T) {
	h := newHarness(t)
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationRequested}}, 2*MaxPendingApprovalsPerAgent)
	defer sub.Close()
	results := make(chan *Result, MaxPendingApprovalsPerAgent+1)
	for i := range MaxPendingApprovalsPerAgent {
		env := h.env("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key(fmt.Sprint("p", i)))
		go func() { results <- h.k.Invoke(context.Background(), env) }()
	}
	var first ApprovalRequest
	for i := range MaxPendingApprovalsPerAgent {
		select {
		case e := <-sub.C:
			if i == 0 {
				first = *e.Approval
			}
		case r := <-results:
			t.Fatalf("a call ended before its approval: %+v", r.Error)
		case <-time.After(60 * time.Second):
			t.Fatalf("%d approval requests, want %d", i, MaxPendingApprovalsPerAgent)
		}
	}
	r := h.invoke("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("one-more"))
	if errClass(r) != ErrConcurrencyExceeded || r.ReceiptID == "" {
		t.Fatalf("one approval more: %+v", r.Error)
	}
	// Another agent's request is not refused.
	tok, jti := h.mint("other", captoken.Capability{Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	_, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "y"}, key("other"), func(e *Envelope) {
		e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "other", tok, jti
	})
	if _, err := h.k.Decide(first.ID, h.approver("alice", captoken.RoleApprover), "deny", "no"); err != nil {
		t.Fatal(err)
	}
	<-results
	_, _ = h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("after a decision"))
	h.k.Close() // ends the calls still waiting
	<-res
}

// TestPendingApprovalBytesBounded: the calls of one agent waiting for
// approvals hold at most MaxPendingApprovalBytesPerAgent (waitingBytes):
// big calls are refused concurrency_exceeded long before the count's
// bound, and a small call of another agent still asks (rev10-approve F7).
func TestPendingApprovalBytesBounded(t *testing.T) {
	h := newHarness(t)
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationRequested}}, 64)
	defer sub.Close()
	big := strings.Repeat("x", 900<<10)
	one := h.env("fs.write", map[string]any{"path": "Makefile", "content": big}, key("big0"))
	per := waitingBytes(&call{env: one, canonArgs: one.Args}) // as admitted: env.Args is canonArgs
	fit := int(MaxPendingApprovalBytesPerAgent / per)
	results := make(chan *Result, fit+1)
	for i := range fit {
		env := h.env("fs.write", map[string]any{"path": "Makefile", "content": big}, key(fmt.Sprint("big", i)))
		go func() { results <- h.k.Invoke(context.Background(), env) }()
	}
	for i := range fit {
		select {
		case <-sub.C:
		case r := <-results:
			t.Fatalf("call %d ended before its approval: %+v", i, r.Error)
		case <-time.After(60 * time.Second):
			t.Fatalf("%d approval requests, want %d", i, fit)
		}
	}
	r := h.invoke("fs.write", map[string]any{"path": "Makefile", "content": big}, key("one-more"))
	if errClass(r) != ErrConcurrencyExceeded || !strings.Contains(r.Error.Message, "MiB") || r.ReceiptID == "" {
		t.Fatalf("one big call more (%d waiting): %+v", fit, r.Error)
	}
	tok, jti := h.mint("other", captoken.Capability{Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	_, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "y"}, key("other"), func(e *Envelope) {
		e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "other", tok, jti
	})
	h.k.Close() // ends the calls still waiting
	<-res
}

// TestDrainEndsLaterApprovals: Drain ends the calls waiting for an
// approval, and a call that asks for one after Drain (its body still
// arriving, or its policy deciding, when the shutdown began) is recorded
// and ends cancelled at once, rather than wait out the approval timeout
// and hold the shutdown (rev10-approve F6).
func TestDrainEndsLaterApprovals(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = time.Hour })
	h.write("dir/x", "x")
	_, waiting := h.gated("fs.delete", map[string]any{"path": "dir"}, key("before"))
	h.k.Drain()
	for name, res := range map[string]<-chan *Result{"waiting at Drain": waiting} {
		if r := <-res; r.Error == nil || r.Error.Class != ErrCancelled {
			t.Fatalf("%s: %+v, want cancelled", name, r)
		}
	}
	done := make(chan *Result, 1)
	go func() {
		done <- h.k.Invoke(context.Background(), h.env("fs.delete", map[string]any{"path": "dir"}, key("after")))
	}()
	select {
	case r := <-done:
		if r.Error == nil || r.Error.Class != ErrCancelled || !strings.Contains(r.Error.Message, "shutting down") {
			t.Fatalf("call gated after Drain: %+v, want cancelled, the kernel shutting down", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a call gated after Drain still waits for an approval")
	}
	if n := len(h.ledgerKinds(KindApprovalRequested)); n != 2 {
		t.Fatalf("%d approval requests recorded, want 2", n)
	}
}
