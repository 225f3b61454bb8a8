package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
)

// Mint and Attenuate refuse an fs root that is not an existing directory
// as the kernel sees it, naming the root, and mint a root's path with its
// links resolved; a token minted before with a root that is gone still
// attenuates (its roots are refused at a call, as before).
func TestMintRootMustBeADirectory(t *testing.T) {
	h := newHarness(t)
	dir := filepath.Dir(h.ws)
	os.MkdirAll(filepath.Join(h.ws, "sub"), 0o755)
	os.WriteFile(filepath.Join(h.ws, "notes.txt"), []byte("n\n"), 0o644)
	star := filepath.Join(dir, "odd", "*")
	os.MkdirAll(star, 0o755)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(h.ws, link); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		path string
		want string // the minted root's path, or the error's text
		ok   bool
	}{
		{"a directory", h.ws, h.ws, true},
		{"a directory literally named *", star, star, true},
		{"a link to a directory", link, h.ws, true},
		{"missing", filepath.Join(dir, "nonexist"), "fs root " + filepath.Join(dir, "nonexist") + " does not exist where the kernel runs: a root must be an existing directory", false},
		{"a file", filepath.Join(h.ws, "notes.txt"), "fs root " + filepath.Join(h.ws, "notes.txt") + " is not a directory", false},
		{"a glob", filepath.Join(h.ws, "*"), "not a pattern ('*' is no wildcard there)", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := h.k.Mint(TokenRequest{AgentID: "m", Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: tt.path, Mode: "r"}}})
			switch {
			case tt.ok && err != nil:
				t.Fatalf("Mint: %v", err)
			case tt.ok && m.Cap.FS[0].Path != tt.want:
				t.Fatalf("minted root %q, want %q", m.Cap.FS[0].Path, tt.want)
			case !tt.ok && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Mint = %v, want an error with %q", err, tt.want)
			}
		})
	}

	ctx := context.Background()
	missing := filepath.Join(h.ws, "nonexist")
	_, err := h.k.Attenuate(ctx, AttenuateRequest{Parent: h.token, FS: []captoken.FSRoot{{Path: missing, Mode: "r"}}})
	var ae *AttenuateError
	if !errors.As(err, &ae) || ae.Class != ErrInvalidArgs || !strings.Contains(ae.Message, "fs root "+missing+" does not exist") {
		t.Fatalf("Attenuate naming a missing root = %v, want invalid_args naming it", err)
	}
	// A widening is said first: it is the refusal that matters.
	_, err = h.k.Attenuate(ctx, AttenuateRequest{Parent: h.token, FS: []captoken.FSRoot{{Path: filepath.Join(dir, "nonexist"), Mode: "r"}}})
	if !errors.As(err, &ae) || ae.Class != ErrScopeDenied {
		t.Fatalf("Attenuate naming a missing root outside the parent's = %v, want scope_denied", err)
	}
	// A link inside the parent's root leading inside it is minted resolved.
	os.Symlink(filepath.Join(h.ws, "sub"), filepath.Join(h.ws, "tosub"))
	child := h.attenuate(AttenuateRequest{Parent: h.token, FS: []captoken.FSRoot{{Path: filepath.Join(h.ws, "tosub"), Mode: "r"}}})
	if got := child.Cap.FS[0].Path; got != filepath.Join(h.ws, "sub") {
		t.Fatalf("child root %q, want the link's target %s", got, filepath.Join(h.ws, "sub"))
	}

	// A token minted before with a root that is gone still attenuates,
	// inheriting its roots; the call is what refuses them.
	gone := filepath.Join(dir, "gone")
	old, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: gone, Mode: "rw"}}})
	oldChild := h.attenuate(AttenuateRequest{Parent: old})
	if r := h.invoke("fs.list", map[string]any{"path": gone}, as(oldChild)); errClass(r) != ErrScopeDenied {
		t.Fatalf("a call of a token whose root is gone: %+v, want scope_denied", r)
	}
}

// TestAttenuateOldLinkRoot: a parent minted before the kernel resolved
// roots' links (its roots as spelled) that writes through a link root
// whose target lies in one of its read-only roots may restate that root,
// or narrow below it, for a child: resolving the child's root to the
// target put it under the read-only root, and Attenuate refused it as a
// widening (rev17 #3). The child writes where its parent does.
func TestAttenuateOldLinkRoot(t *testing.T) {
	h := newHarness(t)
	if err := os.MkdirAll(filepath.Join(h.ws, "real", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(h.ws, "link")
	if err := os.Symlink(filepath.Join(h.ws, "real"), link); err != nil {
		t.Fatal(err)
	}
	// Signed as Mint signed before: roots as spelled.
	old, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}, {Path: link, Mode: "rw"}}})
	for i, p := range []string{link, filepath.Join(link, "sub")} {
		m, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: old, FS: []captoken.FSRoot{{Path: p, Mode: "rw"}}})
		if err != nil {
			t.Fatalf("Attenuate(%s:rw) of a parent that writes there: %v", p, err)
		}
		r := h.invoke("fs.write", map[string]any{"path": filepath.Join(p, "f.txt"), "content": "x"}, func(e *Envelope) {
			e.CapabilityToken, e.CapabilityTokenID = m.Token, m.ID
		}, key(fmt.Sprint("old-link-", i)))
		if r.Status != StatusOK {
			t.Fatalf("the child's write through %s: %+v", p, r.Error)
		}
	}
}
