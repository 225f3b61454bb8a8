package console

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// Chromium is Debian's (make chromium installs it); the browser tests need
// it, Node.js, and playwright-core from console/web's package-lock.json.
const chromium = "/usr/bin/chromium"

// browserRun bounds the whole browser run: six scenarios take seconds; a
// hung browser must not hold the test binary until its own timeout.
const browserRun = 5 * time.Minute

// screenshots are the views the browser run must save, by file name.
var screenshots = []string{"login", "approvals", "history", "verify", "ledger", "tokens", "audit", "erased"}

// needBrowser returns node's path, skipping the test when Chromium, node
// or playwright-core are missing, unless CAPKERNEL_BROWSER_TESTS=1 (set
// by make test), which makes that a failure.
func needBrowser(t *testing.T) string {
	t.Helper()
	missing := func(what string, err error) {
		if os.Getenv("CAPKERNEL_BROWSER_TESTS") == "1" {
			t.Fatalf("browser tests: %s: %v (make chromium console-deps)", what, err)
		}
		t.Skipf("browser tests skipped: %s: %v (CAPKERNEL_BROWSER_TESTS=1 makes this fail)", what, err)
	}
	if _, err := os.Stat(chromium); err != nil {
		missing("Chromium", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("Node.js", err)
	}
	if _, err := os.Stat("web/node_modules/playwright-core/package.json"); err != nil {
		missing("playwright-core", err)
	}
	return node
}

// artifactDir is where the screenshots go: $CAPKERNEL_TEST_ARTIFACTS/console
// when that is set (make test sets it), else a new temporary directory
// that is kept, for a person to look at.
func artifactDir(t *testing.T) string {
	t.Helper()
	var dir string
	var err error
	if root := os.Getenv("CAPKERNEL_TEST_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, "console")
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "capkernel-console-screenshots-")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// TestBrowser drives the console in Chromium against a kernel served on
// loopback (web/browser/console.mjs holds the scenarios: approve, deny,
// two consoles racing, receipt verification and tampering, CSRF and a
// foreign origin, screenshots) and then checks the kernel's side: the
// approved write is in the workspace, the refused ones are not.
func TestBrowser(t *testing.T) {
	node := needBrowser(t)
	w := newWorld(t)
	art := artifactDir(t)
	for _, s := range screenshots {
		os.Remove(filepath.Join(art, s+".png")) // a stale one must not pass
	}
	cfg, _ := json.Marshal(map[string]any{
		"url": w.srv.URL, "admin": w.admin, "alice": w.alice.Token, "bob": w.bob.Token, "carol": w.carol.Token, "dave": w.dave.Token,
		"agent":       map[string]string{"token": w.agent.Token, "id": w.agent.ID, "agent_id": w.agent.AgentID},
		"policy_hash": w.k.PolicyHash(), "ws": w.ws, "artifacts": art, "chromium": chromium,
	})
	cfgFile := filepath.Join(t.TempDir(), "browser.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), browserRun)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "browser/console.mjs", cfgFile)
	cmd.Dir = "web"
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser tests failed (%v):\n%s", err, out.String())
	}
	if testing.Verbose() {
		t.Log(out.String())
	}

	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(w.ws, name))
		return string(b), err
	}
	if got, err := read("notes.txt"); err != nil || got != "status: final\nowner: ops\n" {
		t.Errorf("the approved fs.write: notes.txt is %q (%v)", got, err)
	}
	for _, name := range []string{"denied.txt", "csrf.txt", "late.txt", "stale.txt", "audited.txt"} {
		if _, err := read(name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of a denied call exists (%v)", name, err)
		}
	}
	if got, err := read("race.txt"); err == nil && got != "raced\n" {
		t.Errorf("race.txt is %q", got)
	}
	if p := w.k.Approvals(false); len(p) != 0 {
		t.Errorf("%d approvals still pending after the run", len(p))
	}
	for _, s := range screenshots {
		b, err := os.ReadFile(filepath.Join(art, s+".png"))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("screenshot %s.png: %v (%d bytes)", s, err, len(b))
		}
	}
}

// TestBrowserCookieOfAnotherPort: the operator signs in in Chromium, then
// opens a page served on another port of the console's loopback host,
// which makes the browser send that server the console's cookie: cookies
// are not scoped by port, and SameSite=Strict counts every port of
// 127.0.0.1 as the same site. That cookie, replayed outside the browser,
// opens no session: GET /console/api/session is 401 and gives no key out,
// and the agent's own gated call cannot be approved with it. (Before the
// session key, the cookie alone gave the CSRF token and every action of
// the session: the agent approved its own fs.write as the approver.)
func TestBrowserCookieOfAnotherPort(t *testing.T) {
	node := needBrowser(t)
	w := newWorld(t)
	var mu sync.Mutex
	var got string // the Cookie header the other server received
	other := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, Prefix) {
			mu.Lock()
			got = r.Header.Get("Cookie")
			mu.Unlock()
			rw.Write([]byte("seen"))
			return
		}
		rw.Header().Set("Content-Type", "text/html")
		rw.Write([]byte(`<!doctype html><title>dev preview</title>
<script>fetch("/console/x", {credentials: "include"}).then((r) => r.text()).then((t) => {
  const d = document.createElement("p"); d.id = "done"; d.textContent = t; document.body.append(d); });</script>`))
	}))
	defer other.Close()
	cfg, _ := json.Marshal(map[string]any{"url": w.srv.URL, "credential": w.alice.Token, "other": other.URL, "chromium": chromium})
	cfgFile := filepath.Join(t.TempDir(), "otherport.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), browserRun)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "browser/otherport.mjs", cfgFile)
	cmd.Dir = "web"
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("browser run failed (%v):\n%s", err, out)
	}
	t.Logf("browser:\n%s", out)
	mu.Lock()
	cookie := got
	mu.Unlock()
	if !strings.Contains(cookie, cookieName+"=") {
		t.Fatalf("the other port's server got no console cookie (Cookie %q): the premise of this test no longer holds", cookie)
	}

	// Outside the browser, with the cookie the other server got.
	send := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, w.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Cookie", cookie)
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", w.srv.URL)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := send(http.MethodGet, "/console/api/session", ""); st != http.StatusUnauthorized || strings.Contains(b, `"key"`) || strings.Contains(b, `"role"`) {
		t.Errorf("GET /console/api/session with the cookie alone: %d %s, want 401 and nothing of the session", st, b)
	}
	op, a := w.gated(w.agent, "fs.write", map[string]any{"path": "pwned.txt", "content": "the agent approved itself\n"}, "otherport-1")
	if st, b := send(http.MethodPost, "/console/api/approvals/"+a.ID, `{"decision":"allow","reason":"lgtm"}`); st != http.StatusUnauthorized {
		t.Errorf("a decision with the cookie alone: %d %s, want 401", st, b)
	}
	if st, _ := w.k.Operation(op); st.State != kernel.OpAwaitingApproval {
		t.Fatalf("after the decision with the cookie alone the call is %s, want still awaiting approval", st.State)
	}
	if _, err := w.k.Decide(a.ID, w.alice.Token, "deny", "test over"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.k.Wait(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(w.ws, "pwned.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pwned.txt: %v, want none", err)
	}
}

// TestBrowserLedgerOriginChange: the Ledger view, in Chromium, remembers
// the checkpoints it verified per signing key, as kernelctl ledger
// checkpoint does. A server in front of the kernel hands the page
// checkpoints signed with one key: the kernel's history (origin
// ck-real, size 5), then another, shorter history of that key under a new
// origin, which the page refuses (ORIGIN CHANGED) and does not remember,
// then the first again, still consistent. Its JWKS lists another key
// first: the page takes the key the signature names. (The page used to
// take the JWKS's first key, skip the check for a new origin and
// remember the new history from then on.)
func TestBrowserLedgerOriginChange(t *testing.T) {
	node := needBrowser(t)
	w := newWorld(t)
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	decoy := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	for _, pub := range []ed25519.PublicKey{decoy.Public().(ed25519.PublicKey), key.Public().(ed25519.PublicKey)} {
		one, err := receipts.JWKS(pub)
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Keys []json.RawMessage `json:"keys"`
		}
		if err := json.Unmarshal(one, &s); err != nil {
			t.Fatal(err)
		}
		set.Keys = append(set.Keys, s.Keys...)
	}
	jwks, _ := json.Marshal(set)
	sign := func(origin string, size uint64, root byte) kernel.SignedCheckpoint {
		s, err := ledger.NewCheckpointSigner(origin, key)
		if err != nil {
			t.Fatal(err)
		}
		cp := ledger.Checkpoint{Origin: origin, Size: size, Root: [32]byte(bytes.Repeat([]byte{root}, 32))}
		note, err := ledger.SignCheckpoint(s, cp)
		if err != nil {
			t.Fatal(err)
		}
		return kernel.SignedCheckpoint{Origin: origin, Size: size, Root: digest.Format(cp.Root), Note: string(note)}
	}
	checkpoints := map[string]kernel.SignedCheckpoint{
		"/test/real":   sign("ck-real", 5, 1),
		"/test/forged": sign("ck-forged", 2, 2),
	}
	var mu sync.Mutex
	current := checkpoints["/test/real"]
	target, _ := url.Parse(w.srv.URL)
	kernelProxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/test/real", "/test/forged":
			mu.Lock()
			current = checkpoints[r.URL.Path]
			mu.Unlock()
		case "/v1/ledger/checkpoint":
			mu.Lock()
			json.NewEncoder(rw).Encode(current)
			mu.Unlock()
		case "/.well-known/jwks.json":
			rw.Write(jwks)
		case "/v1/ledger/proof/consistency":
			http.Error(rw, `{"error":"no such proof"}`, http.StatusBadRequest) // no test phase needs one
		default:
			kernelProxy.ServeHTTP(rw, r)
		}
	}))
	defer front.Close()
	phases := []string{"/test/real", "/test/real", "/test/forged", "/test/real"}
	cfg, _ := json.Marshal(map[string]any{"url": front.URL, "credential": w.admin, "phases": phases, "chromium": chromium})
	cfgFile := filepath.Join(t.TempDir(), "ledger.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), browserRun)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "browser/ledger.mjs", cfgFile)
	cmd.Dir = "web"
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("browser run failed (%v):\n%s", err, out)
	}
	type check struct{ Class, Text string }
	var got []struct {
		Checks     []check
		Remembered string
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "PHASE "); ok {
			var p struct {
				Checks     []check
				Remembered string
			}
			if err := json.Unmarshal([]byte(rest), &p); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			got = append(got, p)
		}
	}
	if len(got) != len(phases) {
		t.Fatalf("%d phases reported, want %d:\n%s", len(got), len(phases), out)
	}
	want := []struct {
		classes []string
		text    string // in the second check
	}{
		{[]string{"pass", "skip"}, "first checkpoint this browser has seen"},
		{[]string{"pass", "pass"}, "same as the checkpoint seen"},
		{[]string{"pass", "fail"}, `ORIGIN CHANGED: key ` + receiptsKID(t, key) + ` signed the checkpoint of origin "ck-real" (size 5)`},
		{[]string{"pass", "pass"}, "same as the checkpoint seen"},
	}
	for i, p := range got {
		var classes []string
		for _, c := range p.Checks {
			classes = append(classes, c.Class)
		}
		if !slices.Equal(classes, want[i].classes) || !strings.Contains(p.Checks[1].Text, want[i].text) {
			t.Errorf("phase %d (%s): checks %+v, want %v with %q", i+1, phases[i], p.Checks, want[i].classes, want[i].text)
		}
		if strings.Contains(p.Remembered, "ck-forged") {
			t.Errorf("phase %d (%s): the page remembers the forged history: %s", i+1, phases[i], p.Remembered)
		}
	}
}

// receiptsKID is the kid the kernel's JWKS gives key's public key.
func receiptsKID(t *testing.T, key ed25519.PrivateKey) string {
	t.Helper()
	one, err := receipts.JWKS(key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(one, &s); err != nil || len(s.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", one, err)
	}
	return s.Keys[0].Kid
}
