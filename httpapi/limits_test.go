package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// TestBodyOverLimitIs413: every endpoint that reads a JSON body answers
// one over its 1 MiB limit with 413 invalid_args, as docs/http.md says.
// POST /v1/approvals/{id} answered it 400.
func TestBodyOverLimitIs413(t *testing.T) {
	f := newAccessFixture(t)
	big := `{"decision":"allow","reason":"` + strings.Repeat("r", 2<<20) + `"}`
	tests := []struct {
		name, path, cred string
	}{
		{"decide", "/v1/approvals/x", f.approver},
		{"inspect", "/v1/tokens/inspect", ""},
		{"attenuate", "/v1/tokens/attenuate", f.a.token},
		{"mint", "/v1/tokens", f.admin},
		{"revoke", "/v1/tokens/" + f.a.jti + "/revoke", f.admin},
		{"erase", "/v1/admin/ledger/erase", f.admin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.srv.URL+tt.path, strings.NewReader(big))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if tt.cred != "" {
				req.Header.Set("Authorization", "Bearer "+tt.cred)
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb httpapi.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatalf("status %d, answer is not an error body: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != http.StatusRequestEntityTooLarge || eb.Error.Class != kernel.ErrInvalidArgs {
				t.Fatalf("status %d %+v, want 413 %s", resp.StatusCode, eb.Error, kernel.ErrInvalidArgs)
			}
		})
	}
}

// TestDeclaredLengthIsNotAllocated: a call's body buffer grows with the
// bytes that arrive, not with the Content-Length the request declares.
// 64 connections each declare a body just under the envelope limit, send
// its first byte and stall; once every handler is reading its body, the
// server's heap holds far less than the 64 MiB declared. Each held a
// buffer of the declared size, so any unauthenticated client made the
// server allocate ~1 MiB per connection for the whole read timeout.
func TestDeclaredLengthIsNotAllocated(t *testing.T) {
	f := newFixture(t)
	const conns = 64
	reading := make(chan struct{}, conns)
	api := httpapi.New(f.k)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &firstRead{ReadCloser: r.Body, read: reading}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	declared := f.k.MaxEnvelopeBytes() - 1
	before := heapAlloc()
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "POST /v1/syscalls HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", addr, declared); err != nil {
			t.Fatal(err)
		}
	}
	for i := range conns {
		select {
		case <-reading:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d handlers are reading their body", i, conns)
		}
	}
	grown := int64(heapAlloc()) - int64(before)
	t.Logf("%d stalled connections declaring %d-byte bodies: heap grew %d KiB", conns, declared, grown>>10)
	// The pooled buffer (8 KiB) and the connection's own buffers are
	// what a stalled connection may hold; the declared body is 1 MiB.
	if limit := int64(conns * 128 << 10); grown > limit {
		t.Fatalf("%d connections declaring %d-byte bodies and sending 1 byte grew the heap %d KiB, over %d KiB", conns, declared, grown>>10, limit>>10)
	}
}

// firstRead is a request body that reports its first Read, made once the
// handler has its buffer.
type firstRead struct {
	io.ReadCloser
	read chan<- struct{}
	once sync.Once
}

func (b *firstRead) Read(p []byte) (int, error) {
	b.once.Do(func() { b.read <- struct{}{} })
	return b.ReadCloser.Read(p)
}

// heapAlloc is the bytes of live heap objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestCallBodiesReadWhole: a call's body is read whole whatever its size
// relative to the buffer (8 KiB pooled, grown as bytes arrive), declared
// or chunked; one over the envelope limit is 413.
func TestCallBodiesReadWhole(t *testing.T) {
	f := newFixture(t)
	envelope := func(n int) []byte {
		b, err := json.Marshal(kernel.Envelope{
			ToolID: "echo", Args: json.RawMessage(fmt.Sprintf(`{"text":%q}`, strings.Repeat("x", n))), AgentID: "agent-1",
			CapabilityToken: f.token, CapabilityTokenID: f.jti, PolicyHash: f.k.PolicyHash(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := len(envelope(0))
	limit := int(f.k.MaxEnvelopeBytes())
	tests := []struct {
		name    string
		size    int // of the body
		chunked bool
		status  int
	}{
		{"small", 2 << 10, false, 200},
		{"the pooled buffer less one", 8<<10 - 1, false, 200},
		{"the pooled buffer", 8 << 10, false, 200},
		{"the pooled buffer and one", 8<<10 + 1, false, 200},
		{"300 KiB", 300 << 10, false, 200},
		{"300 KiB chunked", 300 << 10, true, 200},
		{"the limit", limit, false, 200},
		{"the limit chunked", limit, true, 200},
		{"over the limit", limit + 1, false, 413},
		{"over the limit chunked", limit + 1, true, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := envelope(tt.size - base)
			if len(body) != tt.size {
				t.Fatalf("test envelope of %d bytes, want %d", len(body), tt.size)
			}
			var rd io.Reader = strings.NewReader(string(body))
			if tt.chunked {
				rd = io.MultiReader(rd) // no length known: sent chunked
			}
			req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/syscalls", rd)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var res kernel.Result
			if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
				t.Fatalf("status %d, answer is not a result envelope: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %+v", resp.StatusCode, tt.status, res.Error)
			}
			if tt.status == 200 && len(res.Result) < tt.size-base {
				t.Fatalf("the echo holds %d bytes, want the %d sent", len(res.Result), tt.size-base)
			}
		})
	}
}

// TestEventStreamLimits: GET /v1/events streams are bounded per agent
// (with its sub-agents; a person's approver or auditor tokens, the admin
// credential each count as one) and in all: beyond either bound a stream
// is refused 429 concurrency_exceeded, and a stream that closes frees its
// place. Any token opened as many as it liked, each holding a subscription
// with its event buffer in the kernel.
func TestEventStreamLimits(t *testing.T) {
	f := newAccessFixtureWith(t, kernel.Config{}, func(s *httpapi.Server) { httpapi.SetEventStreamLimits(s, 2, 4) })
	sub, err := f.k.Attenuate(context.Background(), kernel.AttenuateRequest{Parent: f.a.token, AgentID: f.a.agent + "/sub"})
	if err != nil {
		t.Fatal(err)
	}
	var first func()
	steps := []struct {
		name, cred string
		status     int
	}{
		{"agent-a's first", f.a.token, 200},
		{"agent-a's second", f.a.token, 200},
		{"agent-a's third: over the agent's bound", f.a.token, 429},
		{"agent-a's sub-agent, counted with agent-a", sub.Token, 429},
		{"agent-b's first: another agent", f.b.token, 200},
		{"the auditor's first, the fourth in all", f.auditor, 200},
		{"the admin's first: over the bound in all", f.admin, 429},
		{"the approver's first: over the bound in all", f.approver, 429},
	}
	for i, st := range steps {
		status, body, stop := openEvents(t, f.srv.URL, st.cred)
		if i == 0 {
			first = stop
		}
		if status != st.status {
			t.Fatalf("%s: status %d, want %d: %s", st.name, status, st.status, body)
		}
		if status == http.StatusTooManyRequests {
			var eb httpapi.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error.Class != kernel.ErrConcurrencyExceeded {
				t.Fatalf("%s: 429 answer %s is not a %s error body", st.name, body, kernel.ErrConcurrencyExceeded)
			}
		}
	}
	// Once agent-a's first stream closes (the server sees it when its
	// handler returns), the admin's stream takes its place.
	first()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		status, body, _ := openEvents(t, f.srv.URL, f.admin)
		if status == http.StatusOK {
			break
		}
		if status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("the admin's stream after one closed: %d %s", status, body)
		}
	}
}

// openEvents opens GET /v1/events with cred: its status, and the body of
// a refusal; a stream open is closed by stop, or when the test ends.
func openEvents(t *testing.T, base, cred string) (status int, body []byte, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return resp.StatusCode, body, func() {}
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); resp.Body.Close() }) }
	t.Cleanup(stop)
	return resp.StatusCode, nil, stop
}

// TestEntriesPageIsBoundedInBytes: a page of GET /v1/ledger/entries stops
// at MaxEntriesPageBytes of JSON, says so (more) and where to go on
// (next), and paging on from next reads every entry once, in order. An
// agent reads its own records with their payloads; the page was bounded
// by count alone, so 1000 of them of ~1 MiB each were one answer of
// gigabytes, built whole in the server.
func TestEntriesPageIsBoundedInBytes(t *testing.T) {
	f := newAccessFixture(t)
	big := strings.Repeat("x", 900<<10)
	const calls = 8 // ~1.8 MB of payload each (args and the echoed result): ~14 MB in all
	for i := range calls {
		if res := f.call(t, f.a, "echo", fmt.Sprintf(`{"text":%q}`, big), fmt.Sprintf("k%d", i), ""); res.Status != kernel.StatusOK {
			t.Fatalf("echo %d: %+v", i, res.Error)
		}
	}
	status, body := f.get(t, f.a.token, "/v1/ledger/entries?from=0&limit=1000")
	if status != http.StatusOK {
		t.Fatalf("GET entries: %d %s", status, body)
	}
	// The page's JSON past its last entry is `],"next":N,"more":true}` and a newline.
	if len(body) > httpapi.MaxEntriesPageBytes+64 {
		t.Fatalf("a page is %d bytes, over the %d-byte bound", len(body), httpapi.MaxEntriesPageBytes)
	}
	var page httpapi.Entries
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	h, err := f.k.Inspector().Head()
	if err != nil {
		t.Fatal(err)
	}
	head := h.Size
	if n := len(page.Entries); n == 0 || uint64(n) >= head || !page.More || page.Next != page.Entries[n-1].Seq+1 {
		t.Fatalf("page of %d entries of %d, more %v, next %d: want a short page, more, next after its last", n, head, page.More, page.Next)
	}
	var seqs []uint64
	payloads := 0
	c := &httpapi.Client{BaseURL: f.srv.URL, Credential: f.a.token}
	err = c.ScanViews(context.Background(), 0, func(v kernel.EntryView) error {
		seqs = append(seqs, v.Seq)
		if v.Payload != nil {
			payloads++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		if s != uint64(i) {
			t.Fatalf("paging read seqs %v, want 0..%d once each", seqs, head-1)
		}
	}
	if uint64(len(seqs)) != head || payloads < calls {
		t.Fatalf("paging read %d entries (%d payloads), want %d (at least %d payloads)", len(seqs), payloads, head, calls)
	}
}
