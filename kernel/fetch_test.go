package kernel

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/txn"
)

type fetchResult struct {
	Status    int               `json:"status"`
	Headers   map[string]string `json:"headers"`
	Body      string            `json:"body"`
	Truncated bool              `json:"truncated"`
	FinalURL  string            `json:"final_url"`
	Redirects []string          `json:"redirects"`
	NetBytes  int64             `json:"net_bytes"`
}

func TestFetch(t *testing.T) {
	h := newExecHarness(t, func(c *Config) { c.FetchMaxBytes = 1000 })
	var posts atomic.Int32
	var other *httptest.Server
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hello":
			fmt.Fprint(w, "hello")
		case "/big":
			w.Write([]byte(strings.Repeat("x", 5000)))
		case "/to-denied":
			http.Redirect(w, r, strings.Replace(other.URL, "127.0.0.1", "denied.test", 1)+"/hello", http.StatusFound)
		case "/to-allowed":
			http.Redirect(w, r, strings.Replace(other.URL, "127.0.0.1", "allowed.test", 1)+"/hello", http.StatusFound)
		case "/to-metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		case "/post":
			b, _ := io.ReadAll(r.Body)
			posts.Add(1)
			fmt.Fprintf(w, "%s %s", r.Method, b)
		}
	}))
	defer srv.Close()
	other = httptest.NewServer(srv.Config.Handler)
	defer other.Close()
	port := func(s *httptest.Server) string { return s.URL[strings.LastIndexByte(s.URL, ':')+1:] }
	loop := "http://127.0.0.1:" + port(srv)

	tests := []struct {
		name    string
		net     []string
		args    map[string]any
		key     string
		class   string
		body    string
		trunc   bool
		budgets map[string]int64
	}{
		{"GET an explicitly named loopback address", []string{"127.0.0.1"}, map[string]any{"url": loop + "/hello"}, "", "", "hello", false, nil},
		{"HEAD is a read", []string{"127.0.0.1"}, map[string]any{"url": loop + "/hello", "method": "HEAD"}, "", "", "", false, nil},
		{"host outside the patterns", []string{"example.com"}, map[string]any{"url": loop + "/hello"}, "", ErrScopeDenied, "", false, nil},
		{"DNS name to loopback under *", []string{"*"}, map[string]any{"url": "http://evil.test:" + port(srv) + "/hello"}, "", ErrScopeDenied, "", false, nil},
		{"localhost under *", []string{"*"}, map[string]any{"url": "http://localhost:" + port(srv) + "/hello"}, "", ErrScopeDenied, "", false, nil},
		{"loopback literal under *", []string{"*"}, map[string]any{"url": loop + "/hello"}, "", ErrScopeDenied, "", false, nil},
		{"wildcard does not name loopback", []string{"*.test"}, map[string]any{"url": "http://evil.test:" + port(srv) + "/hello"}, "", ErrScopeDenied, "", false, nil},
		{"exact name that resolves to loopback", []string{"allowed.test"}, map[string]any{"url": "http://allowed.test:" + port(srv) + "/hello"}, "", "", "hello", false, nil},
		{"redirect to a disallowed host", []string{"127.0.0.1", "allowed.test"}, map[string]any{"url": loop + "/to-denied"}, "", ErrScopeDenied, "", false, nil},
		{"redirect to an allowed host", []string{"127.0.0.1", "allowed.test"}, map[string]any{"url": loop + "/to-allowed"}, "", "", "hello", false, nil},
		{"redirect to metadata under *", []string{"127.0.0.1", "*"}, map[string]any{"url": loop + "/to-metadata"}, "", ErrScopeDenied, "", false, nil},
		{"response capped", []string{"127.0.0.1"}, map[string]any{"url": loop + "/big"}, "", "", strings.Repeat("x", 1000), true, nil},
		{"max_bytes lowers the cap", []string{"127.0.0.1"}, map[string]any{"url": loop + "/big", "max_bytes": 10}, "", "", strings.Repeat("x", 10), true, nil},
		{"net_bytes budget", []string{"127.0.0.1"}, map[string]any{"url": loop + "/big"}, "", ErrBudgetExceeded, "", false, map[string]int64{"net_bytes": 100}},
		{"POST needs a key", []string{"127.0.0.1"}, map[string]any{"url": loop + "/post", "method": "POST", "body": "b"}, "", ErrIdempotencyKeyRequired, "", false, nil},
		{"POST", []string{"127.0.0.1"}, map[string]any{"url": loop + "/post", "method": "POST", "body": "b"}, "p1", "", "POST b", false, nil},
		{"file scheme", []string{"*"}, map[string]any{"url": "file:///etc/passwd"}, "", ErrInvalidArgs, "", false, nil},
	}
	// Why some refusals happen: the SSRF guard on the dialed address, or
	// the patterns.
	const ssrf = "loopback, private, link-local, metadata"
	reasons := map[string]string{
		"DNS name to loopback under *": ssrf, "localhost under *": ssrf, "loopback literal under *": ssrf,
		"wildcard does not name loopback": ssrf, "redirect to metadata under *": ssrf,
		"redirect to a disallowed host": "outside the capability token's net patterns",
		"host outside the patterns":     "outside the capability token's net patterns",
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: tc.net, Budgets: tc.budgets})
			var mods []func(*Envelope)
			if tc.key != "" {
				mods = append(mods, key(fmt.Sprint(tc.key, i)))
			}
			before := h.headSize()
			r := h.invoke("net.fetch", tc.args, mods...)
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if a := h.audits(before); len(a) != 1 {
				t.Fatalf("%d audit records", len(a))
			}
			if want, ok := reasons[tc.name]; ok && !strings.Contains(r.Error.Message, want) {
				t.Fatalf("message %q does not say %q", r.Error.Message, want)
			}
			if limit, ok := tc.budgets[txn.BudgetNetBytes]; ok {
				// The bytes went over the wire: they are charged even
				// though the call was refused for them.
				var left txn.Usage
				h.k.View(func(tx *bbolt.Tx) (err error) {
					left, err = txn.Remaining(tx, []txn.Account{{TokenID: h.jti, Limits: txn.Usage{txn.BudgetNetBytes: limit}}})
					return err
				})
				if left[txn.BudgetNetBytes] != 0 {
					t.Fatalf("%d of %d net_bytes left after an over-budget fetch", left[txn.BudgetNetBytes], limit)
				}
			}
			if tc.class != "" {
				return
			}
			var f fetchResult
			if err := json.Unmarshal(r.Result, &f); err != nil {
				t.Fatal(err)
			}
			if f.Status != 200 || f.Body != tc.body || f.Truncated != tc.trunc || f.NetBytes == 0 {
				t.Fatalf("%+v", f)
			}
		})
	}
	// A replayed POST is not sent again.
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: []string{"127.0.0.1"}})
	args := map[string]any{"url": loop + "/post", "method": "PUT", "body": "once"}
	n := posts.Load()
	first := h.invoke("net.fetch", args, key("put"))
	again := h.invoke("net.fetch", args, key("put"))
	mustOK(t, first)
	if !again.Replayed || posts.Load() != n+1 || first.TxOutcome != Committed {
		t.Fatalf("PUT sent %d times; replay %+v", posts.Load()-n, again)
	}
	// GET is READ and POST NETWORK in the policy input.
	a := h.audits(0)
	var trail struct {
		Hops []struct {
			Host   string
			Status int
		}
		Bytes int64
	}
	if err := json.Unmarshal(a[len(a)-2].Notes["net_connections"], &trail); err != nil || len(trail.Hops) != 1 ||
		trail.Hops[0].Host != "127.0.0.1" || trail.Hops[0].Status != 200 || trail.Bytes == 0 {
		t.Fatalf("net_connections %s: %v", a[len(a)-2].Notes["net_connections"], err)
	}
	if a[len(a)-2].PolicyInput.SideEffect != "NETWORK" {
		t.Fatalf("PUT decided as %s", a[len(a)-2].PolicyInput.SideEffect)
	}
	var sawNet bool
	for _, r := range a[len(a)-2].PolicyInput.Resources {
		sawNet = sawNet || r.Kind == "net" && r.Host == "127.0.0.1"
	}
	if !sawNet {
		t.Fatalf("no net resource in the policy input: %+v", a[len(a)-2].PolicyInput.Resources)
	}
}

// The default policy soft-gates NETWORK and EXECUTE calls (they wait for
// an approver), and GET is a read.
func TestFetchDefaultPolicy(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 200 * time.Millisecond })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer srv.Close()
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, Net: []string{"127.0.0.1"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	mustOK(t, h.invoke("net.fetch", map[string]any{"url": srv.URL}))
	if r := h.invoke("net.fetch", map[string]any{"url": srv.URL, "method": "DELETE"}, key("d")); errClass(r) != ErrApprovalTimeout {
		t.Fatalf("unapproved DELETE under the default policy: %+v", r.Error)
	}
	a, res := h.gated("proc.exec", execArgs("true"), key("x"))
	if a.SideEffect != "EXECUTE" || len(a.ProjectedEffects) == 0 {
		t.Fatalf("approval request for proc.exec: %+v", a)
	}
	if _, err := h.k.Decide(a.ID, h.approver("alice", captoken.RoleApprover), "allow", "ok"); err != nil {
		t.Fatal(err)
	}
	mustOK(t, <-res)
}

// A call whose token has spent its budget is refused before it runs: a
// GET sends nothing once the calls budget is gone (it used to go out, its
// record refusing it only afterwards, so a spent token could still send
// data to an allowed host in its URLs), nor once net_bytes is (the first
// request may overdraw it: its size is known only once sent). Each
// refusal is audited.
func TestSpentBudgetSendsNothing(t *testing.T) {
	h := newExecHarness(t)
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		budget string
		limit  int64
		sent   int32 // requests the budget lets out
		ok     int   // calls answered ok
	}{
		{txn.BudgetCalls, 2, 2, 2},
		{txn.BudgetNetBytes, 50, 1, 0},
	} {
		t.Run(tc.budget, func(t *testing.T) {
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: []string{"127.0.0.1"}, Budgets: map[string]int64{tc.budget: tc.limit}})
			gets.Store(0)
			for i := range 5 {
				before := h.headSize()
				r := h.invoke("net.fetch", map[string]any{"url": fmt.Sprintf("%s/chunk-%d", srv.URL, i)})
				want := ""
				if i >= tc.ok {
					want = ErrBudgetExceeded
				}
				if errClass(r) != want {
					t.Fatalf("call %d: class %q (%+v), want %q", i, errClass(r), r.Error, want)
				}
				if a := h.audits(before); len(a) != 1 {
					t.Fatalf("call %d: %d audit records", i, len(a))
				}
			}
			if n := gets.Load(); n != tc.sent {
				t.Fatalf("the server saw %d requests, want %d", n, tc.sent)
			}
		})
	}
}

// TestSentRequestSettlesItsKey: a mutating request that was sent has had
// its effect, whatever ends the call then: a commit refused (net_bytes
// the request spent past the limit, a ledger:head precondition another
// call moved while it ran) or a redirect refused after the first hop.
// The call ends outcome_unknown and rolled back, the refusal in its
// message, and its idempotency key keeps that outcome: a repeat is
// answered with it and sends nothing (it used to free the key, and the
// repeat sent the request again), and replay verify counts the key as
// settled.
func TestSentRequestSettlesItsKey(t *testing.T) {
	h := newExecHarness(t)
	var posts atomic.Int32
	var held atomic.Pointer[chan struct{}] // /slow answers once it is closed
	var denied string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		switch r.URL.Path {
		case "/slow":
			<-*held.Load()
		case "/redirect":
			http.Redirect(w, r, denied, http.StatusTemporaryRedirect)
			return
		}
		fmt.Fprint(w, strings.Repeat("x", 200))
	}))
	defer srv.Close()
	denied = strings.Replace(srv.URL, "127.0.0.1", "denied.test", 1) + "/x"
	for _, tc := range []struct {
		name    string
		path    string
		budgets map[string]int64
		during  func() // while the request is held
		class   string
		mods    []func(*Envelope)
	}{
		{name: "net_bytes overdrawn", path: "/post", budgets: map[string]int64{txn.BudgetNetBytes: 100}, class: ErrBudgetExceeded},
		{name: "precondition moved", path: "/slow", class: ErrPreconditionFailed,
			during: func() { mustOK(t, h.invoke("echo", map[string]any{"text": "moves the head"})) },
			mods: []func(*Envelope){func(e *Envelope) {
				e.PreconditionRefs = []txn.Precondition{mustPre(fmt.Sprintf(`{"ref":"ledger:head","seq":%d}`, h.headSize()-1))}
			}}},
		{name: "redirect refused after the first hop", path: "/redirect", class: "was sent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*", "echo"}, Net: []string{"127.0.0.1"}, Budgets: tc.budgets})
			posts.Store(0)
			release := make(chan struct{})
			held.Store(&release)
			args := map[string]any{"url": srv.URL + tc.path, "method": "POST", "body": "pay"}
			mods := append([]func(*Envelope){key("settle-" + tc.name)}, tc.mods...)
			res := make(chan *Result, 1)
			go func() { res <- h.invoke("net.fetch", args, mods...) }()
			if tc.during != nil {
				for posts.Load() == 0 {
					time.Sleep(time.Millisecond)
				}
				tc.during()
			}
			close(release)
			first := <-res
			if errClass(first) != ErrOutcomeUnknown || first.TxOutcome != RolledBack || !strings.Contains(first.Error.Message, tc.class) {
				t.Fatalf("first: class %q, outcome %q (%+v); want outcome_unknown, rolled back, saying %s", errClass(first), first.TxOutcome, first.Error, tc.class)
			}
			again := h.invoke("net.fetch", args, mods...)
			if !again.Replayed || errClass(again) != ErrOutcomeUnknown || again.OperationID != first.OperationID {
				t.Fatalf("repeat: %+v, want the first outcome replayed", again)
			}
			if n := posts.Load(); n != 1 {
				t.Fatalf("the server saw %d POSTs under one key, want 1", n)
			}
			if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) > 0 {
				t.Fatalf("replay verify: %v %+v", err, rep)
			}
		})
	}
}
