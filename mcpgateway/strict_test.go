package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// strictCase is a JSON-RPC message a client sends and what it must get.
type strictCase struct {
	name, msg string
	id        string // the id of the answer, as JSON ("null" for none)
	code      int    // a JSON-RPC error's code; 0 for a tools/call result
	want      string // in a refused call's text ("" for a call that runs)
}

// strictCases break the strictjson rules in the message's own members, in
// its params and their _meta, or are no JSON at all, among calls that are
// well formed: each faulty tools/call is refused by the kernel (audited,
// with a receipt), each other faulty message answered with a JSON-RPC
// error and not run, and the session goes on.
var strictCases = []strictCase{
	{"plain call", `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, "10", 0, ""},
	{"two arguments", `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"arguments":{"text":"y"}}}`, "11", 0,
		`duplicate member name "arguments" in /provenance/mcp_message/params`},
	{"two names", `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"echo","name":"fs.read","arguments":{"path":"x"}}}`, "12", 0, `duplicate member name "name"`},
	{"two params", `{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}},"params":{"name":"echo","arguments":{"text":"y"}}}`, "13", 0,
		`duplicate member name "params" in /provenance/mcp_message`},
	{"two methods, the call last", `{"jsonrpc":"2.0","id":14,"method":"tools/list","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, "14", 0, `duplicate member name "method"`},
	{"two methods, the call first", `{"jsonrpc":"2.0","id":15,"method":"tools/call","method":"tools/list","params":{"name":"echo","arguments":{"text":"x"}}}`, "15", -32600, ""},
	{"two ids", `{"jsonrpc":"2.0","id":20,"id":21,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, "21", 0, `duplicate member name "id"`},
	{"two keys in _meta", `{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"echo","_meta":{"capkernel/idempotency_key":"a","capkernel/idempotency_key":"b"}}}`, "16", 0,
		`in /provenance/mcp_message/params/_meta`},
	{"invalid UTF-8 in the name", "{\"jsonrpc\":\"2.0\",\"id\":17,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\xff\"}}", "17", 0, `invalid UTF-8`},
	{"lone surrogate in the args", `{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"echo","arguments":{"text":"\ud800"}}}`, "18", 0, `surrogate`},
	{"a list with two cursors", `{"jsonrpc":"2.0","id":19,"method":"tools/list","params":{"cursor":"a","cursor":"b"}}`, "19", -32600, ""},
	{"escaped method, two names", `{"jsonrpc":"2.0","id":22,"method":"tools\u002fcall","params":{"name":"echo","name":"fs.read"}}`, "22", 0, `duplicate member name "name"`},
	// The SDK reads member names exactly: "Method" is no method, so this
	// is a tools/list, not a call.
	{"a call's method in other case", `{"jsonrpc":"2.0","id":23,"method":"tools/list","Method":"tools/call","params":{"name":"echo","name":"x"}}`, "23", -32600, ""},
	{"no JSON", `garbage{`, "null", -32700, ""},
	{"a call after them", `{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`, "30", 0, ""},
}

const (
	strictInit        = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	strictInitialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
)

// checkStrictAnswers checks the answers (JSON-RPC responses by id) to
// strictCases and that the kernel recorded exactly the calls.
func checkStrictAnswers(t *testing.T, k *kernel.Kernel, before uint64, answers map[string][]json.RawMessage) {
	t.Helper()
	calls := 0
	for _, c := range strictCases {
		got := answers[c.id]
		if len(got) != 1 {
			t.Errorf("%s: %d answers with id %s, want 1", c.name, len(got), c.id)
			continue
		}
		var r struct {
			Result *struct {
				IsError bool                       `json:"isError"`
				Content []struct{ Text string }    `json:"content"`
				Meta    map[string]json.RawMessage `json:"_meta"`
			}
			Error *struct{ Code int }
		}
		if err := json.Unmarshal(got[0], &r); err != nil {
			t.Fatalf("%s: answer %s: %v", c.name, got[0], err)
		}
		if c.code != 0 {
			if r.Error == nil || r.Error.Code != c.code {
				t.Errorf("%s: answer %.300s, want a JSON-RPC error %d", c.name, got[0], c.code)
			}
			continue
		}
		calls++
		if r.Result == nil || len(r.Result.Content) == 0 {
			t.Errorf("%s: answer %.300s, want a tools/call result", c.name, got[0])
			continue
		}
		text := r.Result.Content[0].Text
		if c.want == "" {
			if r.Result.IsError {
				t.Errorf("%s: refused: %s", c.name, text)
			}
			continue
		}
		if !r.Result.IsError || !strings.HasPrefix(text, kernel.ErrInvalidArgs+": ") || !strings.Contains(text, c.want) || r.Result.Meta[MetaReceiptID] == nil {
			t.Errorf("%s: answer %.300s, want a receipted invalid_args naming %s", c.name, got[0], c.want)
		}
	}
	es, err := k.Inspector().Entries(before, 1000)
	if err != nil {
		t.Fatal(err)
	}
	audited := 0
	for _, e := range es {
		if e.Kind == "audit" {
			audited++
		}
	}
	if audited != calls {
		t.Errorf("%d audit records, want one per tools/call (%d)", audited, calls)
	}
}

// serveLines serves the stdio lines in, each ended by eol, and returns the
// gateway's answers by id (byID).
func serveLines(t *testing.T, g *Gateway, in []string, eol string) map[string][]json.RawMessage {
	t.Helper()
	var out bytes.Buffer
	if err := g.serveIO(context.Background(), strings.NewReader(strings.Join(in, eol)+eol), &out); err != nil && err != io.EOF {
		t.Logf("serveIO: %v", err)
	}
	answers := map[string][]json.RawMessage{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		byID(t, answers, sc.Bytes())
	}
	return answers
}

// byID files JSON-RPC responses by their id's JSON.
func byID(t *testing.T, answers map[string][]json.RawMessage, msg []byte) {
	var r struct{ ID json.RawMessage }
	if err := json.Unmarshal(msg, &r); err != nil {
		t.Fatalf("answer %q: %v", msg, err)
	}
	id := string(r.ID)
	if id == "" {
		id = "null"
	}
	answers[id] = append(answers[id], append(json.RawMessage(nil), msg...))
}

func TestStrictStdio(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo", "fs.read"}}, Config{})
	before, err := k.Inspector().Head()
	if err != nil {
		t.Fatal(err)
	}
	in := []string{strictInit, strictInitialized}
	for _, c := range strictCases {
		in = append(in, c.msg)
	}
	answers := serveLines(t, g, in, "\n")
	if len(answers["1"]) != 1 {
		t.Fatalf("no answer to initialize: %s", answers)
	}
	checkStrictAnswers(t, k, before.Size, answers)
}

func TestStrictHTTP(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo", "fs.read"}}, Config{})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	defer srv.Close()
	post := func(body, session string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set(sessionIDHeader, session)
			req.Header.Set(protocolVersionHeader, "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// An SSE answer: the message is the data of its one event.
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			for _, line := range bytes.Split(b, []byte("\n")) {
				if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
					return resp, d
				}
			}
		}
		return resp, b
	}
	resp, _ := post(strictInit, "")
	session := resp.Header.Get(sessionIDHeader)
	if session == "" {
		t.Fatalf("initialize: %d, no session", resp.StatusCode)
	}
	post(strictInitialized, session)
	before, err := k.Inspector().Head()
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string][]json.RawMessage{}
	for _, c := range strictCases {
		_, b := post(c.msg, session)
		byID(t, answers, bytes.TrimSpace(b))
	}
	checkStrictAnswers(t, k, before.Size, answers)
}

// A batch is read element by element: well-formed calls are tagged, a
// faulty call becomes a refused one, and any other faulty element has the
// whole batch rejected.
func TestPrepareBatch(t *testing.T) {
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`
	dupCall := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","name":"fs.read"}}`
	dupList := `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"a","cursor":"b"}}`
	cases := []struct {
		name, batch string
		reject      bool
		invalid     []bool // per element: marked MetaInvalid
	}{
		{"well formed", "[" + call + "," + call + "]", false, []bool{false, false}},
		{"a faulty call", "[" + call + "," + dupCall + "]", false, []bool{false, true}},
		{"a faulty list", "[" + call + "," + dupList + "]", true, nil},
		{"no JSON", "[" + call + ",", true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, reject := prepare(newSealer(), []byte(c.batch))
			if c.reject {
				if reject == nil || out != nil {
					t.Fatalf("prepared %s, want a rejection", out)
				}
				return
			}
			var msgs []struct {
				Params struct {
					Meta map[string]any `json:"_meta"`
				}
			}
			if err := json.Unmarshal(out, &msgs); err != nil || reject != nil || len(msgs) != len(c.invalid) {
				t.Fatalf("prepared %s (%v), rejected %s", out, err, reject)
			}
			for i, m := range msgs {
				if _, ok := m.Params.Meta[MetaRequestID]; !ok {
					t.Errorf("element %d untagged: %v", i, m.Params.Meta)
				}
				if _, ok := m.Params.Meta[MetaInvalid]; ok != c.invalid[i] {
					t.Errorf("element %d marked invalid %v, want %v", i, ok, c.invalid[i])
				}
			}
		})
	}
}

// A stdio line over MaxLineBytes is answered with an error and the
// session goes on.
func TestStdioLongLine(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	long := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("x", MaxLineBytes) + `"}}}`
	answers := serveLines(t, g, []string{strictInit, strictInitialized, long, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`}, "\n")
	if len(answers["null"]) != 1 || !strings.Contains(string(answers["null"][0]), `"code":-32600`) || len(answers["2"]) != 0 {
		t.Errorf("the long line's answers: %s; with its id: %s", answers["null"], answers["2"])
	}
	if len(answers["3"]) != 1 || !strings.Contains(string(answers["3"][0]), `after`) {
		t.Errorf("the call after it: %s", answers["3"])
	}
}

// Lines the SDK's reader could not take end no session: a message with
// whitespace after it runs; JSON that is no JSON-RPC message, and a
// response of the client's breaking the strictjson rules, are answered
// with -32600 and id null (a response's id names a request of the
// gateway's, not one of the client's); the call after them runs. A
// tagged call keeps <, > and & as sent: escaped, each would grow the line
// sixfold, past what the SDK reads.
func TestStdioLinesSDKCannotRead(t *testing.T) {
	_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	in := []string{strictInit, strictInitialized,
		`{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"echo","arguments":{"text":"<&>"}}}` + " \t ",
		`[]`, `42`, `{"x":1}`, `{"jsonrpc":"2.0","id":7,"result":{},"result":{}}`,
		`{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`,
	}
	answers := serveLines(t, g, in, "\r\n")
	for _, id := range []string{"40", "41"} {
		if len(answers[id]) != 1 || !bytes.Contains(answers[id][0], []byte(`"result"`)) || bytes.Contains(answers[id][0], []byte(`"isError":true`)) {
			t.Errorf("call %s: %s", id, answers[id])
		}
	}
	if len(answers["7"]) != 0 {
		t.Errorf("the client's response was answered under its id: %s", answers["7"])
	}
	if n := len(answers["null"]); n != 4 {
		t.Errorf("%d answers with id null, want 4 (-32600 each): %s", n, answers["null"])
	}
	for _, a := range answers["null"] {
		if !bytes.Contains(a, []byte(`"code":-32600`)) {
			t.Errorf("answer %s, want -32600", a)
		}
	}
	if tagged := tagFull(g.seals, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"<&>"}}}`), int64(1)); !bytes.Contains(tagged, []byte(`"<&>"`)) {
		t.Errorf("tagFull escaped the args: %s", tagged)
	}
}

// A stdio batch in which two requests share an id (or two notifications
// are, to the SDK, one id) is answered -32600, to the repeated id, none of
// it run, and the session goes on, as for any other bad line: the SDK's
// reader failed on it, ending the session, and the lines after it were
// never read (rev10-mcp #4).
func TestStdioBatchRepeatedID(t *testing.T) {
	for _, c := range []struct{ name, batch, answer string }{
		{"integer id", `[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":5,"method":"ping"}]`, "5"},
		{"string id", `[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","id":"b","method":"ping"},{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}]`, `"a"`},
		{"two notifications", `[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}]`, "null"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
			init := strings.Replace(strictInit, "2025-06-18", "2025-03-26", 1)
			answers := serveLines(t, g, []string{init, strictInitialized, c.batch,
				`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`}, "\n")
			if a := answers[c.answer]; len(a) != 1 || !strings.Contains(string(a[0]), `"code":-32600`) {
				t.Fatalf("the batch's answers to %s: %s", c.answer, a)
			}
			if len(answers) != 3 {
				t.Fatalf("answers %v, want to 1, %s and 9 only (none of the batch run)", answers, c.answer)
			}
			if a := answers["9"]; len(a) != 1 || !strings.Contains(string(a[0]), "after") {
				t.Fatalf("the call after the batch: %s", a)
			}
		})
	}
}

// A batch naming a request id of an earlier batch not yet answered (a
// client resending a batch whose gated call still waits), or holding a
// notification after an earlier batch's (the SDK keeps a batch's
// notification as an id never answered), is refused with -32600 and the
// session goes on: the lines after it are read and answered. The SDK's
// reader ended on it, leaving every later line unread (rev12 #4).
func TestStdioBatchIDOfEarlierBatch(t *testing.T) {
	k, g, _, _ := newGatedWriteGateway(t, time.Minute, false, nil)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() { served <- g.serveIO(context.Background(), inR, outW) }()
	lines := bufio.NewScanner(outR)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("no answer: %v", lines.Err())
		}
		return lines.Text()
	}
	io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`+"\n")
	next()
	io.WriteString(inW, `[{"jsonrpc":"2.0","method":"notifications/initialized"}]`+"\n")
	io.WriteString(inW, `[{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"fs.write","arguments":{"path":"b.txt","content":"x"}}}]`+"\n")
	onePending(t, k)
	for _, c := range []struct{ batch, id string }{ // id: of the refusal, as JSON
		{`[{"jsonrpc":"2.0","id":5,"method":"ping"}]`, `5`},
		{`[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":77}}]`, `null`},
	} {
		io.WriteString(inW, c.batch+"\n")
		if l := next(); !strings.Contains(l, `"code":-32600`) || !strings.Contains(l, `"id":`+c.id+`,`) {
			t.Errorf("%s: answered %s, want -32600 to id %s", c.batch, l, c.id)
		}
		io.WriteString(inW, `{"jsonrpc":"2.0","id":9,"method":"ping"}`+"\n")
		if l := next(); !strings.Contains(l, `"id":9,`) || !strings.Contains(l, `"result"`) {
			t.Errorf("the ping after %s: answered %s", c.batch, l)
		}
	}
	go io.Copy(io.Discard, outR)
	// An approver ends the waiting call, so that the end of input is
	// not held for it.
	alice, _ := k.Mint(kernel.TokenRequest{AgentID: "alice", Role: captoken.RoleApprover})
	for _, ar := range k.Approvals(false) {
		k.Decide(ar.ID, alice.Token, "deny", "test")
	}
	inW.Close()
	<-served
}
