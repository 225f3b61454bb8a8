package kernel

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// TestNestedRootsSensitive: with roots that nest, a write under a
// sensitive path (or a secret one) is decided alike however the agent
// spells it, relative to the first root or absolute in the innermost one:
// the policy sees the file from every root that holds it
// (syscalls.Resource.OtherPaths), where the spelling picked the root and
// so whether `.git/` was at the start of the path (rev10-approve F3).
func TestNestedRootsSensitive(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 50 * time.Millisecond }) // a gated call ends unapproved
	for _, d := range []string{".git/hooks", "app/.git/hooks", "keys/.ssh"} {
		if err := os.MkdirAll(filepath.Join(h.ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		inner string
		paths []string
		mode  string
	}{
		{"app", []string{"app/.git/hooks/pre-commit", filepath.Join(h.ws, "app/.git/hooks/pre-commit")}, "soft_gate"},
		{".git", []string{".git/hooks/pre-commit", filepath.Join(h.ws, ".git/hooks/pre-commit")}, "soft_gate"},
		{"keys/.ssh", []string{"keys/.ssh/id_x", filepath.Join(h.ws, "keys/.ssh/id_x")}, "no_go"},
	} {
		tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"},
			FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}, {Path: filepath.Join(h.ws, tc.inner), Mode: "rw"}}})
		for _, p := range tc.paths {
			as := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
			r := h.invoke("fs.write", map[string]any{"path": p, "content": "#!/bin/sh\n"}, key(p), as)
			if r.AutonomyMode != tc.mode || r.TxOutcome == Committed {
				t.Fatalf("roots ws and ws/%s, path %s: mode %s, %s; want %s, nothing committed", tc.inner, p, r.AutonomyMode, r.TxOutcome, tc.mode)
			}
		}
	}
}
