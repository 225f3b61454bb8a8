package kernel

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/captoken"
)

// TestRootsKeepOutOfKernelDirs: no token's root may reach the kernel's
// own directories — one that holds the data dir (a grant of its parent),
// one inside it, one inside the sandbox dir, one reaching it through a
// bind mount: every call on such a root is scope_denied, the admin
// credential and kernel.db unread; a root beside them serves as usual.
func TestRootsKeepOutOfKernelDirs(t *testing.T) {
	h := newHarness(t)
	parent := filepath.Dir(h.data)
	bound := filepath.Join(t.TempDir(), "bound")
	if err := os.MkdirAll(bound, 0o755); err != nil {
		t.Fatal(err)
	}
	mounted := syscall.Mount(h.data, bound, "", syscall.MS_BIND, "") == nil
	if mounted {
		t.Cleanup(func() { syscall.Unmount(bound, syscall.MNT_DETACH) })
	}
	tests := []struct {
		name, root, path string
	}{
		{"a root that holds the data dir", parent, "data/admin.token"},
		{"the data dir", h.data, "admin.token"},
		{"a root inside the data dir", filepath.Join(h.data, "keys"), "receipt.pub"},
		{"a root inside the sandbox dir", filepath.Join(h.data, "sandbox"), "."},
	}
	if mounted {
		tests = append(tests, struct{ name, root, path string }{"the data dir bound elsewhere", bound, "admin.token"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, jti := h.mint("agent-"+strings.ReplaceAll(tt.name, " ", "-"), captoken.Capability{Tools: []string{"fs.read", "fs.list"}, FS: []captoken.FSRoot{{Path: tt.root, Mode: "r"}}})
			for _, tool := range []string{"fs.read", "fs.list"} {
				r := h.invoke(tool, map[string]any{"path": tt.path}, func(e *Envelope) {
					e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "agent-"+strings.ReplaceAll(tt.name, " ", "-"), tok, jti
				})
				if errClass(r) != ErrScopeDenied || !strings.Contains(r.Error.Message, "reaches the kernel's") || strings.Contains(string(r.Result), "ckadmin_") {
					t.Fatalf("%s %s: %+v %s", tool, tt.path, r.Error, r.Result)
				}
			}
		})
	}
	// The policy dir only against writes: a read-only root holding it
	// serves, an rw one is refused.
	pol := filepath.Join(h.ws, "policy")
	if err := os.MkdirAll(pol, 0o755); err != nil {
		t.Fatal(err)
	}
	h.k.private = append(h.k.private, privateDirs(Config{PolicyDir: pol})...)
	for _, mode := range []string{"r", "rw"} {
		_, err := h.k.Mint(TokenRequest{AgentID: "p", Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: mode}}})
		if (err == nil) != (mode == "r") {
			t.Errorf("minting a %s root holding the policy dir: %v", mode, err)
		}
	}
	h.k.private = h.k.private[:len(h.k.private)-1]
	// Minting such a root is refused at once, with the reason.
	if _, err := h.k.Mint(TokenRequest{AgentID: "m", Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: parent, Mode: "r"}}}); err == nil || !strings.Contains(err.Error(), "reaches the kernel's data dir") {
		t.Fatalf("minting a root that holds the data dir: %v", err)
	}
	h.write("beside.txt", "ok")
	if r := h.invoke("fs.read", map[string]any{"path": "beside.txt"}); r.Status != StatusOK {
		t.Fatalf("a root beside the data dir: %+v", r.Error)
	}
}

// TestRootSwappedForKernelDir: a root that passed the check when its
// token's workspace was opened, then was swapped for a link to the data
// dir, is refused to proc.exec, which binds roots by the path as it
// resolves at each run (the workspace's file calls hold the directory
// opened before, by its descriptor).
func TestRootSwappedForKernelDir(t *testing.T) {
	h := newExecHarness(t)
	sub := filepath.Join(h.ws, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	tok, jti := h.mint("b", captoken.Capability{Tools: []string{"fs.list", "proc.exec"}, FS: []captoken.FSRoot{{Path: sub, Mode: "r"}}})
	as := func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "b", tok, jti }
	mustOK(t, h.invoke("fs.list", map[string]any{"path": "."}, as))
	if err := os.Rename(sub, sub+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(h.data, sub); err != nil {
		t.Fatal(err)
	}
	r := h.invoke("proc.exec", execArgs("cat", "admin.token"), key("swapped"), as)
	if errClass(r) != ErrScopeDenied || strings.Contains(string(r.Result), "ckadmin_") {
		t.Fatalf("proc.exec in a root swapped for the data dir: %+v %s", r.Error, r.Result)
	}
}

// TestDataDirInSystemDir: a kernel whose data dir lies in a directory
// every sandboxed run sees whole (here the test's stand-in for /usr, where
// a data dir under /usr/local would be) refuses proc.exec, whatever the
// token's roots: a command read admin.token from /usr with a root
// elsewhere. Other calls go on.
func TestDataDirInSystemDir(t *testing.T) {
	h := newExecHarness(t)
	h.k.systemDirs = []string{filepath.Dir(h.data)}
	r := h.invoke("proc.exec", execArgs("cat", filepath.Join(h.data, "admin.token")), key("read-admin"))
	if errClass(r) != ErrScopeDenied || !strings.Contains(r.Error.Message, "every sandboxed command sees") || strings.Contains(string(r.Result), "ckadmin_") {
		t.Fatalf("proc.exec with the data dir in a system dir: %+v %s", r.Error, r.Result)
	}
	mustOK(t, h.invoke("echo", map[string]any{"text": "x"}))
	// The data dir bound into a system dir from elsewhere is found by its
	// identity there (the sandbox shows mounts below /usr too).
	sys := t.TempDir()
	at := filepath.Join(sys, "local", "bound")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	if syscall.Mount(filepath.Dir(h.data), at, "", syscall.MS_BIND, "") != nil {
		t.Skip("no bind mounts here")
	}
	t.Cleanup(func() { syscall.Unmount(at, syscall.MNT_DETACH) })
	h.k.systemDirs = []string{sys}
	r = h.invoke("proc.exec", execArgs("true"), key("bound"))
	if errClass(r) != ErrScopeDenied || !strings.Contains(r.Error.Message, at) {
		t.Fatalf("proc.exec with the data dir's parent bound into a system dir: %+v", r.Error)
	}
	syscall.Unmount(at, syscall.MNT_DETACH)
	// So is a single file of it bound there.
	file := filepath.Join(sys, "etc-token")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(filepath.Join(h.data, "admin.token"), file, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(file, syscall.MNT_DETACH) })
	r = h.invoke("proc.exec", execArgs("cat", file), key("file bound"))
	if errClass(r) != ErrScopeDenied || strings.Contains(string(r.Result), "ckadmin_") {
		t.Fatalf("proc.exec with admin.token bound into a system dir: %+v %s", r.Error, r.Result)
	}
}

// TestRootHoldsDataDirMount: a root that holds a bind mount of the data
// dir, or of a file in it, reaches it as a root that holds the data dir
// does: refused (its path text compared alone said nothing).
func TestRootHoldsDataDirMount(t *testing.T) {
	h := newHarness(t)
	root := t.TempDir()
	at := filepath.Join(root, "d")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	if syscall.Mount(h.data, at, "", syscall.MS_BIND, "") != nil {
		t.Skip("no bind mounts here")
	}
	t.Cleanup(func() { syscall.Unmount(at, syscall.MNT_DETACH) })
	for _, tc := range []struct{ root, path string }{{root, "d/admin.token"}, {filepath.Join(at, "keys"), "receipt.pub"}} {
		tok, jti := h.mint("m", captoken.Capability{Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: tc.root, Mode: "r"}}})
		r := h.invoke("fs.read", map[string]any{"path": tc.path}, func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "m", tok, jti })
		if errClass(r) != ErrScopeDenied || strings.Contains(string(r.Result), "ckadmin_") {
			t.Fatalf("fs.read of %s through root %s, which holds or lies in a bind mount of the data dir: %+v %s", tc.path, tc.root, r.Error, r.Result)
		}
	}
}
