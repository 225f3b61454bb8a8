package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/txn"
)

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// entryOf returns the audit entry of r and its stored payload.
func (h *harness) entryOf(r *Result) (ledger.Entry, *Payload) {
	h.t.Helper()
	var e ledger.Entry
	var p *Payload
	if err := h.k.View(func(tx *bbolt.Tx) (err error) {
		if e, err = ledger.Get(tx, r.LedgerSeq); err != nil {
			return err
		}
		p, err = getPayload(tx, r.LedgerSeq)
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	return e, p
}

// TestCommitmentsAndErasure: a record commits to its call's parts; the
// caller opens them with the salt of its result envelope; a wrong guess
// does not open; erasure leaves every verifier passing and says erased;
// tampering with a payload that was not erased is found.
func TestCommitmentsAndErasure(t *testing.T) {
	h := newHarness(t)
	const secret = "pin 4711"
	w := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": secret}, key("w1"))
	mustOK(t, w)
	r := h.invoke("fs.read", map[string]any{"path": "pin.txt"})
	mustOK(t, r)
	if w.AuditSalt == "" || len(w.AuditSalt) != 2*SaltSize {
		t.Fatalf("result envelope salt %q", w.AuditSalt)
	}

	we, wp := h.entryOf(w)
	if bytes.Contains(we.Body, []byte(secret)) || bytes.Contains(we.Body, []byte("pin.txt")) {
		t.Fatalf("the chained body holds the call's arguments: %s", we.Body)
	}
	if wp == nil || !bytes.Contains(wp.Args, []byte(secret)) {
		t.Fatalf("payload %+v", wp)
	}
	// The caller opens the record with its args and its salt.
	args := json.RawMessage(`{"content":"pin 4711","path":"pin.txt"}`)
	if err := CheckPayload(we, Payload{Salt: w.AuditSalt, Args: args}); err != nil {
		t.Fatalf("the caller cannot open its record: %v", err)
	}
	for _, guess := range []string{"pin 4712", "pin 4711 "} {
		g := json.RawMessage(`{"content":"` + guess + `","path":"pin.txt"}`)
		if err := CheckPayload(we, Payload{Salt: w.AuditSalt, Args: g}); err == nil {
			t.Fatalf("guess %q opens the commitment", guess)
		}
	}
	res := json.RawMessage(`{"status":"ok","result":` + string(r.Result) + `}`)
	re, _ := h.entryOf(r)
	if err := CheckPayload(re, Payload{Salt: r.AuditSalt, Result: res}); err != nil {
		t.Fatalf("the reader cannot open its result: %v", err)
	}

	check := mustVerify(t, h.k.Inspector())
	if p := check.Payloads; p == nil || p.Records < 2 || p.Opened < 4 || p.Erased != 0 {
		t.Fatalf("payload report %+v", check.Payloads)
	}

	er, err := h.k.Erase(context.Background(), w.OperationID, "subject asked")
	if err != nil {
		t.Fatal(err)
	}
	if len(er.Seqs) != 1 || er.Seqs[0] != w.LedgerSeq {
		t.Fatalf("erasure %+v", er)
	}
	if _, err := h.k.Erase(context.Background(), w.OperationID, "again"); !errors.Is(err, ErrNothingToErase) {
		t.Fatalf("a second erasure: %v", err)
	}
	if _, err := h.k.Erase(context.Background(), "no-such-op", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("erasing an unknown operation: %v", err)
	}
	if _, p := h.entryOf(w); p != nil {
		t.Fatalf("payload still stored: %+v", p)
	}
	stored, err := h.k.Inspector().Operation(w.OperationID)
	if err != nil || bytes.Contains(stored, []byte(w.AuditSalt)) {
		t.Fatalf("the stored result envelope keeps the salt: %s %v", stored, err)
	}

	// Every verifier passes and reports the erasure.
	check = mustVerify(t, h.k.Inspector())
	if p := check.Payloads; p == nil || p.Erased != 1 || p.ErasureRecords != 1 {
		t.Fatalf("after erasure: payload report %+v", check.Payloads)
	}
	var export bytes.Buffer
	if err := h.k.Inspector().Export(&export); err != nil {
		t.Fatal(err)
	}
	exported := export.Bytes()
	off, err := VerifyExport(bytes.NewReader(exported), h.k.ID(), h.k.ReceiptKey(), nil)
	if err != nil || !off.Intact || off.Payloads == nil || off.Payloads.Erased != 1 || off.Payloads.Opened < 4 {
		t.Fatalf("offline export verification: %+v %v", off, err)
	}
	// The erased payload is reported as erased only, not also as one the
	// export lacks (before, it counted as both).
	if off.Payloads.Absent != 0 {
		t.Fatalf("offline export verification counts the erased payload as absent: %+v", off.Payloads)
	}
	// The export carries the kept payloads; tampering with one is found
	// offline; without payload lines it is the public export, intact.
	if !bytes.Contains(exported, []byte(`{"payload":`)) || bytes.Contains(exported, []byte(`"args":{"content":"pin 4711"`)) {
		t.Fatalf("export payload lines: %s", exported)
	}
	bad := bytes.Replace(exported, []byte(`"bytes_returned"`), []byte(`"bytes_Returned"`), 1)
	if off, err := VerifyExport(bytes.NewReader(bad), h.k.ID(), h.k.ReceiptKey(), nil); err != nil || off.Intact || off.BadSeq == nil || *off.BadSeq != r.LedgerSeq {
		t.Fatalf("a tampered payload line in the export: %+v %v", off, err)
	}
	// A payload line that lacks a part its record commits to is tampering
	// too, as in the store.
	var dropped bytes.Buffer
	for line := range bytes.Lines(exported) {
		var pl struct {
			Payload map[string]json.RawMessage `json:"payload"`
			Seq     uint64                     `json:"seq"`
		}
		if json.Unmarshal(line, &pl) == nil && pl.Payload != nil && pl.Seq == r.LedgerSeq {
			delete(pl.Payload, "result")
			b, err := jcs.Marshal(pl)
			if err != nil {
				t.Fatal(err)
			}
			line = append(b, '\n')
		}
		dropped.Write(line)
	}
	if off, err := VerifyExport(&dropped, h.k.ID(), h.k.ReceiptKey(), nil); err != nil || off.Intact || off.BadSeq == nil || *off.BadSeq != r.LedgerSeq {
		t.Fatalf("a payload line without its result part: %+v %v", off, err)
	}
	var public bytes.Buffer
	for line := range bytes.Lines(exported) {
		if !bytes.HasPrefix(line, []byte(`{"payload":`)) {
			public.Write(line)
		}
	}
	if off, err := VerifyExport(&public, h.k.ID(), h.k.ReceiptKey(), nil); err != nil || !off.Intact || off.Payloads.Absent == 0 {
		t.Fatalf("the public export: %+v %v", off, err)
	}
	b, err := h.k.Inspector().Bundle(w.ReceiptID)
	if err != nil {
		t.Fatal(err)
	}
	jwks, _ := h.k.Inspector().JWKS()
	raw, _ := json.Marshal(b)
	if _, err := VerifyBundle(raw, jwks); err != nil {
		t.Fatalf("the erased call's receipt bundle: %v", err)
	}
	rep, err := h.k.Inspector().ReplayVerify()
	if err != nil || len(rep.Problems) != 0 || rep.Committed != 1 {
		t.Fatalf("replay verify: %+v %v", rep, err)
	}
	// A repeat of the erased write is still a replay, not a second effect.
	again := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": secret}, key("w1"))
	if !again.Replayed {
		t.Fatalf("repeat: %+v", again)
	}
	if rep, err = h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("replay verify after a repeat of an erased call: %+v %v", rep, err)
	}
	pr, err := ReplayPolicy(context.Background(), h.k.policy, ReplayFilter{}, func(fn func(EntryView) error) error {
		return h.k.Inspector().ScanViews(0, AccessAll, fn)
	})
	if err != nil || pr.Erased != 1 || pr.Decided == 0 {
		t.Fatalf("replay policy: %+v %v", pr, err)
	}

	// Tampering with a payload that was not erased is found.
	for _, tc := range []struct {
		name   string
		tamper func(tx *bbolt.Tx) error
		seq    uint64
	}{
		{"result changed", func(tx *bbolt.Tx) error {
			k := payloadKey(r.LedgerSeq)
			v, err := unpackPayload(tx.Bucket(bucketPayloads).Get(k))
			if err != nil || !bytes.Contains(v, []byte("pin 4711")) {
				t.Fatalf("stored payload %s (%v) lacks the result", v, err)
			}
			return tx.Bucket(bucketPayloads).Put(k, packPayload(bytes.Replace(v, []byte("pin 4711"), []byte("pin 4712"), 1)))
		}, r.LedgerSeq},
		{"payload garbled", func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketPayloads).Put(payloadKey(r.LedgerSeq), []byte(`{"args":`))
		}, r.LedgerSeq},
		{"payload frame damaged", func(tx *bbolt.Tx) error {
			frame := packPayload([]byte(`{"result":"` + strings.Repeat("pin 4711 ", 400) + `"}`))
			frame[len(frame)/2] ^= 0xff
			return tx.Bucket(bucketPayloads).Put(payloadKey(r.LedgerSeq), frame)
		}, r.LedgerSeq},
		{"payload dropped without an erasure record", func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketPayloads).Delete(payloadKey(r.LedgerSeq))
		}, r.LedgerSeq},
		{"erased payload put back", func(tx *bbolt.Tx) error {
			b, _ := marshalPayload(wp)
			return tx.Bucket(bucketPayloads).Put(payloadKey(w.LedgerSeq), b)
		}, w.LedgerSeq},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var saved []byte
			k := payloadKey(r.LedgerSeq)
			h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
				saved = bytes.Clone(tx.Bucket(bucketPayloads).Get(k))
				return tc.tamper(tx)
			})
			defer h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
				tx.Bucket(bucketPayloads).Delete(payloadKey(w.LedgerSeq))
				return tx.Bucket(bucketPayloads).Put(k, saved)
			})
			c, err := h.k.Inspector().Verify(nil)
			if err != nil || c.Intact || c.BadSeq == nil || *c.BadSeq != tc.seq || !strings.Contains(c.Reason, "tampered") {
				t.Fatalf("verify: %+v %v", c, err)
			}
		})
	}
	mustVerify(t, h.k.Inspector())
}

// TestCommitmentsOnly: a tool at depth commitments_only keeps no part of
// its calls, yet the caller proves which content it wrote.
func TestCommitmentsOnly(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Audit = &AuditConfig{Depth: map[string]string{"fs.write": DepthCommitmentsOnly}}
	})
	w := h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "secret"}, key("w1"))
	mustOK(t, w)
	e, p := h.entryOf(w)
	if p != nil {
		// Not even the salt: with it, a reader could test guesses of a
		// short part against the record's commitments.
		t.Fatalf("stored payload %+v, want none", p)
	}
	if !bytes.Contains(e.Body, []byte(`"payload_depth":"commitments_only"`)) {
		t.Fatalf("body %s", e.Body)
	}
	if err := CheckPayload(e, Payload{Salt: w.AuditSalt, Args: json.RawMessage(`{"path":"a.txt","content":"secret"}`)}); err != nil {
		t.Fatalf("the writer cannot prove what it wrote: %v", err)
	}
	r := h.invoke("fs.read", map[string]any{"path": "a.txt"})
	mustOK(t, r)
	if _, p := h.entryOf(r); p == nil || p.Args == nil {
		t.Fatalf("fs.read is at depth full: payload %+v", p)
	}
	c := mustVerify(t, h.k.Inspector())
	if c.Payloads == nil || c.Payloads.NotKept < 3 {
		t.Fatalf("payload report %+v", c.Payloads)
	}
}

// TestCommitmentsOnlyStoresNoParts: at depth commitments_only no part of
// a call reaches the store, the stored result envelope included (GET
// /v1/operations and an idempotent replay answer it): no keyed read's
// content, no written path or content hash, no error message quoting the
// args, no provenance. Before, the envelope kept them all. A replay
// answers that envelope, and replay verify accepts it.
func TestCommitmentsOnlyStoresNoParts(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Audit = &AuditConfig{Depth: map[string]string{"*": DepthCommitmentsOnly}}
	})
	const (
		content = "memo-the-merger-closes-friday"
		missing = "layoffs-list-2027.txt"
		wpath   = "termination-bob.txt"
		prov    = "user-said-my-ssn-is-078-05-1120"
	)
	h.write("memo.txt", content)
	withProv := func(e *Envelope) { e.Provenance = json.RawMessage(`{"prompt":"` + prov + `"}`) }
	read := h.invoke("fs.read", map[string]any{"path": "memo.txt"}, key("k-read"), withProv)
	mustOK(t, read)
	failed := h.invoke("fs.read", map[string]any{"path": missing}, withProv)
	if failed.Status == StatusOK || !strings.Contains(failed.Error.Message, missing) {
		t.Fatalf("read of a missing file: %+v", failed.Error)
	}
	write := h.invoke("fs.write", map[string]any{"path": wpath, "content": "1234"}, key("k-write"), withProv)
	mustOK(t, write)
	if !bytes.Contains(read.Result, []byte(content)) || write.AuditSalt == "" {
		t.Fatalf("the caller's own envelope lacks its result or salt: %s %q", read.Result, write.AuditSalt)
	}
	secrets := []string{content, missing, wpath, digest.Sum([]byte("1234")), prov}
	for _, r := range []*Result{read, failed, write} {
		stored, err := h.k.Inspector().Operation(r.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if bytes.Contains(stored, []byte(s)) {
				t.Errorf("operation %s (%s) stores %q: %s", r.OperationID, r.ToolID, s, stored)
			}
		}
		if bytes.Contains(stored, []byte(r.AuditSalt)) {
			t.Errorf("operation %s stores its audit salt: %s", r.OperationID, stored)
		}
	}
	// Once the calls are finished (closed: a write's intent, which holds
	// its recovery context, goes when it is applied), no bucket holds
	// them; the deltas bucket alone keeps the written path and content
	// digest, for workspace verify (docs/formats.md "Erasure").
	cfg := func(c *Config) { c.Audit = &AuditConfig{Depth: map[string]string{"*": DepthCommitmentsOnly}} }
	h.k.Close()
	h.open(cfg)
	h.k.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				for i, s := range secrets {
					if string(name) == "deltas" && i >= 2 && i <= 3 {
						continue
					}
					if bytes.Contains(v, []byte(s)) || bytes.Contains(k, []byte(s)) {
						t.Errorf("bucket %s key %q holds %q", name, k, s)
					}
				}
				return nil
			})
		})
	})
	// A replay of a kept key answers the stored envelope: the outcome
	// without the parts.
	for _, tc := range []struct {
		orig *Result
		tool string
		args map[string]any
	}{
		{read, "fs.read", map[string]any{"path": "memo.txt"}},
		{write, "fs.write", map[string]any{"path": wpath, "content": "1234"}},
	} {
		again := h.invoke(tc.tool, tc.args, key(map[string]string{"fs.read": "k-read", "fs.write": "k-write"}[tc.tool]))
		if !again.Replayed || again.OperationID != tc.orig.OperationID || again.Status != StatusOK || again.Result != nil ||
			again.AuditSalt != "" || again.ResultHash != "" || again.TxOutcome != tc.orig.TxOutcome || again.CommitDeltaID != tc.orig.CommitDeltaID {
			t.Fatalf("replay of %s: %+v", tc.tool, again)
		}
	}
	mustVerify(t, h.k.Inspector())
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) != 0 || rep.Replays != 2 {
		t.Fatalf("replay verify: %+v %v", rep, err)
	}
	// Nothing is kept, so there is nothing to erase (not even the salt),
	// and the message still reads as not kept.
	if _, err := h.k.Erase(context.Background(), failed.OperationID, "subject asked"); !errors.Is(err, ErrNothingToErase) {
		t.Fatalf("erasure of a commitments_only operation: %v, want ErrNothingToErase", err)
	}
	if stored, _ := h.k.Inspector().Operation(failed.OperationID); !bytes.Contains(stored, []byte(NotKeptMessage)) {
		t.Fatalf("commitments_only operation: %s", stored)
	}
}

// TestRefusedHandleCallDepth: a call by handle refused before the handle
// resolves still names the handle, yet its record is kept at the depth of
// the handle's tool when the kernel knows it (here fs.write's
// commitments_only: an expired handle of the caller's own token), at the
// strictest depth configured when it does not (a handle no table
// holds), and every retention rule by tool covers it. Before, such a
// record was kept at depth full, file content and all, and no tool rule
// ever matched it.
func TestRefusedHandleCallDepth(t *testing.T) {
	clk := &clock{t: time.Now()}
	depth := map[string]string{"fs.write": DepthCommitmentsOnly}
	h := newHarness(t, func(c *Config) { c.Now = clk.now; c.Audit = &AuditConfig{Depth: depth} })
	tok, cl, err := h.k.MintToken(captoken.Claims{Subject: h.agent, IssuedAt: clk.now(), NotBefore: clk.now(), Expiry: clk.now().Add(24 * time.Hour),
		Cap: captoken.Capability{Tools: []string{"*"}, Handles: true, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := h.k.Handles(tok, "s1")
	if err != nil {
		t.Fatal(err)
	}
	byTool := map[string]string{}
	for _, x := range hs {
		byTool[x.Tool] = x.Handle
	}
	call := func(handle, content string) *Result {
		return h.invoke("fs.write", map[string]any{"path": "a.txt", "content": content}, func(e *Envelope) {
			e.ToolID, e.CapabilityToken, e.CapabilityTokenID = handle, tok, cl.ID
			e.Provenance = json.RawMessage(`{"session_id":"s1"}`)
			e.IdempotencyKey = "k-" + content
		})
	}
	mustOK(t, call(byTool["fs.write"], "by-handle-ok"))
	clk.add(90 * time.Minute) // the handle (1h) expired; the token (24h) is valid
	for _, tc := range []struct {
		name, handle string
	}{
		{"expired handle of fs.write", byTool["fs.write"]},
		{"expired handle of fs.read, at depth full", byTool["fs.read"]},
		{"a handle no table holds", HandlePrefix + strings.Repeat("a", 26)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := call(tc.handle, "content-that-must-not-be-kept")
			if errClass(bad) != ErrToolNotFound || bad.ToolID != tc.handle {
				t.Fatalf("refused: %+v", bad)
			}
			e, p := h.entryOf(bad)
			full := tc.handle == byTool["fs.read"]
			if kept := p != nil && p.Args != nil; kept != full {
				t.Fatalf("record %s keeps payload %+v, want args kept: %v", e.Body, p, full)
			}
		})
	}
	// Retention by tool covers the refused handle calls, whose records do
	// not name their tool.
	h.k.Close()
	clk.add(2 * time.Hour)
	h.open(func(c *Config) {
		c.Now = clk.now
		c.Audit = &AuditConfig{Depth: depth, Retention: []RetentionRule{{OlderThan: "1h", Tool: "fs.read"}}}
	})
	n := 0
	for _, e := range h.entries(ledger.KindAudit, 0) {
		var a recordOwner
		if json.Unmarshal(e.Body, &a) != nil || !strings.HasPrefix(a.ToolID, HandlePrefix) {
			continue
		}
		n++
		var p *Payload
		h.k.View(func(tx *bbolt.Tx) (err error) { p, err = getPayload(tx, e.Seq); return err })
		if p != nil {
			t.Errorf("retention by tool kept the payload of refused handle call %s: %+v", a.OperationID, p)
		}
	}
	if n != 3 {
		t.Fatalf("%d refused handle calls recorded, want 3", n)
	}
	mustVerify(t, h.k.Inspector())
}

// TestRetentionByAgent: a rule for agent X covers X's records, those of
// its sub-agents (X/…), and those of calls that claimed X but whose token
// no longer verified (revoked, expired), which carry a payload as any
// other (their args' digest form, result and context); not another
// agent's. Before, only records with agent_id X
// matched.
func TestRetentionByAgent(t *testing.T) {
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.Now = clk.now })
	own := h.invoke("echo", map[string]any{"text": "first-secret"})
	mustOK(t, own)
	as := func(agent string) func(*Envelope) {
		tok, jti := h.mint(agent, captoken.Capability{Tools: []string{"*"}})
		return func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = agent, tok, jti }
	}
	sub := h.invoke("echo", map[string]any{"text": "sub-agent-secret"}, as(h.agent+"/sub"))
	mustOK(t, sub)
	other := h.invoke("echo", map[string]any{"text": "other-agent-secret"}, as(h.agent+"-other"))
	mustOK(t, other)
	if err := h.k.Revoke(context.Background(), h.jti, "rotated"); err != nil {
		t.Fatal(err)
	}
	refused := h.invoke("echo", map[string]any{"text": "sent-after-revocation"})
	if refused.Status == StatusOK || refused.AgentID != "" {
		t.Fatalf("a revoked token's call: %+v", refused)
	}
	if _, p := h.entryOf(refused); p == nil || p.Args == nil || p.Result == nil {
		t.Fatalf("the refused call's payload: %+v", p)
	}
	h.k.Close()
	clk.add(2 * time.Hour)
	h.open(func(c *Config) {
		c.Now = clk.now
		c.Audit = &AuditConfig{Retention: []RetentionRule{{OlderThan: "1h", Agent: h.agent}}}
	})
	for _, tc := range []struct {
		name string
		r    *Result
		kept bool
	}{{"own call", own, false}, {"sub-agent's call", sub, false}, {"revoked token's call", refused, false}, {"another agent's call", other, true}} {
		if _, p := h.entryOf(tc.r); (p != nil) != tc.kept {
			t.Errorf("%s: payload %+v, want kept %v", tc.name, p, tc.kept)
		}
	}
	mustVerify(t, h.k.Inspector())
}

// TestCompactionDropsErasedBytes: an erased payload's bytes stay in
// kernel.db's freed pages until bbolt reuses them; the remedy
// docs/formats.md gives, a bbolt compaction of the stopped kernel's file,
// leaves none, and the kernel opens the compacted file and verifies it.
func TestCompactionDropsErasedBytes(t *testing.T) {
	h := newHarness(t)
	const secret = "patient-4711-diagnosis-secret"
	r := h.invoke("echo", map[string]any{"text": secret})
	mustOK(t, r)
	if _, err := h.k.Erase(context.Background(), r.OperationID, "data subject request"); err != nil {
		t.Fatal(err)
	}
	h.k.Close()
	path := filepath.Join(h.data, DBFile)
	src, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	dst, err := bbolt.Open(path+".compact", 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bbolt.Compact(dst, src, 0)
	src.Close()
	dst.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".compact", path); err != nil {
		t.Fatal(err)
	}
	if db, err := os.ReadFile(path); err != nil || bytes.Contains(db, []byte(secret)) {
		t.Fatalf("the compacted kernel.db still holds the erased secret (%v)", err)
	}
	h.open()
	c := mustVerify(t, h.k.Inspector())
	if c.Payloads == nil || c.Payloads.Erased != 1 {
		t.Fatalf("payload report after compaction %+v", c.Payloads)
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "after compaction"}))
	mustVerify(t, h.k.Inspector())
}

// TestRetention: retention rules erase old payloads at start and on their
// schedule, per tool and per agent, and record each erasure.
func TestRetention(t *testing.T) {
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.Now = clk.now })
	w := h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "x"}, key("w1"))
	r := h.invoke("fs.read", map[string]any{"path": "a.txt"})
	mustOK(t, w)
	mustOK(t, r)
	h.k.Close()

	// At start: fs.read payloads older than an hour go; fs.write's stay.
	clk.add(2 * time.Hour)
	h.open(func(c *Config) {
		c.Now = clk.now
		c.Audit = &AuditConfig{Retention: []RetentionRule{{OlderThan: "1h", Tool: "fs.read"}}, RetentionInterval: "20ms"}
	})
	if _, p := h.entryOf(r); p != nil {
		t.Fatal("retention at start left the old fs.read payload")
	}
	if _, p := h.entryOf(w); p == nil {
		t.Fatal("retention erased an fs.write payload its rule does not cover")
	}
	h.remintAt(clk.now())
	ers := h.entries(KindErasure, 0)
	if len(ers) != 1 || !bytes.Contains(ers[0].Body, []byte(`"by":"retention"`)) {
		t.Fatalf("erasure records %v", ers)
	}
	// On schedule: a new read ages past the rule while the kernel runs.
	r2 := h.invoke("fs.read", map[string]any{"path": "a.txt"})
	mustOK(t, r2)
	clk.add(2 * time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, p := h.entryOf(r2); p == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("scheduled retention never erased the aged fs.read payload")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := mustVerify(t, h.k.Inspector())
	if c.Payloads == nil || c.Payloads.Erased != 2 {
		t.Fatalf("payload report %+v", c.Payloads)
	}
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("replay verify: %+v %v", rep, err)
	}
	// The stored operation of an erased read keeps no salt.
	if st, err := h.k.Inspector().Operation(r.OperationID); err == nil && bytes.Contains(st, []byte(r.AuditSalt)) {
		t.Fatalf("stored operation keeps the salt: %s", st)
	}
}

func TestAuditConfigRefused(t *testing.T) {
	for _, c := range []AuditConfig{
		{Depth: map[string]string{"fs.write": "some"}},
		{Depth: map[string]string{"[": DepthFull}},
		{Retention: []RetentionRule{{OlderThan: "-1h"}}},
		{Retention: []RetentionRule{{OlderThan: "soon"}}},
		{RetentionInterval: "0s"},
	} {
		if _, err := c.parse(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// An erased payload is gone from every copy a read can reach, the kernel's
// memory of a finished background operation included (which
// GET /v1/operations/{id} and Wait answer from).
func TestErasureForgetsOperationInMemory(t *testing.T) {
	h := newHarness(t)
	const secret, prov = "pin 4711", "user-said-my-ssn-is-078-05-1120"
	data, err := json.Marshal(h.env("fs.write", map[string]any{"path": "pin.txt", "content": secret}, key("w1"),
		func(e *Envelope) { e.Provenance = json.RawMessage(`{"prompt":"` + prov + `"}`) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, refused, err := h.k.Start(ctx, data)
	if err != nil || refused != nil {
		t.Fatalf("start: %v %+v", err, refused)
	}
	w, err := h.k.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, w)
	if _, err := h.k.Erase(ctx, id, "subject asked"); err != nil {
		t.Fatal(err)
	}
	st, ok := h.k.Operation(id)
	if !ok || st.Result == nil {
		t.Fatalf("operation %s: %+v", id, st)
	}
	if st.Result.Result != nil || st.Result.AuditSalt != "" || st.Result.ResultHash != "" || st.Result.Status != w.Status {
		t.Fatalf("after erasure the operation still serves result %s, salt %q, result_hash %q", st.Result.Result, st.Result.AuditSalt, st.Result.ResultHash)
	}
	if again, _ := h.k.Wait(ctx, id); again.Result != nil || again.AuditSalt != "" || again.Provenance != nil {
		t.Fatalf("Wait after erasure: %+v", again)
	}
	// The provenance is part of the erased context: neither copy keeps
	// it (before, both did).
	if stored, err := h.k.Inspector().Operation(id); err != nil || bytes.Contains(stored, []byte(prov)) {
		t.Fatalf("stored operation after erasure: %s %v", stored, err)
	}
}

// An error's message is part of the call's result: erasing the payload
// removes it from the stored envelope and the kernel's memory too, while
// the status and error class (public in the chained body) stay.
func TestErasureRemovesErrorMessage(t *testing.T) {
	h := newHarness(t)
	const secret = "pin-4711"
	r := h.invoke("fs.read", map[string]any{"path": secret + ".txt"})
	if r.Status != StatusError || r.Error == nil || !strings.Contains(r.Error.Message, secret) {
		t.Fatalf("read of a missing file: %+v", r)
	}
	if _, err := h.k.Erase(context.Background(), r.OperationID, "subject asked"); err != nil {
		t.Fatal(err)
	}
	stored, err := h.k.Inspector().Operation(r.OperationID)
	if err != nil || bytes.Contains(stored, []byte(secret)) {
		t.Fatalf("the stored envelope keeps the message: %s %v", stored, err)
	}
	var got Result
	if err := json.Unmarshal(stored, &got); err != nil || got.Status != StatusError || got.Error == nil ||
		got.Error.Class != r.Error.Class || got.Error.Message != ErasedMessage || got.ResultHash != "" {
		t.Fatalf("stored envelope after erasure: %s %v", stored, err)
	}
	if st, ok := h.k.Operation(r.OperationID); ok && st.Result != nil && strings.Contains(st.Result.Error.Message, secret) {
		t.Fatalf("the kernel's memory keeps the message: %+v", st.Result.Error)
	}
}

// An operation whose stored envelope a v1 kernel wrote (its receipt a
// JWS string) is erased like any other.
func TestEraseV1StoredEnvelope(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "pin 4711")
	r := h.invoke("fs.read", map[string]any{"path": "a.txt"})
	mustOK(t, r)
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		// A v1 kernel stored the envelope as JSON.
		b := tx.Bucket([]byte("operations"))
		env, err := txn.GetOperation(tx, r.OperationID)
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal(env, &m); err != nil {
			return err
		}
		m["receipt"] = "eyJhbGciOiJFZERTQSJ9.e30.c2ln"
		v, _ := json.Marshal(m)
		return b.Put([]byte(r.OperationID), v)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Erase(context.Background(), r.OperationID, "subject asked"); err != nil {
		t.Fatalf("erasing an operation stored with a v1 receipt: %v", err)
	}
}

// TestDeltaIDConfirmsNoGuess: a committed call's commit_delta_id is public
// in its audit record, and its delta holds the digest and size of what was
// written; the delta's salt, kept only in kernel.db, is what stops a
// reader from confirming a guess of the content by hashing the delta the
// guess would make (everything else in it is public or guessable).
func TestDeltaIDConfirmsNoGuess(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"fs.write", map[string]any{"path": "pin.txt", "content": "pin 4711"}},
		{"kv.put", map[string]any{"key": "pin", "value": "pin 4711"}},
	} {
		r := h.invoke(c.tool, c.args, key(c.tool))
		mustOK(t, r)
		e, _ := h.entryOf(r)
		var body struct {
			DeltaID string `json:"commit_delta_id"`
		}
		if err := json.Unmarshal(e.Body, &body); err != nil || body.DeltaID == "" {
			t.Fatalf("%s: body %s: %v", c.tool, e.Body, err)
		}
		var stored []byte
		h.k.View(func(tx *bbolt.Tx) error { stored = txn.GetDelta(tx, body.DeltaID); return nil })
		var d txn.Delta
		if err := json.Unmarshal(stored, &d); err != nil {
			t.Fatalf("%s: stored delta %q: %v", c.tool, stored, err)
		}
		if len(d.Salt) != 2*txn.DeltaSaltSize {
			t.Fatalf("%s: delta salt %q", c.tool, d.Salt)
		}
		// The id proves the stored delta; the delta without its salt,
		// all a guesser could build, does not make the id.
		for _, tc := range []struct {
			salt string
			same bool
		}{{d.Salt, true}, {"", false}} {
			d.Salt = tc.salt
			canon, err := jcs.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			if got := digest.Sum(canon) == body.DeltaID; got != tc.same {
				t.Fatalf("%s: delta with salt %q hashes to the public commit_delta_id: %v, want %v", c.tool, tc.salt, got, tc.same)
			}
		}
	}
}

// TestStoredEnvelopeLedgerRefs: a stored result envelope leaves out the
// state_snapshot_id and receipt_id that name its audit entry; every read
// of it (the operation lookup, an idempotent replay) has them back, equal
// to what the call answered, and erasure, which rewrites it, leaves them
// out too.
func TestStoredEnvelopeLedgerRefs(t *testing.T) {
	h := newHarness(t)
	h.write("f.txt", "x")
	erased := h.invoke("fs.write", map[string]any{"path": "e.txt", "content": "z"}, key("e"))
	mustOK(t, erased)
	if _, err := h.k.Erase(context.Background(), erased.OperationID, "test"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Result{
		h.invoke("fs.read", map[string]any{"path": "f.txt"}),
		h.invoke("fs.write", map[string]any{"path": "g.txt", "content": "y"}, key("g")),
		erased,
	} {
		if r != erased {
			mustOK(t, r)
		}
		var raw []byte
		h.k.View(func(tx *bbolt.Tx) (err error) { raw, err = txn.GetOperation(tx, r.OperationID); return err })
		var stored Result
		if err := json.Unmarshal(raw, &stored); err != nil || stored.StateSnapshotID != "" || stored.ReceiptID != "" || stored.LedgerSeq != r.LedgerSeq {
			t.Fatalf("%s: stored envelope %s: %v", r.ToolID, raw, err)
		}
		got, err := h.k.Inspector().Operation(r.OperationID)
		var read Result
		if err == nil {
			err = json.Unmarshal(got, &read)
		}
		if err != nil || read.StateSnapshotID != r.StateSnapshotID || read.ReceiptID != r.ReceiptID {
			t.Fatalf("%s: operation read %s, %v; the call answered %s %s", r.ToolID, got, err, r.StateSnapshotID, r.ReceiptID)
		}
	}
	again := h.invoke("fs.write", map[string]any{"path": "g.txt", "content": "y"}, key("g"))
	mustOK(t, again)
	first, _ := h.k.Inspector().Operation(again.OperationID)
	if !again.Replayed || again.StateSnapshotID == "" || again.ReceiptID == "" || !bytes.Contains(first, []byte(again.StateSnapshotID)) {
		t.Fatalf("replay %+v; stored %s", again, first)
	}
}

// Erasing an operation erases its replays' copies too: a replay's record
// commits with the original's salt, and its payload and stored envelope
// carry the original's args and result. Before, the replay kept them, and
// nothing named it to erase. The risk basis, which may quote args, goes
// from the stored envelopes with the rest.
func TestErasureTakesReplays(t *testing.T) {
	h := newHarness(t)
	const secret = "secret-pin-4711"
	args := map[string]any{"path": "pin.txt", "content": secret}
	orig := h.invoke("fs.write", args, key("k1"))
	mustOK(t, orig)
	again := h.invoke("fs.write", args, key("k1"))
	if !again.Replayed || again.OperationID != orig.OperationID {
		t.Fatalf("repeat: %+v", again)
	}
	var replay auditRecord
	for _, a := range h.audits(0) {
		if a.ReplayOf == orig.OperationID {
			replay = a
		}
	}
	if replay.OperationID == "" {
		t.Fatal("no replay record")
	}
	er, err := h.k.Erase(context.Background(), orig.OperationID, "subject asked")
	if err != nil {
		t.Fatal(err)
	}
	if len(er.Seqs) != 2 {
		t.Fatalf("erased %v, want the original's record and its replay's", er.Seqs)
	}
	for _, seq := range er.Seqs {
		var p *Payload
		h.k.View(func(tx *bbolt.Tx) (err error) { p, err = getPayload(tx, seq); return err })
		if p != nil {
			t.Fatalf("record %d keeps its payload", seq)
		}
	}
	for _, op := range []string{orig.OperationID, replay.OperationID} {
		stored, err := h.k.Inspector().Operation(op)
		var got Result
		if err != nil || json.Unmarshal(stored, &got) != nil || bytes.Contains(stored, []byte(secret)) || got.AuditSalt != "" || got.RiskBasis != nil {
			t.Fatalf("operation %s after erasure: %s %v", op, stored, err)
		}
	}
	mustVerify(t, h.k.Inspector())
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("replay verify: %+v %v", rep, err)
	}
	// A repeat after the erasure records the args again, in its replay's
	// payload: erasing the operation again takes that too.
	mustOK(t, h.invoke("fs.write", args, key("k1")))
	er, err = h.k.Erase(context.Background(), orig.OperationID, "subject asked again")
	if err != nil || len(er.Seqs) != 1 {
		t.Fatalf("second erasure: %+v %v", er, err)
	}
	if _, err := h.k.Erase(context.Background(), orig.OperationID, "a third time"); !errors.Is(err, ErrNothingToErase) {
		t.Fatalf("third erasure: %v, want ErrNothingToErase", err)
	}
	mustVerify(t, h.k.Inspector())
}

// An erasure while repeats of the call are being replayed leaves no
// replay with the original's salt: a replay whose read of the key an
// erasure overtook reads it again in its record's transaction (before,
// it recorded the erased salt and result after the erasure had returned).
func TestErasureDuringReplays(t *testing.T) {
	h := newHarness(t)
	for round := range 5 {
		args := map[string]any{"path": fmt.Sprintf("pin%d.txt", round), "content": "secret-4711"}
		k := key(fmt.Sprint("race-", round))
		orig := h.invoke("fs.write", args, k)
		mustOK(t, orig)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { mustOK(t, h.invoke("fs.write", args, k)) })
		}
		wg.Go(func() {
			if _, err := h.k.Erase(context.Background(), orig.OperationID, "subject asked"); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		for _, e := range h.entries(ledger.KindAudit, 0) {
			var body struct {
				ReplayOf string `json:"replay_of"`
			}
			if json.Unmarshal(e.Body, &body) != nil || body.ReplayOf != orig.OperationID {
				continue
			}
			var p *Payload
			h.k.View(func(tx *bbolt.Tx) (err error) { p, err = getPayload(tx, e.Seq); return err })
			if p != nil && p.Salt == orig.AuditSalt {
				t.Fatalf("round %d: replay record %d keeps the erased original's salt", round, e.Seq)
			}
			var op struct {
				OperationID string `json:"operation_id"`
			}
			json.Unmarshal(e.Body, &op)
			if stored, err := h.k.Inspector().Operation(op.OperationID); err != nil || bytes.Contains(stored, []byte(orig.AuditSalt)) {
				t.Fatalf("round %d: replay %s's stored envelope keeps the erased original's salt: %s %v", round, op.OperationID, stored, err)
			}
		}
	}
	mustVerify(t, h.k.Inspector())
}

// TestRetentionInBatches: a run that erases more payloads than one erasure
// record lists goes on in batches, each batch's walk starting where the
// last stopped, passing over the payloads its rule does not cover; the
// next run erases what aged since.
func TestRetentionInBatches(t *testing.T) {
	defer func(n int) { maxErasedPerRecord = n }(maxErasedPerRecord)
	maxErasedPerRecord = 3
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.Now = clk.now })
	h.write("a.txt", "text")
	var reads []*Result
	var write *Result
	for i := range 10 {
		if i == 4 {
			write = h.invoke("fs.write", map[string]any{"path": "b.txt", "content": "x"}, key("w"))
			mustOK(t, write)
		}
		r := h.invoke("fs.read", map[string]any{"path": "a.txt"})
		mustOK(t, r)
		reads = append(reads, r)
	}
	h.k.audit.retention = []retention{{RetentionRule: RetentionRule{OlderThan: "1h", Tool: "fs.read"}, age: time.Hour}}
	clk.add(2 * time.Hour)
	if n, err := h.k.Retain(context.Background()); err != nil || n != 10 {
		t.Fatalf("Retain erased %d payloads, %v; want 10", n, err)
	}
	if ers := h.entries(KindErasure, 0); len(ers) != 4 {
		t.Fatalf("%d erasure records, want 4 (of at most 3 payloads)", len(ers))
	}
	for _, r := range reads {
		if _, p := h.entryOf(r); p != nil {
			t.Fatalf("the payload of entry %d is left", r.LedgerSeq)
		}
	}
	if _, p := h.entryOf(write); p == nil {
		t.Fatal("the fs.write payload, which the rule does not cover, was erased")
	}
	h.remintAt(clk.now())
	late := h.invoke("fs.read", map[string]any{"path": "a.txt"})
	mustOK(t, late)
	clk.add(2 * time.Hour)
	if n, err := h.k.Retain(context.Background()); err != nil || n != 1 {
		t.Fatalf("second Retain erased %d payloads, %v; want 1", n, err)
	}
	mustVerify(t, h.k.Inspector())
}

// remintAt gives h a token for its agent and workspace valid for a day
// from now, for tests that move the kernel's clock past the first one.
func (h *harness) remintAt(now time.Time) {
	h.t.Helper()
	tok, cl, err := h.k.MintToken(captoken.Claims{Subject: h.agent, IssuedAt: now, NotBefore: now, Expiry: now.Add(24 * time.Hour),
		Cap: captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}}})
	if err != nil {
		h.t.Fatal(err)
	}
	h.token, h.jti = tok, cl.ID
}
