package mcpgateway

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// kernelInvoker runs envelopes through a real kernel.
type kernelInvoker struct{ k *kernel.Kernel }

func (i kernelInvoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return i.k.InvokeJSON(ctx, env), nil
}

// newTestGateway opens a kernel in a fresh data dir and makes a gateway
// for a token of agent-1 with capability c, serving the token's tools; c
// is the rest of the gateway's configuration (its Invoker, when set, runs
// the calls; else the kernel does).
func newTestGateway(t testing.TB, cp captoken.Capability, c Config) (*kernel.Kernel, *Gateway) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := kernel.Init(dir); err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	tok, cl, err := k.MintToken(captoken.Claims{Subject: "agent-1", Expiry: time.Now().Add(time.Hour), Cap: cp})
	if err != nil {
		t.Fatal(err)
	}
	defs, err := k.Tools(tok, "mcp")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(defs, &c.Tools); err != nil {
		t.Fatal(err)
	}
	if c.Invoker == nil {
		c.Invoker = kernelInvoker{k}
	}
	c.Token, c.TokenID, c.AgentID, c.PolicyHash, c.StdioSession = tok, cl.ID, "agent-1", k.PolicyHash(), "s1"
	return k, New(c)
}

// A tools/call whose _meta another reader could read differently (two
// idempotency keys, bytes that are not UTF-8), or whose idempotency key is
// not a string, is refused with invalid_args naming the member, by the
// kernel, which audits it with a receipt; a well-formed one runs. (The
// transports read the message as prepare does: strict_test.go.)
func TestMetaStrictJSON(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	tests := []struct {
		name   string
		params string
		want   string // in the refusal; "" for a call that runs
	}{
		{"no _meta", `{"name":"echo","arguments":{"text":"hi"}}`, ""},
		{"a key", `{"name":"echo","arguments":{"text":"hi"},"_meta":{"capkernel/idempotency_key":"k1"}}`, ""},
		{"two keys", `{"name":"echo","arguments":{"text":"hi"},"_meta":{"capkernel/idempotency_key":"k1","capkernel/idempotency_key":"k2"}}`,
			`duplicate member name "capkernel/idempotency_key" in /provenance/mcp_message/params/_meta`},
		{"two keys, one escaped", `{"name":"echo","_meta":{"capkernel/idempotency_key":"k1","capkernel\/idempotency_key":"k2"}}`,
			`duplicate member name "capkernel/idempotency_key"`},
		{"deep duplicate", `{"name":"echo","_meta":{"trace":{"a":[{"b":1,"b":2}]}}}`, `duplicate member name "b" in /provenance/mcp_message/params/_meta/trace/a/0`},
		{"two _meta", `{"name":"echo","_meta":{"capkernel/idempotency_key":"k1"},"_meta":{}}`, `duplicate member name "_meta"`},
		{"invalid UTF-8", "{\"name\":\"echo\",\"_meta\":{\"capkernel/idempotency_key\":\"k\xff\"}}", `invalid UTF-8 in /provenance/mcp_message/params/_meta/capkernel~1idempotency_key`},
		{"key not a string", `{"name":"echo","_meta":{"capkernel/idempotency_key":7}}`, `/idempotency_key`},
		{"key an object", `{"name":"echo","_meta":{"capkernel/idempotency_key":{"k":"v"}}}`, `/idempotency_key`},
		{"lone surrogate", `{"name":"echo","_meta":{"note":"\ud800"}}`, `surrogate`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := `{"jsonrpc":"2.0","id":"r-` + tc.name + `","method":"tools/call","params":` + tc.params + `}`
			prepared, reject := prepare(g.seals, []byte(msg))
			var m struct{ Params mcp.CallToolParamsRaw }
			if err := json.Unmarshal(prepared, &m); err != nil || reject != nil {
				t.Fatalf("prepared %s: %v %s", prepared, err, reject)
			}
			p := m.Params
			before, err := k.Inspector().Head()
			if err != nil {
				t.Fatal(err)
			}
			r, err := g.handle(context.Background(), &mcp.CallToolRequest{Params: &p})
			if err != nil {
				t.Fatal(err)
			}
			text := r.Content[0].(*mcp.TextContent).Text
			after, _ := k.Inspector().Head()
			if tc.want == "" {
				if r.IsError || after.Size == before.Size {
					t.Fatalf("call refused or not recorded: %s", text)
				}
				return
			}
			if !r.IsError || !strings.HasPrefix(text, kernel.ErrInvalidArgs+": ") || !strings.Contains(text, tc.want) {
				t.Fatalf("answer %q, want invalid_args naming %s", text, tc.want)
			}
			// Refused by the kernel: audited, with a receipt.
			if r.Meta[MetaReceiptID] == nil || after.Size == before.Size {
				t.Fatalf("refusal not audited: _meta %v, ledger %d → %d", r.Meta, before.Size, after.Size)
			}
		})
	}
}

// A result's _meta gives the client its audit record's salt, which opens
// the record's commitment to the arguments the client sent and to no
// other arguments.
func TestMetaAuditSalt(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	p := mcp.CallToolParamsRaw{Name: "echo", Arguments: json.RawMessage(`{"text":"a secret"}`)}
	r, err := g.handle(context.Background(), &mcp.CallToolRequest{Params: &p})
	if err != nil || r.IsError {
		t.Fatalf("echo: %v %+v", err, r)
	}
	salt, _ := r.Meta[MetaAuditSalt].(string)
	seq, _ := r.Meta[MetaLedgerSeq].(uint64)
	if salt == "" || seq == 0 {
		t.Fatalf("_meta %v: want %s and %s", r.Meta, MetaAuditSalt, MetaLedgerSeq)
	}
	es, err := k.Inspector().Entries(seq, 1)
	if err != nil || len(es) != 1 {
		t.Fatalf("entry %d: %v", seq, err)
	}
	if err := kernel.CheckPayload(es[0], kernel.Payload{Salt: salt, Args: json.RawMessage(`{"text":"a secret"}`)}); err != nil {
		t.Errorf("the salt does not open the args the client sent: %v", err)
	}
	if err := kernel.CheckPayload(es[0], kernel.Payload{Salt: salt, Args: json.RawMessage(`{"text":"a guess"}`)}); err == nil {
		t.Error("the salt opened the record's commitment to other args")
	}
}
