package kernel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
)

// wantAncestorReadOnly stops the test unless r is refused as scope_denied
// for lying where a token the caller was attenuated from is read-only.
// (It stops: a call let through may go on to wait for an approval the
// default policy asks of a directory's delete.)
func wantAncestorReadOnly(t *testing.T, what string, r *Result) {
	t.Helper()
	if errClass(r) != ErrScopeDenied || !strings.Contains(r.Error.Message, "read-only for a token this one was attenuated from") {
		t.Fatalf("%s: status %s, error %+v; want scope_denied, read-only for an ancestor", what, r.Status, r.Error)
	}
}

// mustRead returns the content of file p.
func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A parent's read-only root stays read-only for its children at every
// call, whatever links lead there: attenuation compares the roots' real
// paths once, and a root spelled through a link that dangles then, or a
// root path replaced by a link afterwards, must not let the child write
// (or delete) where the parent cannot. Writing beside the read-only root
// still works.
func TestAncestorReadOnlyAtCallTime(t *testing.T) {
	for _, c := range []struct {
		name string
		// setup makes the tree under base (ws exists, holding ro/f) and
		// returns the parent's roots, the child's, and what the host
		// changes after attenuation; proj is base/proj.
		setup func(t *testing.T, base, ws, proj string) (parent, child []captoken.FSRoot, after func())
		// ro is the physical directory the child reaches as proj/ro.
		ro func(base, ws string) string
		// opened, when set, changes the tree after attenuation; the child
		// then makes a call, so its workspace is opened before after.
		opened func(t *testing.T, base string)
	}{
		{
			name: "a root spelled through a link that dangles at attenuation",
			setup: func(t *testing.T, base, ws, proj string) ([]captoken.FSRoot, []captoken.FSRoot, func()) {
				later := filepath.Join(base, "later")
				symlink(t, later, proj)
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(later, "ro"), Mode: "r"}},
					[]captoken.FSRoot{{Path: proj, Mode: "rw"}},
					func() { writeFile(t, filepath.Join(later, "ro", "f"), "original") }
			},
			ro: func(base, _ string) string { return filepath.Join(base, "later", "ro") },
		},
		{
			name: "a link completed after the child's workspace is opened",
			setup: func(t *testing.T, base, ws, proj string) ([]captoken.FSRoot, []captoken.FSRoot, func()) {
				later := filepath.Join(base, "later")
				symlink(t, later, proj)
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(later, "ro"), Mode: "r"}},
					[]captoken.FSRoot{{Path: proj, Mode: "rw"}},
					func() { writeFile(t, filepath.Join(later, "ro", "f"), "original") }
			},
			ro: func(base, _ string) string { return filepath.Join(base, "later", "ro") },
			opened: func(t *testing.T, base string) {
				if err := os.Mkdir(filepath.Join(base, "later"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "a root replaced by a link after attenuation",
			setup: func(t *testing.T, base, ws, proj string) ([]captoken.FSRoot, []captoken.FSRoot, func()) {
				if err := os.Mkdir(proj, 0o755); err != nil {
					t.Fatal(err)
				}
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(ws, "ro"), Mode: "r"}},
					[]captoken.FSRoot{{Path: proj, Mode: "rw"}},
					func() {
						if err := os.Remove(proj); err != nil {
							t.Fatal(err)
						}
						symlink(t, ws, proj)
					}
			},
			ro: func(_, ws string) string { return filepath.Join(ws, "ro") },
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.write("ro/f", "original")
			base := filepath.Dir(h.ws)
			proj := filepath.Join(base, "proj")
			pfs, cfs, after := c.setup(t, base, h.ws, proj)
			ptok, pjti := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"}, FS: pfs})
			var child *MintedToken
			if _, err := os.Stat(cfs[0].Path); err != nil {
				// Attenuate refuses a root that is no directory yet; a
				// child attenuated before it did carries one, and must be
				// held to its ancestor's read-only root all the same.
				if _, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: ptok, FS: cfs}); err == nil {
					t.Fatal("Attenuate granted a root that does not exist")
				}
				child = h.signChild(ptok, cfs)
			} else {
				child = h.attenuate(AttenuateRequest{Parent: ptok, FS: cfs})
			}
			if c.opened != nil {
				c.opened(t, base)
				mustOK(t, h.invoke("fs.list", map[string]any{"path": "."}, as(child)))
			}
			after()
			ro := c.ro(base, h.ws)
			asParent := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = ptok, pjti }
			// The parent is refused by its own read-only root.
			if r := h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "ro", "f"), "content": "by parent"}, asParent, key("p")); errClass(r) != ErrScopeDenied {
				t.Fatalf("the parent's write of proj/ro/f: %+v", r)
			}
			f := filepath.Join(proj, "ro", "f")
			wantAncestorReadOnly(t, "the child's write of proj/ro/f", h.invoke("fs.write", map[string]any{"path": f, "content": "by child"}, as(child), key("c-write")))
			wantAncestorReadOnly(t, "the child's new file proj/ro/g", h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "ro", "g"), "content": "by child"}, as(child), key("c-new")))
			wantAncestorReadOnly(t, "the child's delete of proj/ro/f", h.invoke("fs.delete", map[string]any{"path": f}, as(child), key("c-delete")))
			wantAncestorReadOnly(t, "the child's delete of proj/ro", h.invoke("fs.delete", map[string]any{"path": filepath.Join(proj, "ro")}, as(child), key("c-delete-dir")))
			if got := mustRead(t, filepath.Join(ro, "f")); got != "original" {
				t.Errorf("ro/f is %q, want it untouched", got)
			}
			if _, err := os.Lstat(filepath.Join(ro, "g")); !os.IsNotExist(err) {
				t.Errorf("ro/g: %v, want it never written", err)
			}
			// Beside the read-only root the child writes as before.
			mustOK(t, h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "beside.txt"), "content": "by child"}, as(child), key("c-beside")))
			if got := mustRead(t, filepath.Join(proj, "beside.txt")); got != "by child" {
				t.Errorf("beside.txt is %q", got)
			}
		})
	}
}

// The read-only paths travel down a chain: a grandchild is held to the
// read-only roots of its root token and of its parent alike, and still
// writes beside them.
func TestAncestorReadOnlyChain(t *testing.T) {
	for _, c := range []struct {
		name string
		// root and middle are the root token's and the middle child's
		// roots (the grandchild takes proj:rw); ws holds ro/f.
		root, middle func(ws, proj string) []captoken.FSRoot
	}{
		{
			name: "read-only for the root token",
			root: func(ws, proj string) []captoken.FSRoot {
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(ws, "ro"), Mode: "r"}}
			},
			middle: func(ws, proj string) []captoken.FSRoot { return []captoken.FSRoot{{Path: proj, Mode: "rw"}} },
		},
		{
			name: "read-only for the middle child",
			root: func(ws, proj string) []captoken.FSRoot {
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: ws, Mode: "rw"}}
			},
			middle: func(ws, proj string) []captoken.FSRoot {
				return []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: ws, Mode: "rw"}, {Path: filepath.Join(ws, "ro"), Mode: "r"}}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.write("ro/f", "original")
			proj := filepath.Join(filepath.Dir(h.ws), "proj")
			if err := os.Mkdir(proj, 0o755); err != nil {
				t.Fatal(err)
			}
			rtok, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"}, FS: c.root(h.ws, proj)})
			middle := h.attenuate(AttenuateRequest{Parent: rtok, FS: c.middle(h.ws, proj)})
			grand := h.attenuate(AttenuateRequest{Parent: middle.Token, AgentID: h.agent + "/helper", FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
			if n := len(grand.Cap.Ancestors); n != 2 {
				t.Fatalf("grandchild has %d ancestors", n)
			}
			// The host re-points proj at ws.
			if err := os.Remove(proj); err != nil {
				t.Fatal(err)
			}
			symlink(t, h.ws, proj)
			wantAncestorReadOnly(t, "the grandchild's write of proj/ro/f",
				h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "ro", "f"), "content": "by grandchild"}, as(grand), key("g-write")))
			if got := h.read("ro/f"); got != "original" {
				t.Errorf("ro/f is %q, want it untouched", got)
			}
			mustOK(t, h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "beside.txt"), "content": "x"}, as(grand), key("g-beside")))
			if got := h.read("beside.txt"); got != "x" {
				t.Errorf("beside.txt is %q", got)
			}
		})
	}
}

// A writable root a parent holds inside its read-only one keeps its
// files writable for the parent's children: the ancestor's innermost
// root decides, as it does for the parent itself.
func TestAncestorWritableInsideReadOnly(t *testing.T) {
	h := newHarness(t)
	sub := filepath.Join(h.ws, "sub")
	h.write("sub/f", "original")
	h.write("top.txt", "original")
	ptok, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}, {Path: sub, Mode: "rw"}}})
	child := h.attenuate(AttenuateRequest{Parent: ptok, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}, {Path: sub, Mode: "rw"}}})
	mustOK(t, h.invoke("fs.write", map[string]any{"path": filepath.Join(sub, "f"), "content": "by child"}, as(child), key("c-sub")))
	if got := h.read("sub/f"); got != "by child" {
		t.Errorf("sub/f is %q", got)
	}
	if r := h.invoke("fs.write", map[string]any{"path": filepath.Join(h.ws, "top.txt"), "content": "by child"}, as(child), key("c-top")); errClass(r) != ErrScopeDenied {
		t.Errorf("the child's write in the read-only root: %+v", r)
	}
}

// A whole-root child running a command that writes in its parent's
// read-only root, reached through a link made after attenuation, commits
// nothing: the command's delta is resolved through the same workspace.
func TestAncestorReadOnlyExecDelta(t *testing.T) {
	h := newExecHarness(t)
	h.write("ro/f", "original")
	proj := filepath.Join(filepath.Dir(h.ws), "proj")
	if err := os.Mkdir(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	ptok, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(h.ws, "ro"), Mode: "r"}}})
	child := h.attenuate(AttenuateRequest{Parent: ptok, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
	if err := os.Remove(proj); err != nil {
		t.Fatal(err)
	}
	symlink(t, h.ws, proj)
	for _, c := range []struct {
		name, script string
	}{
		{"overwrite", "echo by-child > ro/f"},
		{"new file", "echo by-child > ro/g"},
		{"delete", "rm ro/f"},
	} {
		r := h.invoke("proc.exec", with(execArgs("sh", "-c", c.script), "cwd", proj), as(child), key("exec-"+c.name))
		if r.Status == StatusOK || r.TxOutcome == Committed {
			t.Errorf("%s: status %s, outcome %s: the delta was committed", c.name, r.Status, r.TxOutcome)
		}
		if r.Error == nil || !strings.Contains(r.Error.Message, "read-only for a token this one was attenuated from") {
			t.Errorf("%s: error %+v, want the ancestor's read-only root named", c.name, r.Error)
		}
		if got := h.read("ro/f"); got != "original" {
			t.Errorf("%s: ro/f is %q, want it untouched", c.name, got)
		}
		if _, err := os.Lstat(filepath.Join(h.ws, "ro", "g")); !os.IsNotExist(err) {
			t.Errorf("%s: ro/g: %v, want it never written", c.name, err)
		}
	}
	// The same child's command writing beside the read-only root commits.
	r := h.invoke("proc.exec", with(execArgs("sh", "-c", "echo ok > beside.txt"), "cwd", proj), as(child), key("exec-beside"))
	if e := decodeExec(t, r); e.ExitCode != 0 || r.TxOutcome != Committed {
		t.Fatalf("beside: %+v %+v", r, e)
	}
	if got := h.read("beside.txt"); got != "ok\n" {
		t.Errorf("beside.txt is %q", got)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Workspaces are shared by tokens with the same roots; a child held to
// its parent's read-only root does not share one with a child of the
// same roots whose parent has none, whichever calls first.
func TestAncestorReadOnlyWorkspaceNotShared(t *testing.T) {
	h := newHarness(t)
	h.write("ro/f", "original")
	proj := filepath.Join(filepath.Dir(h.ws), "proj")
	if err := os.Mkdir(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	strict, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: filepath.Join(h.ws, "ro"), Mode: "r"}}})
	loose, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
	held := h.attenuate(AttenuateRequest{Parent: strict, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
	free := h.attenuate(AttenuateRequest{Parent: loose, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
	if err := os.Remove(proj); err != nil {
		t.Fatal(err)
	}
	symlink(t, h.ws, proj)
	f := filepath.Join(proj, "ro", "f")
	// The loose parent's child writes there, as its parent may.
	mustOK(t, h.invoke("fs.write", map[string]any{"path": f, "content": "by free"}, as(free), key("free")))
	wantAncestorReadOnly(t, "the held child's write after the free one's", h.invoke("fs.write", map[string]any{"path": f, "content": "by held"}, as(held), key("held")))
	if got := h.read("ro/f"); got != "by free" {
		t.Errorf("ro/f is %q", got)
	}
}

// An ancestor's read-only root must stay where it is for as long as the
// child lives, whatever the child does: attenuation refuses one whose
// path passes a link that dangles (a later target, even one the child
// makes under its own writable root, would move it) or a link lying in a
// writable root of the child (which the child could delete, moving it
// while the parent keeps its directory open). Passing a steady link
// outside the child's roots, it is granted and held at each call.
func TestAncestorReadOnlyUnsteadyLinks(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, base, proj string) (ro string) // the parent's read-only root
		want  string                                            // "" for granted
	}{
		{"through a dangling link", func(t *testing.T, base, proj string) string {
			symlink(t, filepath.Join(proj, "sub"), filepath.Join(base, "l"))
			return filepath.Join(base, "l", "ro")
		}, "leads nowhere yet"},
		{"through a link in the child's writable root", func(t *testing.T, base, proj string) string {
			writeFile(t, filepath.Join(proj, "real", "sub", "ro", "f"), "original")
			symlink(t, "real", filepath.Join(proj, "x"))
			symlink(t, filepath.Join(proj, "x", "sub"), filepath.Join(base, "l"))
			return filepath.Join(base, "l", "ro")
		}, "widens fs"}, // the resolved paths already show it
		// A link leading out of the child's root: no call can remove it.
		{"through a link in the child's writable root, leading out", func(t *testing.T, base, proj string) string {
			writeFile(t, filepath.Join(base, "other", "ro", "f"), "original")
			symlink(t, filepath.Join(base, "other"), filepath.Join(proj, "x"))
			symlink(t, filepath.Join(proj, "x"), filepath.Join(base, "l"))
			return filepath.Join(base, "l", "ro")
		}, ""},
		{"through a link in the child's writable root, dangling", func(t *testing.T, base, proj string) string {
			symlink(t, "real", filepath.Join(proj, "x"))
			symlink(t, filepath.Join(proj, "x", "sub"), filepath.Join(base, "l"))
			return filepath.Join(base, "l", "ro")
		}, "leads nowhere yet"},
		{"through a steady link elsewhere", func(t *testing.T, base, proj string) string {
			writeFile(t, filepath.Join(base, "other", "ro", "f"), "original")
			symlink(t, filepath.Join(base, "other"), filepath.Join(base, "l"))
			return filepath.Join(base, "l", "ro")
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			base := filepath.Dir(h.ws)
			proj := filepath.Join(base, "proj")
			if err := os.Mkdir(proj, 0o755); err != nil {
				t.Fatal(err)
			}
			ro := c.setup(t, base, proj)
			ptok, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"},
				FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}, {Path: ro, Mode: "r"}}})
			child, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: ptok, FS: []captoken.FSRoot{{Path: proj, Mode: "rw"}}})
			if c.want != "" {
				var ae *AttenuateError
				if !errors.As(err, &ae) || ae.Class != ErrScopeDenied || !strings.Contains(ae.Message, c.want) {
					t.Fatalf("Attenuate: %v, want scope_denied: %s", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Granted: the root is held at each call; a write beside it is not.
			as := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = child.Token, child.ID }
			if r := h.invoke("fs.write", map[string]any{"path": filepath.Join(proj, "beside.txt"), "content": "ok"}, as, key(newID())); r.Status != StatusOK {
				t.Fatalf("a write beside: %+v", r.Error)
			}
		})
	}
}

// A ".." after a link climbs from where the link led, as the file system
// follows it: l → w/s/x/../../../other passes w/s/x → a/b, so the
// read-only root l/ro is w/other/ro, and the link x, which a child given
// w/s could remove (it leads into w/s), is on its way: refused, where a
// walk of the link's text, "..", cancelling "x", missed it.
func TestAncestorReadOnlyLinkBeforeDotDot(t *testing.T) {
	h := newHarness(t)
	base := filepath.Dir(h.ws)
	w := filepath.Join(base, "w")
	if err := os.MkdirAll(filepath.Join(w, "s", "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w, "other", "ro", "f"), "original")
	symlink(t, "a/b", filepath.Join(w, "s", "x"))
	symlink(t, w+"/s/x/../../../other", filepath.Join(base, "l")) // not cleaned: the text keeps its ".."
	ptok, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"fs.*"},
		FS: []captoken.FSRoot{{Path: w, Mode: "rw"}, {Path: filepath.Join(w, "s"), Mode: "rw"}, {Path: filepath.Join(base, "l", "ro"), Mode: "r"}}})
	_, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: ptok, FS: []captoken.FSRoot{{Path: filepath.Join(w, "s"), Mode: "rw"}}})
	var ae *AttenuateError
	if !errors.As(err, &ae) || ae.Class != ErrScopeDenied || !strings.Contains(ae.Message, filepath.Join(w, "s", "x")+", which lies in a writable root") {
		t.Fatalf("Attenuate: %v, want scope_denied naming the removable link w/s/x", err)
	}
}

// signChild signs a child of the token ptok granting its tools and the
// roots fs as Attenuate does (bases, parent, ancestors), without
// Attenuate's checks: a child attenuated before a check was added.
func (h *harness) signChild(ptok string, fs []captoken.FSRoot) *MintedToken {
	h.t.Helper()
	parent, err := h.k.VerifyBearer(ptok)
	if err != nil {
		h.t.Fatal(err)
	}
	p := parent.Claims
	roots := make([]captoken.FSRoot, len(fs))
	for i, r := range fs {
		if cover, ok := captoken.CoveringRoot(p.Cap.FS, r); ok {
			r.Base = cover.BaseOrPath()
		}
		roots[i] = r
	}
	tok, c, err := h.k.MintToken(captoken.Claims{Subject: p.Subject, Expiry: p.Expiry, Cap: captoken.Capability{
		Tools: p.Cap.Tools, FS: roots, Parent: p.ID,
		Ancestors: append(slices.Clone(p.Cap.Ancestors), captoken.AsAncestor(p)),
	}})
	if err != nil {
		h.t.Fatal(err)
	}
	return &MintedToken{Token: tok, ID: c.ID, AgentID: c.Subject, Cap: c.Cap}
}
