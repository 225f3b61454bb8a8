package runner

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// A session of a token in handle mode lists its tools by handles
// (list_tools), calls them by handle, is answered tool_not_found for a
// raw syscall id exactly as for a name that does not exist, and its
// handles die when the session ends. A session without handles is told
// list_tools does not apply.
func TestHandleMode(t *testing.T) {
	f := newFixture(t)
	m, err := f.k.Mint(kernel.TokenRequest{AgentID: "agent", Tools: []string{"echo"}, Handles: true})
	if err != nil {
		t.Fatal(err)
	}
	f.s.Token, f.s.TokenID, f.s.Handles = m.Token, m.ID, KernelHandles(f.k, m.Token, m.ID)

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() { served <- f.s.Serve(context.Background(), inR, outW); outW.Close() }()
	answers := bufio.NewScanner(outR)
	ask := func(line string) ToolResponse {
		t.Helper()
		fmt.Fprintln(inW, line)
		if !answers.Scan() {
			t.Fatalf("no answer to %s", line)
		}
		var r ToolResponse
		if err := json.Unmarshal(answers.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}

	list := ask(`{"op":"list_tools","tool_call_id":"l1"}`)
	if list.Op != "tool_list" || !list.OK || len(list.Tools) != 1 || list.Tools[0].Tool != "echo" || !strings.HasPrefix(list.Tools[0].Handle, kernel.HandlePrefix) {
		t.Fatalf("list_tools: %+v", list)
	}
	h := list.Tools[0].Handle
	if again := ask(`{"op":"list_tools","tool_call_id":"l2"}`); len(again.Tools) != 1 || again.Tools[0].Handle != h {
		t.Fatalf("a second list_tools changed the handle: %+v", again)
	}
	if r := ask(call("c1", h, `{"text":"hi"}`)); !r.OK || string(r.Result) != `{"text":"hi"}` {
		t.Fatalf("call by handle: %+v", r)
	}
	raw, unknown := ask(call("c2", "echo", `{"text":"hi"}`)), ask(call("c3", "teleport", `{"text":"hi"}`))
	if raw.Error != kernel.ErrToolNotFound || unknown.Error != kernel.ErrToolNotFound ||
		strings.ReplaceAll(raw.Message, `"echo"`, `"X"`) != strings.ReplaceAll(unknown.Message, `"teleport"`, `"X"`) {
		t.Fatalf("raw id %+v vs unknown %+v", raw, unknown)
	}
	if r := ask(`{"op":"list_tools","tool_call_id":"l3","tool":"echo"}`); r.Error != kernel.ErrInvalidArgs {
		t.Fatalf("list_tools with a tool: %+v", r)
	}
	inW.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	// The session is over: its handle is an unknown tool now.
	env, _ := json.Marshal(kernel.Envelope{ToolID: h, Args: json.RawMessage(`{"text":"x"}`), AgentID: "agent", CapabilityToken: m.Token,
		CapabilityTokenID: m.ID, PolicyHash: f.k.PolicyHash(), Provenance: json.RawMessage(`{"session_id":"` + f.s.ID + `"}`)})
	if res := f.k.InvokeJSON(context.Background(), env); res.Error == nil || res.Error.Class != kernel.ErrToolNotFound {
		t.Fatalf("handle after the session: %+v", res)
	}

	// Without handle mode.
	g := newFixture(t)
	var out strings.Builder
	g.s.Serve(context.Background(), strings.NewReader(`{"op":"list_tools","tool_call_id":"l1"}`), &out)
	var r ToolResponse
	if json.Unmarshal([]byte(out.String()), &r); r.Error != kernel.ErrInvalidArgs || !strings.Contains(r.Message, "handle mode") {
		t.Fatalf("list_tools without handles: %s", out.String())
	}
}
