package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// POST /v1/syscalls answers on one kept-alive connection, call after call,
// with the result envelope as encoding/json writes it and a declared
// Content-Length (no chunked encoding), for allowed calls and refusals
// alike.
func TestCallOnTheWire(t *testing.T) {
	f := newFixture(t)
	env := f.envelope(t)
	var unknown kernel.Envelope
	if err := json.Unmarshal(env, &unknown); err != nil {
		t.Fatal(err)
	}
	unknown.ToolID = "no.such.tool"
	unknownEnv, _ := json.Marshal(unknown)
	// An envelope over the limit, as encoding/json writes one: what comes
	// before its args (tool, claimed agent and token id) reaches the audit
	// record.
	big := unknown
	big.ToolID, big.Args = "echo", json.RawMessage(`{"text":"`+strings.Repeat("x", int(f.k.MaxEnvelopeBytes()))+`"}`)
	oversize, _ := json.Marshal(big)
	tests := []struct {
		name   string
		body   []byte
		header string
		status int
		class  string
	}{
		{"ok", env, "", http.StatusOK, ""},
		{"ok again", env, "", http.StatusOK, ""},
		{"not JSON", []byte(`{"tool_id":`), "", http.StatusBadRequest, kernel.ErrInvalidArgs},
		{"duplicate member", []byte(`{"tool_id":"echo","tool_id":"echo"}`), "", http.StatusBadRequest, kernel.ErrInvalidArgs},
		{"admin credential", env, "Authorization: Bearer " + f.admin, http.StatusUnauthorized, kernel.ErrTokenInvalid},
		{"unknown tool", unknownEnv, "", http.StatusNotFound, kernel.ErrToolNotFound},
		{"html in the answer", []byte(`{"tool_id":"<b>&</b>"}`), "", http.StatusBadRequest, kernel.ErrInvalidArgs},
		{"ok after refusals", env, "", http.StatusOK, ""},
		// The server reads no more than the limit; net/http drains a
		// short rest, so the connection stays usable (docs/http.md).
		{"over the limit", oversize, "", http.StatusRequestEntityTooLarge, kernel.ErrInvalidArgs},
		{"ok after the limit", env, "", http.StatusOK, ""},
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	for _, tt := range tests {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		req := fmt.Sprintf("POST /v1/syscalls HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", conn.RemoteAddr(), len(tt.body))
		if tt.header != "" {
			req += tt.header + "\r\n"
		}
		go conn.Write(append([]byte(req+"\r\n"), tt.body...)) // the server may answer before reading it all
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		body := new(bytes.Buffer)
		_, err = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: reading the body: %v", tt.name, err)
		}
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, body)
		}
		for name, want := range map[string]string{
			"Content-Length": strconv.Itoa(body.Len()), "Content-Type": "application/json",
			"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
		} {
			if got := resp.Header.Values(name); len(got) != 1 || got[0] != want {
				t.Errorf("%s: %s %q, want %q", tt.name, name, got, want)
			}
		}
		if len(resp.TransferEncoding) > 0 {
			t.Errorf("%s: Transfer-Encoding %q", tt.name, resp.TransferEncoding)
		}
		var r kernel.Result
		if err := json.Unmarshal(body.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v: %s", tt.name, err, body)
		}
		if want, _ := json.Marshal(&r); !bytes.Equal(body.Bytes(), append(want, '\n')) {
			t.Errorf("%s: the body is not encoding/json's encoding of the envelope it holds:\n%s\nwant\n%s", tt.name, body, want)
		}
		if class := errClassOf(&r); class != tt.class || r.LedgerSeq == 0 {
			t.Errorf("%s: class %q, ledger_seq %d; want class %q, audited", tt.name, class, r.LedgerSeq, tt.class)
		}
		// Its agent is a claim its token did not back: the result names
		// none (the record keeps it as claimed_agent_id).
		if tt.name == "over the limit" && (r.ToolID != "echo" || r.AgentID != "") {
			t.Errorf("%s: the refusal names tool %q and agent %q, want echo and none", tt.name, r.ToolID, r.AgentID)
		}
		if resp.Close && tt.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: the server closes the connection", tt.name)
		}
	}
}

func errClassOf(r *kernel.Result) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Class
}

// The call handler reads bodies into pooled buffers, which is sound only
// while InvokeJSON, Refuse and Start keep no reference to the envelope's
// bytes once they return: overwriting them afterwards leaves each result,
// and what the kernel stored of it, as it was.
func TestCallKeepsNoBody(t *testing.T) {
	f := newFixture(t)
	var env kernel.Envelope
	if err := json.Unmarshal(f.envelope(t), &env); err != nil {
		t.Fatal(err)
	}
	env.Args = json.RawMessage(`{"text":"kept text"}`)
	env.Provenance = json.RawMessage(`{"session_id":"kept-session"}`)
	ctx := context.Background()
	calls := []struct {
		name string
		call func(data []byte) *kernel.Result
	}{
		{"InvokeJSON", func(data []byte) *kernel.Result { return f.k.InvokeJSON(ctx, data) }},
		{"Refuse", func(data []byte) *kernel.Result { return f.k.Refuse(ctx, data, kernel.ErrInvalidArgs, "refused") }},
		{"Start", func(data []byte) *kernel.Result {
			id, refused, err := f.k.Start(ctx, data)
			if err != nil {
				t.Fatalf("Start: %v: %+v", err, refused)
			}
			clear(data) // while the call runs
			r, err := f.k.Wait(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			data, _ := json.Marshal(&env)
			r := c.call(data)
			want, _ := json.Marshal(r)
			for i := range data {
				data[i] = 'x'
			}
			if got, _ := json.Marshal(r); !bytes.Equal(got, want) {
				t.Errorf("the result changed with the body's bytes:\n%s\nwas\n%s", got, want)
			}
			if c.name != "Refuse" && (!bytes.Contains(want, []byte(`"kept text"`)) || !bytes.Contains(want, []byte(`"kept-session"`))) {
				t.Errorf("result %s: want the call's text and session", want)
			}
			stored, err := f.k.Inspector().Operation(r.OperationID)
			if err != nil {
				t.Fatal(err)
			}
			var s kernel.Result
			if err := json.Unmarshal(stored, &s); err != nil {
				t.Fatal(err)
			}
			if s.ToolID != r.ToolID || s.AgentID != r.AgentID || !bytes.Equal(s.Provenance, r.Provenance) {
				t.Errorf("stored %s\nfor the result %s", stored, want)
			}
		})
	}
}

// Every JSON answer declares its length, the long ones too (net/http
// itself declares it only for answers under 2 KiB).
func TestAnswersDeclareLength(t *testing.T) {
	f := newFixture(t)
	if code, body := f.send(t, "POST", "/v1/syscalls", f.envelope(t), "Content-Type: application/json"); code != http.StatusOK {
		t.Fatalf("call: %d %s", code, body)
	}
	for _, path := range []string{"/v1/ledger/entries", "/v1/ledger/head", "/.well-known/jwks.json", "/v1/ledger/checkpoint", "/v1/no/such/endpoint"} {
		req, err := http.NewRequest("GET", f.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+f.admin)
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := new(bytes.Buffer)
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.ContentLength != int64(body.Len()) || len(resp.TransferEncoding) > 0 {
			t.Errorf("GET %s: %d bytes, Content-Length %d, Transfer-Encoding %q", path, body.Len(), resp.ContentLength, resp.TransferEncoding)
		}
	}
}

// TestClosingAnswers503: once the kernel closes, a call over HTTP,
// synchronous or background, is answered 503 with its result envelope
// saying it did not run: the status a client retries on.
func TestClosingAnswers503(t *testing.T) {
	f := newFixture(t)
	env := f.envelope(t)
	if err := f.k.Close(); err != nil {
		t.Fatal(err)
	}
	for _, async := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/syscalls", bytes.NewReader(env))
		req.Header.Set("Content-Type", "application/json")
		if async {
			req.Header.Set("Prefer", "respond-async")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var r kernel.Result
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || errClassOf(&r) != kernel.ErrInternal || !strings.Contains(r.Error.Message, "did not run") {
			t.Errorf("async %v: status %d, %+v; want 503 and the call not run", async, resp.StatusCode, r.Error)
		}
	}
}
