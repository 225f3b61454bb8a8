package kernel

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// harness is a real kernel on a real data dir in t.TempDir(), with a
// workspace and a token for agent "agent-1".
type harness struct {
	t     testing.TB
	k     *Kernel
	data  string
	ws    string
	agent string
	token string
	jti   string
}

func newHarness(t testing.TB, cfg ...func(*Config)) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, data: filepath.Join(dir, "data"), ws: filepath.Join(dir, "ws"), agent: "agent-1"}
	if _, err := Init(h.data); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.ws, 0o755); err != nil {
		t.Fatal(err)
	}
	h.open(cfg...)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{
		Tools: []string{"*"},
		FS:    []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		KV:    []captoken.KVScope{{Keys: "*", Mode: "rw"}},
	})
	return h
}

func (h *harness) open(cfg ...func(*Config)) {
	h.t.Helper()
	c := Config{DataDir: h.data}
	for _, f := range cfg {
		f(&c)
	}
	k, err := Open(context.Background(), c)
	if err != nil {
		h.t.Fatal(err)
	}
	h.k = k
	h.t.Cleanup(func() { k.Close() })
}

func (h *harness) mint(agent string, cp captoken.Capability) (token, jti string) {
	h.t.Helper()
	tok, cl, err := h.k.MintToken(captoken.Claims{Subject: agent, Expiry: time.Now().Add(time.Hour), Cap: cp})
	if err != nil {
		h.t.Fatal(err)
	}
	return tok, cl.ID
}

// env builds an envelope for tool with args, from the harness's agent and
// token; mods adjust it.
func (h *harness) env(tool string, args any, mods ...func(*Envelope)) *Envelope {
	h.t.Helper()
	a, err := json.Marshal(args)
	if err != nil {
		h.t.Fatal(err)
	}
	e := &Envelope{
		ToolID: tool, Args: a, AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
		PolicyHash: h.k.PolicyHash(), TaskClass: "test",
	}
	for _, m := range mods {
		m(e)
	}
	return e
}

func (h *harness) invoke(tool string, args any, mods ...func(*Envelope)) *Result {
	h.t.Helper()
	return h.k.Invoke(context.Background(), h.env(tool, args, mods...))
}

func key(k string) func(*Envelope) { return func(e *Envelope) { e.IdempotencyKey = k } }

func (h *harness) write(rel, content string) {
	h.t.Helper()
	p := filepath.Join(h.ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) read(rel string) string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.ws, rel))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// entries returns the ledger's entries of kind from seq on.
func (h *harness) entries(kind string, from uint64) []ledger.Entry {
	h.t.Helper()
	var out []ledger.Entry
	err := h.k.View(func(tx *bbolt.Tx) error {
		return ledger.Scan(tx, from, func(e ledger.Entry) error {
			if kind == "" || e.Kind == kind {
				out = append(out, e)
			}
			return nil
		})
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// oneRecord fails the test unless the ledger holds exactly one audit
// record of operation id, with tx_outcome outcome.
func (h *harness) oneRecord(id, outcome string) {
	h.t.Helper()
	records := 0
	for _, a := range h.audits(0) {
		if a.OperationID == id {
			records++
			if a.TxOutcome != outcome {
				h.t.Errorf("the record of %s says %s, want %s", id, a.TxOutcome, outcome)
			}
		}
	}
	if records != 1 {
		h.t.Fatalf("%d audit records for operation %s, want 1", records, id)
	}
}

// audits returns the audit records from seq on, whole: each with the
// private fields its payload holds.
func (h *harness) audits(from uint64) []auditRecord {
	h.t.Helper()
	var out []auditRecord
	for _, e := range h.entries(ledger.KindAudit, from) {
		var p *Payload
		if err := h.k.View(func(tx *bbolt.Tx) (err error) {
			p, err = getPayload(tx, e.Seq)
			return err
		}); err != nil {
			h.t.Fatal(err)
		}
		a, err := openRecord(e, p)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, *a)
	}
	return out
}

func (h *harness) headSize() uint64 {
	h.t.Helper()
	hd, err := h.k.Inspector().Head()
	if err != nil {
		h.t.Fatal(err)
	}
	return hd.Size
}

func errClass(r *Result) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Class
}

func mustOK(t testing.TB, r *Result) {
	t.Helper()
	if r.Status != StatusOK {
		t.Fatalf("%s: status %s, error %+v", r.ToolID, r.Status, r.Error)
	}
}

// mustVerify verifies the whole ledger of in (chain, tree, checkpoint and
// receipt signatures) and fails the test unless it is intact.
func mustVerify(t testing.TB, in *Inspector) LedgerCheck {
	t.Helper()
	c, err := in.Verify(nil)
	if err != nil || !c.Intact {
		t.Fatalf("ledger verification: %+v, %v", c, err)
	}
	return c
}

// verifyReceipt checks r's receipt offline, as a third party would (the
// JSON of the result envelope's receipt and the kernel's JWKS), and
// returns what it attests.
func verifyReceipt(t testing.TB, k *Kernel, r *Result) *receipts.Receipt {
	t.Helper()
	jwks, err := k.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(r.Receipt)
	if err != nil {
		t.Fatal(err)
	}
	p, err := receipts.VerifyLogged(raw, jwks)
	if err != nil {
		t.Fatalf("receipt of %s does not verify: %v", r.OperationID, err)
	}
	// The record commits to the result under the salt the caller got, and
	// to args and a context the kept payload gives: the receipt states
	// their hashes and the approver's reason once they open.
	if err := CheckPayload(p.Entry, Payload{Salt: r.AuditSalt, Result: resultCanonical(r, nil)}); err != nil {
		t.Fatalf("receipt of %s: %v", r.OperationID, err)
	}
	p.Receipt.ResultHash = resultHash(r, nil)
	if err := k.View(func(tx *bbolt.Tx) error {
		pl, err := getPayload(tx, p.Entry.Seq)
		if err != nil {
			return err
		}
		a, err := openRecord(p.Entry, pl)
		if err == nil {
			p.Receipt.ArgsHash, p.Receipt.ApprovalReason = a.ArgsHash, a.ApprovalReason
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return p.Receipt
}
