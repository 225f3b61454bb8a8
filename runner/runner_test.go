package runner

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

type invoker struct{ k *kernel.Kernel }

func (i invoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return i.k.InvokeJSON(ctx, env), nil
}

// fixture is a real kernel in a temp dir with a workspace, and a session
// under a token granting fs.read and echo on it.
type fixture struct {
	k  *kernel.Kernel
	ws string
	s  *Session
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	if _, err := kernel.Init(data); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("hello"), 0o644)
	os.WriteFile(filepath.Join(dir, "outside.txt"), []byte("secret"), 0o644)
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	m, err := k.Mint(kernel.TokenRequest{AgentID: "agent", Tools: []string{"fs.read", "echo"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{k: k, ws: ws, s: &Session{
		Invoker: invoker{k}, Token: m.Token, TokenID: m.ID, AgentID: m.AgentID, PolicyHash: k.PolicyHash(), ID: "s-" + t.Name(),
	}}
}

// serve feeds lines to a session and returns its responses by
// tool_call_id ("" collects the responses to lines without one).
func (f *fixture) serve(t *testing.T, lines ...string) map[string][]ToolResponse {
	t.Helper()
	var out strings.Builder
	if err := f.s.Serve(context.Background(), strings.NewReader(strings.Join(lines, "\n")), &out); err != nil {
		t.Fatal(err)
	}
	got := map[string][]ToolResponse{}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var r ToolResponse
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Op != "tool_response" && r.Op != "tool_list" {
			t.Fatalf("response line %q: %v", sc.Text(), err)
		}
		got[r.ToolCallID] = append(got[r.ToolCallID], r)
	}
	return got
}

func call(id, tool, args string) string {
	return fmt.Sprintf(`{"op":"tool_call","tool_call_id":%q,"tool":%q,"args":%s}`, id, tool, args)
}

// Seed 000 §9's acceptance list, through a real kernel: each case's
// answer, and a receipt for every one of them.
func TestAcceptance(t *testing.T) {
	f := newFixture(t)
	outside := filepath.Join(filepath.Dir(f.ws), "outside.txt")
	cases := []struct {
		name, id, line string
		ok             bool
		class          string
	}{
		{"capability granted", "granted", call("granted", "fs.read", `{"path":"a.txt"}`), true, ""},
		{"capability denied", "denied", call("denied", "proc.exec", `{"argv":["true"]}`), false, kernel.ErrPermissionDenied},
		{"tool not found", "unknown", call("unknown", "teleport", `{}`), false, kernel.ErrToolNotFound},
		{"fs path not granted", "fs", call("fs", "fs.read", fmt.Sprintf(`{"path":%q}`, outside)), false, kernel.ErrScopeDenied},
		{"tool handler fails", "fails", call("fails", "fs.read", `{"path":"missing.txt"}`), false, kernel.ErrExecution},
		{"bad args", "args", call("args", "fs.read", `{"path":7}`), false, kernel.ErrInvalidArgs},
	}
	var lines []string
	for _, c := range cases {
		lines = append(lines, c.line)
	}
	got := f.serve(t, lines...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := got[c.id]
			if len(rs) != 1 {
				t.Fatalf("%d responses", len(rs))
			}
			r := rs[0]
			if r.OK != c.ok || r.Error != c.class || r.ReceiptID == "" {
				t.Fatalf("response %+v, want ok=%v error=%q with a receipt", r, c.ok, c.class)
			}
			if _, err := f.k.Inspector().Receipt(r.ReceiptID); err != nil {
				t.Fatalf("receipt %s is not in the ledger: %v", r.ReceiptID, err)
			}
		})
	}
	var content struct {
		Content string `json:"content"`
	}
	json.Unmarshal(got["granted"][0].Result, &content)
	if content.Content != "hello" {
		t.Fatalf("fs.read returned %q", content.Content)
	}
}

// Lines that are not tool calls are answered invalid_args, audited, and
// do not stop the session.
func TestMalformedLines(t *testing.T) {
	f := newFixture(t)
	f.s.MaxLine = 256
	lines := []string{
		"garbage",
		"\x00\xff\xfe binary",
		`["an array"]`,
		`{"op":"other","tool_call_id":"x1","tool":"echo"}`,
		`{"op":"tool_call","tool":"echo","args":{"text":"no id"}}`,
		`{"op":"tool_call","tool_call_id":"x3","args":{}}`,
		`{"op":"tool_call","tool_call_id":"` + strings.Repeat("i", MaxToolCallID+1) + `","tool":"echo"}`,
		`{"op":"tool_call","tool_call_id":"x4","tool":"echo","args":{"text":"` + strings.Repeat("x", 300) + `"}}`,
		`{"op":"tool_call","tool_call_id":"x5","tool":"fs.delete","tool":"echo","args":{"text":"two tools"}}`,
		`{"op":"tool_call","tool_call_id":"x6","TOOL":"echo","tool":"echo","args":{"text":"case"}}`,
		`{"op":"tool_call","tool_call_id":"x7","tool":"echo","args":{"text":"extra"},"sudo":true}`,
		"{\"op\":\"tool_call\",\"tool_call_id\":\"x8\",\"tool\":\"echo\",\"args\":{\"text\":\"\xff\"}}",
		`{"op":"tool_call","tool_call_id":"x9","tool":"echo","args":{"text":"a","text":"b"}}`,
		`{"op":"list_tools"}`,
		`{"op":"list_tools","tool_call_id":"l1","tool":"fs.write","args":{"path":"x"}}`,
		`{"op":"list_tools","tool_call_id":"l2"}`, // the fixture's token is not in handle mode
		"",
		"   ",
		call("after", "echo", `{"text":"still here"}`),
	}
	got := f.serve(t, lines...)
	bad := 0
	for id, rs := range got {
		for _, r := range rs {
			if id == "after" {
				if !r.OK {
					t.Fatalf("the call after the garbage: %+v", r)
				}
				continue
			}
			bad++
			if r.OK || r.Error != kernel.ErrInvalidArgs {
				t.Fatalf("malformed line answered %+v", r)
			}
			f.checkRefusal(t, r)
		}
	}
	if bad != 16 {
		t.Fatalf("%d malformed lines answered, want 16 (blank lines are skipped): %v", bad, got)
	}
}

// checkRefusal checks that the refusal of a line, answered r, is in the
// ledger as the session's own call: its agent, its token, its session,
// the tool InvalidLineTool refused tool_not_found, and the problem.
func (f *fixture) checkRefusal(t *testing.T, r ToolResponse) {
	t.Helper()
	if r.ReceiptID == "" {
		t.Fatalf("refused line without a receipt: %+v", r)
	}
	info, err := f.k.Inspector().Receipt(r.ReceiptID)
	if err != nil {
		t.Fatalf("receipt %s of %+v: %v", r.ReceiptID, r, err)
	}
	rc := info.Receipt
	if rc.AgentID != f.s.AgentID || rc.CapabilityTokenID != f.s.TokenID || rc.ToolID != InvalidLineTool || rc.ErrorClass != kernel.ErrToolNotFound || rc.TxOutcome != kernel.NoOp {
		t.Fatalf("refusal recorded as %+v; want agent %s, token %s, tool %s, tool_not_found, no_op", rc, f.s.AgentID, f.s.TokenID, InvalidLineTool)
	}
	views, err := f.k.Inspector().EntryViews(info.Seq, 1, kernel.AccessAll)
	if err != nil || len(views) != 1 || views[0].Payload == nil {
		t.Fatalf("audit record %d: %v %v", info.Seq, views, err)
	}
	var ctx struct {
		Provenance struct {
			SessionID   string `json:"session_id"`
			Source      string `json:"source"`
			InvalidLine struct {
				Line    int    `json:"line"`
				Problem string `json:"problem"`
			} `json:"invalid_line"`
		} `json:"provenance"`
	}
	if err := json.Unmarshal(views[0].Payload.Context, &ctx); err != nil {
		t.Fatalf("audit record %d context %s: %v", info.Seq, views[0].Payload.Context, err)
	}
	p := ctx.Provenance
	if p.SessionID != f.s.ID || p.Source != "runner" || p.InvalidLine.Line == 0 || p.InvalidLine.Problem != r.Message {
		t.Fatalf("refusal's provenance %+v; want session %s and the problem %q", p, f.s.ID, r.Message)
	}
}

// A line holding a whole call envelope under another agent's token is a
// malformed tool_call: refused under the run's own token and session,
// never run under the token it names (rev-runner #2: it was sent to the
// kernel as it came, which ran it as the other agent, with the session
// and provenance the agent wrote).
func TestEnvelopeLineRunsNothing(t *testing.T) {
	f := newFixture(t)
	other := filepath.Join(filepath.Dir(f.ws), "other")
	os.MkdirAll(other, 0o755)
	m, err := f.k.Mint(kernel.TokenRequest{AgentID: "victim", Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: other, Mode: "rw"}}})
	if err != nil {
		t.Fatal(err)
	}
	env, _ := json.Marshal(kernel.Envelope{
		ToolID: "fs.write", Args: json.RawMessage(`{"path":"planted.txt","content":"by the run's agent"}`),
		AgentID: m.AgentID, CapabilityToken: m.Token, CapabilityTokenID: m.ID, PolicyHash: f.k.PolicyHash(),
		IdempotencyKey: "forged-1", Provenance: json.RawMessage(`{"session_id":"another-run","source":"runner","tool_call_id":"x"}`),
	})
	got := f.serve(t, string(env))
	if b, err := os.ReadFile(filepath.Join(other, "planted.txt")); err == nil {
		t.Fatalf("the run's agent wrote %q as agent %q", b, m.AgentID)
	}
	rs := got[""]
	if len(rs) != 1 || rs[0].Error != kernel.ErrInvalidArgs {
		t.Fatalf("answers %v", got)
	}
	f.checkRefusal(t, rs[0])
}

// Many calls in flight at once are matched by tool_call_id; a repeated
// tool_call_id is answered from the first call when it committed, and
// runs again when it did not.
func TestInFlightAndRepeats(t *testing.T) {
	f := newFixture(t)
	f.s.MaxInFlight = 4
	var lines []string
	for i := range 40 {
		lines = append(lines, call(fmt.Sprint("c", i), "echo", fmt.Sprintf(`{"text":"n%d"}`, i)))
	}
	got := f.serve(t, lines...)
	for i := range 40 {
		rs := got[fmt.Sprint("c", i)]
		if len(rs) != 1 || !rs[0].OK || !strings.Contains(string(rs[0].Result), fmt.Sprintf(`"n%d"`, i)) {
			t.Fatalf("c%d: %+v", i, rs)
		}
	}
	again := f.serve(t, call("c7", "echo", `{"text":"n7"}`), call("c8", "echo", `{"text":"different"}`))
	if r := again["c7"][0]; !r.OK || r.OperationID != got["c7"][0].OperationID {
		t.Fatalf("repeated c7: %+v, first was operation %s", r, got["c7"][0].OperationID)
	}
	if r := again["c8"][0]; r.OK || r.Error != kernel.ErrIdempotencyConflict {
		t.Fatalf("c8 repeated with other args: %+v", r)
	}
	// Only committed outcomes are kept: a call that failed runs again,
	// as a new operation (docs/runner.md), while a read that succeeded
	// is replayed.
	first := f.serve(t, call("r1", "fs.read", `{"path":"missing.txt"}`), call("r2", "fs.read", `{"path":"a.txt"}`))
	second := f.serve(t, call("r1", "fs.read", `{"path":"missing.txt"}`), call("r2", "fs.read", `{"path":"a.txt"}`))
	a, b := first["r1"][0], second["r1"][0]
	if a.Error != kernel.ErrExecution || b.Error != kernel.ErrExecution || a.OperationID == b.OperationID {
		t.Fatalf("a failed call repeated: %+v then %+v; want execution_error twice, under two operation ids", a, b)
	}
	if a, b := first["r2"][0], second["r2"][0]; !a.OK || !b.OK || a.OperationID != b.OperationID {
		t.Fatalf("a read repeated: %+v then %+v; want the first replayed", a, b)
	}
}

// An agent that writes and vanishes (the pipe breaks) leaves no goroutine
// stuck and every call it made answered in the ledger.
func TestAgentGoneMidway(t *testing.T) {
	f := newFixture(t)
	r, w := io.Pipe()
	out, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- f.s.Serve(context.Background(), r, outW) }()
	fmt.Fprintln(w, call("c1", "echo", `{"text":"x"}`))
	out.Close() // the agent stops reading
	fmt.Fprintln(w, call("c2", "echo", `{"text":"y"}`))
	w.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(io.Discard, out) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after the agent went away")
	}
	wg.Wait()
}
