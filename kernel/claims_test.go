package kernel

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/digest"
)

// TestPublicClaims: what an envelope claims and nothing vouches for
// reaches its (public, never erased) record only in the form of its
// member — a token pasted as the token id or as the tool id, or a
// megabyte of text as the agent or tool id, is recorded as its digest,
// in the record, the result and its message alike — while claims of the
// right form are recorded as sent.
func TestPublicClaims(t *testing.T) {
	h := newHarness(t)
	big := strings.Repeat("A", 1<<20)
	envelope := func(mod func(m map[string]any)) []byte {
		m := map[string]any{"tool_id": "echo", "args": map[string]string{"text": "x"}, "agent_id": h.agent,
			"capability_token": h.token, "capability_token_id": h.jti, "policy_hash": h.k.PolicyHash()}
		mod(m)
		b, _ := json.Marshal(m)
		return b
	}
	tests := []struct {
		name    string
		data    []byte
		refuse  bool   // through Refuse, as a front end's refusal before decoding
		secret  string // what no record may hold
		tool    string // the tool id recorded
		agent   string // the agent id claimed in the record
		tokenID string // the token id claimed in the record
	}{
		{name: "token and token id swapped", secret: h.token,
			data: envelope(func(m map[string]any) { m["capability_token"], m["capability_token_id"] = h.jti, h.token }),
			tool: "echo", agent: h.agent, tokenID: digest.Sum([]byte(h.token))},
		{name: "token as the tool id", secret: h.token,
			data: envelope(func(m map[string]any) { m["tool_id"] = h.token }),
			tool: digest.Sum([]byte(h.token))},
		{name: "a megabyte as the agent and tool id", secret: big, refuse: true,
			data: envelope(func(m map[string]any) { m["agent_id"], m["tool_id"] = big, big+"t" }),
			tool: digest.Sum([]byte(big + "t")), agent: digest.Sum([]byte(big)), tokenID: h.jti},
		{name: "the admin credential as the agent id", secret: AdminPrefix + "s3cr3tAdminCredential",
			data: envelope(func(m map[string]any) { m["agent_id"] = AdminPrefix + "s3cr3tAdminCredential" }),
			tool: "echo", agent: digest.Sum([]byte(AdminPrefix + "s3cr3tAdminCredential")), tokenID: h.jti},
		{name: "the admin credential as the task class", secret: AdminPrefix + "s3cr3tAdminCredential",
			data: envelope(func(m map[string]any) {
				m["task_class"], m["tool_id"] = AdminPrefix+"s3cr3tAdminCredential", "no.such_tool"
			}),
			tool: "no.such_tool", agent: h.agent, tokenID: h.jti},
		{name: "claims of the right form kept", secret: "\x00",
			data: envelope(func(m map[string]any) { m["tool_id"], m["capability_token"] = "no.such_tool", "x" }),
			tool: "no.such_tool", agent: h.agent, tokenID: h.jti},
		{name: "a handle's form kept", secret: "\x00",
			data: envelope(func(m map[string]any) { m["tool_id"] = HandlePrefix + strings.Repeat("a", handleNameLen) }),
			tool: HandlePrefix + strings.Repeat("a", handleNameLen)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.headSize()
			var r *Result
			if tt.refuse {
				r = h.k.Refuse(context.Background(), tt.data, ErrInvalidArgs, "refused by the front end")
			} else {
				r = h.k.InvokeJSON(context.Background(), tt.data)
			}
			if r.Status == StatusOK || r.ToolID != tt.tool || strings.Contains(r.Error.Message, tt.secret) {
				t.Fatalf("result %s %+v", r.ToolID, r.Error)
			}
			es := h.entries("", before)
			for _, e := range es {
				b, _ := json.Marshal(e)
				if strings.Contains(string(b), tt.secret) || len(b) > 16<<10 {
					t.Fatalf("ledger entry %d (%d bytes) holds what the envelope claimed: %.300s", e.Seq, len(b), b)
				}
			}
			a := h.audits(before)
			if len(a) != 1 || a[0].ToolID != tt.tool || a[0].ClaimedAgentID+a[0].AgentID != tt.agent && tt.agent != "" ||
				a[0].ClaimedTokenID+a[0].CapabilityTokenID != tt.tokenID && tt.tokenID != "" {
				t.Fatalf("record %+v", a)
			}
		})
	}
}

// TestPublicClaimsOtherMembers: the envelope's other members a record
// publishes — task_class, state_snapshot_id, idempotency_key and
// autonomy_mode — reach it only in their own form: a token pasted there,
// or 200 KiB of text, is refused invalid_args and recorded as its digest,
// whether or not the call's token verifies; a well-formed value passes.
func TestPublicClaimsOtherMembers(t *testing.T) {
	h := newHarness(t)
	big := strings.Repeat("B", 200<<10)
	for _, member := range []string{"task_class", "state_snapshot_id", "idempotency_key", "autonomy_mode"} {
		for _, secret := range []string{h.token, big} {
			for _, verifies := range []bool{true, false} {
				m := map[string]any{"tool_id": "echo", "args": map[string]string{"text": "x"}, "agent_id": h.agent,
					"capability_token": h.token, "capability_token_id": h.jti, "policy_hash": h.k.PolicyHash(), member: secret}
				if !verifies {
					m["capability_token"] = "not-a-token"
				}
				data, _ := json.Marshal(m)
				before := h.headSize()
				r := h.k.InvokeJSON(context.Background(), data)
				if r.Status == StatusOK {
					t.Fatalf("%s of %d bytes: the call ran", member, len(secret))
				}
				for _, e := range h.entries("", before) {
					b, _ := json.Marshal(e)
					if strings.Contains(string(b), secret) || len(b) > 16<<10 {
						t.Fatalf("%s (token verifies %v): entry %d of %d bytes holds it", member, verifies, e.Seq, len(b))
					}
				}
			}
		}
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) {
		e.TaskClass, e.StateSnapshotID, e.AutonomyMode = "triage", "3:"+digest.Sum([]byte("x")), "autopilot"
	}))
	// A session id is published too (approval requests, events): bounded
	// as the handles' (MaxSessionIDBytes), and a refused one reaches no
	// event whole; the admin credential is none.
	sub := h.k.Subscribe(EventFilter{}, 64)
	defer sub.Close()
	for _, session := range []string{strings.Repeat("s", 300<<10), AdminPrefix + "s3cr3tAdminCredential", "Bearer " + AdminPrefix + "s3cr3tAdminCredential"} {
		if r := h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) {
			e.Provenance = json.RawMessage(`{"session_id":"` + session + `"}`)
		}); errClass(r) != ErrInvalidArgs || strings.Contains(r.Error.Message, session) {
			t.Fatalf("a session id of %d bytes: %+v", len(session), r.Error != nil)
		}
	drain:
		for {
			select {
			case e := <-sub.C:
				if b, _ := json.Marshal(e); strings.Contains(string(b), session) {
					t.Fatalf("an event holds the refused session id (%d bytes)", len(session))
				}
			default:
				break drain
			}
		}
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) {
		e.Provenance = json.RawMessage(`{"session_id":"` + strings.Repeat("s", MaxSessionIDBytes) + `"}`)
	}))
	// Values quoted in refusals are cut to their size and digest.
	cred := AdminPrefix + "s3cr3tAdminCredential"
	for _, mod := range []func(*Envelope){
		func(e *Envelope) { e.AutonomyMode = big },
		func(e *Envelope) { e.PolicyHash = h.token },
		func(e *Envelope) { e.OperationID = h.token },
		func(e *Envelope) { e.PolicyHash = " " + cred },
		func(e *Envelope) { e.AutonomyMode = "Bearer " + cred },
	} {
		if r := h.invoke("echo", map[string]any{"text": "x"}, mod); r.Status == StatusOK || strings.Contains(r.Error.Message, h.token) ||
			strings.Contains(r.Error.Message, cred) || len(r.Error.Message) > 1024 {
			t.Fatalf("a refusal quoting what was sent: %d bytes", len(r.Error.Message))
		}
	}
	// The admin credential obeys the task class's rule; a call carrying it
	// there runs, and its record (and result) keep its digest.
	before := h.headSize()
	r := h.invoke("echo", map[string]any{"text": "x"}, func(e *Envelope) { e.TaskClass = cred })
	mustOK(t, r)
	if a := h.audits(before); len(a) != 1 || a[0].TaskClass != digest.Sum([]byte(cred)) || r.TaskClass != a[0].TaskClass {
		t.Fatalf("task_class recorded %+v, answered %q", a, r.TaskClass)
	}
	verifyReceipt(t, h.k, r)
}
