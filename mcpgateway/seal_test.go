package mcpgateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
)

// marksOf takes the marks under their own seal, from this gateway, and
// nothing else.
func TestSeal(t *testing.T) {
	s, other := newSealer(), newSealer()
	mk := marks{requestID: `"r1"`, invalid: "duplicate member name", raw: "e30="}
	meta := func(m marks, seal string) mcp.Meta {
		return mcp.Meta{MetaRequestID: "r1", MetaInvalid: m.invalid, MetaRawMessage: m.raw, MetaSeal: seal}
	}
	cases := []struct {
		name string
		meta mcp.Meta
		want marks
	}{
		{"sealed", meta(mk, s.seal(mk)), mk},
		{"an id only", mcp.Meta{MetaRequestID: float64(7), MetaSeal: s.seal(marks{requestID: "7"})}, marks{requestID: "7"}},
		{"no seal", meta(mk, ""), marks{}},
		{"forged seal", meta(mk, "AAAA"), marks{}},
		{"another gateway's seal", meta(mk, other.seal(mk)), marks{}},
		{"another id", mcp.Meta{MetaRequestID: "r2", MetaInvalid: mk.invalid, MetaRawMessage: mk.raw, MetaSeal: s.seal(mk)}, marks{}},
		{"another reason", meta(marks{invalid: "x", raw: mk.raw}, s.seal(mk)), marks{}},
		{"another message", meta(marks{invalid: mk.invalid, raw: "e319"}, s.seal(mk)), marks{}},
		{"a mark added", meta(mk, s.seal(marks{requestID: mk.requestID})), marks{}},
		{"fields shifted", mcp.Meta{MetaRequestID: "r1", MetaInvalid: "ab", MetaSeal: s.seal(marks{requestID: `"r1"`, invalid: "a", raw: "b"})}, marks{}},
		{"a seal not a string", mcp.Meta{MetaRequestID: "r1", MetaSeal: 1}, marks{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := s.marksOf(c.meta); got != c.want {
				t.Fatalf("marksOf = %+v, want %+v", got, c.want)
			}
		})
	}
}

// A call that reaches the handler by no transport of the gateway's (here
// the SDK's in-memory one) carries no marks the gateway sealed: the
// client's own request id, strictjson marks and seal are ignored, and
// the call runs with no key derived from them and no provenance of the
// client's.
func TestHandleIgnoresUnsealedMarks(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := g.server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var forged mcp.Meta
	if err := json.Unmarshal([]byte(forgedMeta()), &forged); err != nil {
		t.Fatal(err)
	}
	forged[MetaSeal] = "AAAA"
	for _, name := range []string{"echo", "not.served"} { // the handler, and the middleware's way to it
		t.Run(name, func(t *testing.T) {
			before, err := k.Inspector().Head()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"text": "a"}, Meta: forged}); err != nil {
				t.Fatal(err)
			}
			key, status, context := lastCall(t, k, before.Size)
			if strings.Contains(key, "chosen") || strings.Contains(context, "forged") {
				t.Fatalf("status %s key %q provenance %s: the client's marks were taken", status, key, context)
			}
			if name == "echo" && status != "ok" {
				t.Fatalf("status %s: the call did not run", status)
			}
		})
	}
}

// A tools/call's key derives from its JSON-RPC id, whatever the id
// (numbers up to 2^63 the SDK reads as floats, strings with characters
// JSON escapes): the sealed id the handler gets from the SDK is the one
// the transport read.
func TestSealedRequestIDs(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	m := newRawMCP(t, g)
	for _, id := range []string{`7`, `-3`, `3.0`, `9007199254740993`, `1152921504606846976`, `"a<b&>"`, `"\u00e9"`, `"x\u0000y"`, `"\ud83d\ude00"`} {
		for _, meta := range []string{"", `,"_meta":{}`} {
			t.Run(id+meta, func(t *testing.T) {
				msg := `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}` + meta + `}}`
				for _, tr := range []string{"stdio", "http"} {
					before, err := k.Inspector().Head()
					if err != nil {
						t.Fatal(err)
					}
					session := "s1"
					if tr == "stdio" {
						serveLines(t, g, []string{strictInit, strictInitialized, msg}, "\n")
					} else {
						m.post(msg)
						session = m.cs.ID()
					}
					var rid any
					json.Unmarshal([]byte(id), &rid) // as the SDK reads it
					key, status, _ := lastCall(t, k, before.Size)
					if want := "mcp:" + session + ":" + string(mustJSON(rid)); key != want || status != "ok" {
						t.Errorf("%s: key %q status %s, want key %q", tr, key, status, want)
					}
				}
			})
		}
	}
}
