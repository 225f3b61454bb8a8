package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/conformance"
)

// The whole conformance suite against a freshly started `kernelctl serve`:
// every case must pass or skip with its reason, and the history the suite
// leaves behind must verify.
func TestConformanceAgainstServe(t *testing.T) {
	// A short approval timeout, so the approval_timeout cases run.
	sv := initServed(t, "--approval-timeout", "3s")
	s, dir, adminFile, admin := sv.server, sv.dir, sv.adminFile, sv.admin
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(ws, 0o755)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	rep := conformance.Run(ctx, conformance.Config{Server: s.url, AdminToken: admin, Workspace: ws})
	if rep.Error != "" {
		t.Fatalf("the suite could not run: %s", rep.Error)
	}
	// Cases that need what a local serve gives (a command reaching a
	// listener of the suite's on loopback) must run, not skip.
	mustRun := map[string]bool{"DESIGN-ERR-018": true}
	for _, c := range rep.Cases {
		switch c.Status {
		case conformance.Fail:
			ev, _ := json.MarshalIndent(c.Evidence, "  ", "  ")
			t.Errorf("FAIL %s (%s): %s\n  %s", c.ID, c.Clause, c.Message, ev)
		case conformance.Skip:
			if mustRun[c.ID] {
				t.Errorf("%s skipped against a local serve: %s", c.ID, c.Message)
			}
			t.Logf("skip %s: %s", c.ID, c.Message)
		}
	}
	t.Logf("%s, %s in %s", rep.Summary(), rep.Version, time.Since(start).Round(time.Millisecond))
	if len(rep.Cases) != len(conformance.Cases()) || rep.Passed == 0 {
		t.Fatalf("ran %d of %d cases, %d passed", len(rep.Cases), len(conformance.Cases()), rep.Passed)
	}
	if rep.Passed+rep.Failed+rep.Skipped != len(rep.Cases) {
		t.Fatalf("summary counts %d+%d+%d do not add up to %d cases", rep.Passed, rep.Failed, rep.Skipped, len(rep.Cases))
	}

	// The history the suite made verifies: chain, tree, checkpoints,
	// receipts, and one committed effect per idempotency key.
	env := append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN="+admin)
	for _, args := range [][]string{{"ledger", "verify", "--server", s.url}, {"replay", "verify", "--server", s.url}} {
		cmd := exec.Command(kernelctl, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%v after the suite: %v\n%s", args, err, out)
		}
	}

	// The CLI: table and summary, exit 0; a filter; JSON; usage errors.
	out, stderr, code := run(t, "conformance", "--server", s.url, "--admin-token", adminFile, "--workspace", ws, "--run", "NOBYPASS|SEED000")
	if code != 0 || !regexp.MustCompile(`(?m)^conformance: \d+ passed, 0 failed, \d+ skipped`).MatchString(out) ||
		!strings.Contains(out, "PASS    TOOL01-INV-NOBYPASS-001") || strings.Contains(out, "TOOL01-INV-TXN-001") {
		t.Fatalf("kernelctl conformance --run: exit %d\n%s%s", code, out, stderr)
	}
	out, _, code = run(t, "conformance", "--server", s.url, "--admin-token", adminFile, "--run", "^DESIGN-RCPT-00[12]$", "--json")
	var jrep conformance.Report
	if err := json.Unmarshal([]byte(out), &jrep); code != 0 || err != nil || jrep.Passed != 2 || jrep.Version != conformance.Version || len(jrep.Cases[0].Evidence) == 0 {
		t.Fatalf("kernelctl conformance --json: exit %d, %v\n%s", code, err, out)
	}
	if _, stderr, code := run(t, "conformance", "--admin-token", adminFile); code != 2 {
		t.Fatalf("without --server: exit %d, want 2: %s", code, stderr)
	}
	if _, stderr, code := run(t, "conformance", "--server", s.url, "--admin-token", adminFile, "--run", "("); code != 2 {
		t.Fatalf("bad --run pattern: exit %d, want 2: %s", code, stderr)
	}
	wrong := filepath.Join(dir, "wrong.token")
	os.WriteFile(wrong, []byte("ckadmin_wrong\n"), 0o600)
	if out, stderr, code := run(t, "conformance", "--server", s.url, "--admin-token", wrong); code != 1 || !strings.Contains(out+stderr, "minting a token") {
		t.Fatalf("a wrong admin credential: exit %d, want 1:\n%s%s", code, out, stderr)
	}
	s.stop()
}

// TestConformanceAgainstDefaultServe runs, against a kernelctl serve with
// no flags beyond --data and --listen, the cases that meet its approval
// gates (held calls, proc.exec, the approval timeout): the suite sets up
// what they need through the admin API (it denies the held calls, allows
// proc.exec) and says at start how long the run takes and that the
// approval_timeout cases skip under a 5-minute approval timeout.
func TestConformanceAgainstDefaultServe(t *testing.T) {
	requireBwrap(t) // proc.exec runs in it
	sv := initServed(t)
	start := time.Now()
	out, stderr, code := run(t, "conformance", "--server", sv.url, "--admin-token", sv.adminFile,
		"--run", "DELEGATION|DESIGN-ERR-01[1-9]|DESIGN-ERR-020|CONFIRM|TIMEOUT|CANCEL")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("exit %d after %s\n%s%s", code, took, out, stderr)
	}
	lines := strings.Split(out, "\n")
	if !regexp.MustCompile(`^capkernel-conformance/\S+ against \S+: \d+ cases, about \d+s \(workspace `).MatchString(lines[0]) ||
		!strings.Contains(lines[1], "approval timeout is 5m0s: the 2 approval_timeout case(s) skip") {
		t.Fatalf("the start does not say what the run takes:\n%s", out)
	}
	for _, want := range []string{"PASS    TOOL01-INV-DELEGATION-004", "PASS    DESIGN-ERR-017", "PASS    DESIGN-ERR-019", "PASS    SEED002-TIMEOUT-001", "SKIP    DESIGN-ERR-012", "0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	// Each held call ends at once, not after the approval timeout (5 min)
	// or the case's own (60 s).
	if took > 50*time.Second {
		t.Errorf("the run took %s", took)
	}
}
