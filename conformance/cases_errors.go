package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	gErrors = "DESIGN error classes"
	cErrors = "DESIGN.md Error classes; docs/http.md status codes"
)

// errorCase triggers one error class and checks class, status, envelope
// and that the refusal is audited with a verifying receipt.
func errorCase(id, class, how string, trigger func(t *T) *Resp) Case {
	title := fmt.Sprintf("%s is reported as HTTP %d with a full result envelope and an audited receipt: %s", class, statusOf[class], how)
	return mk(id, gErrors, cErrors, title, func(t *T) {
		r := trigger(t)
		t.ExpectClass(r, class)
		_, body := t.Audit(r)
		if cl := str(body["error_class"]); cl != "" && cl != class {
			t.Failf("audit record error_class %q", cl)
		}
	})
}

// approvalsAPI reports whether the endpoint has an approval API
// (GET /v1/approvals answers something other than 404/405).
func approvalsAPI(t *T) bool {
	status, _, err := t.env.do(t.ctx, http.MethodGet, "/v1/approvals", t.Admin(), nil)
	return err == nil && status != http.StatusNotFound && status != http.StatusMethodNotAllowed
}

// slowExec starts a proc.exec call that runs for seconds, or skips the
// case saying what is missing: the syscall, or a policy that lets it run.
func slowExec(t *T, ctx context.Context, seconds, timeout int, edit func(map[string]any)) (*Resp, error) {
	return execArgv(t, ctx, []string{"sleep", fmt.Sprint(seconds)}, timeout, edit)
}

// execArgv runs argv with proc.exec (see slowExec).
func execArgv(t *T, ctx context.Context, argv []string, timeout int, edit func(map[string]any)) (*Resp, error) {
	t.NeedTool("proc.exec", "a call that runs long enough to time out, be cancelled or be repeated while in flight needs a command runner")
	args := map[string]any{"argv": argv}
	if timeout > 0 {
		args["timeout_s"] = timeout
	}
	return execAs(t, ctx, t.Full("a"), args, edit)
}

// execAs calls proc.exec with args under tok, allowing the approval the
// endpoint's policy may hold it for; edit changes the envelope.
func execAs(t *T, ctx context.Context, tok *Token, args map[string]any, edit func(map[string]any)) (*Resp, error) {
	op := newUUID()
	body := t.env.envelope(tok, "proc.exec", args, func(m map[string]any) {
		m["operation_id"] = op
		if edit != nil {
			edit(m)
		}
		if id, ok := m["operation_id"].(string); ok {
			op = id // the case's own
		}
	})
	// The default policy holds proc.exec for an approval: allow it.
	stop := t.autoDecide(op, "allow")
	status, b, err := t.env.do(ctx, http.MethodPost, "/v1/syscalls", "", body)
	stop()
	t.addEvidence(Evidence{Label: "call", Request: "POST /v1/syscalls " + shorten(t.env.redact(string(body))), Status: status, Response: shorten(t.env.redact(string(b)))})
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Failf("not a result envelope: %v", err)
	}
	json.Unmarshal(b, &r.raw)
	if c := r.errClass(); c == "approval_denied" || c == "policy_denied" || c == "approval_timeout" {
		t.Skipf("proc.exec is gated by the endpoint's policy (%s) and no approval was given: the case runs once EXECUTE calls may run unattended (policy confirmation settings) or approvals can be granted", c)
	}
	return &Resp{Status: status, Body: b, R: &r}, nil
}

// testOutcomeUnknown runs a command with network that reaches a listener
// of the suite's on loopback and then fails: its effect there happened,
// so the call must end outcome_unknown (502), rolled back and audited,
// and a repeat with its key must return that outcome without running it
// again. An endpoint whose commands cannot reach the suite (a remote one,
// or one without proc.exec, curl in its sandbox, or the allowlist
// posture) skips the case.
func testOutcomeUnknown(t *T) {
	t.NeedTool("proc.exec", "an external effect the suite can observe needs a command with network")
	t.NeedWorkspace()
	var hits atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Failf("listening on loopback: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		io.WriteString(w, "charged")
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/charge"
	tok := t.Mint("net", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, Net: []string{"127.0.0.1"}})
	args := map[string]any{"argv": []string{"sh", "-c", "curl -s --max-time 10 -o /dev/null " + url + "; exit 3"},
		"network": "allowlist", "commit_on": "success", "timeout_s": 30}
	k := t.Key("k")
	r, err := execAs(t, t.ctx, tok, args, func(m map[string]any) { m["idempotency_key"] = k })
	if err != nil {
		t.Failf("%v", err)
	}
	if hits.Load() == 0 {
		t.Skipf("the command never reached the suite's listener on %s (%d %q): outcome_unknown needs a peer the kernel's commands reach, which a remote endpoint, or one without curl in its sandbox or the allowlist posture, does not give", url, r.Status, r.Class())
	}
	t.ExpectClass(r, "outcome_unknown")
	if r.R.TxOutcome != "rolled_back" || r.R.CommitDeltaID != "" {
		t.Failf("tx_outcome %q, commit_delta_id %q: nothing of the failed command may be applied", r.R.TxOutcome, r.R.CommitDeltaID)
	}
	t.Audit(r)
	again, err := execAs(t, t.ctx, tok, args, func(m map[string]any) { m["idempotency_key"] = k })
	if err != nil {
		t.Failf("%v", err)
	}
	t.ExpectClass(again, "outcome_unknown")
	if again.R.Replayed == nil || !*again.R.Replayed || again.R.OperationID != r.R.OperationID {
		t.Failf("the repeat with the same key is not the replayed outcome of %s: replayed %v, operation %s", r.R.OperationID, again.R.Replayed, again.R.OperationID)
	}
	if n := hits.Load(); n != 1 {
		t.Failf("the listener was called %d times: the repeat ran the command again", n)
	}
}

func errorCases() []Case {
	key := func(t *T, name string) func(map[string]any) {
		return func(m map[string]any) { m["idempotency_key"] = t.Key(name) }
	}
	return []Case{
		errorCase("DESIGN-ERR-001", "tool_not_found", "a syscall id the kernel does not have, under a token granting *", func(t *T) *Resp {
			return t.Call(t.Full("a"), "conformance.no_such_tool", map[string]any{}, nil)
		}),
		errorCase("DESIGN-ERR-002", "invalid_args", "args violating the input schema (echo text: 5)", func(t *T) *Resp {
			return t.Call(t.Full("a"), "echo", map[string]any{"text": 5}, nil)
		}),
		errorCase("DESIGN-ERR-003", "invalid_args", "an envelope that is not valid JSON", func(t *T) *Resp {
			return t.Post([]byte(`{"tool_id":"echo","args":{`))
		}),
		errorCase("DESIGN-ERR-004", "token_invalid", "a token signed by a stranger's key", func(t *T) *Resp {
			return t.Call(signedByStranger(t.Full("a"), nil), "echo", map[string]any{"text": "x"}, nil)
		}),
		errorCase("DESIGN-ERR-005", "token_revoked", "a revoked token", func(t *T) *Resp {
			tok := t.Mint("revoked-err", TokenRequest{Tools: []string{"echo"}})
			if status, _ := t.Do("POST", "/v1/tokens/"+tok.ID+"/revoke", t.Admin(), []byte(`{"reason":"conformance"}`)); status != 200 {
				t.Failf("revoke: %d", status)
			}
			return t.Call(tok, "echo", map[string]any{"text": "x"}, nil)
		}),
		errorCase("DESIGN-ERR-006", "permission_denied", "a tool the token does not grant", func(t *T) *Resp {
			return t.Call(t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}}), "fs.list", map[string]any{"path": "."}, nil)
		}),
		errorCase("DESIGN-ERR-007", "scope_denied", "an fs path outside the token's roots", func(t *T) *Resp {
			return t.Call(t.Full("a"), "fs.read", map[string]any{"path": "../outside.txt"}, nil)
		}),
		errorCase("DESIGN-ERR-008", "scope_denied", "a net host outside the token's net scopes (net.fetch)", func(t *T) *Resp {
			t.NeedTool("net.fetch", "the net scope case needs a network syscall")
			tok := t.Mint("net", TokenRequest{Tools: []string{"net.*"}, Net: []string{"allowed.example:443"}})
			return t.Call(tok, "net.fetch", map[string]any{"url": "https://not-allowed.example/"}, key(t, "n"))
		}),
		errorCase("DESIGN-ERR-009", "policy_mismatch", "a stale policy_hash", func(t *T) *Resp {
			return t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, func(m map[string]any) { m["policy_hash"] = "blake3:" + strings.Repeat("1", 64) })
		}),
		errorCase("DESIGN-ERR-010", "policy_denied", "a no_go decision (reading a .pem file)", func(t *T) *Resp {
			dir := t.Dir()
			t.WriteFile(dir+"/server.pem", "-----BEGIN PRIVATE KEY-----")
			return t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/server.pem"}, nil)
		}),
		errorCase("DESIGN-ERR-011", "approval_denied", "a soft_gate call (token ceiling soft_gate) that an approver denies", func(t *T) *Resp {
			tok := t.Mint("gated", TokenRequest{Tools: []string{"echo"}, Autonomy: "soft_gate"})
			if !approvalsAPI(t) {
				// Without an approval channel a gated call must fail closed.
				return t.Call(tok, "echo", map[string]any{"text": "x"}, nil)
			}
			return decideGated(t, tok, "echo", map[string]any{"text": "x"}, nil, "deny")
		}),
		mk("DESIGN-ERR-012", gErrors, cErrors, "approval_timeout is reported as HTTP 504 when nobody decides a gated call in time", approvalTimeout),
		errorCase("DESIGN-ERR-013", "precondition_failed", "a kv version precondition that does not hold", func(t *T) *Resp {
			t.NeedTool("kv.put", "the precondition is a kv version")
			return t.Call(t.Full("a"), "kv.put", map[string]any{"key": t.Key("k"), "value": 1}, func(m map[string]any) {
				m["idempotency_key"] = t.Key("p")
				m["precondition_refs"] = []any{map[string]any{"ref": "kv:" + t.Key("k"), "version": 7}}
			})
		}),
		errorCase("DESIGN-ERR-014", "budget_exceeded", "a second call on a token with calls=1", func(t *T) *Resp {
			tok := t.Mint("one-call", TokenRequest{Tools: []string{"echo"}, Budgets: map[string]int64{"calls": 1}})
			t.ExpectOK(t.Call(tok, "echo", map[string]any{"text": "first"}, nil))
			return t.Call(tok, "echo", map[string]any{"text": "second"}, nil)
		}),
		errorCase("DESIGN-ERR-015", "idempotency_key_required", "a write without a key", func(t *T) *Resp {
			return t.Call(t.Full("a"), "fs.write", map[string]any{"path": t.Dir() + "/k.txt", "content": "x"}, nil)
		}),
		errorCase("DESIGN-ERR-016", "idempotency_conflict", "a key reused with other args", func(t *T) *Resp {
			dir := t.Dir()
			tok := t.Full("a")
			t.ExpectOK(t.Call(tok, "fs.write", map[string]any{"path": dir + "/a.txt", "content": "a"}, key(t, "k")))
			return t.Call(tok, "fs.write", map[string]any{"path": dir + "/a.txt", "content": "b"}, key(t, "k"))
		}),
		mk("DESIGN-ERR-017", gErrors, cErrors, "idempotency_in_flight is reported as HTTP 409: a repeat while the original call still runs", func(t *T) {
			t.NeedTool("proc.exec", "a repeat can only find the original in flight when the original runs for a while")
			var wg sync.WaitGroup
			wg.Add(1)
			var first *Resp
			go func() {
				defer wg.Done()
				defer func() { recover() }() // a skip inside the goroutine is seen below
				first, _ = slowExec(t, t.ctx, 3, 10, key(t, "k"))
			}()
			time.Sleep(700 * time.Millisecond)
			r, err := slowExec(t, t.ctx, 3, 10, key(t, "k"))
			wg.Wait()
			if err != nil {
				t.Failf("%v", err)
			}
			if first == nil {
				t.Skipf("the original call did not run")
			}
			// The 700 ms head start does not fix which call the kernel
			// sees first (on a loaded machine the second can overtake
			// the first): the repeat is whichever arrived second, and
			// it must find the other in flight.
			if first.Class() == "idempotency_in_flight" {
				r = first
			}
			t.ExpectClass(r, "idempotency_in_flight")
		}),
		mk("DESIGN-ERR-018", gErrors, cErrors, "outcome_unknown (HTTP 502) is reported only for an external effect that may have happened without a commit", func(t *T) {
			testOutcomeUnknown(t)
		}),
		mk("DESIGN-ERR-019", gErrors, cErrors, "timeout is reported as HTTP 504 when a call outlives its time limit", func(t *T) {
			r, err := slowExec(t, t.ctx, 30, 1, key(t, "k"))
			if err != nil {
				t.Failf("%v", err)
			}
			t.ExpectClass(r, "timeout")
			t.Audit(r)
		}),
		mk("DESIGN-ERR-020", gErrors, cErrors, "cancelled: a call whose client goes away is cancelled and audited as cancelled", func(t *T) {
			op := newUUID()
			ctx, cancel := context.WithTimeout(t.ctx, 1500*time.Millisecond)
			from := t.Head()
			_, err := slowExec(t, ctx, 30, 60, func(m map[string]any) { m["idempotency_key"] = t.Key("k"); m["operation_id"] = op })
			cancel()
			if err == nil {
				t.Failf("the call answered before the client went away")
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				audits, _ := t.AuditRecords(from, op)
				if len(audits) > 0 {
					var b map[string]json.RawMessage
					json.Unmarshal(audits[0].Body, &b)
					if c := str(b["error_class"]); c != "cancelled" {
						t.Failf("the abandoned call is recorded as %q, want cancelled", c)
					}
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Failf("no audit record of the abandoned call %s within 30 s", op)
		}),
		errorCase("DESIGN-ERR-021", "execution_error", "a syscall that fails while running (fs.read of a missing file)", func(t *T) *Resp {
			return t.Call(t.Full("a"), "fs.read", map[string]any{"path": t.Dir() + "/missing.txt"}, nil)
		}),
		mk("DESIGN-ERR-022", gErrors, cErrors, "internal (HTTP 500) is reported only for a fault of the kernel itself", func(t *T) {
			t.Skipf("internal needs a storage or kernel fault: it cannot be provoked through the HTTP API")
		}),
		mk("DESIGN-ERR-023", gErrors, "docs/http.md Endpoints, credentials", "other endpoints answer errors as {\"error\":{class,message}} with the documented status", func(t *T) {
			tok := t.Full("a")
			for _, q := range []struct {
				method, path, cred, body string
				status                   int
				class                    string
			}{
				{"POST", "/v1/tokens", "", `{"agent_id":"x","tools":["*"]}`, 401, "token_invalid"},
				{"POST", "/v1/tokens", tok.Token, `{"agent_id":"x","tools":["*"]}`, 403, "permission_denied"},
				{"POST", "/v1/tokens", "ckadmin_wrong", `{"agent_id":"x","tools":["*"]}`, 401, "token_invalid"},
				{"GET", "/v1/receipts/no-such-receipt", t.Admin(), "", 404, ""},
				{"GET", "/v1/operations/" + newUUID(), tok.Token, "", 404, ""},
				{"GET", "/v1/ledger/entries", "", "", 401, "token_invalid"},
				{"GET", "/v1/ledger/entries?from=x", t.Admin(), "", 400, "invalid_args"},
				{"GET", "/v1/admin/ledger/verify", tok.Token, "", 403, "permission_denied"},
				{"GET", "/v1/no/such/endpoint", "", "", 404, ""},
			} {
				var body []byte
				if q.body != "" {
					body = []byte(q.body)
				}
				status, b := t.Do(q.method, q.path, q.cred, body)
				var e struct {
					Error *ErrorBody `json:"error"`
				}
				json.Unmarshal(b, &e)
				if status != q.status || e.Error == nil || e.Error.Class == "" || e.Error.Message == "" || (q.class != "" && e.Error.Class != q.class) {
					t.Failf("%s %s: %d %s, want %d with error class %q", q.method, q.path, status, shorten(string(b)), q.status, q.class)
				}
			}
		}),
	}
}
