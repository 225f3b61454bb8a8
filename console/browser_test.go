package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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
		"url": w.srv.URL, "admin": w.admin, "alice": w.alice.Token, "bob": w.bob.Token, "dave": w.dave.Token,
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
