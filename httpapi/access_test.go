package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// party is one credential of the access fixture.
type party struct {
	agent, token, jti, ws string
}

// accessFixture is a real kernel over real HTTP with two agents on
// separate file trees, an auditor and an approver.
type accessFixture struct {
	k                 *kernel.Kernel
	srv               *httptest.Server
	admin             string
	a, b              party
	auditor, approver string
}

func newAccessFixture(t *testing.T) *accessFixture {
	t.Helper()
	return newAccessFixtureWith(t, kernel.Config{}, nil)
}

// newAccessFixtureWith is newAccessFixture with the kernel's cfg (DataDir
// is set here) and a change to the API server before it serves.
func newAccessFixtureWith(t *testing.T, cfg kernel.Config, api func(*httpapi.Server)) *accessFixture {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	ir, err := kernel.Init(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = dir
	k, err := kernel.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	s := httpapi.New(k)
	if api != nil {
		api(s)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	f := &accessFixture{k: k, srv: srv, admin: ir.AdminCredential}
	mk := func(agent string) party {
		ws := filepath.Join(root, agent)
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		tok, cl, err := k.MintToken(captoken.Claims{Subject: agent, Expiry: time.Now().Add(time.Hour),
			Cap: captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: ws, Mode: "rw"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return party{agent: agent, token: tok, jti: cl.ID, ws: ws}
	}
	f.a, f.b = mk("agent-a"), mk("agent-b")
	// The role tokens are minted as an operator would: over the API.
	for role, dst := range map[string]*string{captoken.RoleAuditor: &f.auditor, captoken.RoleApprover: &f.approver} {
		c := &httpapi.Client{BaseURL: srv.URL, Credential: f.admin}
		m, err := c.Mint(context.Background(), kernel.TokenRequest{AgentID: "person-" + role, Role: role})
		if err != nil {
			t.Fatalf("minting a %s token: %v", role, err)
		}
		*dst = m.Token
	}
	return f
}

// call makes p's call over HTTP and returns its result envelope.
func (f *accessFixture) call(t *testing.T, p party, tool, args, key, op string) *kernel.Result {
	t.Helper()
	b, err := json.Marshal(kernel.Envelope{ToolID: tool, Args: json.RawMessage(args), AgentID: p.agent,
		CapabilityToken: p.token, CapabilityTokenID: p.jti, PolicyHash: f.k.PolicyHash(), IdempotencyKey: key, OperationID: op})
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := (&httpapi.Client{BaseURL: f.srv.URL}).Call(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// get answers a GET with cred as bearer: status and body.
func (f *accessFixture) get(t *testing.T, cred, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// stream collects the raw SSE bytes of GET /v1/events for cred until
// stop is closed.
type stream struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func (f *accessFixture) events(t *testing.T, cred string) (*stream, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/events: %d", resp.StatusCode)
	}
	s := &stream{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			s.mu.Lock()
			s.buf.Write(sc.Bytes())
			s.buf.WriteByte('\n')
			s.mu.Unlock()
		}
	}()
	return s, func() { cancel(); resp.Body.Close(); <-s.done }
}

// waitFor waits until the stream holds want.
func (s *stream) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		ok := strings.Contains(s.buf.String(), want)
		s.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the event stream never carried %q", want)
}

func (s *stream) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.buf.Bytes())
}

func hashOf(t *testing.T, v string) string {
	t.Helper()
	h, err := digest.JSON([]byte(v))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestScopedReads: agent B cannot read agent A's arguments or results
// from any read endpoint, nor confirm a guess of them from the plain
// hashes; it can prove A's record is in the log; the auditor and the
// admin read everything.
func TestScopedReads(t *testing.T) {
	f := newAccessFixture(t)
	ctx := context.Background()
	const secret = "hunter2-QX7"
	const secretName = "plan-ZK9.txt"

	bEvents, stopB := f.events(t, f.b.token)
	defer stopB()
	audEvents, stopAud := f.events(t, f.auditor)
	defer stopAud()
	apprEvents, stopAppr := f.events(t, f.approver)
	defer stopAppr()

	writeArgs := fmt.Sprintf(`{"path":"notes.txt","content":%q}`, secret)
	w := f.call(t, f.a, "fs.write", writeArgs, "k-a1", "")
	if w.Status != kernel.StatusOK {
		t.Fatalf("A's fs.write: %+v", w.Error)
	}
	r := f.call(t, f.a, "fs.read", `{"path":"notes.txt"}`, "", "")
	if r.Status != kernel.StatusOK {
		t.Fatalf("A's fs.read: %+v", r.Error)
	}
	miss := f.call(t, f.a, "fs.read", fmt.Sprintf(`{"path":%q}`, secretName), "", "")
	if miss.Status == kernel.StatusOK {
		t.Fatal("reading a missing file succeeded")
	}
	// B's own call marks the end of A's events in every stream.
	const bOp = "0190b3e4-0000-7000-8000-00000000b0b0"
	if own := f.call(t, f.b, "echo", `{"text":"b-own-call"}`, "", bOp); own.Status != kernel.StatusOK {
		t.Fatalf("B's echo: %+v", own.Error)
	}
	for _, s := range []*stream{bEvents, audEvents, apprEvents} {
		s.waitFor(t, bOp)
	}

	// What must never reach B: the secret, the name A asked for, and the
	// plain digests of A's args and results (a guess of a short secret
	// would be confirmed by recomputing them).
	forbidden := []string{secret, secretName, hashOf(t, writeArgs), w.ResultHash, r.ResultHash, miss.ResultHash}

	rl, err := (&httpapi.Client{BaseURL: f.srv.URL, Credential: f.admin}).Receipts(ctx, kernel.ReceiptFilter{AgentID: f.a.agent})
	if err != nil || len(rl) < 3 {
		t.Fatalf("A's receipts: %v (%d)", err, len(rl))
	}
	aReceipt := rl[0].ReceiptID
	paths := []string{
		"/v1/ledger/entries?limit=1000",
		"/v1/ledger/export",
		"/v1/receipts",
		"/v1/receipts/" + aReceipt,
		"/v1/receipts/" + aReceipt + "/bundle",
		"/v1/operations/" + w.OperationID,
		"/v1/operations/" + r.OperationID,
	}
	cases := []struct {
		who      string
		cred     string
		full     bool
		statuses map[string]int
	}{
		// A receipt (the audit entry proven by the log) is public: it
		// holds commitments only.
		{"agent B", f.b.token, false, map[string]int{"/v1/ledger/export": 403,
			"/v1/operations/" + w.OperationID: 404, "/v1/operations/" + r.OperationID: 404}},
		{"approver", f.approver, false, map[string]int{"/v1/ledger/export": 403,
			"/v1/operations/" + w.OperationID: 404, "/v1/operations/" + r.OperationID: 404}},
		{"auditor", f.auditor, true, nil},
		{"admin", f.admin, true, nil},
		{"agent A", f.a.token, true, map[string]int{"/v1/ledger/export": 403}},
	}
	for _, c := range cases {
		var all []byte
		for _, p := range paths {
			status, body := f.get(t, c.cred, p)
			wantStatus := http.StatusOK
			if s, ok := c.statuses[p]; ok {
				wantStatus = s
			}
			if status != wantStatus {
				t.Errorf("%s: GET %s: %d, want %d: %s", c.who, p, status, wantStatus, body)
			}
			all = append(all, body...)
		}
		if !c.full {
			for _, s := range forbidden {
				if bytes.Contains(all, []byte(s)) {
					t.Errorf("%s read %q of agent A's call", c.who, s)
				}
			}
			continue
		}
		for _, s := range []string{secret, secretName} {
			if !bytes.Contains(all, []byte(s)) {
				t.Errorf("%s could not read %q of agent A's call", c.who, s)
			}
		}
	}

	// B proves A's write is in the log from its public part alone.
	_, body := f.get(t, f.b.token, "/v1/ledger/entries?limit=1000")
	var page httpapi.Entries
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	var seq uint64
	var hash string
	found := false
	for _, e := range page.Entries {
		if e.Kind == "audit" && strings.Contains(string(e.Body), w.OperationID) {
			seq, hash, found = e.Seq, e.Hash, true
			// The record is public whole: its hash recomputes from B's
			// view, and it holds commitments, not the payload.
			if h, err := ledger.EntryHash(e.Entry); err != nil || h != e.Hash || e.Withheld != nil || e.Payload != nil {
				t.Errorf("B's view of A's record: hash %s (%v), withheld %v, payload %v", h, err, e.Withheld, e.Payload)
			}
			if !bytes.Contains(e.Body, []byte(`"args_commitment"`)) {
				t.Errorf("A's record commits to no args: %s", e.Body)
			}
		}
	}
	if !found {
		t.Fatal("B does not see A's audit record at all")
	}
	bc := &httpapi.Client{BaseURL: f.srv.URL}
	cp, err := bc.Checkpoint(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	proof, err := bc.ProveInclusion(ctx, seq, cp.Size)
	if err != nil {
		t.Fatal(err)
	}
	if proof.LeafHash != hash {
		t.Fatalf("inclusion proof of seq %d is for leaf %s, B's view says %s", seq, proof.LeafHash, hash)
	}
	root, err := digest.Parse(cp.Root)
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.Verify(root); err != nil {
		t.Errorf("B cannot prove A's record is in the log: %v", err)
	}

	// Events: B sees none of A's; the approver sees A's without messages;
	// the auditor sees A's in full.
	if ev := bEvents.bytes(); bytes.Contains(ev, []byte(f.a.agent)) {
		t.Errorf("B's event stream carried agent A's events:\n%s", ev)
	}
	if ev := apprEvents.bytes(); !bytes.Contains(ev, []byte(f.a.agent)) || bytes.Contains(ev, []byte(secretName)) {
		t.Errorf("the approver's event stream: want A's events without their messages:\n%s", ev)
	}
	if ev := audEvents.bytes(); !bytes.Contains(ev, []byte(secretName)) {
		t.Errorf("the auditor's event stream lacks A's error message:\n%s", ev)
	}
}

// TestAuditorRole: an auditor token reads but cannot decide an
// approval or make a call.
func TestAuditorRole(t *testing.T) {
	f := newAccessFixture(t)
	ins := httpapi.Inspect(f.k, f.auditor)
	if !ins.Valid || ins.Claims.Cap.Role != captoken.RoleAuditor {
		t.Fatalf("auditor token: %+v", ins)
	}
	res := f.call(t, party{agent: "person-auditor", token: f.auditor, jti: ins.Claims.ID}, "echo", `{"text":"x"}`, "", "")
	if res.Status == kernel.StatusOK {
		t.Fatal("an auditor token made a call")
	}
	if _, err := f.k.Decide("no-such-approval", f.auditor, "allow", "r"); err == nil || !strings.Contains(err.Error(), "not an approver token") {
		t.Fatalf("an auditor deciding: %v", err)
	}
	// A role token cannot carry grants.
	c := &httpapi.Client{BaseURL: f.srv.URL, Credential: f.admin}
	if _, err := c.Mint(context.Background(), kernel.TokenRequest{AgentID: "x", Role: captoken.RoleAuditor, Tools: []string{"echo"}}); err == nil {
		t.Fatal("minted an auditor token with tools")
	}
}

// TestEraseOverHTTP: the admin erases one call's payload; the auditor and
// the call's agent no longer read it; the ledger verifies intact and
// reports the erasure; nobody else may erase; the agent still proves its
// record commits to what it sent.
func TestEraseOverHTTP(t *testing.T) {
	f := newAccessFixture(t)
	ctx := context.Background()
	const secret = "medical-note-77"
	args := fmt.Sprintf(`{"path":"n.txt","content":%q}`, secret)
	w := f.call(t, f.a, "fs.write", args, "k1", "")
	if w.Status != kernel.StatusOK {
		t.Fatalf("write: %+v", w.Error)
	}
	_, before := f.get(t, f.a.token, "/v1/ledger/entries?limit=1000")
	if !bytes.Contains(before, []byte(secret)) || !bytes.Contains(before, []byte(w.AuditSalt)) {
		t.Fatal("agent A does not read its own payload and salt")
	}
	for _, cred := range []string{f.a.token, f.auditor, f.approver} {
		c := &httpapi.Client{BaseURL: f.srv.URL, Credential: cred}
		if _, err := c.Erase(ctx, w.OperationID, "x"); err == nil {
			t.Fatal("a token erased a payload")
		}
	}
	admin := &httpapi.Client{BaseURL: f.srv.URL, Credential: f.admin}
	if _, err := admin.Erase(ctx, w.OperationID, ""); err == nil {
		t.Fatal("an erasure without a reason")
	}
	e, err := admin.Erase(ctx, w.OperationID, "data subject request")
	if err != nil || len(e.Seqs) != 1 {
		t.Fatalf("erase: %+v %v", e, err)
	}
	if _, err := admin.Erase(ctx, w.OperationID, "again"); err == nil {
		t.Fatal("erased twice")
	}
	for _, cred := range []string{f.a.token, f.auditor, f.admin} {
		for _, p := range []string{"/v1/ledger/entries?limit=1000", "/v1/operations/" + w.OperationID} {
			if _, body := f.get(t, cred, p); bytes.Contains(body, []byte(secret)) || bytes.Contains(body, []byte(w.AuditSalt)) {
				t.Errorf("GET %s still holds the erased payload", p)
			}
		}
	}
	check, err := admin.VerifyLedger(ctx)
	if err != nil || !check.Intact || check.Payloads == nil || check.Payloads.Erased != 1 {
		t.Fatalf("verify after erasure: %+v %v", check, err)
	}
	// The agent kept its args and salt: the record still commits to them.
	var page httpapi.Entries
	_, body := f.get(t, f.b.token, "/v1/ledger/entries?limit=1000")
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	for _, v := range page.Entries {
		if v.Seq == w.LedgerSeq {
			if err := kernel.CheckPayload(v.Entry, kernel.Payload{Salt: w.AuditSalt, Args: json.RawMessage(args)}); err != nil {
				t.Fatalf("the erased record no longer opens with the agent's own payload: %v", err)
			}
			return
		}
	}
	t.Fatal("the erased record is not in the ledger")
}
