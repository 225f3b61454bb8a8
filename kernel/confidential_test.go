package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// messages is an Observer keeping the error messages it is told.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (o *messages) CallDone(r *CallReport) {
	o.mu.Lock()
	o.msgs = append(o.msgs, r.ErrorMessage)
	o.mu.Unlock()
}

func (o *messages) GroupCommit(int, time.Duration) {}

// TestCommitmentsOnlyMessageIsTheCallers: the error message of a call
// audited at depth commitments_only, which may quote its args, reaches
// its own agent's event stream, and no other reader's (the admin's and
// auditors' streams read NotKeptMessage), nor the Observer (what serve
// logs); at depth full every reader in full sees it.
func TestCommitmentsOnlyMessageIsTheCallers(t *testing.T) {
	for _, depth := range []string{DepthCommitmentsOnly, DepthFull} {
		t.Run(depth, func(t *testing.T) {
			obs := &messages{}
			h := newHarness(t, func(c *Config) {
				c.Audit = &AuditConfig{Depth: map[string]string{"fs.read": depth}}
				c.Observer = obs
			})
			const secret = "layoffs-2027"
			sub := h.k.Subscribe(EventFilter{}, 64)
			defer sub.Close()
			r := h.invoke("fs.read", map[string]any{"path": secret + ".txt"})
			if r.Status != StatusError || !strings.Contains(r.Error.Message, secret) {
				t.Fatalf("the caller's answer: %+v", r.Error)
			}
			var ended *Event
			for ended == nil {
				select {
				case e := <-sub.C:
					if e.OperationID == r.OperationID && e.Kind != EventCalled {
						ended = &e
					}
				case <-time.After(5 * time.Second):
					t.Fatal("no event ended the call")
				}
			}
			kept := depth == DepthFull
			for _, acc := range []Access{AccessAll, {Agent: h.agent}} {
				e, ok := acc.Event(*ended)
				if !ok {
					t.Fatalf("%+v does not see the event", acc)
				}
				own := acc.Agent == h.agent
				if got := strings.Contains(e.Message, secret); got != (kept || own) {
					t.Errorf("reader %+v sees message %q", acc, e.Message)
				}
				if !kept && !own && e.Message != NotKeptMessage {
					t.Errorf("reader %+v sees message %q, want %q", acc, e.Message, NotKeptMessage)
				}
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			for _, m := range obs.msgs {
				if strings.Contains(m, secret) != kept {
					t.Errorf("the Observer is told %q", m)
				}
			}
		})
	}
}

// TestUndecodableEnvelopeStrictestDepth: an envelope whose decoding
// stopped before its tool id (a fault inside args written first) is
// recorded at the strictest depth configured, since its error may quote
// the args of any tool: here fs.write's commitments_only.
func TestUndecodableEnvelopeStrictestDepth(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Audit = &AuditConfig{Depth: map[string]string{"fs.write": DepthCommitmentsOnly}}
	})
	const secret = "pw-hunter2"
	for _, body := range []string{
		`{"args":{"content":"x","` + secret + `":1,"` + secret + `":2},"tool_id":"fs.write","agent_id":"agent-1"}`,
		`{"args":{"path":"a.txt","content":"\ud800` + secret + `"},"tool_id":"fs.write","agent_id":"agent-1"}`,
	} {
		r := h.k.InvokeJSON(context.Background(), []byte(body))
		if r.Status != StatusError || r.LedgerSeq == 0 {
			t.Fatalf("%s: %+v", body, r)
		}
		views, err := h.k.Inspector().EntryViews(r.LedgerSeq, 1, AccessAll)
		if err != nil || len(views) != 1 {
			t.Fatal(err)
		}
		view, _ := json.Marshal(views[0])
		stored, _ := h.k.Inspector().Operation(r.OperationID)
		if !bytes.Contains(view, []byte(`"payload_depth":"commitments_only"`)) || bytes.Contains(view, []byte(secret)) || bytes.Contains(stored, []byte(secret)) {
			t.Errorf("%s:\nrecord %s\nstored %s", body, view, stored)
		}
	}
}

// TestErasureWhileRunning: an erasure of a background call's record that
// lands before the call has kept its result in memory (its record
// commits first) still takes the erased parts from that result.
func TestErasureWhileRunning(t *testing.T) {
	o := newOperations()
	o.byAgent["a"], o.running = 1, 1
	op := &operation{agent: "a", family: "a", done: make(chan struct{})}
	o.byID["op"] = op
	o.forgetResult("op") // the erasure, between the record and the result
	r := &Result{Status: StatusOK, Result: json.RawMessage(`{"pin":"4711"}`), ResultHash: "blake3:00", AuditSalt: "00",
		Provenance: json.RawMessage(`{"prompt":"p"}`), RiskBasis: []string{"b"}}
	o.finish("op", op, r, "a")
	if got := op.result; got.Result != nil || got.ResultHash != "" || got.AuditSalt != "" || got.Provenance != nil || got.RiskBasis != nil || got.Status != StatusOK {
		t.Fatalf("kept after the erasure: %+v", got)
	}
}

// TestRetentionToolRuleCoversUnknownTool: a retention rule with a tool
// pattern covers its tool's records, and those whose tool is unknown (a
// refused handle's, an envelope that did not decode as far as its tool
// id), erring towards erasing; not another tool's.
func TestRetentionToolRuleCoversUnknownTool(t *testing.T) {
	r := retention{RetentionRule: RetentionRule{Tool: "fs.*"}}
	for _, c := range []struct {
		tool string
		want bool
	}{{"fs.write", true}, {"", true}, {HandlePrefix + "abc", true}, {"echo", false}} {
		if got := r.matches(c.tool, "agent-1"); got != c.want {
			t.Errorf("tool %q: matches %v, want %v", c.tool, got, c.want)
		}
	}
}

// TestOldSaltOnlyPayloadNotServed: a record at depth commitments_only
// written by a build that kept the salt alone is served without it (the
// salt would let a reader test guesses of a short part against the
// record's commitments), and an erasure of its operation removes it.
func TestOldSaltOnlyPayloadNotServed(t *testing.T) {
	cfg := func(c *Config) {
		c.Audit = &AuditConfig{Depth: map[string]string{"fs.write": DepthCommitmentsOnly}}
	}
	h := newHarness(t, cfg)
	w := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": "4711"}, key("w1"))
	mustOK(t, w)
	// What builds before fc670a8 stored at this depth.
	old := packPayload(appendPayload(nil, &Payload{Salt: w.AuditSalt}, nil))
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error { return putPayload(tx, w.LedgerSeq, old) }); err != nil {
		t.Fatal(err)
	}
	h.k.Close()
	h.open(cfg)
	views, err := h.k.Inspector().EntryViews(w.LedgerSeq, 1, AccessAll)
	if err != nil || len(views) != 1 || views[0].Payload != nil {
		t.Fatalf("the auditor's view: %+v %v", views, err)
	}
	mustVerify(t, h.k.Inspector())
	if _, err := h.k.Erase(context.Background(), w.OperationID, "purge the old salt"); err != nil {
		t.Fatal(err)
	}
	var p *Payload
	h.k.View(func(tx *bbolt.Tx) (err error) { p, err = getPayload(tx, w.LedgerSeq); return err })
	if p != nil {
		t.Fatalf("after the erasure the store keeps %+v", p)
	}
}
