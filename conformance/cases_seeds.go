package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	gSeed000 = "seed 000 §9 acceptance"
	gSeed002 = "seed 002 test list"
)

// outside makes a file outside the run's workspace (beside it) and returns
// its absolute path; tokens never grant it.
func outside(t *T, content string) string {
	t.NeedWorkspace()
	dir := filepath.Join(filepath.Dir(t.env.ws), "outside-"+t.env.runID)
	os.MkdirAll(dir, 0o755)
	p := filepath.Join(dir, strings.ToLower(t.id)+".txt")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Failf("outside file: %v", err)
	}
	return p
}

func mustUnchanged(t *T, path, content string) {
	b, err := os.ReadFile(path)
	if err != nil || string(b) != content {
		t.Failf("%s outside the granted root changed: %q (%v)", path, b, err)
	}
}

func listed(t *T, tok *Token, format string) []map[string]any {
	var list []map[string]any
	t.GetJSON("/v1/syscalls?format="+format, tok.Token, &list)
	return list
}

func seed000Cases() []Case {
	c := func(id, item, title string, fn func(*T)) Case {
		return mk(id, gSeed000, "seed 000 §9 item "+item, title, fn)
	}
	return []Case{
		c("SEED000-ACC-001", "1", "a registry exists: GET /v1/syscalls lists definitions, each with a name, a description and an object input schema", func(t *T) {
			for _, d := range listed(t, t.Full("a"), "mcp") {
				name, _ := d["name"].(string)
				desc, _ := d["description"].(string)
				schema, _ := d["inputSchema"].(map[string]any)
				if name == "" || desc == "" || schema == nil || schema["type"] != "object" {
					t.Failf("definition %v lacks a name, description or object schema", d)
				}
			}
		}),
		c("SEED000-ACC-002", "2", "the built-in Read, Write and Echo are registered (fs.read, fs.write, echo)", func(t *T) {
			for _, id := range []string{"fs.read", "fs.write", "echo"} {
				if !t.env.tools[id] {
					t.Failf("%s is not listed (the endpoint lists %v)", id, t.env.sortedTools())
				}
			}
		}),
		c("SEED000-ACC-003", "3", "capability granted: ok with the expected result (echo returns its text, fs.read the file's content)", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/hello.txt", "hello, kernel")
			tok := t.Full("a")
			e := t.Call(tok, "echo", map[string]any{"text": "ping"}, nil)
			t.ExpectOK(e)
			var echo struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(e.R.Result, &echo) != nil || echo.Text != "ping" {
				t.Failf("echo returned %s", e.R.Result)
			}
			r := t.Call(tok, "fs.read", map[string]any{"path": dir + "/hello.txt"}, nil)
			t.ExpectOK(r)
			var rd struct {
				Content string `json:"content"`
			}
			if json.Unmarshal(r.R.Result, &rd) != nil || rd.Content != "hello, kernel" {
				t.Failf("fs.read returned %s", r.R.Result)
			}
		}),
		c("SEED000-ACC-004", "3", "capability denied: permission_denied (403) for a tool the token does not name", func(t *T) {
			r := t.Call(t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}}), "fs.write", map[string]any{"path": "x", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectRefused(r, "permission_denied")
		}),
		c("SEED000-ACC-005", "3", "tool not found: tool_not_found (404)", func(t *T) {
			t.ExpectRefused(t.Call(t.Full("a"), "Read", map[string]any{"path": "x"}, nil), "tool_not_found")
		}),
		c("SEED000-ACC-006", "3", "fs path not granted: scope_denied (the seed's fs_denied), 403, for read and write", func(t *T) {
			dir := t.Dir()
			ro := t.Mint("ro", TokenRequest{Tools: []string{"fs.*"}, FS: []FSRoot{{Path: t.Abs(dir), Mode: "r"}}})
			out := outside(t, "outside")
			t.ExpectRefused(t.Call(ro, "fs.read", map[string]any{"path": out}, nil), "scope_denied")
			// A read-only root does not grant writes.
			w := t.Call(ro, "fs.write", map[string]any{"path": "w.txt", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectRefused(w, "scope_denied")
			if _, ok := t.ReadFile(dir + "/w.txt"); ok {
				t.Failf("a write under a read-only root created the file")
			}
		}),
		c("SEED000-ACC-007", "4", "no such tool in the registry: tool_not_found even under a token granting every tool (*)", func(t *T) {
			r := t.Call(t.Full("a"), "net.conformance_never_registered", map[string]any{}, nil)
			t.ExpectRefused(r, "tool_not_found")
		}),
		c("SEED000-ACC-008", "5", "a tool that fails returns an error result (execution_error), and the kernel keeps answering", func(t *T) {
			tok := t.Full("a")
			r := t.Call(tok, "fs.read", map[string]any{"path": t.Dir()}, nil)
			t.ExpectRefused(r, "execution_error")
			t.ExpectOK(t.Call(tok, "echo", map[string]any{"text": "still here"}, nil))
		}),
		c("SEED000-ACC-009", "6", "audit events: an allowed and a denied call both land in the ledger as audit records (status ok / error)", func(t *T) {
			tok := t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}})
			ok := t.Call(tok, "echo", map[string]any{"text": "dispatched"}, nil)
			t.ExpectOK(ok)
			denied := t.Call(tok, "fs.read", map[string]any{"path": "x"}, nil)
			t.ExpectRefused(denied, "permission_denied")
			_, b1 := t.Audit(ok)
			_, b2 := t.Audit(denied)
			if s := str(b1["status"]); s != "" && s != "ok" {
				t.Failf("dispatched call recorded with status %q", s)
			}
			if s := str(b2["status"]); s != "" && s != "error" {
				t.Failf("denied call recorded with status %q", s)
			}
		}),
		c("SEED000-ACC-010", "7", "no file outside the granted root is modified: writes by .., absolute path and symlink are refused and the file is intact", func(t *T) {
			dir := t.Dir()
			out := outside(t, "untouched")
			if err := os.Symlink(out, t.Abs(dir+"/link")); err != nil {
				t.Failf("symlink: %v", err)
			}
			rel, _ := filepath.Rel(t.env.ws, out)
			tok := t.Full("a")
			for i, p := range []string{rel, out, dir + "/link"} {
				r := t.Call(tok, "fs.write", map[string]any{"path": p, "content": "overwritten"}, func(m map[string]any) { m["idempotency_key"] = t.Key(fmt.Sprint(i)) })
				if r.R.Status == "ok" {
					t.Failf("write to %s succeeded", p)
				}
				t.CheckEnvelope(r)
				mustUnchanged(t, out, "untouched")
			}
			del := t.Call(tok, "fs.delete", map[string]any{"path": rel}, func(m map[string]any) { m["idempotency_key"] = t.Key("d") })
			t.ExpectRefused(del, "scope_denied")
			mustUnchanged(t, out, "untouched")
		}),
	}
}

func seed002Cases() []Case {
	c := func(id, section, title string, fn func(*T)) Case {
		return mk(id, gSeed002, "seed 002 "+section, title, fn)
	}
	invalid := func(t *T, tool string, args any) {
		r := t.Call(t.Full("a"), tool, args, func(m map[string]any) { m["idempotency_key"] = t.Key("v") })
		t.ExpectRefused(r, "invalid_args")
	}
	escape := func(t *T, path string, tool string) {
		r := t.Call(t.Full("a"), tool, map[string]any{"path": path, "content": "x"}, func(m map[string]any) {
			if tool == "fs.read" {
				m["args"] = json.RawMessage(mustJSON(map[string]any{"path": path}))
			} else {
				m["idempotency_key"] = t.Key("e")
			}
		})
		t.ExpectRefused(r, "scope_denied")
	}
	return []Case{
		c("SEED002-VALID-001", "§validation; test list: input_invalid", "an argument of the wrong type is invalid_args and names the argument", func(t *T) {
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": []int{1}}, nil)
			t.ExpectRefused(r, "invalid_args")
			if !strings.Contains(r.R.Error.Message, "path") {
				t.Failf("the message does not name the argument: %q", r.R.Error.Message)
			}
		}),
		c("SEED002-VALID-002", "§validation; test list: input_invalid", "a missing required argument is invalid_args", func(t *T) {
			invalid(t, "fs.write", map[string]any{"path": "x"})
		}),
		c("SEED002-VALID-003", "§validation; test list: input_invalid", "an argument the schema does not define is invalid_args", func(t *T) {
			invalid(t, "echo", map[string]any{"text": "x", "extra": true})
		}),
		c("SEED002-VALID-004", "§validation; test list: input_invalid", "args that are not an object are invalid_args", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{}, func(m map[string]any) { m["args"] = []string{"x"} })
			t.ExpectRefused(r, "invalid_args")
		}),
		c("SEED002-VALID-005", "§validation; test list: input_invalid", "an envelope with an unknown field is invalid_args (strict decoding)", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, func(m map[string]any) { m["capabilities_please"] = "all" })
			t.ExpectRefused(r, "invalid_args")
		}),
		c("SEED002-VALID-006", "§validation", "an envelope without tool_id or agent_id is invalid_args", func(t *T) {
			for _, f := range []string{"tool_id", "agent_id"} {
				r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, func(m map[string]any) { delete(m, f) })
				t.ExpectRefused(r, "invalid_args")
			}
		}),
		c("SEED002-VALID-007", "§validation", "invalid args never execute: an invalid write creates nothing", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/v.txt", "content": "x", "mode": "rwxrwxrwx"}, func(m map[string]any) { m["idempotency_key"] = t.Key("v") })
			t.ExpectRefused(r, "invalid_args")
			assertOnly(t, dir)
		}),
		c("SEED002-ESCAPE-001", "§5.1 workspace escape: ..", "a relative path climbing out with .. is refused (scope_denied)", func(t *T) {
			t.NeedWorkspace()
			escape(t, "../../etc/passwd", "fs.read")
		}),
		c("SEED002-ESCAPE-002", "§5.1 workspace escape: absolute paths outside", "an absolute path outside the root is refused", func(t *T) {
			escape(t, outside(t, "o"), "fs.read")
		}),
		c("SEED002-ESCAPE-003", "§5.1 workspace escape: .. resolved during checking", "subdir/../../../etc/passwd is refused even though it starts inside", func(t *T) {
			dir := t.Dir()
			escape(t, dir+"/../../../etc/passwd", "fs.read")
		}),
		c("SEED002-ESCAPE-004", "§5.1 workspace escape: symlinks", "reading through a symlink that points outside the root is refused", func(t *T) {
			dir := t.Dir()
			out := outside(t, "outside secret")
			os.Symlink(out, t.Abs(dir+"/link"))
			escape(t, dir+"/link", "fs.read")
		}),
		c("SEED002-ESCAPE-005", "§5.1 workspace escape: symlinks", "writing through a symlinked directory that points outside is refused and writes nothing there", func(t *T) {
			dir := t.Dir()
			out := outside(t, "o")
			os.Symlink(filepath.Dir(out), t.Abs(dir+"/linkdir"))
			escape(t, dir+"/linkdir/new.txt", "fs.write")
			if _, err := os.Stat(filepath.Join(filepath.Dir(out), "new.txt")); err == nil {
				t.Failf("the refused write created a file outside the root")
			}
		}),
		c("SEED002-ESCAPE-006", "§5.1 path resolution: absolute within the root", "an absolute path inside the root is accepted", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/abs.txt", "inside")
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": t.Abs(dir + "/abs.txt")}, nil)
			t.ExpectOK(r)
		}),
		c("SEED002-ESCAPE-007", "§5.1 workspace escape", "a path with a NUL byte is refused before anything runs", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/a\x00b", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("n") })
			t.ExpectRefused(r, "scope_denied", "invalid_args")
			assertOnly(t, dir)
		}),
		c("SEED002-ESCAPE-008", "§5.1 path resolution: symlinks inside", "a symlink that stays inside the root is followed for reads", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/target.txt", "target content")
			os.Symlink("target.txt", t.Abs(dir+"/inner-link"))
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/inner-link"}, nil)
			t.ExpectOK(r)
			if !strings.Contains(string(r.R.Result), "target content") {
				t.Failf("read through an inner symlink returned %s", r.R.Result)
			}
		}),
		c("SEED002-ESCAPE-009", "§5.1 workspace escape", "a token root is a boundary for sibling directories with a common prefix (root ws/a does not grant ws/ab)", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/a/in.txt", "in")
			t.WriteFile(dir+"/ab/out.txt", "out")
			tok := t.Mint("prefix", TokenRequest{Tools: []string{"fs.*"}, FS: []FSRoot{{Path: t.Abs(dir + "/a"), Mode: "rw"}}})
			t.ExpectOK(t.Call(tok, "fs.read", map[string]any{"path": "in.txt"}, nil))
			t.ExpectRefused(t.Call(tok, "fs.read", map[string]any{"path": t.Abs(dir + "/ab/out.txt")}, nil), "scope_denied")
		}),
		c("SEED002-CONFIRM-001", "§5.2 confirmation; test list: user_denied", "a write that needs confirmation, denied by the user, fails (approval_denied) and writes nothing", func(t *T) {
			if !approvalsAPI(t) {
				t.Skipf("no approval API (GET /v1/approvals is 404): nobody can deny a pending call; the case runs once the endpoint lists pending approvals and accepts POST /v1/approvals/{id}")
			}
			dir := t.Dir()
			tok := t.Mint("confirm", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, Autonomy: "soft_gate"})
			r := decideGated(t, tok, "fs.write", map[string]any{"path": dir + "/c.txt", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("c") }, "deny")
			t.ExpectRefused(r, "approval_denied")
			if _, ok := t.ReadFile(dir + "/c.txt"); ok {
				t.Failf("the denied write happened")
			}
		}),
		c("SEED002-CONFIRM-002", "§5.2 confirmation; test list: confirmation_timeout", "a confirmation nobody answers ends as approval_timeout (504)", func(t *T) {
			approvalTimeout(t)
		}),
		c("SEED002-CONFIRM-003", "§5.2 confirmation: WRITE prompts by default", "without a confirmation channel a call that needs one fails closed (approval_denied) and writes nothing", func(t *T) {
			if approvalsAPI(t) {
				t.Skipf("the endpoint has an approval API: gated calls wait for a decision (SEED002-CONFIRM-001)")
			}
			tok := t.Mint("confirm", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, Autonomy: "soft_gate"})
			writeRefused(t, tok, nil, "approval_denied")
		}),
		c("SEED002-TIMEOUT-001", "§dispatch step 7: execute under timeout; test list: timeout", "a call running past its timeout ends as timeout (504), audited", func(t *T) {
			r, err := slowExec(t, t.ctx, 30, 1, func(m map[string]any) { m["idempotency_key"] = t.Key("t") })
			if err != nil {
				t.Failf("%v", err)
			}
			t.ExpectClass(r, "timeout")
		}),
		c("SEED002-CANCEL-001", "§cancellation; test list: cancelled", "a cancelled call (client gone) ends as cancelled and leaves no partial effect", func(t *T) {
			dir := t.Dir()
			op := newUUID()
			from := t.Head()
			ctx, cancel := context.WithTimeout(t.ctx, 1500*time.Millisecond)
			defer cancel()
			argv := []string{"sh", "-c", "echo partial > " + t.Abs(dir+"/partial.txt") + "; sleep 30"}
			if _, err := execArgv(t, ctx, argv, 60, func(m map[string]any) { m["idempotency_key"] = t.Key("c"); m["operation_id"] = op }); err == nil {
				t.Failf("the call answered before the client went away")
			}
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if audits, _ := t.AuditRecords(from, op); len(audits) > 0 {
					var b map[string]json.RawMessage
					json.Unmarshal(audits[0].Body, &b)
					if str(b["tx_outcome"]) == "committed" {
						t.Failf("the cancelled call committed")
					}
					if _, ok := t.ReadFile(dir + "/partial.txt"); ok {
						t.Failf("the cancelled call left its partial write in the workspace")
					}
					return
				}
			}
			t.Failf("no audit record of the cancelled call %s within 30 s", op)
		}),
		c("SEED002-CONC-001", "§4.1 parallel tool calls (read a.txt, b.txt, c.txt)", "three concurrent reads all succeed with their own content", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			names := []string{"a.txt", "b.txt", "c.txt"}
			for _, n := range names {
				t.WriteFile(dir+"/"+n, "content of "+n)
			}
			var wg sync.WaitGroup
			errs := make([]string, len(names))
			for i, n := range names {
				wg.Add(1)
				go func() {
					defer wg.Done()
					status, r, err := t.env.rawCall(t.ctx, t.env.envelope(tok, "fs.read", map[string]any{"path": dir + "/" + n}, nil))
					if err != nil || status != 200 || !strings.Contains(string(r.Result), "content of "+n) {
						errs[i] = fmt.Sprintf("%s: %d %v", n, status, err)
					}
				}()
			}
			wg.Wait()
			for _, e := range errs {
				if e != "" {
					t.Failf("%s", e)
				}
			}
		}),
		c("SEED002-CONC-002", "§4.1 per-session concurrency cap (default 4)", "16 concurrent calls of one session (more than the cap) are all answered, none refused", func(t *T) {
			tok := t.Full("a")
			var wg sync.WaitGroup
			var mu sync.Mutex
			var bad []string
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					status, r, err := t.env.rawCall(t.ctx, t.env.envelope(tok, "echo", map[string]any{"text": fmt.Sprint(i)}, func(m map[string]any) {
						m["provenance"] = map[string]any{"session_id": "s-" + t.env.runID}
					}))
					if err != nil || status != 200 || r.Status != "ok" {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("call %d: %d %v %s", i, status, err, r.errClass()))
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if len(bad) > 0 {
				t.Failf("%s", strings.Join(bad, "; "))
			}
		}),
		c("SEED002-CONC-003", "§4.1 concurrency; §3.1 fresh instance per call", "concurrent writes to different files all commit, each file with its own content", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			var wg sync.WaitGroup
			var mu sync.Mutex
			var bad []string
			for i := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, r, err := t.env.rawCall(t.ctx, t.env.envelope(tok, "fs.write", map[string]any{"path": fmt.Sprintf("%s/f%d.txt", dir, i), "content": strings.Repeat(fmt.Sprint(i), 100)}, func(m map[string]any) { m["idempotency_key"] = t.Key(fmt.Sprint(i)) }))
					if err != nil || r.TxOutcome != "committed" {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("write %d: %v %s", i, err, r.errClass()))
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if len(bad) > 0 {
				t.Failf("%s", strings.Join(bad, "; "))
			}
			for i := range 12 {
				if got, _ := t.ReadFile(fmt.Sprintf("%s/f%d.txt", dir, i)); got != strings.Repeat(fmt.Sprint(i), 100) {
					t.Failf("f%d.txt holds %q", i, got)
				}
			}
		}),
		c("SEED002-EXEC-001", "§6 errors; test list: ToolExecutionError redacted", "a tool failure is an error result whose message carries no stack trace or kernel source location", func(t *T) {
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": t.Dir() + "/nope.txt"}, nil)
			t.ExpectRefused(r, "execution_error")
			for _, leak := range []string{"goroutine ", ".go:", "panic(", "runtime/"} {
				if strings.Contains(r.R.Error.Message, leak) {
					t.Failf("the error message leaks %q: %q", leak, r.R.Error.Message)
				}
			}
		}),
		c("SEED002-SIDEFX-001", "§side-effect classes; test list: side_effects matches the declared class", "the audit record's policy input names each tool's side-effect class: echo NONE, fs.read READ, fs.write WRITE", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/s.txt", "s")
			tok := t.Full("a")
			for _, tc := range []struct {
				tool, class string
				args        map[string]any
				key         bool
			}{
				{"echo", "NONE", map[string]any{"text": "x"}, false},
				{"fs.read", "READ", map[string]any{"path": dir + "/s.txt"}, false},
				{"fs.write", "WRITE", map[string]any{"path": dir + "/w.txt", "content": "w"}, true},
			} {
				r := t.Call(tok, tc.tool, tc.args, func(m map[string]any) {
					if tc.key {
						m["idempotency_key"] = t.Key(tc.tool)
					}
				})
				t.ExpectOK(r)
				_, body := t.Audit(r)
				var in struct {
					SideEffect string `json:"side_effect"`
				}
				if len(body["policy_input"]) == 0 {
					t.Skipf("the endpoint's audit records carry no policy_input, so the side-effect class the call ran under is not visible")
				}
				json.Unmarshal(body["policy_input"], &in)
				if in.SideEffect != tc.class {
					t.Failf("%s ran as side effect %q, want %s", tc.tool, in.SideEffect, tc.class)
				}
			}
		}),
		c("SEED002-LIST-001", "§3 get_definitions_for_session", "the definitions a session sees are those its token grants: an echo-only token sees echo alone", func(t *T) {
			var names []string
			for _, d := range listed(t, t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}}), "mcp") {
				n, _ := d["name"].(string)
				names = append(names, n)
			}
			if !slices.Equal(names, []string{"echo"}) {
				t.Failf("an echo-only token sees %v", names)
			}
		}),
		c("SEED002-LIST-002", "§3 definitions in provider formats", "definitions come in the openai, anthropic and mcp tool formats with the schema in each", func(t *T) {
			tok := t.Full("a")
			for format, schemaOf := range map[string]func(map[string]any) any{
				"openai": func(d map[string]any) any {
					f, _ := d["function"].(map[string]any)
					return f["parameters"]
				},
				"anthropic": func(d map[string]any) any { return d["input_schema"] },
				"mcp":       func(d map[string]any) any { return d["inputSchema"] },
			} {
				list := listed(t, tok, format)
				if len(list) == 0 {
					t.Failf("format %s: no definitions", format)
				}
				for _, d := range list {
					if s, _ := schemaOf(d).(map[string]any); s["type"] != "object" {
						t.Failf("format %s: a definition without an object schema: %v", format, d)
					}
				}
			}
			if status, _ := t.Get("/v1/syscalls?format=nonsense", tok.Token); status != 400 {
				t.Failf("an unknown format: %d, want 400", status)
			}
		}),
	}
}
