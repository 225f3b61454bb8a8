package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// Approvals, async calls, events and cancellation against a real server,
// through kernelctl and raw HTTP.
func TestApprovalsOverServer(t *testing.T) {
	sv := initServed(t, "--approval-timeout", "3s")
	s, dir, adminFile, admin := sv.server, sv.dir, sv.adminFile, sv.admin
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(filepath.Join(ws, "dir"), 0o755)
	os.WriteFile(filepath.Join(ws, "dir", "x"), []byte("x"), 0o644)
	srv := []string{"--server", s.url, "--admin-token", adminFile}
	must := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	tok := mintCLI(t, s, admin, "--agent", "a1", "--tools", "fs.*", "--fs", ws+":rw")
	approverFile := func(name string, extra ...string) string {
		out := must(append([]string{"token", "mint", "--agent", name, "--approver"}, append(extra, srv...)...)...)
		f := filepath.Join(dir, name+".token")
		os.WriteFile(f, []byte(out), 0o600)
		return f
	}
	alice, carol := approverFile("alice"), approverFile("carol", "--escalation")

	// The event stream, followed by kernelctl events with the admin credential.
	events := exec.Command(kernelctl, append([]string{"events", "--json", "--agent", "a1", "--count", "9"}, srv...)...)
	evOut, _ := events.StdoutPipe()
	if err := events.Start(); err != nil {
		t.Fatal(err)
	}
	var seen []kernel.Event
	var evDone sync.WaitGroup
	evDone.Go(func() {
		sc := bufio.NewScanner(evOut)
		for sc.Scan() {
			var e kernel.Event
			json.Unmarshal(sc.Bytes(), &e)
			seen = append(seen, e)
		}
	})
	time.Sleep(300 * time.Millisecond) // let the stream subscribe before the calls

	// An async soft_gate write: 202 with the operation id, then pending
	// with the approval, approved with the CLI, then done.
	call := func(path, key string, async bool) string {
		args := []string{"call", "fs.write", "--token", tok.file, "--arg", "path=" + path, "--arg-str", "content=hi", "--idempotency-key", key, "--session", "sess-1", "--server", s.url}
		if async {
			args = append(args, "--async")
		}
		return strings.TrimSpace(must(args...))
	}
	op := call("Makefile", "k1", true)
	var st kernel.OperationStatus
	for deadline := time.Now().Add(20 * time.Second); st.State != kernel.OpAwaitingApproval; time.Sleep(50 * time.Millisecond) {
		code, body := s.get("/v1/operations/"+op, tok.Token)
		json.Unmarshal(body, &st)
		if code != http.StatusAccepted && st.State != kernel.OpAwaitingApproval || time.Now().After(deadline) {
			t.Fatalf("operation %s: %d %s", op, code, body)
		}
	}
	list := must(append([]string{"approvals", "list", "--token", alice}, srv...)...)
	if !strings.Contains(list, st.Approval.ID) || !strings.Contains(list, "write fs:"+filepath.Join(ws, "Makefile")) {
		t.Fatalf("approvals list:\n%s", list)
	}
	// show prints what the call carries: its input, session, risk basis,
	// its args whole and the file as it is now (rev10-approve F8: the
	// list's table has none of them; rev11 #3: the input's summary is
	// cut at 512 bytes).
	shown := must(append([]string{"approvals", "show", st.Approval.ID, "--token", alice}, srv...)...)
	for _, want := range []string{`fs.write {"content":"hi","path":"Makefile"}`, "sess-1", "sensitive path: Makefile", `"content": "hi"`, "file " + filepath.Join(ws, "Makefile") + " (now", "write fs:" + filepath.Join(ws, "Makefile")} {
		if !strings.Contains(shown, want) {
			t.Fatalf("approvals show lacks %q:\n%s", want, shown)
		}
	}
	if code, body := s.get("/v1/approvals/"+st.Approval.ID, tok.Token); code != http.StatusForbidden {
		t.Fatalf("an agent's token read an approval's detail: %d %s", code, body)
	}
	if code, body := s.get("/v1/approvals", tok.Token); code != http.StatusForbidden {
		t.Fatalf("an agent's token listed approvals: %d %s", code, body)
	}
	must("approvals", "approve", st.Approval.ID, "--token", alice, "--reason", "reviewed", "--server", s.url)
	// Decided, it is shown as the list keeps it: no args or files.
	if shown := must(append([]string{"approvals", "show", st.Approval.ID, "--token", alice}, srv...)...); !strings.Contains(shown, "allowed") || !strings.Contains(shown, "reviewed") || strings.Contains(shown, "args:") {
		t.Fatalf("approvals show of the decided approval:\n%s", shown)
	}
	if out := must(append([]string{"wait", op}, srv...)...); !strings.Contains(out, "fs.write ok") {
		t.Fatalf("wait:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "Makefile")); string(b) != "hi" {
		t.Fatalf("Makefile %q after approval", b)
	}
	// A second decision is a conflict; the receipt names the approver.
	aliceTok, _ := readSecret(alice)
	if code, body := s.do(http.MethodPost, "/v1/approvals/"+st.Approval.ID, aliceTok, []byte(`{"decision":"deny","reason":"changed my mind"}`)); code != http.StatusConflict || !strings.Contains(string(body), `"state":"allowed"`) {
		t.Fatalf("second decision: %d %s", code, body)
	}
	code, body := s.get("/v1/operations/"+op, tok.Token)
	var res kernel.Result
	json.Unmarshal(body, &res)
	if code != http.StatusOK || res.Status != kernel.StatusOK {
		t.Fatalf("finished operation: %d %s", code, body)
	}
	if out := must(append([]string{"receipts", "show", res.ReceiptID}, srv...)...); !strings.Contains(out, "alice") || !strings.Contains(out, "reviewed") {
		t.Fatalf("receipt without the approver:\n%s", out)
	}

	// Escalated: a plain approver is refused (403), the escalation role decides.
	op = strings.TrimSpace(must("call", "fs.delete", "--token", tok.file, "--arg", "path=dir", "--idempotency-key", "d1", "--async", "--server", s.url))
	var pending []kernel.ApprovalRequest
	for deadline := time.Now().Add(20 * time.Second); len(pending) == 0; time.Sleep(50 * time.Millisecond) {
		var l struct{ Approvals []kernel.ApprovalRequest }
		_, b := s.get("/v1/approvals", admin)
		json.Unmarshal(b, &l)
		pending = l.Approvals
		if time.Now().After(deadline) {
			t.Fatal("no approval request for the directory delete")
		}
	}
	if _, stderr, code := run(t, "approvals", "approve", pending[0].ID, "--token", alice, "--server", s.url); code != 1 || !strings.Contains(stderr, "escalation") {
		t.Fatalf("plain approver on an escalated call: exit %d %s", code, stderr)
	}
	if code, _ := s.do(http.MethodPost, "/v1/approvals/"+pending[0].ID, admin, []byte(`{"decision":"allow"}`)); code != http.StatusForbidden {
		t.Fatalf("the admin credential decided: %d", code)
	}
	must("approvals", "deny", pending[0].ID, "--token", carol, "--reason", "keep it", "--server", s.url)
	if _, stderr, code := run(t, append([]string{"wait", op}, srv...)...); code != 1 || !strings.Contains(stderr, "approval_denied") {
		t.Fatalf("denied delete: exit %d %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(ws, "dir", "x")); err != nil {
		t.Fatal("the denied delete took effect")
	}

	// Nobody answers: approval_timeout (504), nothing written.
	code, r := s.post(envelopeWith(tok, s, "fs.write", map[string]any{"path": "Makefile", "content": "late"}, "k2", nil))
	if code != http.StatusGatewayTimeout || r.Error.Class != kernel.ErrApprovalTimeout {
		t.Fatalf("unanswered: %d %+v", code, r.Error)
	}
	// kernelctl call says the kernel ended it, and why.
	if _, stderr, code := run(t, "call", "fs.write", "--token", tok.file, "--arg-str", "path=Makefile", "--arg-str", "content=late",
		"--idempotency-key", "k2b", "--server", s.url); code != 1 || !strings.Contains(stderr, ": expired: no decision within 3s") {
		t.Fatalf("unanswered call: exit %d %s", code, stderr)
	}

	// Cancelled while waiting: by operation (the agent's own token), and
	// by session; 404 for an unknown or finished operation.
	op = call("Makefile", "k3", true)
	waitPending(t, s, admin, op)
	if out := must("cancel", op, "--server", s.url, "--token", tok.file); !strings.Contains(out, "cancelled") {
		t.Fatal(out)
	}
	if _, stderr, code := run(t, append([]string{"wait", op}, srv...)...); code != 1 || !strings.Contains(stderr, "cancelled") {
		t.Fatalf("cancelled call: exit %d %s", code, stderr)
	}
	op = call("Makefile", "k4", true)
	waitPending(t, s, admin, op)
	if out := must(append([]string{"cancel", "--session", "sess-1"}, srv...)...); !strings.Contains(out, "cancelled 1 calls") {
		t.Fatal(out)
	}
	if _, stderr, code := run(t, append([]string{"wait", op}, srv...)...); code != 1 || !strings.Contains(stderr, "cancelled") {
		t.Fatalf("session-cancelled call: exit %d %s", code, stderr)
	}
	if code, _ := s.do(http.MethodDelete, "/v1/operations/"+op, admin, nil); code != http.StatusNotFound {
		t.Fatalf("cancel of a finished call: %d", code)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "Makefile")); string(b) != "hi" {
		t.Fatalf("Makefile %q after refused and cancelled calls", b)
	}

	events.Wait()
	evDone.Wait()
	var kinds []string
	for _, e := range seen {
		kinds = append(kinds, e.Kind)
	}
	want := []string{kernel.EventConfirmationRequested, kernel.EventConfirmationResolved, kernel.EventCalled, kernel.EventCompleted,
		kernel.EventConfirmationRequested, kernel.EventConfirmationResolved, kernel.EventDenied,
		kernel.EventConfirmationRequested, kernel.EventConfirmationResolved}
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Fatalf("event stream:\n got %v\nwant %v", kinds, want)
	}
	if out := must(append([]string{"ledger", "verify"}, srv...)...); !strings.Contains(out, "ledger intact") {
		t.Fatal(out)
	}
	s.stop()
}

func waitPending(t *testing.T, s *server, admin, op string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var st kernel.OperationStatus
		_, b := s.get("/v1/operations/"+op, admin)
		json.Unmarshal(b, &st)
		if st.State == kernel.OpAwaitingApproval {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s never awaited approval: %s", op, b)
		}
	}
}

func envelopeWith(tok agentToken, s *server, tool string, args map[string]any, key string, prov map[string]any) []byte {
	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	_, b := s.get("/v1/policy", "")
	json.Unmarshal(b, &pol)
	env := envelope(tok, pol.PolicyHash, tool, args, key)
	if prov != nil {
		var m map[string]any
		json.Unmarshal(env, &m)
		m["provenance"] = prov
		env, _ = json.Marshal(m)
	}
	return env
}

// A burst of 50 calls of one session over HTTP: the kernel runs at most
// the session's cap at once, and reaches it (as tool.called events report
// on the SSE stream).
func TestSessionCapOverServer(t *testing.T) {
	sv := initServed(t, "--session-concurrency", "3")
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(ws, 0o755)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "a1", "--tools", "fs.*", "--fs", ws+":rw")
	c := &httpapi.Client{BaseURL: sv.url, Credential: sv.admin}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	peak, n := 0, 0
	streamed := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		close(subscribed)
		streamed <- c.Events(ctx, kernel.EventFilter{SessionID: "burst", Kinds: []string{kernel.EventCalled}}, func(e kernel.Event) error {
			peak = max(peak, e.SessionRunning)
			if n++; n == 50 {
				cancel()
			}
			return nil
		}, nil)
	}()
	<-subscribed
	time.Sleep(300 * time.Millisecond) // the stream is open before the burst
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			env := envelopeWith(tok, sv.server, "fs.write", map[string]any{"path": fmt.Sprintf("f%d", i), "content": "x"}, fmt.Sprint(i), map[string]any{"session_id": "burst"})
			if code, r := sv.post(env); code != http.StatusOK {
				t.Errorf("call %d: %d %+v", i, code, r.Error)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-streamed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("saw %d of 50 tool.called events", n)
	}
	if peak != 3 {
		t.Fatalf("peak concurrency of the session %d, want the cap 3", peak)
	}
}
