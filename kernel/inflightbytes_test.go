package kernel

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// TestInflightBytesBounded: the calls of one agent with its sub-agents
// hold at most a bound of bytes (waitingBytes) from admission to record,
// and all calls another: a call over either is refused at once,
// concurrency_exceeded, and audited, where one agent could park any
// number of 1 MiB calls behind a lock (rev14 F6). Another agent's call
// within the bounds runs, and the bytes are counted back as each call is
// recorded, refused ones included. The bounds are lowered here; the
// kernel's are MaxInflightBytesPerAgent and MaxInflightBytes.
func TestInflightBytesBounded(t *testing.T) {
	h := newHarness(t)
	started, release := make(chan struct{}, 2), make(chan struct{})
	if err := h.k.Registry().Register(func() syscalls.Syscall { return holdSys{started, release} }); err != nil {
		t.Fatal(err)
	}
	big := map[string]any{"pad": strings.Repeat("x", 100<<10)}
	env := h.env("test.hold", big)
	per := waitingBytes(&call{env: env, canonArgs: env.Args}) // as admitted: env.Args is canonArgs
	// Room for two big calls, and one small, of either bound.
	h.k.held.perAgent, h.k.held.all = 2*per+per/2, 2*per+per/2
	held := make(chan *Result, 2)
	for range 2 {
		go func() { held <- h.invoke("test.hold", big) }()
	}
	var once sync.Once
	end := func() { once.Do(func() { close(release) }) }
	defer end() // a failure below ends the held calls too
	<-started
	<-started // both admitted, and running until released
	sub, subJTI := h.mint(h.agent+"/helper", captoken.Capability{Tools: []string{"*"}})
	other, otherJTI := h.mint("agent-b", captoken.Capability{Tools: []string{"echo"}})
	as := func(agent, tok, jti string) func(*Envelope) {
		return func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = agent, tok, jti }
	}
	for _, tc := range []struct {
		name, tool string
		args       map[string]any
		mods       []func(*Envelope)
		refused    string // the refusal message's mark, "" for none
	}{
		{"the agent's third big call", "echo", map[string]any{"text": big["pad"]}, nil, "(with its sub-agents) in flight"},
		{"its sub-agent's", "echo", map[string]any{"text": big["pad"]}, []func(*Envelope){as(h.agent+"/helper", sub, subJTI)}, "(with its sub-agents) in flight"},
		{"another agent's big call", "echo", map[string]any{"text": big["pad"]}, []func(*Envelope){as("agent-b", other, otherJTI)}, "the calls in flight hold"},
		{"another agent's small call", "echo", map[string]any{"text": "x"}, []func(*Envelope){as("agent-b", other, otherJTI)}, ""},
	} {
		r := h.invoke(tc.tool, tc.args, tc.mods...)
		switch {
		case tc.refused == "":
			mustOK(t, r)
		case errClass(r) != ErrConcurrencyExceeded || !strings.Contains(r.Error.Message, tc.refused) || r.ReceiptID == "":
			t.Fatalf("%s: class %q, receipt %q, %+v; want concurrency_exceeded (%s), recorded", tc.name, errClass(r), r.ReceiptID, r.Error, tc.refused)
		}
	}
	end()
	for range 2 {
		mustOK(t, <-held)
	}
	// Every call's bytes are counted back: the same big call runs now.
	mustOK(t, h.invoke("echo", map[string]any{"text": big["pad"]}))
	h.k.held.mu.Lock()
	defer h.k.held.mu.Unlock()
	if h.k.held.total != 0 || len(h.k.held.byFamily) != 0 {
		t.Fatalf("after every call ended, %d bytes are counted in flight (%v)", h.k.held.total, h.k.held.byFamily)
	}
}

// TestInflightBytesCountWholeEnvelope: a call counts what it holds of its
// whole envelope, not of its args alone: a call with tiny args and 900 KB
// of provenance, or of risk_basis, is refused over a 1 MiB bound, where
// it counted 4 KiB and calls parking 2.7 MB each were admitted without
// bound (rev16a #1). A small call within the bound still runs. The
// approvals' bounds count the same estimate (waitingBytes), which grows
// by at least twice the bytes added to any member of unbounded size.
func TestInflightBytesCountWholeEnvelope(t *testing.T) {
	h := newHarness(t)
	h.k.held.perAgent, h.k.held.all = 1<<20, 1<<20
	big := strings.Repeat("p", 900<<10)
	for _, tc := range []struct {
		name    string
		mod     func(*Envelope)
		refused bool
	}{
		{"900 KB of provenance", func(e *Envelope) { e.Provenance = json.RawMessage(`{"model":"` + big + `"}`) }, true},
		{"900 KB of risk_basis", func(e *Envelope) { e.RiskBasis = []string{big} }, true},
		{"small", func(*Envelope) {}, false},
	} {
		r := h.invoke("echo", map[string]any{"text": "x"}, tc.mod)
		if got := errClass(r) == ErrConcurrencyExceeded && strings.Contains(r.Error.Message, "in flight"); got != tc.refused {
			t.Errorf("%s: class %q, %+v; refused over the in-flight bound: %v, want %v", tc.name, errClass(r), r.Error, got, tc.refused)
		}
	}
	const more = 100 << 10
	pad := strings.Repeat("a", more)
	base := &Envelope{ToolID: "echo", AgentID: "a", Args: json.RawMessage(`{}`)}
	for name, grow := range map[string]func(*Envelope){
		"args":                func(e *Envelope) { e.Args = json.RawMessage(`{"t":"` + pad + `"}`) },
		"provenance":          func(e *Envelope) { e.Provenance = json.RawMessage(`{"t":"` + pad + `"}`) },
		"risk_basis":          func(e *Envelope) { e.RiskBasis = []string{pad} },
		"capability_token":    func(e *Envelope) { e.CapabilityToken = pad },
		"capability_token_id": func(e *Envelope) { e.CapabilityTokenID = pad },
		"tool_id":             func(e *Envelope) { e.ToolID = pad },
		"policy_hash":         func(e *Envelope) { e.PolicyHash = pad },
		"state_snapshot_id":   func(e *Envelope) { e.StateSnapshotID = pad },
		"operation_id":        func(e *Envelope) { e.OperationID = pad },
		"autonomy_mode":       func(e *Envelope) { e.AutonomyMode = pad },
		"precondition_refs":   func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{{Ref: "fs:" + pad}} },
	} {
		env := *base
		grow(&env)
		if d := waitingBytes(&call{env: &env}) - waitingBytes(&call{env: base}); d < 2*more {
			t.Errorf("%d more bytes of %s: waitingBytes grew %d, want at least %d", more, name, d, 2*more)
		}
	}
}
