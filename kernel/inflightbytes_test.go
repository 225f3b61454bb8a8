package kernel

import (
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
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
