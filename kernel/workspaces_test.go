package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
)

// errText returns r's error class and message, or "".
func errText(r *Result) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Class + ": " + r.Error.Message
}

// openFDs returns how many descriptors the process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count open descriptors: %v", err)
	}
	return len(ents)
}

// One agent attenuating many children, each with many roots in its own
// modes, and calling with each, holds no more descriptors in the kernel
// than MaxOpenRoots allows, and another agent's reads and writes go on
// (rev14 finding 1: the workspace cache kept every child's roots open
// until the process ran out of descriptors).
func TestWorkspaceDescriptorsBounded(t *testing.T) {
	h := newHarness(t)
	const roots = captoken.MaxFSRoots
	for j := range roots {
		h.write(fmt.Sprintf("d%02d/f.txt", j), "x")
	}
	victimWS := t.TempDir()
	if err := os.WriteFile(filepath.Join(victimWS, "v.txt"), []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	vtok, vjti := h.mint("victim", captoken.Capability{Tools: []string{"fs.read", "fs.write"}, FS: []captoken.FSRoot{{Path: victimWS, Mode: "rw"}}})
	asVictim := func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "victim", vtok, vjti }
	victim := func(round string) {
		t.Helper()
		if r := h.k.Invoke(context.Background(), h.env("fs.read", map[string]any{"path": "v.txt"}, asVictim)); r.Status != StatusOK {
			t.Fatalf("%s: victim fs.read: %s", round, errText(r))
		}
		if r := h.k.Invoke(context.Background(), h.env("fs.write", map[string]any{"path": "w.txt", "content": round}, asVictim, key("w-"+round))); r.Status != StatusOK {
			t.Fatalf("%s: victim fs.write: %s", round, errText(r))
		}
	}
	victim("before")
	before := openFDs(t)

	// Enough children that their roots, kept open, would be three times
	// the bound.
	kids := 3*MaxOpenRoots/roots + 1
	for i := range kids {
		var fs []captoken.FSRoot
		for j := range roots {
			mode := "r"
			if (i+j)%3 == 0 {
				mode = "rw"
			}
			fs = append(fs, captoken.FSRoot{Path: filepath.Join(h.ws, fmt.Sprintf("d%02d", (i+j)%roots)), Mode: mode})
		}
		m, err := h.k.Attenuate(context.Background(), AttenuateRequest{Parent: h.token, AgentID: fmt.Sprintf("%s/c%d", h.agent, i), Tools: []string{"fs.read"}, FS: fs})
		if err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		r := h.k.Invoke(context.Background(), h.env("fs.read", map[string]any{"path": "f.txt"}, func(e *Envelope) {
			e.AgentID, e.CapabilityToken, e.CapabilityTokenID = m.AgentID, m.Token, m.ID
		}))
		if r.Status != StatusOK {
			t.Fatalf("child %d fs.read: %s", i, errText(r))
		}
	}
	t.Logf("%d children of %d roots each: open descriptors %d -> %d", kids, roots, before, openFDs(t))
	// A few descriptors of slack for the rest of the process (bbolt's
	// remaps, the syncer's file systems).
	if got, bound := openFDs(t)-before, 2*MaxOpenRoots+16; got > bound {
		t.Errorf("after %d children of %d roots each the process holds %d descriptors more than before; want at most %d", kids, roots, got, bound)
	}
	if n := h.k.workspaces.openRoots(); n > MaxOpenRoots {
		t.Errorf("the kernel holds %d workspace roots open; the limit is %d", n, MaxOpenRoots)
	}
	victim("after")
}

// A path named twice in a token's roots is refused at mint and at
// attenuation, and more roots than captoken.MaxFSRoots too.
func TestDuplicateRootsRefused(t *testing.T) {
	h := newHarness(t)
	sub := filepath.Join(h.ws, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	many := make([]captoken.FSRoot, captoken.MaxFSRoots+1)
	for i := range many {
		d := filepath.Join(h.ws, fmt.Sprintf("m%d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		many[i] = captoken.FSRoot{Path: d, Mode: "r"}
	}
	for _, tc := range []struct {
		name string
		fs   []captoken.FSRoot
		want string
	}{
		{"same path, same mode", []captoken.FSRoot{{Path: sub, Mode: "r"}, {Path: sub, Mode: "r"}}, "names " + sub + ", as cap.fs[0] does"},
		{"same path, other mode", []captoken.FSRoot{{Path: h.ws, Mode: "r"}, {Path: sub, Mode: "rw"}, {Path: h.ws, Mode: "rw"}}, "cap.fs[2] names " + h.ws},
		{"too many roots", many, fmt.Sprintf("holds %d roots; the limit is %d", captoken.MaxFSRoots+1, captoken.MaxFSRoots)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.k.Mint(TokenRequest{AgentID: "a2", Tools: []string{"fs.read"}, FS: tc.fs})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("mint: %v; want an error saying %q", err, tc.want)
			}
			_, err = h.k.Attenuate(context.Background(), AttenuateRequest{Parent: h.token, Tools: []string{"fs.read"}, FS: tc.fs})
			var ae *AttenuateError
			if !errors.As(err, &ae) || ae.Class != ErrInvalidArgs || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("attenuate: %v; want invalid_args saying %q", err, tc.want)
			}
		})
	}
}

// A call refused for its policy hash opens no workspace.
func TestPolicyMismatchOpensNoWorkspace(t *testing.T) {
	h := newHarness(t)
	h.write("f.txt", "x")
	r := h.k.Invoke(context.Background(), h.env("fs.read", map[string]any{"path": "f.txt"}, func(e *Envelope) { e.PolicyHash = "sha256:0" }))
	if r.Error == nil || r.Error.Class != ErrPolicyMismatch {
		t.Fatalf("call with another policy hash: %s; want policy_mismatch", errText(r))
	}
	if n := h.k.workspaces.openRoots(); n != 0 {
		t.Errorf("%d workspace roots open after a call refused policy_mismatch; want 0", n)
	}
}

// The cache closes idle workspaces, least recently used first, to open
// another within its limit; never one a call holds: when those fill the
// limit, a workspace to open is refused (workspaceBusyError).
func TestWorkspaceCacheEviction(t *testing.T) {
	dir := t.TempDir()
	opened := map[string]*syscalls.Workspace{}
	open := func(name string) func() (*syscalls.Workspace, error) {
		return func() (*syscalls.Workspace, error) {
			w, err := syscalls.OpenWorkspace([]syscalls.RootSpec{{Path: dir}, {Path: dir}})
			opened[name] = w
			return w, err
		}
	}
	usable := func(name string) bool {
		_, err := opened[name].Resolve(".", syscalls.AccessList)
		return err == nil
	}
	c := newWorkspaceCache(6, 100) // three workspaces of two roots
	defer c.close()
	acquire := func(key, name string) (workspaceHold, error) { return c.acquire("agent", []byte(key), 2, open(name)) }
	held, err := acquire("a", "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "c"} {
		h, err := acquire(name, name)
		if err != nil {
			t.Fatal(err)
		}
		c.release(h)
	}
	// c is used again: b is the least recently used idle workspace.
	h, err := acquire("c", "c-again")
	if err != nil || opened["c-again"] != nil {
		t.Fatalf("acquire of a cached workspace: %v, opened again: %v", err, opened["c-again"] != nil)
	}
	c.release(h)
	d, err := acquire("d", "d")
	if err != nil {
		t.Fatal(err)
	}
	if usable("b") || !usable("a") || !usable("c") || !usable("d") {
		t.Errorf("after d: usable a %v, b %v, c %v, d %v; want b alone closed", usable("a"), usable("b"), usable("c"), usable("d"))
	}
	e, err := acquire("e", "e") // closes c, the one idle
	if err != nil {
		t.Fatal(err)
	}
	var busy workspaceBusyError
	if _, err := acquire("f", "f"); !errors.As(err, &busy) || opened["f"] != nil {
		t.Errorf("acquire past the limit with every workspace held: %v (opened %v); want a workspaceBusyError, nothing opened", err, opened["f"] != nil)
	}
	if !usable("a") || usable("c") || !usable("d") || !usable("e") {
		t.Errorf("held workspaces: usable a %v, d %v, e %v; idle c %v (want closed)", usable("a"), usable("d"), usable("e"), usable("c"))
	}
	if n := c.openRoots(); n != 6 {
		t.Errorf("%d roots open; want 6", n)
	}
	for _, h := range []workspaceHold{held, d, e} {
		c.release(h)
	}
	if _, err := acquire("f", "f"); err != nil {
		t.Errorf("acquire once workspaces are released: %v", err)
	}
}

// An agent family's calls hold workspaces of at most familyLimit roots,
// a workspace counted once however many of its calls hold it; another
// family's calls are not refused for them.
func TestWorkspaceCacheFamilyLimit(t *testing.T) {
	dir := t.TempDir()
	open := func() (*syscalls.Workspace, error) {
		return syscalls.OpenWorkspace([]syscalls.RootSpec{{Path: dir}, {Path: dir}})
	}
	c := newWorkspaceCache(100, 4) // two workspaces of two roots a family
	defer c.close()
	var busy workspaceBusyError
	for _, step := range []struct {
		family, key string
		busy        bool
	}{
		{"a1", "w1", false},
		{"a1", "w1", false}, // held already: counted once
		{"a1", "w2", false},
		{"a1", "w3", true},
		{"a1", "w2", false},
		{"b1", "w3", false},
		{"b1", "w1", false}, // a1 holds it too: b1's share
		{"b1", "w2", true},
	} {
		_, err := c.acquire(step.family, []byte(step.key), 2, open)
		if got := errors.As(err, &busy); got != step.busy || (err != nil && !got) {
			t.Errorf("%s acquires %s: %v; want busy %v", step.family, step.key, err, step.busy)
		}
	}
}

// Calls acquiring and releasing workspaces at once, more of them than the
// limits hold, always use an open one: the cache closes none a call holds
// and keeps its roots within the limit.
func TestWorkspaceCacheConcurrent(t *testing.T) {
	dir := t.TempDir()
	c := newWorkspaceCache(6, 4) // three workspaces of two roots, two a family
	defer c.close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				name := fmt.Sprintf("w%d", (g+i)%5)
				h, err := c.acquire(fmt.Sprintf("a%d", g%2), []byte(name), 2, func() (*syscalls.Workspace, error) {
					return syscalls.OpenWorkspace([]syscalls.RootSpec{{Path: dir}, {Path: dir}})
				})
				var busy workspaceBusyError
				if errors.As(err, &busy) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				if _, err := h.e.w.Resolve(".", syscalls.AccessList); err != nil {
					errs <- fmt.Errorf("%s, held: %w", name, err)
				}
				if n := c.openRoots(); n > 6 {
					errs <- fmt.Errorf("%d roots open; the limit is 6", n)
				}
				c.release(h)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A token signed before Mint refused repeated roots opens each (path,
// base) once, the first naming it counting, as the workspace resolved
// it; the key tells apart only what changes the workspace.
func TestWorkspaceKeyRepeatedRoots(t *testing.T) {
	tok := func(fs ...captoken.FSRoot) *captoken.Token {
		return &captoken.Token{Claims: captoken.Claims{Cap: captoken.Capability{FS: fs}}}
	}
	ws, sub := captoken.FSRoot{Path: "/w", Mode: "r"}, captoken.FSRoot{Path: "/w/s", Mode: "rw", Base: "/w"}
	wsRW, subR := captoken.FSRoot{Path: "/w", Mode: "rw"}, captoken.FSRoot{Path: "/w/s", Mode: "r", Base: "/w"}
	subOther := captoken.FSRoot{Path: "/w/s", Mode: "rw", Base: "/w/s"}
	key := func(tk *captoken.Token) string {
		k, n := appendWorkspaceKey(nil, tk)
		if roots := workspaceRoots(tk); len(roots) != n {
			t.Errorf("%v: key counts %d roots, the workspace opens %d", tk.Claims.Cap.FS, n, len(roots))
		}
		return string(k)
	}
	for _, tc := range []struct {
		name string
		a, b *captoken.Token
		same bool
	}{
		{"repeats dropped", tok(ws, sub, wsRW, subR, ws), tok(ws, sub), true},
		{"the first of a path counts", tok(wsRW, ws), tok(ws, wsRW), false},
		{"order kept", tok(ws, sub), tok(sub, ws), false},
		{"another base kept", tok(sub, subOther), tok(sub), false},
	} {
		if got := key(tc.a) == key(tc.b); got != tc.same {
			t.Errorf("%s: keys of %v and %v equal %v; want %v", tc.name, tc.a.Claims.Cap.FS, tc.b.Claims.Cap.FS, got, tc.same)
		}
	}
	if roots := workspaceRoots(tok(ws, sub, wsRW, subR, ws)); len(roots) != 2 || roots[0].Writable || !roots[1].Writable {
		t.Errorf("roots of a token repeating both: %+v; want /w read-only, /w/s writable", roots)
	}
}

// openRoots returns how many roots the cache holds open.
func (c *workspaceCache) openRoots() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}
