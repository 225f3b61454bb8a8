package mcpgateway

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
)

var mcpToolName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// A token in handle mode: each MCP session lists the tools by its own
// handles (valid MCP names, 128 random bits, never a syscall id), calls
// by them, and gets for a raw syscall id, another session's handle or a
// forged one exactly the answer of a tool that does not exist; a
// session's handles die when it ends, and all of them on revocation.
func TestGatewayHandleMode(t *testing.T) {
	ctx := context.Background()
	k, _ := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent-1", Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Tools: []string{"echo", "fs.read"}, Handles: true}})
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{Invoker: kernelInvoker{k}, Token: tok, TokenID: cl.ID, AgentID: "agent-1", PolicyHash: k.PolicyHash(),
		StdioSession: "stdio", Handles: runner.KernelHandles(k, tok, cl.ID)})
	srv := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(srv.Close)
	connect := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() }) // before srv.Close, which waits for open streams
		return cs
	}
	// list returns the session's tools by syscall id, as the kernel
	// minted them for the session, checking each name the client sees.
	list := func(cs *mcp.ClientSession) map[string]string {
		lt, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		minted, err := k.Handles(tok, cs.ID())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for i, tl := range lt.Tools {
			if !mcpToolName.MatchString(tl.Name) || !strings.HasPrefix(tl.Name, HandleToolPrefix) || len(tl.Name) != len(HandleToolPrefix)+26 ||
				tl.Name != handleTool(minted[i].Handle) || tl.Description != minted[i].Description {
				t.Fatalf("tool %q, minted %+v", tl.Name, minted[i])
			}
			out[minted[i].Tool] = tl.Name
		}
		return out
	}
	call := func(cs *mcp.ClientSession, name string) (bool, string) {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"text": "hi"}})
		if err != nil {
			t.Fatal(err)
		}
		return r.IsError, r.Content[0].(*mcp.TextContent).Text
	}
	a, b := connect(), connect()
	ta, tb := list(a), list(b)
	if len(ta) != 2 || len(tb) != 2 {
		t.Fatalf("tools %v %v", ta, tb)
	}
	ha, hb := ta["echo"], tb["echo"]
	if ha == hb || ha == "" {
		t.Fatalf("sessions share handle %q", ha)
	}
	if isErr, text := call(a, ha); isErr || !strings.Contains(text, `"text":"hi"`) {
		t.Fatalf("call by handle: %s", text)
	}
	_, want := call(a, "teleport")
	for _, name := range []string{"echo", "fs.read", hb, HandleToolPrefix + strings.Repeat("a", 26), "/object/" + strings.TrimPrefix(ha, HandleToolPrefix)} {
		isErr, text := call(a, name)
		// A name not of a tool id's form is named by its digest
		// (kernel: publicClaims).
		text = strings.Replace(text, digest.Sum([]byte(kernelTool(name))), "teleport", 1)
		if !isErr || strings.Replace(text, name, "teleport", 1) != want {
			t.Errorf("call of %q: %q, want the unknown tool's %q", name, text, want)
		}
	}
	// A's session ends: its handles die (the kernel no longer knows them
	// in A's session).
	aID := a.ID()
	a.Close()
	env, _ := json.Marshal(kernel.Envelope{ToolID: "/object/" + strings.TrimPrefix(ha, HandleToolPrefix), Args: json.RawMessage(`{"text":"x"}`),
		AgentID: "agent-1", CapabilityToken: tok, CapabilityTokenID: cl.ID, PolicyHash: k.PolicyHash(), Provenance: json.RawMessage(`{"session_id":"` + aID + `"}`)})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res := k.InvokeJSON(ctx, env); res.Error != nil && res.Error.Class == kernel.ErrToolNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's handle outlived its session")
		}
	}
	// Revocation ends B's.
	if isErr, _ := call(b, hb); isErr {
		t.Fatal("B's handle before revocation")
	}
	if err := k.Revoke(ctx, cl.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if isErr, text := call(b, hb); !isErr || !strings.Contains(text, "revoked") && !strings.HasPrefix(text, "tool_not_found") {
		t.Fatalf("B's handle after revocation: %s", text)
	}
}
