package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/syscalls"
)

func session(id string) func(*Envelope) {
	return func(e *Envelope) { e.Provenance = json.RawMessage(fmt.Sprintf(`{"session_id":%q}`, id)) }
}

// kindsOf collects the kinds of the events of operation op until its
// final event.
func kindsOf(t *testing.T, sub *Subscription, op string) []string {
	t.Helper()
	var out []string
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-sub.C:
			if e.OperationID != op {
				continue
			}
			out = append(out, e.Kind)
			switch e.Kind {
			case EventCompleted, EventFailed, EventDenied, EventInputInvalid:
				return out
			}
		case <-deadline:
			t.Fatalf("events of %s so far: %v", op, out)
		}
	}
}

// Each path emits its documented sequence.
func TestEventSequences(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 200 * time.Millisecond })
	alice := h.approver("alice", captoken.RoleApprover)
	h.write("a.txt", "a")
	tests := []struct {
		name string
		run  func(op string)
		want []string
	}{
		{"completed", func(op string) { h.invoke("fs.read", map[string]any{"path": "a.txt"}, opID(op)) },
			[]string{EventCalled, EventCompleted}},
		{"failed", func(op string) { h.invoke("fs.read", map[string]any{"path": "missing.txt"}, opID(op)) },
			[]string{EventCalled, EventFailed}},
		{"input invalid", func(op string) { h.invoke("fs.read", map[string]any{"path": 7}, opID(op)) },
			[]string{EventInputInvalid}},
		{"denied", func(op string) { h.invoke("fs.read", map[string]any{"path": ".env"}, opID(op)) },
			[]string{EventDenied}},
		{"approved", func(op string) {
			a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("e1"), opID(op))
			h.k.Decide(a.ID, alice, "allow", "")
			<-res
		}, []string{EventConfirmationRequested, EventConfirmationResolved, EventCalled, EventCompleted}},
		{"approval denied", func(op string) {
			a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "y"}, key("e2"), opID(op))
			h.k.Decide(a.ID, alice, "deny", "")
			<-res
		}, []string{EventConfirmationRequested, EventConfirmationResolved, EventDenied}},
		{"approval timeout", func(op string) {
			_, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "z"}, key("e3"), opID(op))
			<-res
		}, []string{EventConfirmationRequested, EventConfirmationResolved, EventDenied}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sub := h.k.Subscribe(EventFilter{AgentID: h.agent}, 64)
			defer sub.Close()
			op := newID()
			go tc.run(op)
			if got := kindsOf(t, sub, op); !slices.Equal(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
		})
	}
}

func opID(id string) func(*Envelope) { return func(e *Envelope) { e.OperationID = id } }

// Under a burst of 50 calls in one session, at most the cap execute at
// once, and the cap is reached; a session whose line is full refuses at
// once; other sessions are not held up.
func TestSessionConcurrencyCap(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SessionConcurrency = 4 })
	sub := h.k.Subscribe(EventFilter{SessionID: "s1", Kinds: []string{EventCalled}}, 256)
	defer sub.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			mustOK(t, h.invoke("fs.write", map[string]any{"path": fmt.Sprintf("f%d", i), "content": "x"}, key(fmt.Sprint(i)), session("s1")))
		})
	}
	wg.Wait()
	peak := 0
	for range 50 {
		e := <-sub.C
		peak = max(peak, e.SessionRunning)
	}
	if peak != 4 {
		t.Fatalf("peak concurrency of the session %d, want the cap 4", peak)
	}

	// With a cap of 1 and a line of 1, most of 30 simultaneous calls are
	// refused at once, and the rest run.
	small := newHarness(t, func(c *Config) { c.SessionConcurrency = 1; c.SessionQueue = 1 })
	results := make(chan string, 30)
	for i := range 30 {
		wg.Go(func() {
			results <- errClass(small.invoke("fs.write", map[string]any{"path": fmt.Sprintf("g%d", i), "content": "x"}, key(fmt.Sprint(i)), session("s2")))
		})
	}
	wg.Wait()
	close(results)
	counts := map[string]int{}
	for c := range results {
		counts[c]++
	}
	if counts[ErrConcurrencyExceeded] == 0 || counts[""] == 0 || counts[""]+counts[ErrConcurrencyExceeded] != 30 {
		t.Fatalf("with cap 1 and a line of 1: %v", counts)
	}
}

// A subscriber that never reads loses events; calls do not wait for it.
func TestStalledSubscriberDoesNotBlockCalls(t *testing.T) {
	h := newHarness(t)
	stalled := h.k.Subscribe(EventFilter{}, 4)
	defer stalled.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 40 {
			mustOK(t, h.invoke("echo", map[string]any{"text": fmt.Sprint(i)}))
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("calls are stuck behind a subscriber that does not read")
	}
	if d := stalled.Dropped(); d != 80-4 {
		t.Fatalf("dropped %d events, want %d (80 events, 4 buffered)", d, 80-4)
	}
}

// Cancellation by operation id and by session ends calls that wait (for
// an approval) with cancelled, audited, and nothing applied.
func TestCancel(t *testing.T) {
	h := newHarness(t)
	a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("c1"), session("s9"))
	if h.k.Cancel(a.OperationID, "someone-else") {
		t.Fatal("another agent cancelled the call")
	}
	if !h.k.Cancel(a.OperationID, h.agent) {
		t.Fatal("Cancel found no call")
	}
	r := <-res
	if errClass(r) != ErrCancelled {
		t.Fatalf("cancelled call: %q", errClass(r))
	}
	if got := h.k.Approvals(true); got[len(got)-1].State != ApprovalAbandoned {
		t.Fatalf("approval after cancel: %+v", got[len(got)-1])
	}
	_, res1 := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "y"}, key("c2"), session("s9"))
	_, res2 := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "z"}, key("c3"), session("s9"))
	if n := h.k.CancelSession("s9", ""); n != 2 {
		t.Fatalf("cancelled %d calls of the session, want 2", n)
	}
	for _, ch := range []<-chan *Result{res1, res2} {
		if r := <-ch; errClass(r) != ErrCancelled {
			t.Fatalf("session-cancelled call: %q", errClass(r))
		}
	}
	if h.k.Cancel(a.OperationID, "") {
		t.Fatal("Cancel found a finished call")
	}
	if _, err := h.k.Inspector().Receipt(r.ReceiptID); err != nil {
		t.Fatalf("the cancelled call has no receipt: %v", err)
	}
}

// A background call reports awaiting_approval, then done with its result.
func TestStartAndOperation(t *testing.T) {
	h := newHarness(t)
	env := h.env("fs.write", map[string]any{"path": "Makefile", "content": "bg"}, key("bg"), opID(newID()))
	raw, _ := json.Marshal(env)
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationRequested}}, 4)
	defer sub.Close()
	id, _, err := h.k.Start(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	e := <-sub.C
	st, ok := h.k.Operation(id)
	if !ok || st.State != OpAwaitingApproval || st.Approval == nil || st.Approval.ID != e.Approval.ID {
		t.Fatalf("status while waiting: %+v", st)
	}
	if _, refused, err := h.k.Start(context.Background(), raw); !errors.Is(err, ErrOperationInUse) || refused == nil || refused.OperationID == id || refused.Receipt == nil {
		t.Fatalf("a second call with the operation id in flight: %v, %+v", err, refused)
	}
	h.k.Decide(e.Approval.ID, h.approver("alice", captoken.RoleApprover), "allow", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := h.k.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, r)
	if st, _ := h.k.Operation(id); st.State != OpDone || st.Result.OperationID != id || h.read("Makefile") != "bg" {
		t.Fatalf("status when done: %+v", st)
	}
	// Once it is done (in memory and stored), its id is still not another
	// call's: a call naming it is refused, and the id keeps its result.
	if _, refused, err := h.k.Start(context.Background(), raw); !errors.Is(err, ErrOperationInUse) || refused == nil || refused.OperationID == id {
		t.Fatalf("a second call with the operation id of a finished call: %v, %+v", err, refused)
	}
	if st, _ := h.k.Operation(id); st.State != OpDone || st.Result.OperationID != id || st.Result.Status != StatusOK {
		t.Fatalf("status after the id was asked for again: %+v", st)
	}
	if id2, _, err := h.k.Start(context.Background(), []byte("garbage")); err != nil {
		t.Fatal(err)
	} else if r, _ := h.k.Wait(ctx, id2); errClass(r) != ErrInvalidArgs {
		t.Fatalf("garbage in the background: %+v", r)
	}
}

// TestOperationIDInFlight: a call in flight keeps its operation id,
// whether it runs in the background or not, minted or chosen: another
// call naming it, synchronous or started, is refused under an id of its
// own and runs nothing, and the calls in flight then record under their
// ids as their own (a refusal stored under the id would have stood for
// the call in flight, and an idempotency key's replay answered with it).
func TestOperationIDInFlight(t *testing.T) {
	h := newHarness(t)
	alice := h.approver("alice", captoken.RoleApprover)
	ctx := context.Background()
	sub := h.k.Subscribe(EventFilter{Kinds: []string{EventConfirmationRequested}}, 4)
	defer sub.Close()
	raw, _ := json.Marshal(h.env("fs.write", map[string]any{"path": "Makefile", "content": "bg"}, key("bg")))
	bg, _, err := h.k.Start(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	var bgApproval ApprovalRequest
	select {
	case e := <-sub.C:
		bgApproval = *e.Approval
	case <-time.After(30 * time.Second):
		t.Fatal("the background call asked for no approval")
	}
	mine := newID()
	a, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "sync"}, key("sync"), opID(mine))
	for _, id := range []string{bg, mine} {
		r := h.invoke("fs.write", map[string]any{"path": "probe.txt", "content": "x"}, key("probe-"+id), opID(id))
		if errClass(r) != ErrInvalidArgs || r.OperationID == id || !strings.Contains(r.Error.Message, "in flight") {
			t.Fatalf("a call naming %s in flight: %+v %+v", id, r, r.Error)
		}
		raw, _ := json.Marshal(h.env("echo", map[string]any{"text": "x"}, opID(id)))
		if _, refused, err := h.k.Start(ctx, raw); !errors.Is(err, ErrOperationInUse) || refused == nil || refused.OperationID == id {
			t.Fatalf("a call started naming %s in flight: %v %+v", id, err, refused)
		}
	}
	if _, err := os.Stat(filepath.Join(h.ws, "probe.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused call wrote: %v", err)
	}
	h.k.Decide(bgApproval.ID, alice, "deny", "")
	h.k.Decide(a.ID, alice, "allow", "")
	if r := <-res; r.Status != StatusOK || r.TxOutcome != Committed {
		t.Fatalf("the synchronous call in flight: %+v", r.Error)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if r, err := h.k.Wait(wctx, bg); err != nil || errClass(r) != ErrApprovalDenied {
		t.Fatalf("the background call: %v %+v", err, r)
	}
	if r := h.invoke("fs.write", map[string]any{"path": "Makefile", "content": "sync"}, key("sync")); !r.Replayed || r.TxOutcome != Committed || r.OperationID != mine {
		t.Fatalf("replay of the committed call: %+v", r)
	}
}

// TestUnverifiedRefusalTakesNoID: an envelope whose token does not verify
// (none at all, or a malformed envelope) names any operation id it likes;
// its refusal is recorded under an id of its own, the one named kept in
// its notes, so it can neither take over a call in flight (whose record
// would then be refused as a reuse, and whose stored envelope would be the
// attacker's) nor squat an id a call will use later.
func TestUnverifiedRefusalTakesNoID(t *testing.T) {
	h := newHarness(t)
	inFlight, later := newID(), newID()
	pending, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "mine"}, key("w"), opID(inFlight))
	for _, tc := range []struct {
		name, id, class string
		env             *Envelope
	}{
		{"bad autonomy mode, no token", inFlight, ErrInvalidArgs, &Envelope{ToolID: "x", AgentID: h.agent, OperationID: inFlight, AutonomyMode: "yolo", Args: json.RawMessage(`{}`)}},
		{"no token, the id in flight", inFlight, ErrTokenInvalid, &Envelope{ToolID: "echo", AgentID: h.agent, OperationID: inFlight, Args: json.RawMessage(`{"text":"x"}`)}},
		{"no token, an id not used yet", later, ErrTokenInvalid, &Envelope{ToolID: "echo", AgentID: h.agent, OperationID: later, Args: json.RawMessage(`{"text":"x"}`)}},
	} {
		before := h.headSize()
		r := h.k.Invoke(context.Background(), tc.env)
		if errClass(r) != tc.class || r.OperationID == tc.id || r.OperationID == "" {
			t.Fatalf("%s: class %q, operation_id %q; want %q under an id of its own", tc.name, errClass(r), r.OperationID, tc.class)
		}
		a := h.audits(before)
		if len(a) != 1 || string(a[0].Notes["requested_operation_id"]) != `"`+tc.id+`"` {
			t.Fatalf("%s: audit records %+v, want one noting the id asked for", tc.name, a)
		}
	}
	h.k.Decide(pending.ID, h.approver("alice", captoken.RoleApprover), "allow", "")
	r := <-res
	mustOK(t, r)
	if r.OperationID != inFlight || h.read("Makefile") != "mine" {
		t.Fatalf("the call in flight: %+v", r)
	}
	stored, err := h.k.Inspector().Operation(inFlight)
	if err != nil || !strings.Contains(string(stored), `"status":"ok"`) {
		t.Fatalf("the id's stored envelope: %s, %v", stored, err)
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "y"}, opID(later)))
	// Another agent, its token verified, naming that recorded id: refused
	// as a reuse under an id of its own, the id's one record still the
	// owner's.
	other, otherJTI := h.mint("agent-b", captoken.Capability{Tools: []string{"fs.*"}})
	r = h.k.Invoke(context.Background(), &Envelope{ToolID: "echo", AgentID: "agent-b", CapabilityToken: other, CapabilityTokenID: otherJTI,
		OperationID: inFlight, PolicyHash: h.k.PolicyHash(), Args: json.RawMessage(`{"text":"x"}`)})
	if errClass(r) != ErrInvalidArgs || r.OperationID == inFlight {
		t.Fatalf("agent-b naming a recorded id: class %q, operation_id %q", errClass(r), r.OperationID)
	}
	n := 0
	for _, a := range h.audits(0) {
		if a.OperationID == inFlight {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d audit records under the owner's id, want 1", n)
	}
	// Start: an envelope whose token does not verify reserves no id it
	// names; the agent's own Start of that id then runs under it.
	named := newID()
	raw, _ := json.Marshal(&Envelope{ToolID: "echo", AgentID: h.agent, OperationID: named, Args: json.RawMessage(`{"text":"x"}`)})
	if id, _, err := h.k.Start(context.Background(), raw); err != nil || id == named {
		t.Fatalf("an unverified Start: id %q, %v; want a new id", id, err)
	}
	raw, _ = json.Marshal(h.env("echo", map[string]any{"text": "x"}, opID(named)))
	if id, _, err := h.k.Start(context.Background(), raw); err != nil || id != named {
		t.Fatalf("the agent's Start of %s: id %q, %v", named, id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := h.k.Wait(ctx, named); err != nil || r.Status != StatusOK || r.OperationID != named {
		t.Fatalf("the agent's call: %+v, %v", r, err)
	}
	// Unverified envelopes naming an id, sent while the agent's own call
	// names it, never hold it: the agent's call is never refused as in
	// flight (they used to register the id before their token was
	// checked).
	for range 30 {
		id := newID()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				h.k.Invoke(context.Background(), &Envelope{ToolID: "echo", AgentID: h.agent, OperationID: id, Args: json.RawMessage(`{"text":"x"}`)})
			})
		}
		mustOK(t, h.invoke("echo", map[string]any{"text": "mine"}, opID(id)))
		wg.Wait()
	}
	// A call whose named id Start reserved keeps it, whatever refuses it
	// later (its token expiring meanwhile): its result is served under it.
	c := &call{env: &Envelope{OperationID: named}, reserved: true}
	if c.disown(); c.env.OperationID != named || c.notes != nil {
		t.Fatalf("a reserved id was disowned: %q", c.env.OperationID)
	}
}

// holdSys is test.hold: a read that runs until its test releases it.
type holdSys struct {
	started chan<- struct{}
	release <-chan struct{}
}

func (holdSys) Definition() syscalls.Definition {
	return syscalls.Definition{ID: "test.hold", Description: "runs until released", SideEffect: syscalls.Read, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (s holdSys) Execute(context.Context, *syscalls.Call) (syscalls.Output, error) {
	s.started <- struct{}{}
	<-s.release
	return syscalls.Output{Result: json.RawMessage(`{}`)}, nil
}

// TestSessionIsTheAgents: a session's cap and line are its agent's.
// Another agent naming the same session id (ids are chosen by agents and
// seen by approvers) fills a session of its own: the first agent's call
// still runs (it used to be refused, the line full of the other's calls).
func TestSessionIsTheAgents(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SessionConcurrency = 1; c.SessionQueue = 1 })
	started, release := make(chan struct{}, 2), make(chan struct{})
	if err := h.k.Registry().Register(func() syscalls.Syscall { return holdSys{started, release} }); err != nil {
		t.Fatal(err)
	}
	other, otherJTI := h.mint("agent-b", captoken.Capability{Tools: []string{"test.*"}})
	var wg sync.WaitGroup
	for range 2 { // one runs, one waits in its line
		wg.Go(func() {
			mustOK(t, h.invoke("test.hold", map[string]any{}, session("shared"), func(e *Envelope) {
				e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "agent-b", other, otherJTI
			}))
		})
	}
	<-started
	for waiting(h.k.sessions, "agent-b", "shared") == 0 {
		time.Sleep(time.Millisecond)
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "mine"}, session("shared")))
	close(release)
	wg.Wait()
}

// waiting returns how many calls of agent's session id wait in its line.
func waiting(s *sessions, agent, id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.gates[sessionKey(agent, id)]; g != nil {
		return g.waiting.Load()
	}
	return 0
}

// TestUnverifiedRefusalNamesNoAgent: an envelope whose token does not
// verify may name any agent and token id; its refusal is recorded with
// that claim as claimed_agent_id and claimed_capability_token_id, and is
// nobody's call: not in the agent's event stream, not read as the agent's
// own record, its result naming no agent. A call whose token verified and
// which is refused after still names its agent.
func TestUnverifiedRefusalNamesNoAgent(t *testing.T) {
	h := newHarness(t)
	sub := h.k.Subscribe(EventFilter{AgentID: h.agent}, 64)
	defer sub.Close()
	before := h.headSize()
	forged := h.k.Invoke(context.Background(), &Envelope{ToolID: "fs.delete", AgentID: h.agent, CapabilityToken: "garbage",
		CapabilityTokenID: h.jti, IdempotencyKey: "k2", PolicyHash: h.k.PolicyHash(), Args: json.RawMessage(`{"path":"Makefile"}`)})
	if errClass(forged) != ErrTokenInvalid || forged.AgentID != "" {
		t.Fatalf("forged: class %q, agent %q", errClass(forged), forged.AgentID)
	}
	refused := h.invoke("fs.read", map[string]any{"path": "../outside"})
	if errClass(refused) != ErrScopeDenied || refused.AgentID != h.agent {
		t.Fatalf("verified refusal: class %q, agent %q", errClass(refused), refused.AgentID)
	}
	a := h.audits(before)
	if len(a) != 2 {
		t.Fatalf("%d audit records", len(a))
	}
	if f := a[0]; f.AgentID != "" || f.CapabilityTokenID != "" || f.ClaimedAgentID != h.agent || f.ClaimedTokenID != h.jti {
		t.Fatalf("forged record: agent %q token %q, claimed %q %q", f.AgentID, f.CapabilityTokenID, f.ClaimedAgentID, f.ClaimedTokenID)
	}
	if v := a[1]; v.AgentID != h.agent || v.CapabilityTokenID != h.jti || v.ClaimedAgentID != "" || v.ClaimedTokenID != "" {
		t.Fatalf("verified record: agent %q token %q, claimed %q %q", v.AgentID, v.CapabilityTokenID, v.ClaimedAgentID, v.ClaimedTokenID)
	}
	tok, err := h.k.VerifyBearer(h.token)
	if err != nil {
		t.Fatal(err)
	}
	all, err := h.k.Inspector().EntryViews(before, 10, AccessOf(tok))
	if err != nil {
		t.Fatal(err)
	}
	var views []EntryView
	for _, v := range all {
		if v.Entry.Kind == ledger.KindAudit {
			views = append(views, v)
		}
	}
	for i, want := range []bool{false, true} {
		if got := views[i].Payload != nil; got != want {
			t.Fatalf("record %d read in full by the agent: %v, want %v", i, got, want)
		}
	}
	var events []string
	for len(sub.C) > 0 {
		e := <-sub.C
		events = append(events, e.Kind+" "+e.ToolID)
	}
	if len(events) != 1 || events[0] != EventDenied+" fs.read" {
		t.Fatalf("the agent's events: %v, want only its own fs.read's denial", events)
	}
}

// TestBackgroundSlotsPerAgent: one agent (with its sub-agents) runs at
// most MaxBackgroundPerAgent background calls, so calls waiting for
// approvals cannot take every slot from the other agents.
func TestBackgroundSlotsPerAgent(t *testing.T) {
	h := newHarness(t)
	start := func(e *Envelope) error {
		raw, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = h.k.Start(context.Background(), raw)
		return err
	}
	gated := func(i int, mods ...func(*Envelope)) *Envelope {
		return h.env("fs.write", map[string]any{"path": "Makefile", "content": fmt.Sprint(i)}, append(mods, key(fmt.Sprint("w", i)))...)
	}
	for i := range MaxBackgroundPerAgent {
		if err := start(gated(i)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	sub := h.attenuate(AttenuateRequest{Parent: h.token, AgentID: h.agent + "/helper"})
	if err := start(gated(-1, as(sub))); !errors.Is(err, ErrTooManyBackground) {
		t.Fatalf("a sub-agent's call past its parent's slots: %v", err)
	}
	// The refusal is the agent's own (its token verified), under an id of
	// its own: the id asked for stays free for a retry.
	later := newID()
	raw, _ := json.Marshal(h.env("echo", map[string]any{"text": "later"}, opID(later)))
	if _, refused, err := h.k.Start(context.Background(), raw); !errors.Is(err, ErrTooManyBackground) || refused.AgentID != h.agent || refused.OperationID == later {
		t.Fatalf("past the slots: %v, agent %q, operation %s (asked %s)", err, refused.AgentID, refused.OperationID, later)
	}
	other, otherJTI := h.mint("agent-b", captoken.Capability{Tools: []string{"echo"}})
	if err := start(&Envelope{ToolID: "echo", AgentID: "agent-b", CapabilityToken: other, CapabilityTokenID: otherJTI,
		PolicyHash: h.k.PolicyHash(), Args: json.RawMessage(`{"text":"x"}`)}); err != nil {
		t.Fatalf("another agent's call: %v", err)
	}
	// Every call of agent-a waits for its approval: deny them all.
	var pending []ApprovalRequest
	for deadline := time.Now().Add(30 * time.Second); len(pending) < MaxBackgroundPerAgent; time.Sleep(10 * time.Millisecond) {
		if pending = h.k.Approvals(false); time.Now().After(deadline) {
			t.Fatalf("%d approvals pending, want %d", len(pending), MaxBackgroundPerAgent)
		}
	}
	for _, a := range pending {
		if _, err := h.k.Decide(a.ID, h.approver("carol", captoken.RoleApprover), "deny", "done"); err != nil {
			t.Fatal(err)
		}
	}
	// Slots free again, the retry with the id asked for runs.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		id, _, err := h.k.Start(context.Background(), raw)
		if err == nil {
			if id != later {
				t.Fatalf("the retry ran as %s, want %s", id, later)
			}
			break
		}
		if !errors.Is(err, ErrTooManyBackground) || time.Now().After(deadline) {
			t.Fatalf("the retry: %v", err)
		}
	}
}

// TestBackgroundResultsBounded: the finished results of background calls
// are kept in memory within a byte bound per agent family and in all,
// the oldest going first (the operations table still answers for them);
// one agent's results do not push out another's; and a kept result
// holds none of its call's memory (its envelope, args and payload: an
// echo of n bytes keeps about n, not three times that).
func TestBackgroundResultsBounded(t *testing.T) {
	h := newHarness(t)
	const text = 256 << 10
	h.k.ops.mu.Lock()
	h.k.ops.maxKept, h.k.ops.maxKeptPerAgent = 12*text, 4*text
	h.k.ops.mu.Unlock()
	tokB, jtiB := h.mint("other", captoken.Capability{Tools: []string{"echo"}})
	start := func(agent string) string {
		env := h.env("echo", map[string]any{"text": strings.Repeat("x", text)})
		if agent == "other" {
			env.AgentID, env.CapabilityToken, env.CapabilityTokenID = agent, tokB, jtiB
		}
		raw, _ := json.Marshal(env)
		id, _, err := h.k.Start(context.Background(), raw)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := h.k.Wait(context.Background(), id); err != nil || r.Status != StatusOK {
			t.Fatalf("%v %+v", err, r)
		}
		return id
	}
	other := start("other")
	start(h.agent) // first uses (the payload coder's tables) out of the measure
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var mine []string
	for range 10 {
		mine = append(mine, start(h.agent))
	}
	h.k.ops.mu.Lock()
	kept, perAgent := h.k.ops.kept, maps.Clone(h.k.ops.keptByAgent)
	h.k.ops.mu.Unlock()
	if perAgent[h.agent] > 4*text || kept > 12*text {
		t.Errorf("kept %d bytes, %v by agent; bounds %d in all, %d an agent", kept, perAgent, 12*text, 4*text)
	}
	if _, ok := h.k.Operation(other); !ok {
		t.Error("another agent's result was pushed out")
	}
	if _, ok := h.k.Operation(mine[0]); ok {
		t.Error("the oldest result is still in memory past the bound")
	}
	if env, err := h.k.Inspector().Operation(mine[0]); err != nil || !strings.Contains(string(env), `"status":"ok"`) {
		t.Errorf("the operations table lost the call it no longer keeps in memory: %v %.200s", err, env)
	}
	st, ok := h.k.Operation(mine[9])
	if !ok || st.Result == nil || len(st.Result.Result) < text {
		t.Fatalf("the newest result: %v %+v", ok, st)
	}
	// Nothing of the calls behind the kept results: the heap holds about
	// their bytes, not their envelopes and args too (three times that).
	if grew := heap() - before; grew > 2*uint64(perAgent[h.agent]) {
		t.Errorf("the heap grew %d bytes for %d bytes of results kept", grew, perAgent[h.agent])
	}
}

// TestStartRefusesMalformedOperationID: a background call naming an
// operation_id that is no canonical UUID is refused at once, under an id
// of its own, and nothing holds the id it named — neither memory (its
// result was kept under it, uncounted: a megabyte a call) nor the public
// record; the private note keeps its digest.
func TestStartRefusesMalformedOperationID(t *testing.T) {
	h := newHarness(t)
	for _, bad := range []string{strings.Repeat("z", 30000), strings.Repeat("z", 500<<10), "not-a-uuid"} {
		env := h.env("echo", map[string]any{"text": "x"}, opID(bad))
		raw, _ := json.Marshal(env)
		before := h.headSize()
		id, refused, err := h.k.Start(context.Background(), raw)
		if !errors.Is(err, ErrBadOperationID) || id != "" || refused == nil || errClass(refused) != ErrInvalidArgs || refused.OperationID == bad || refused.ReceiptID == "" {
			t.Fatalf("Start with a %d-byte operation_id: an id of %d bytes, %v, refused %v", len(bad), len(id), err, refused != nil)
		}
		if _, ok := h.k.Operation(bad); ok {
			t.Fatal("the malformed id is held in memory")
		}
		for _, e := range h.entries("", before) {
			if b, _ := json.Marshal(e); strings.Contains(string(b), bad) {
				t.Fatalf("entry %d holds the malformed id", e.Seq)
			}
		}
		if a := h.audits(before); len(a) != 1 || !strings.Contains(string(a[0].Notes["requested_operation_id"]), digest.Sum([]byte(bad))) {
			t.Fatalf("the refusal's record: %+v", a)
		}
	}
}

// TestCancelRacingCommit: a cancel that lands after a call's syscall
// returned, before its commit, is honoured there (the call rolls back
// with cancelled, nothing lands) and reported; one that lands after the
// commit was decided is reported false and the call commits. Cancel
// never says cancelled of a call that commits (rev10-race F2).
func TestCancelRacingCommit(t *testing.T) {
	defer func() { crashHook = nil }()
	for _, tc := range []struct {
		point     string
		cancelled bool
	}{{"staged", true}, {"decided", false}} {
		h := newHarness(t)
		op := newID()
		var got, gotSession bool
		crashHook = func(p string) {
			if p == tc.point {
				got = h.k.Cancel(op, h.agent)
				gotSession = h.k.CancelSession("s", h.agent) > 0
			}
		}
		r := h.invoke("fs.write", map[string]any{"path": "c.txt", "content": "x"}, key("c"), opID(op), session("s"))
		crashHook = nil
		_, err := os.Stat(filepath.Join(h.ws, "c.txt"))
		if got != tc.cancelled || gotSession != tc.cancelled {
			t.Fatalf("cancel at %s: Cancel %v, CancelSession %v; want %v", tc.point, got, gotSession, tc.cancelled)
		}
		if tc.cancelled && (errClass(r) != ErrCancelled || r.TxOutcome != RolledBack || err == nil) {
			t.Fatalf("cancelled at %s: %s %s %s, file landed %v; want rolled back, cancelled", tc.point, r.Status, errClass(r), r.TxOutcome, err == nil)
		}
		if !tc.cancelled && (r.Status != StatusOK || r.TxOutcome != Committed || err != nil) {
			t.Fatalf("cancel at %s: %s %s %s, file landed %v; want committed", tc.point, r.Status, errClass(r), r.TxOutcome, err == nil)
		}
	}
}
