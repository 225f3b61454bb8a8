package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// raw is a GET of path by c, as a string.
func (c *client) raw(path string) (int, string) {
	c.w.t.Helper()
	resp, err := c.hc.Get(c.w.srv.URL + path)
	if err != nil {
		c.w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestHistoryReadRules: the console reads the history as the session's
// credential may (docs/http.md "Who reads what of the history"): an
// auditor reads another agent's record in full with its payload, an
// approver only its public part (commitments), from every console
// endpoint; an erased payload comes with its erasure record; an auditor
// decides and revokes nothing.
func TestHistoryReadRules(t *testing.T) {
	w := newWorld(t)
	const secret = "pin 4711 of the vault"
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "vault.txt", "content": secret}, "k1")
	alice, dave, admin := w.client(), w.client(), w.client()
	for who, c := range map[string]*client{w.alice.Token: alice, w.dave.Token: dave, w.admin: admin} {
		if s := c.login(who); s != http.StatusOK {
			t.Fatalf("login: %d", s)
		}
	}
	// The auditor sees the pending call (read-only) but cannot decide it.
	if s, _ := dave.do("GET", "/console/api/approvals/"+a.ID, nil); s != http.StatusOK {
		t.Errorf("an auditor reads a pending request: %d", s)
	}
	if s, _ := dave.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow", Reason: "x"}); s != http.StatusForbidden {
		t.Errorf("an auditor decides: %d, want 403", s)
	}
	if s, out := alice.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow", Reason: "ok"}); s != http.StatusOK {
		t.Fatalf("approve: %d %v", s, out)
	}
	res, err := w.k.Wait(context.Background(), op)
	if err != nil || res.Status != kernel.StatusOK {
		t.Fatalf("the approved call: %+v %v", res, err)
	}
	rid := res.ReceiptID

	// Every read endpoint, for the approver: nothing of the content. The
	// whole phrase is looked for: its digits alone turn up in digests by
	// chance (one run in a few dozen).
	for _, p := range []string{"/console/api/receipts", "/console/api/receipts/" + rid, "/console/api/receipts/" + rid + "/record",
		"/console/api/receipts/" + rid + "/bundle", "/console/api/operations/" + op} {
		if s, body := alice.raw(p); strings.Contains(body, secret) || s >= 500 {
			t.Errorf("approver GET %s: %d %s", p, s, body)
		}
	}
	if s, _ := alice.raw("/console/api/operations/" + op); s != http.StatusNotFound {
		t.Errorf("approver reads another agent's operation: %d, want 404", s)
	}
	var rec Record
	_, body := alice.raw("/console/api/receipts/" + rid + "/record")
	if err := json.Unmarshal([]byte(body), &rec); err != nil || rec.Full || rec.Entry.Payload != nil || rec.Erasure != nil ||
		!strings.Contains(string(rec.Entry.Body), `"args_commitment":"blake3:`) {
		t.Fatalf("approver's record: %v %s", err, body)
	}

	// The auditor: the record with its payload, and the operation.
	_, body = dave.raw("/console/api/receipts/" + rid + "/record")
	rec = Record{}
	if err := json.Unmarshal([]byte(body), &rec); err != nil || !rec.Full || rec.Entry.Payload == nil ||
		!strings.Contains(string(rec.Entry.Payload.Args), secret) || rec.Entry.Payload.Salt == "" {
		t.Fatalf("auditor's record: %v %s", err, body)
	}
	if s, body := dave.raw("/console/api/operations/" + op); s != http.StatusOK || !strings.Contains(body, `"audit_salt"`) {
		t.Errorf("auditor reads the operation: %d %s", s, body)
	}
	if s, _ := dave.raw("/console/api/tokens"); s != http.StatusOK {
		t.Errorf("auditor lists tokens: %d", s)
	}
	if s, _ := alice.raw("/console/api/tokens"); s != http.StatusForbidden {
		t.Errorf("approver lists tokens: %d", s)
	}
	if s, _ := dave.do("POST", "/console/api/tokens/"+w.agent.ID+"/revoke", RevokeRequest{Reason: "x"}); s != http.StatusForbidden {
		t.Errorf("an auditor revokes: %d, want 403", s)
	}
	if _, err := w.k.VerifyBearer(w.agent.Token); err != nil {
		t.Fatalf("the agent's token after the auditor's refused revoke: %v", err)
	}

	// Erased: no payload, and the erasure record that says so.
	if _, err := w.k.Erase(context.Background(), op, "right to erasure"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client{dave, alice} {
		_, body = c.raw("/console/api/receipts/" + rid + "/record")
		rec = Record{}
		if err := json.Unmarshal([]byte(body), &rec); err != nil || rec.Entry.Payload != nil || rec.Erasure == nil ||
			rec.Erasure.Kind != kernel.KindErasure || !strings.Contains(string(rec.Erasure.Body), "right to erasure") {
			t.Fatalf("record after erasure: %v %s", err, body)
		}
	}
	if s, body := dave.raw("/console/api/operations/" + op); s != http.StatusOK || strings.Contains(body, `"audit_salt"`) {
		t.Errorf("auditor reads the erased operation: %d %s", s, body)
	}
}

// TestCommitmentsOnlyRecord: the record endpoint's answer for a call
// audited at depth commitments_only, where the kernel stores no payload,
// not even the salt. The auditor reads it in full with no payload and no
// erasure record, and its depth, which is what tells the page "not kept"
// from a missing payload (commitments.js payloadState); the approver reads
// its public part. An erasure of it is refused, and the record reads the
// same after.
func TestCommitmentsOnlyRecord(t *testing.T) {
	w := newWorldWith(t, kernel.Config{Audit: &kernel.AuditConfig{Depth: map[string]string{"fs.*": kernel.DepthCommitmentsOnly}}}, nil)
	op, a := w.gated(w.agent, "fs.read", map[string]any{"path": "notes.txt"}, "")
	alice, dave := w.client(), w.client()
	for who, c := range map[string]*client{w.alice.Token: alice, w.dave.Token: dave} {
		if s := c.login(who); s != http.StatusOK {
			t.Fatalf("login: %d", s)
		}
	}
	if s, out := alice.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow", Reason: "ok"}); s != http.StatusOK {
		t.Fatalf("approve: %d %v", s, out)
	}
	res, err := w.k.Wait(context.Background(), op)
	if err != nil || res.Status != kernel.StatusOK {
		t.Fatalf("the approved call: %+v %v", res, err)
	}
	check := func(t *testing.T, c *client, full bool) {
		t.Helper()
		s, body := c.raw("/console/api/receipts/" + res.ReceiptID + "/record")
		var rec Record
		if err := json.Unmarshal([]byte(body), &rec); s != http.StatusOK || err != nil {
			t.Fatalf("record: %d %v %s", s, err, body)
		}
		var b struct {
			Depth string `json:"payload_depth"`
			Args  string `json:"args_commitment"`
		}
		if err := json.Unmarshal(rec.Entry.Body, &b); err != nil || b.Depth != kernel.DepthCommitmentsOnly || !strings.HasPrefix(b.Args, "blake3:") {
			t.Errorf("record body: depth %q, args_commitment %q (%v), want %q and a commitment", b.Depth, b.Args, err, kernel.DepthCommitmentsOnly)
		}
		if rec.Full != full || rec.Entry.Payload != nil || rec.Erasure != nil {
			t.Errorf("record: full %v, payload %+v, erasure %+v; want full %v, no payload, no erasure", rec.Full, rec.Entry.Payload, rec.Erasure, full)
		}
		if strings.Contains(body, "status: draft") {
			t.Errorf("record holds the content read: %s", body)
		}
	}
	t.Run("auditor", func(t *testing.T) { check(t, dave, true) })
	t.Run("approver", func(t *testing.T) { check(t, alice, false) })
	if _, err := w.k.Erase(context.Background(), op, "right to erasure"); !errors.Is(err, kernel.ErrNothingToErase) {
		t.Fatalf("erasure of a commitments_only call: %v, want ErrNothingToErase", err)
	}
	t.Run("auditor after the refused erasure", func(t *testing.T) { check(t, dave, true) })
}

// TestErasable: the record endpoint looks for an erasure record only for
// a record with commitments at a depth that stores a payload; at
// commitments_only nothing is stored, so nothing was erased and the ledger
// is not scanned on every view of such a record.
func TestErasable(t *testing.T) {
	for _, tt := range []struct {
		body string
		want bool
	}{
		{`{"payload_depth":"full","args_commitment":"blake3:00"}`, true},
		{`{"payload_depth":"commitments_only","args_commitment":"blake3:00"}`, false},
		{`{"args_hash":"sha256:00"}`, false}, // before commitments: no payload beside the chain
		{`not json`, false},
	} {
		if got := erasable(json.RawMessage(tt.body)); got != tt.want {
			t.Errorf("erasable(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}

// TestRefusedDecisionsAreRecorded: a decision by a session whose
// credential decides nothing (an auditor, the admin) reaches the kernel,
// which refuses it and records the refusal in the ledger exactly as the
// same attempt over POST /v1/approvals/{id} (docs/http.md: each refusal
// is recorded). The console used to answer 403 itself, unrecorded.
func TestRefusedDecisionsAreRecorded(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "refused.txt", "content": "x"}, "k-refused")
	head := func() uint64 {
		t.Helper()
		h, err := w.k.Inspector().Head()
		if err != nil {
			t.Fatal(err)
		}
		return h.Size
	}
	for _, tt := range []struct{ name, cred string }{{"auditor", w.dave.Token}, {"admin", w.admin}} {
		t.Run(tt.name, func(t *testing.T) {
			c := w.client()
			if st := c.login(tt.cred); st != http.StatusOK {
				t.Fatalf("login: %d", st)
			}
			before := head()
			st, out := c.do(http.MethodPost, "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow", Reason: "mine"})
			console := head() - before
			req, _ := http.NewRequest(http.MethodPost, w.srv.URL+"/v1/approvals/"+a.ID, strings.NewReader(`{"decision":"allow","reason":"mine"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tt.cred)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			api := head() - before - console
			if st != resp.StatusCode || st/100 != 4 {
				t.Fatalf("console %d %v, /v1 %d: want the same refusal from both", st, out, resp.StatusCode)
			}
			if console != api || api == 0 {
				t.Errorf("the refusal added %d ledger entries through the console and %d over /v1, want the same, not 0", console, api)
			}
		})
	}
	if st, _ := w.k.Operation(op); st.State != kernel.OpAwaitingApproval {
		t.Fatalf("after refused decisions the call is %s, want still awaiting approval", st.State)
	}
	if _, err := w.k.Decide(a.ID, w.alice.Token, "deny", "test over"); err != nil {
		t.Fatal(err)
	}
}
