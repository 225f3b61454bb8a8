package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/txn"
)

// netUsed returns the net_bytes charged to token jti.
func netUsed(t *testing.T, h *harness, jti string) int64 {
	t.Helper()
	const big = 1 << 40
	var left txn.Usage
	if err := h.k.View(func(tx *bbolt.Tx) error {
		var err error
		left, err = txn.Remaining(tx, []txn.Account{{TokenID: jti, Limits: txn.Usage{txn.BudgetNetBytes: big}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return big - left[txn.BudgetNetBytes]
}

// TestNetBytesHoldUnderConcurrency: 20 net.fetch calls at once under a
// net_bytes limit of 600, by one token or by two children sharing their
// parent's limit, spend it as the same calls one after another would:
// every call but the one that spends the rest is sent only while
// something is left, so the budget is overdrawn by at most that one
// call's bytes (its commit refused: a POST ends outcome_unknown, its key
// settled; a GET's body is withheld), and the calls after it are refused
// budget_exceeded before anything is sent. Found by review: prepare
// reserved only the call, each call read what was left for itself, and
// all 20 POSTs went out, 5540 bytes charged.
func TestNetBytesHoldUnderConcurrency(t *testing.T) {
	const limit, n = 600, 20
	for _, tc := range []struct {
		name     string
		children bool
		method   string // POST calls carry a key; GET ones none (prepared all the same: they reach a host)
		overdraw string // the class of the call that spends the rest
	}{
		{"one token, keyed POSTs", false, "POST", ErrOutcomeUnknown},
		{"two children of the limited parent, keyed POSTs", true, "POST", ErrOutcomeUnknown},
		{"one token, GETs without a key", false, "GET", ErrBudgetExceeded},
		{"two children of the limited parent, GETs without a key", true, "GET", ErrBudgetExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newExecHarness(t)
			var received atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				received.Add(1)
				fmt.Fprint(w, "ok")
			}))
			defer srv.Close()
			parent, pjti := h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: []string{"127.0.0.1"},
				Budgets: map[string]int64{txn.BudgetNetBytes: limit}})
			callers := []func(*Envelope){func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = parent, pjti }}
			if tc.children {
				callers = []func(*Envelope){as(h.attenuate(AttenuateRequest{Parent: parent})), as(h.attenuate(AttenuateRequest{Parent: parent}))}
			}
			var sent atomic.Int64 // net_bytes the ok calls report
			classes := outcomes(n, func(i int) *Result {
				mods := []func(*Envelope){callers[i%len(callers)]}
				args := map[string]any{"url": srv.URL + "/", "method": tc.method}
				if tc.method == "POST" {
					args["body"] = "x"
					mods = append(mods, key(fmt.Sprint("p", i)))
				}
				r := h.invoke("net.fetch", args, mods...)
				if r.Status == StatusOK {
					var out fetchResult
					if err := json.Unmarshal(r.Result, &out); err != nil {
						t.Errorf("result %s: %v", r.Result, err)
					}
					sent.Add(out.NetBytes)
				}
				return r
			})
			used, got, ok := netUsed(t, h, pjti), int64(received.Load()), int64(classes[""])
			t.Logf("outcomes %v, %d requests received, %d of %d net_bytes charged", classes, got, used, limit)
			// What the committed calls spent is within the limit; one call
			// more may have been sent (it spent the rest), and it spent no
			// more than one call does (under 400 bytes here: request and
			// response headers, a body of 1 and one of 2).
			overdraw, unknown := got-ok, int64(0)
			if tc.overdraw == ErrOutcomeUnknown {
				unknown = overdraw
			}
			if ok == 0 || sent.Load() > limit || overdraw > 1 || used-sent.Load() >= 400 ||
				classes[""]+classes[ErrBudgetExceeded]+classes[ErrOutcomeUnknown] != n ||
				int64(classes[ErrOutcomeUnknown]) != unknown {
				t.Fatalf("outcomes %v: %d requests went out, %d net_bytes charged under a limit of %d, %d of them by the ok calls; "+
					"at most one call may overdraw it, and none may be sent once it is spent", classes, got, used, limit, sent.Load())
			}
		})
	}
}

// TestNetBytesHoldForExecAllowlist: two children sharing their parent's
// net_bytes limit each run a command under the allowlist posture, in
// roots of their own (so that no path lock orders them), at once: the
// proxies together relay no more than the limit. Each proxy was given
// what was left when its command started, the whole limit for both, and
// together they relayed past it.
func TestNetBytesHoldForExecAllowlist(t *testing.T) {
	const limit = 600
	h := newExecHarness(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Repeat("x", 200))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	roots := []string{filepath.Join(h.ws, "a"), filepath.Join(h.ws, "b")}
	for _, r := range roots {
		if err := os.Mkdir(r, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	parent, pjti := h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, Net: []string{"allowed.test"},
		FS:      []captoken.FSRoot{{Path: roots[0], Mode: "rw"}, {Path: roots[1], Mode: "rw"}},
		Budgets: map[string]int64{txn.BudgetNetBytes: limit}})
	kids := []*MintedToken{
		h.attenuate(AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: roots[0], Mode: "rw"}}}),
		h.attenuate(AttenuateRequest{Parent: parent, FS: []captoken.FSRoot{{Path: roots[1], Mode: "rw"}}}),
	}
	// One request and response take about 400 bytes: one fits, two do
	// not.
	classes := outcomes(2, func(i int) *Result {
		args := with(execArgs("curl", "-sS", "--max-time", "10", "http://allowed.test:"+port+"/"), "network", "allowlist")
		return h.invoke("proc.exec", args, key(fmt.Sprint("x", i)), as(kids[i]))
	})
	used := netUsed(t, h, pjti)
	t.Logf("outcomes %v, %d of %d net_bytes charged", classes, used, limit)
	if used > limit || classes[""] != 1 {
		t.Fatalf("outcomes %v, %d net_bytes charged: want one command through and the other cut at the limit of %d", classes, used, limit)
	}
}

// TestNetBytesTurnCancelled: a call waiting for its turn of a net_bytes
// budget (another call of the token is running) can be cancelled: it is
// answered cancelled, nothing of it ran, and the running call is
// unaffected.
func TestNetBytesTurnCancelled(t *testing.T) {
	h := newExecHarness(t)
	entered, unblock := make(chan struct{}, 4), make(chan struct{})
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		entered <- struct{}{}
		<-unblock
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	defer close(unblock)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: []string{"127.0.0.1"},
		Budgets: map[string]int64{txn.BudgetNetBytes: 1 << 20}})
	first := make(chan *Result, 1)
	go func() { first <- h.invoke("net.fetch", map[string]any{"url": srv.URL + "/"}) }()
	<-entered // the GET holds the turn, its request at the server
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan *Result, 1)
	go func() {
		second <- h.k.Invoke(ctx, h.env("net.fetch", map[string]any{"url": srv.URL + "/", "method": "POST", "body": "x"}, key("p")))
	}()
	waitFor(t, "the POST to wait for its turn", func() bool {
		h.k.netTurns.mu.Lock()
		defer h.k.netTurns.mu.Unlock()
		return h.k.netTurns.turn[h.jti] != nil && h.k.netTurns.turn[h.jti].holders == 2
	})
	cancel()
	r := <-second
	if errClass(r) != ErrCancelled || r.TxOutcome != NoOp || posts.Load() != 0 {
		t.Fatalf("the cancelled POST: %s %s %+v, %d POSTs received", errClass(r), r.TxOutcome, r.Error, posts.Load())
	}
	unblock <- struct{}{}
	mustOK(t, <-first)
	// The key is free: the POST was refused before it was prepared.
	go func() { <-entered; unblock <- struct{}{} }()
	mustOK(t, h.invoke("net.fetch", map[string]any{"url": srv.URL + "/", "method": "POST", "body": "x"}, key("p")))
	h.k.netTurns.mu.Lock()
	defer h.k.netTurns.mu.Unlock()
	if len(h.k.netTurns.turn) != 0 {
		t.Fatalf("turns left behind: %v", h.k.netTurns.turn)
	}
}

// TestNetCallsWithoutNetLimitRunTogether: calls of tokens whose chain
// limits no net_bytes take no turns: two GETs of such a token (one with
// other limits) are at the server at the same time.
func TestNetCallsWithoutNetLimitRunTogether(t *testing.T) {
	for _, budgets := range []map[string]int64{nil, {txn.BudgetCalls: 100, txn.BudgetCPUMillis: 100}} {
		t.Run(fmt.Sprint(budgets), func(t *testing.T) {
			h := newExecHarness(t)
			var inside, together atomic.Int32
			both := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if inside.Add(1) == 2 {
					close(both)
				}
				// Each request waits for the other, or gives up.
				select {
				case <-both:
					together.Add(1)
				case <-time.After(10 * time.Second):
				}
				fmt.Fprint(w, "ok")
			}))
			defer srv.Close()
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"net.*"}, Net: []string{"127.0.0.1"}, Budgets: budgets})
			outcomes(2, func(i int) *Result { return h.invoke("net.fetch", map[string]any{"url": srv.URL + "/"}) })
			if together.Load() != 2 {
				t.Fatal("the two GETs were not at the server together")
			}
		})
	}
}
