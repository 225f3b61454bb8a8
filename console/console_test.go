package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

func TestLogin(t *testing.T) {
	w := newWorld(t)
	tests := []struct {
		name   string
		cred   string
		status int
		role   string
	}{
		{"admin", w.admin, 200, RoleAdmin},
		{"approver", w.alice.Token, 200, RoleApprover},
		{"escalation approver", w.carol.Token, 200, RoleEscalation},
		{"auditor", w.dave.Token, 200, RoleAuditor},
		{"agent token", w.agent.Token, 403, ""},
		{"wrong admin credential", kernel.AdminPrefix + "nope", 401, ""},
		{"garbage", "not-a-token", 401, ""},
		{"empty", "", 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := w.client()
			if got := c.login(tt.cred); got != tt.status {
				t.Fatalf("login status %d, want %d", got, tt.status)
			}
			status, out := c.do("GET", "/console/api/session", nil)
			if tt.status != 200 {
				if status != 401 {
					t.Fatalf("session after a refused login: %d", status)
				}
				return
			}
			if status != 200 || out["role"] != tt.role {
				t.Fatalf("session: %d %v, want role %s", status, out, tt.role)
			}
			if want := tt.role == RoleApprover || tt.role == RoleEscalation; out["can_decide"] != want {
				t.Fatalf("session: can_decide %v, want %v", out["can_decide"], want)
			}
			if want := tt.role == RoleAdmin || tt.role == RoleAuditor; out["reads_all"] != want {
				t.Fatalf("session: reads_all %v, want %v", out["reads_all"], want)
			}
			if want := tt.role == RoleAdmin; out["can_revoke"] != want {
				t.Fatalf("session: can_revoke %v, want %v", out["can_revoke"], want)
			}
		})
	}
}

// TestSessionNeedsKeyAndCookie: a session is its key, given once in the
// sign-in's answer and sent in X-Console-Key, together with the cookie
// binding it to the browser. Neither alone opens it: cookies are not
// scoped by port, so a server on another port of the console's host gets
// the cookie (TestBrowserCookieOfAnotherPort), and GET
// /console/api/session never gives the key out.
func TestSessionNeedsKeyAndCookie(t *testing.T) {
	w := newWorld(t)
	c := w.client()
	req, _ := http.NewRequest("POST", w.srv.URL+"/console/api/login", strings.NewReader(`{"credential":"`+w.alice.Token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", w.srv.URL)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ck := resp.Cookies()
	if len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || ck[0].Path != Prefix || ck[0].Secure || !ck[0].Expires.IsZero() || ck[0].MaxAge != 0 {
		t.Fatalf("cookie %+v: want a browser session cookie, HttpOnly, SameSite=Strict, Path=%s, not Secure over plain HTTP", ck, Prefix)
	}
	if strings.Contains(string(body), w.alice.Token) || strings.Contains(ck[0].Value, w.alice.Token) {
		t.Fatal("the credential came back to the browser")
	}
	var login SessionInfo
	if err := json.Unmarshal(body, &login); err != nil || len(login.Key) != 43 || login.Key == ck[0].Value {
		t.Fatalf("sign-in answer %s: want a key of its own (%v)", body, err)
	}
	cookie := ck[0].Name + "=" + ck[0].Value
	get := func(header map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", w.srv.URL+"/console/api/session", nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name   string
		header map[string]string
		status int
	}{
		{"cookie alone", map[string]string{"Cookie": cookie}, 401},
		{"key alone", map[string]string{keyHeader: login.Key}, 401},
		{"key with another cookie", map[string]string{keyHeader: login.Key, "Cookie": cookieName + "=" + login.Key}, 401},
		{"cookie as the key", map[string]string{keyHeader: ck[0].Value, "Cookie": cookie}, 401},
		{"key and cookie", map[string]string{keyHeader: login.Key, "Cookie": cookie}, 200},
		{"key and cookie behind a planted one", map[string]string{keyHeader: login.Key, "Cookie": cookieName + "=planted; " + cookie}, 200},
	}
	for _, tt := range tests {
		status, b := get(tt.header)
		if status != tt.status {
			t.Errorf("%s: %d %s, want %d", tt.name, status, b, tt.status)
		}
		if strings.Contains(b, login.Key) || strings.Contains(b, `"key"`) {
			t.Errorf("%s: the answer gives the key out: %s", tt.name, b)
		}
	}

	// Another tab of the same browser signs in on its own (its own key)
	// under the same cookie, so the first tab stays signed in; signing
	// out ends only that tab's session.
	c.key = login.Key
	tab := &client{w: w, origin: w.srv.URL}
	tab.hc = &http.Client{Jar: c.hc.Jar, Transport: keyTransport{tab}}
	if tab.login(w.dave.Token) != 200 {
		t.Fatal("second tab: login")
	}
	if st, out := c.do("GET", "/console/api/session", nil); st != 200 || out["role"] != RoleApprover {
		t.Fatalf("first tab after the second signed in: %d %v", st, out)
	}
	if st, _ := tab.do("POST", "/console/api/logout", map[string]any{}); st != 200 {
		t.Fatalf("logout: %d", st)
	}
	if st, _ := tab.do("GET", "/console/api/session", nil); st != 401 {
		t.Fatalf("a signed-out key still works: %d", st)
	}
	if st, _ := c.do("GET", "/console/api/session", nil); st != 200 {
		t.Fatalf("the other tab's sign-out signed this one out: %d", st)
	}
}

// TestPlantedCookieIsNotAdopted: a cookie a page on another port of the
// host set before the operator signs in is not the session's binding
// (its planter would hold the cookie of the session to come).
func TestPlantedCookieIsNotAdopted(t *testing.T) {
	w := newWorld(t)
	planted := randomID()
	req, _ := http.NewRequest("POST", w.srv.URL+"/console/api/login", strings.NewReader(`{"credential":"`+w.alice.Token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", w.srv.URL)
	req.Header.Set("Cookie", cookieName+"="+planted)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ck := resp.Cookies(); resp.StatusCode != 200 || len(ck) != 1 || ck[0].Value == planted {
		t.Fatalf("sign-in with a planted cookie: %d, cookies %+v: want a new binding", resp.StatusCode, ck)
	}
}

// TestStateChangingRequestsAreGuarded: a decision without the session's
// key, from another origin, or not as JSON, is refused and decides
// nothing.
func TestStateChangingRequestsAreGuarded(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, "k1")
	c := w.client()
	if c.login(w.alice.Token) != 200 {
		t.Fatal("login")
	}
	// The browser's cookies, without the page's key unless a case sends it.
	plain := &http.Client{Jar: c.hc.Jar}
	path := w.srv.URL + "/console/api/approvals/" + a.ID
	body := `{"decision":"allow","reason":"ok"}`
	tests := []struct {
		name    string
		header  map[string]string
		status  int
		message string
	}{
		{"no key", map[string]string{"Origin": w.srv.URL, "Content-Type": "application/json"}, 401, keyHeader},
		{"wrong key", map[string]string{"Origin": w.srv.URL, "Content-Type": "application/json", keyHeader: "x" + c.key}, 401, "sign in again"},
		{"foreign origin", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json", keyHeader: c.key}, 403, "cross-origin"},
		{"no origin", map[string]string{"Content-Type": "application/json", keyHeader: c.key}, 403, "cross-origin"},
		{"form post", map[string]string{"Origin": w.srv.URL, "Content-Type": "application/x-www-form-urlencoded", keyHeader: c.key}, 415, "application/json"},
		{"text/plain", map[string]string{"Origin": w.srv.URL, "Content-Type": "text/plain", keyHeader: c.key}, 415, "application/json"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest("POST", path, strings.NewReader(body))
		for k, v := range tt.header {
			req.Header.Set(k, v)
		}
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.message) {
			t.Errorf("%s: %d %s, want %d mentioning %q", tt.name, resp.StatusCode, b, tt.status, tt.message)
		}
	}
	if st, _ := w.k.Operation(op); st.State != kernel.OpAwaitingApproval {
		t.Fatalf("after refused decisions the call is %s, want still awaiting approval", st.State)
	}
	if status, out := c.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow", Reason: "looks right"}); status != 200 || out["state"] != kernel.ApprovalAllowed {
		t.Fatalf("a proper decision: %d %v", status, out)
	}
	r, err := w.k.Wait(context.Background(), op)
	if err != nil || r.Status != kernel.StatusOK || r.TxOutcome != kernel.Committed {
		t.Fatalf("the approved call: %+v %v", r, err)
	}
}

// TestFirstDecisionWins: two approvers decide one request at once; one
// wins, the other gets 409 with the winning decision.
func TestFirstDecisionWins(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "raced\n"}, "k1")
	alice, bob := w.client(), w.client()
	alice.login(w.alice.Token)
	bob.login(w.bob.Token)
	type answer struct {
		status int
		out    map[string]any
	}
	var got [2]answer
	var wg sync.WaitGroup
	for i, c := range []*client{alice, bob} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := []string{"allow", "deny"}[i]
			s, out := c.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: d, Reason: "race"})
			got[i] = answer{s, out}
		}()
	}
	wg.Wait()
	var winner, loser answer
	switch {
	case got[0].status == 200 && got[1].status == 409:
		winner, loser = got[0], got[1]
	case got[1].status == 200 && got[0].status == 409:
		winner, loser = got[1], got[0]
	default:
		t.Fatalf("want one 200 and one 409, got %d and %d", got[0].status, got[1].status)
	}
	seen := loser.out["approval"].(map[string]any)
	if seen["state"] != winner.out["state"] || seen["decided_by"] != winner.out["decided_by"] {
		t.Fatalf("the loser saw %v, the winner decided %v", seen, winner.out)
	}
	r, _ := w.k.Wait(context.Background(), op)
	if (winner.out["state"] == kernel.ApprovalAllowed) != (r.Status == kernel.StatusOK) {
		t.Fatalf("decision %v, call result %+v", winner.out["state"], r)
	}
}

func TestEscalatedOnlyForEscalationApprovers(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.escalated, "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, "k1")
	alice, carol, admin := w.client(), w.client(), w.client()
	alice.login(w.alice.Token)
	carol.login(w.carol.Token)
	admin.login(w.admin)
	count := func(c *client) int {
		_, out := c.do("GET", "/console/api/approvals", nil)
		return len(out["approvals"].([]any))
	}
	if n := count(alice); n != 0 {
		t.Errorf("an approver without the escalation role sees %d escalated requests", n)
	}
	if s, _ := alice.do("GET", "/console/api/approvals/"+a.ID, nil); s != 404 {
		t.Errorf("an approver reads an escalated request's detail: %d", s)
	}
	if s, _ := alice.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow"}); s != 403 {
		t.Errorf("an approver decides an escalated request: %d", s)
	}
	if count(carol) != 1 || count(admin) != 1 {
		t.Errorf("escalation approver sees %d, admin %d; want 1 each", count(carol), count(admin))
	}
	if s, _ := admin.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow"}); s != 403 {
		t.Errorf("the admin credential decides: %d", s)
	}
	if s, out := carol.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "deny", Reason: "no"}); s != 200 {
		t.Fatalf("escalation approver: %d %v", s, out)
	}
	if r, _ := w.k.Wait(context.Background(), op); r.Error == nil || r.Error.Class != kernel.ErrApprovalDenied {
		t.Fatalf("denied escalated call: %+v", r)
	}
}

func TestApprovalDetailShowsCurrentFile(t *testing.T) {
	w := newWorld(t)
	_, a := w.gated(w.agent, "fs.patch", map[string]any{"path": "notes.txt", "old": "draft", "new": "final"}, "k1")
	c := w.client()
	c.login(w.bob.Token)
	s, out := c.do("GET", "/console/api/approvals/"+a.ID, nil)
	if s != 200 {
		t.Fatalf("detail: %d %v", s, out)
	}
	args := out["args"].(map[string]any)
	files := out["files"].([]any)
	if args["new"] != "final" || len(files) != 1 {
		t.Fatalf("detail args %v files %v", args, files)
	}
	f := files[0].(map[string]any)
	if f["path"] != "notes.txt" || f["content"] != "status: draft\nowner: ops\n" || f["exists"] != true {
		t.Fatalf("file state %v", f)
	}
}

func TestTokensAreAdminOnly(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "n2.txt", "content": "x"}, "k1")
	alice, admin := w.client(), w.client()
	alice.login(w.alice.Token)
	admin.login(w.admin)
	alice.do("POST", "/console/api/approvals/"+a.ID, DecisionRequest{Decision: "allow"})
	w.k.Wait(context.Background(), op)
	if s, _ := alice.do("GET", "/console/api/tokens", nil); s != 403 {
		t.Errorf("an approver lists tokens: %d", s)
	}
	if s, _ := alice.do("POST", "/console/api/tokens/"+w.agent.ID+"/revoke", RevokeRequest{Reason: "x"}); s != 403 {
		t.Errorf("an approver revokes: %d", s)
	}
	s, out := admin.do("GET", "/console/api/tokens", nil)
	if s != 200 {
		t.Fatalf("tokens: %d", s)
	}
	var found map[string]any
	for _, x := range out["tokens"].([]any) {
		if x.(map[string]any)["jti"] == w.agent.ID {
			found = x.(map[string]any)
		}
	}
	if found == nil || found["used"].(map[string]any)["calls"] != float64(1) || found["left"].(map[string]any)["calls"] != float64(49) {
		t.Fatalf("agent token with 1 of 50 calls used: %v", found)
	}
	if s, _ := admin.do("POST", "/console/api/tokens/"+w.agent.ID+"/revoke", RevokeRequest{}); s != 400 {
		t.Errorf("revoke without a reason: %d", s)
	}
	if s, _ := admin.do("POST", "/console/api/tokens/"+w.agent.ID+"/revoke", RevokeRequest{Reason: "leaked"}); s != 200 {
		t.Fatalf("revoke: %d", s)
	}
	if _, err := w.k.VerifyBearer(w.agent.Token); err == nil {
		t.Fatal("the revoked token still verifies")
	}
}

// TestPageLoadsNothingFromElsewhere: the page has no inline script or
// style and names no other origin; every response carries the CSP.
func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	w := newWorld(t)
	for _, p := range []string{"/console/", "/console/app.js", "/console/style.css"} {
		resp, err := http.Get(w.srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") != ContentSecurityPolicy {
			t.Fatalf("%s: %d, CSP %q", p, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
		if p != "/console/" {
			continue
		}
		page := string(b)
		for _, bad := range []*regexp.Regexp{
			regexp.MustCompile(`<script(?:\s+type="module")?>`),   // inline script
			regexp.MustCompile(`(?i)(src|href)="(https?:)?//`),    // another origin
			regexp.MustCompile(`(?i)\sstyle=|<style|\son[a-z]+=`), // inline style or handler
		} {
			if m := bad.FindString(page); m != "" {
				t.Errorf("index.html has %q", m)
			}
		}
	}
}

// TestAssetsMatchSources guards against editing console/assets by hand:
// the copied files must equal their sources (make console-check also
// rebuilds app.js).
func TestAssetsMatchSources(t *testing.T) {
	for _, f := range []string{"index.html", "style.css"} {
		src, err := os.ReadFile(filepath.Join("web", f))
		if err != nil {
			t.Fatal(err)
		}
		built, err := assets.ReadFile("assets/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if string(src) != string(built) {
			t.Errorf("assets/%s differs from web/%s: run make console", f, f)
		}
	}
}

// TestBodiesAreStrict: every console body is read by the strictjson rules
// of POST /v1/approvals (docs/http.md "Strict JSON"): a duplicate or
// case-variant member, an unknown one or a second value is refused with
// 400 and changes nothing. Plain encoding/json took the last of
// {"decision":"deny","Decision":"allow"} and allowed the call.
func TestBodiesAreStrict(t *testing.T) {
	w := newWorld(t)
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "notes.txt", "content": "x"}, "k-strict")
	approver, admin, fresh := w.client(), w.client(), w.client()
	if approver.login(w.alice.Token) != 200 || admin.login(w.admin) != 200 {
		t.Fatal("login")
	}
	decide := "/console/api/approvals/" + a.ID
	revoke := "/console/api/tokens/" + w.bob.ID + "/revoke"
	tests := []struct {
		name    string
		c       *client
		path    string
		body    rawBody
		message string
	}{
		{"decision: duplicate", approver, decide, `{"decision":"deny","decision":"allow"}`, `duplicate member name "decision"`},
		{"decision: case variant", approver, decide, `{"decision":"deny","Decision":"allow","reason":"looks like a deny"}`, `"Decision"`},
		{"decision: case variant alone", approver, decide, `{"DECISION":"allow"}`, `unknown field "DECISION"`},
		{"decision: escaped duplicate", approver, decide, `{"decision":"deny","\u0064ecision":"allow"}`, `duplicate member name "decision"`},
		{"decision: second value", approver, decide, `{"decision":"deny"} {"decision":"allow"}`, "malformed JSON"},
		{"decision: unknown member", approver, decide, `{"decision":"allow","approver":"admin"}`, `unknown field "approver"`},
		{"revoke: duplicate", admin, revoke, `{"reason":"a","reason":"b"}`, `duplicate member name "reason"`},
		{"revoke: case variant", admin, revoke, `{"Reason":"gone"}`, `unknown field "Reason"`},
		{"login: case variant", fresh, "/console/api/login", rawBody(`{"Credential":"` + w.alice.Token + `"}`), `unknown field "Credential"`},
		{"login: duplicate", fresh, "/console/api/login", rawBody(`{"credential":"x","credential":"` + w.alice.Token + `"}`), `duplicate member name "credential"`},
		{"logout: duplicate", approver, "/console/api/logout", `{"a":1,"a":2}`, "request body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, out := tt.c.do(http.MethodPost, tt.path, tt.body)
			if msg, _ := out["error"].(string); status != http.StatusBadRequest || !strings.Contains(msg, tt.message) {
				t.Errorf("%s: %d %v, want 400 mentioning %s", tt.path, status, out, tt.message)
			}
		})
	}
	if st, _ := w.k.Operation(op); st.State != kernel.OpAwaitingApproval {
		t.Fatalf("after refused decisions the call is %s, want still awaiting approval", st.State)
	}
	if _, err := w.k.VerifyBearer(w.bob.Token); err != nil {
		t.Fatalf("a refused revocation revoked: %v", err)
	}
	if status, _ := fresh.do(http.MethodGet, "/console/api/session", nil); status != http.StatusUnauthorized {
		t.Fatalf("a refused login signed in: %d", status)
	}
	if status, _ := approver.do(http.MethodGet, "/console/api/session", nil); status != http.StatusOK {
		t.Fatalf("a refused logout signed out: %d", status)
	}
	if status, out := approver.do(http.MethodPost, decide, DecisionRequest{Decision: "deny", Reason: "strict"}); status != 200 || out["state"] != kernel.ApprovalDenied {
		t.Fatalf("a proper decision: %d %v", status, out)
	}
}

// TestSessionsPerCredential: signing in again and again with one
// credential drops that credential's own oldest sessions, never
// another's (an approver signed the admin out with 1030 sign-ins). Once
// all sessions are taken, those whose credential no longer verifies go
// first, then the oldest of the credential holding the most. The caps are
// lowered to 3 a credential and 6 in all.
func TestSessionsPerCredential(t *testing.T) {
	var con *Console
	w := newWorldWith(t, kernel.Config{}, func(c *Console) { con, c.maxPerCred, c.maxSessions = c, 3, 6 })
	signIn := func(cred string) *client {
		t.Helper()
		c := w.client()
		if st := c.login(cred); st != http.StatusOK {
			t.Fatalf("login: %d", st)
		}
		return c
	}
	alive := func(c *client) bool {
		t.Helper()
		st, _ := c.do(http.MethodGet, "/console/api/session", nil)
		return st == http.StatusOK
	}
	count := func() int {
		con.mu.Lock()
		defer con.mu.Unlock()
		return len(con.sessions)
	}
	admin, alice := signIn(w.admin), signIn(w.alice.Token)
	var bob []*client
	for range 10 * con.maxSessions {
		bob = append(bob, signIn(w.bob.Token))
	}
	if !alive(admin) || !alive(alice) {
		t.Fatal("one approver's sign-ins signed out the admin or another approver")
	}
	for i, c := range bob {
		if want := i >= len(bob)-3; alive(c) != want {
			t.Fatalf("bob's session %d of %d alive: %v, want %v (his own 3 newest)", i, len(bob), !want, want)
		}
	}
	if n := count(); n != 5 {
		t.Fatalf("%d sessions, want 5", n)
	}
	// Full at 6; dave's sign-in takes the oldest session of bob, who
	// holds the most.
	carol := signIn(w.carol.Token)
	dave := signIn(w.dave.Token)
	if !alive(admin) || !alive(alice) || !alive(carol) || alive(bob[len(bob)-3]) || !alive(bob[len(bob)-2]) {
		t.Fatal("a full table did not drop the oldest session of the credential holding the most")
	}
	// Bob revoked: his 2 sessions go before anyone else's.
	if err := w.k.Revoke(context.Background(), w.bob.ID, "bob left"); err != nil {
		t.Fatal(err)
	}
	dave2 := signIn(w.dave.Token)
	if n := count(); n != 5 {
		t.Fatalf("%d sessions after a revoked credential's were swept, want 5", n)
	}
	for name, c := range map[string]*client{"admin": admin, "alice": alice, "carol": carol, "dave": dave, "dave again": dave2} {
		if !alive(c) {
			t.Errorf("%s was signed out while a revoked credential's sessions were there to drop", name)
		}
	}
}
