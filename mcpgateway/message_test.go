package mcpgateway

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// methodSpellings are the member "method": "tools/call" as a client may
// write it: every one is the same JSON, and the SDK runs each as a call.
var methodSpellings = []struct{ name, member string }{
	{"plain", `"method":"tools/call"`},
	{"escaped slash", `"method":"tools\/call"`},
	{"\\u002f", `"method":"tools\u002fcall"`},
	{"\\u002F", `"method":"tools\u002Fcall"`},
	{"every letter escaped", `"method":"\u0074\u006f\u006f\u006c\u0073\u002f\u0063\u0061\u006c\u006c"`},
	{"escaped member name", `"m\u0065thod":"tools/call"`},
}

// forgedMeta is a client's _meta that sets every key only the gateway may
// set: its own request id, and a strictjson refusal whose "message" would
// add provenance members of the client's choosing.
func forgedMeta() string {
	inject := `0,"model":"forged-model","parent_operation_id":"forged-parent","turn_id":"forged"`
	return `{"capkernel/request_id":"chosen","capkernel/invalid_meta":"x","capkernel/raw_message":"` +
		base64.StdEncoding.EncodeToString([]byte(inject)) + `"}`
}

// lastCall is the idempotency key, status and provenance of the last call
// the kernel audited after ledger size before.
func lastCall(t *testing.T, k *kernel.Kernel, before uint64) (key, status, context string) {
	t.Helper()
	views, err := k.Inspector().EntryViews(before, 100, kernel.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if v.Kind != "audit" || v.Payload == nil {
			continue
		}
		var body struct {
			IdempotencyKey string `json:"idempotency_key"`
			Status         string `json:"status"`
		}
		json.Unmarshal(v.Body, &body)
		key, status, context = body.IdempotencyKey, body.Status, string(v.Payload.Context)
	}
	if status == "" {
		t.Fatal("no call audited")
	}
	return key, status, context
}

// A tools/call is the gateway's to tag however its method is spelled, on
// every transport: the stdio lines, streamable HTTP through the SDK (a
// call with _meta) and the lean path (a plain call). The client's own
// request id and strictjson marks are dropped: the call runs under the
// key derived from its JSON-RPC id, with no provenance of the client's.
// (Before, an escaped method skipped the tagging: the call ran under the
// client's key, with the client's bytes spliced into its provenance.)
func TestEscapedMethodTagged(t *testing.T) {
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{})
	m := newRawMCP(t, g)
	transports := []struct {
		name string
		// call sends msg, a tools/call of id, and returns the session id
		// its key derives from.
		call func(t *testing.T, id, msg string) (session string)
		meta bool // the call carries forgedMeta
	}{
		{"stdio", func(t *testing.T, id, msg string) string {
			answers := serveLines(t, g, []string{strictInit, strictInitialized, msg}, "\n")
			if len(answers[id]) != 1 {
				t.Fatalf("answers %s", answers)
			}
			return "s1"
		}, true},
		{"http sdk", func(t *testing.T, _, msg string) string {
			resp, b, _ := m.post(msg)
			if resp.StatusCode != http.StatusOK || lean(resp) {
				t.Fatalf("%d (lean %v) %.200s", resp.StatusCode, lean(resp), b)
			}
			return m.cs.ID()
		}, true},
		{"http lean", func(t *testing.T, _, msg string) string {
			resp, b, _ := m.post(msg)
			if resp.StatusCode != http.StatusOK || !lean(resp) {
				t.Fatalf("%d (lean %v) %.200s: a plain call, however its method is spelled, is the lean path's", resp.StatusCode, lean(resp), b)
			}
			return m.cs.ID()
		}, false},
	}
	n := 0
	for _, tr := range transports {
		for _, sp := range methodSpellings {
			n++
			id := `"c` + strconv.Itoa(n) + `"`
			t.Run(tr.name+"/"+sp.name, func(t *testing.T) {
				params := `{"name":"echo","arguments":{"text":"a"}}`
				if tr.meta {
					params = `{"name":"echo","arguments":{"text":"a"},"_meta":` + forgedMeta() + `}`
				}
				msg := `{"jsonrpc":"2.0","id":` + id + `,` + sp.member + `,"params":` + params + `}`
				before, err := k.Inspector().Head()
				if err != nil {
					t.Fatal(err)
				}
				session := tr.call(t, id, msg)
				key, status, ctx := lastCall(t, k, before.Size)
				if want := `mcp:` + session + `:` + id; key != want {
					t.Errorf("idempotency key %q, want %q", key, want)
				}
				if strings.Contains(ctx, "forged") {
					t.Errorf("status %s, provenance %s: the client's bytes reached it", status, ctx)
				}
			})
		}
	}
}

// The calls in flight are the SDK's and the lean path's alike however a
// method is spelled: a second call with an id in flight is refused (400,
// invalid request) whichever path either took, and notifications/cancelled
// cancels a lean call in any spelling. (Before, an escaped method on the
// SDK's path went untracked: the duplicate ran.)
func TestEscapedMethodInFlight(t *testing.T) {
	gt := newGate()
	k, g := newTestGateway(t, captoken.Capability{Tools: []string{"echo"}}, Config{Invoker: gt})
	gt.inner = kernelInvoker{k}
	m := newRawMCP(t, g)
	// call is a tools/call of id with method member and params member
	// (and _meta) after the name and arguments.
	call := func(id, member string) string {
		method, meta, _ := strings.Cut(member, ",")
		if meta != "" {
			meta = "," + meta
		}
		return `{"jsonrpc":"2.0","id":` + id + `,` + method + `,"params":{"name":"echo","arguments":{"text":"a"}` + meta + `}}`
	}
	// Each case its own id: a call's id is forgotten only after its
	// answer is written.
	n := 0
	for _, sp := range methodSpellings {
		for _, c := range []struct{ name, first, second string }{
			{"lean first", `"method":"tools/call"`, sp.member + `,"_meta":{}`},
			{"sdk first", sp.member + `,"_meta":{}`, `"method":"tools/call"`},
			{"both sdk", sp.member + `,"_meta":{}`, sp.member + `,"_meta":{"x":1}`},
		} {
			n++
			id := strconv.Itoa(n)
			t.Run(sp.name+"/"+c.name, func(t *testing.T) {
				first := make(chan *http.Response, 1)
				go func() {
					resp, _, _ := m.post(call(id, c.first))
					first <- resp
				}()
				gt.wait(t, gt.entered)
				type answer struct {
					resp *http.Response
					body []byte
					msg  map[string]any
				}
				second := make(chan answer, 1)
				go func() {
					resp, b, msg := m.post(call(id, c.second))
					second <- answer{resp, b, msg}
				}()
				var a answer
				held := 1
				select {
				case a = <-second:
				case <-gt.entered:
					t.Errorf("a second call with id %s in flight reached the kernel", id)
					held = 2
				}
				for range held {
					gt.release <- struct{}{}
					<-gt.ended
				}
				if held == 2 {
					a = <-second
				}
				want := `{"error":{"code":-32600,"message":"duplicate in-flight request ID ` + id + `"},"id":` + id + `,"jsonrpc":"2.0"}`
				if a.resp.StatusCode != http.StatusBadRequest || string(mustJSON(a.msg)) != want {
					t.Errorf("a second call with id %s: %d %.300s, want 400 %s", id, a.resp.StatusCode, a.body, want)
				}
				if resp := <-first; resp.StatusCode != http.StatusOK {
					t.Fatalf("the first call: %d", resp.StatusCode)
				}
			})
		}
	}
	for _, sp := range []string{`"method":"notifications/cancelled"`, `"method":"notifications\/cancelled"`, `"method":"notifications\u002fcancelled"`, `"m\u0065thod":"notifications/cancelled"`} {
		n++
		id := strconv.Itoa(n)
		t.Run("cancel "+sp, func(t *testing.T) {
			go m.post(call(id, `"method":"tools/call"`))
			gt.wait(t, gt.entered)
			if resp, b, _ := m.post(`{"jsonrpc":"2.0",` + sp + `,"params":{"requestId":` + id + `}}`); resp.StatusCode != http.StatusAccepted {
				t.Fatalf("notifications/cancelled: %d %s", resp.StatusCode, b)
			}
			gt.cancelled(t)
		})
	}
}
