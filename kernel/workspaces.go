package kernel

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
)

// MaxOpenRoots bounds the workspace roots the kernel holds open at once,
// for calls in flight and cached for later ones together. Each open root
// is two descriptors (syscalls.Workspace), so workspaces hold at most
// 2*MaxOpenRoots of the process's descriptors however many tokens agents
// mint or attenuate. A token's workspace is at most captoken.MaxFSRoots
// roots.
const MaxOpenRoots = 1024

// MaxFamilyRoots bounds the roots of the workspaces one agent family's
// calls in flight hold (a workspace counted once however many of its
// calls hold it): one family holding its share cannot take every open
// root from the others' calls.
const MaxFamilyRoots = MaxOpenRoots / 4

// A workspaceBusyError refuses a call whose workspace would pass
// MaxOpenRoots or MaxFamilyRoots for roots calls in flight hold (run
// reports it as concurrency_exceeded); nothing was opened.
type workspaceBusyError string

func (e workspaceBusyError) Error() string { return string(e) }

// workspaceCache holds opened workspaces by root set (workspaceKey), each
// shared by the calls of every token with that set. A call holds its
// workspace from its first use to the end of the call (acquire, release);
// one no call holds is kept for the next, and closed, least recently
// used first, when a workspace to open would take the roots open past
// limit. It never closes a workspace a call holds.
type workspaceCache struct {
	limit, familyLimit int // MaxOpenRoots and MaxFamilyRoots but in tests

	mu       sync.Mutex
	byKey    map[string]*cachedWorkspace
	idle     list.List // of *cachedWorkspace no call holds, least recently used first
	open     int       // roots of the workspaces in byKey
	families map[string]*familyHolds
}

// cachedWorkspace is one entry of a workspaceCache.
type cachedWorkspace struct {
	key   string
	roots int           // the roots it opens (counted in open)
	ready chan struct{} // closed once w or err is set
	w     *syscalls.Workspace
	err   error

	users int           // calls holding it (under the cache's mu)
	elem  *list.Element // its place in idle when users is 0
}

// familyHolds are the workspaces an agent family's calls hold.
type familyHolds struct {
	roots int            // of the workspaces in calls
	calls map[string]int // calls holding each, by key
}

// workspaceHold is one call's hold of a workspace (acquire).
type workspaceHold struct {
	e      *cachedWorkspace
	family string
}

func newWorkspaceCache(limit, familyLimit int) *workspaceCache {
	return &workspaceCache{limit: limit, familyLimit: familyLimit, byKey: map[string]*cachedWorkspace{}, families: map[string]*familyHolds{}}
}

// acquire returns the workspace of key, holding it for a call of agent
// family family until release, opening it with open (roots being its
// number of roots) if no entry has it. Opening happens outside the
// cache's lock: a slow file system delays the calls needing that
// workspace, not every call. It returns a workspaceBusyError, and opens
// nothing, when the family's calls would hold more than familyLimit roots,
// or when roots more would pass limit even with every idle workspace
// closed.
func (c *workspaceCache) acquire(family, key string, roots int, open func() (*syscalls.Workspace, error)) (*workspaceHold, error) {
	c.mu.Lock()
	fam := c.families[family]
	if fam == nil {
		fam = &familyHolds{calls: map[string]int{}}
	}
	if fam.calls[key] == 0 && fam.roots+roots > c.familyLimit {
		c.mu.Unlock()
		return nil, workspaceBusyError(fmt.Sprintf("the calls in flight of agent %s and its sub-agents hold workspaces of %d roots; with this one's %d they would pass the limit of %d: try again when they are done", family, fam.roots, roots, c.familyLimit))
	}
	e, cached := c.byKey[key]
	var evicted []*syscalls.Workspace
	if cached {
		e.users++
		if e.elem != nil {
			c.idle.Remove(e.elem)
			e.elem = nil
		}
	} else {
		for c.open+roots > c.limit && c.idle.Len() > 0 {
			old := c.idle.Remove(c.idle.Front()).(*cachedWorkspace)
			delete(c.byKey, old.key)
			c.open -= old.roots
			evicted = append(evicted, old.w)
		}
		if c.open+roots > c.limit {
			c.mu.Unlock()
			closeAll(evicted)
			return nil, workspaceBusyError(fmt.Sprintf("calls in flight hold workspaces of %d roots; with this one's %d they would pass the kernel's limit of %d: try again when they are done", c.open, roots, c.limit))
		}
		e = &cachedWorkspace{key: key, roots: roots, ready: make(chan struct{}), users: 1}
		c.byKey[key] = e
		c.open += roots
	}
	if fam.calls[key]++; fam.calls[key] == 1 {
		fam.roots += roots
	}
	c.families[family] = fam
	c.mu.Unlock()
	closeAll(evicted)

	h := &workspaceHold{e: e, family: family}
	if cached {
		<-e.ready
	} else {
		e.w, e.err = open()
		if e.err != nil {
			// Not kept: the next call opens it again (a root may be
			// made meanwhile). Calls waiting for it see the error.
			c.mu.Lock()
			delete(c.byKey, key)
			c.open -= roots
			c.mu.Unlock()
		}
		close(e.ready)
	}
	if e.err != nil {
		c.release(h)
		return nil, e.err
	}
	return h, nil
}

// release ends the hold h (acquire). Once no call holds its workspace, it
// is the most recently used idle one.
func (c *workspaceCache) release(h *workspaceHold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := h.e
	if fam := c.families[h.family]; fam != nil {
		if fam.calls[e.key]--; fam.calls[e.key] <= 0 {
			delete(fam.calls, e.key)
			fam.roots -= e.roots
		}
		if len(fam.calls) == 0 {
			delete(c.families, h.family)
		}
	}
	if e.users--; e.users == 0 && e.err == nil && c.byKey[e.key] == e {
		e.elem = c.idle.PushBack(e)
	}
}

// openRoots returns how many roots the cache holds open.
func (c *workspaceCache) openRoots() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// close closes every workspace, held or not; no call may be in flight.
func (c *workspaceCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.byKey {
		if e.w != nil {
			e.w.Close()
		}
		delete(c.byKey, key)
	}
	c.idle.Init()
	c.open = 0
}

func closeAll(ws []*syscalls.Workspace) {
	for _, w := range ws {
		w.Close()
	}
}

// workspaceRoots returns the roots of tok's workspace: its fs roots in
// order, each (path, base) once, the first of a path named twice kept.
// The workspace resolves a path in the first of its roots with that path
// (syscalls.Workspace.Resolve), so a later copy changed nothing but the
// descriptors it took; tokens minted now cannot name a path twice
// (captoken.Mint), ones minted before may.
func workspaceRoots(tok *captoken.Token) []syscalls.RootSpec {
	fsr := tok.Claims.Cap.FS
	roots := make([]syscalls.RootSpec, 0, len(fsr))
	for i, r := range fsr {
		dup := false
		for _, q := range fsr[:i] {
			if q.Path == r.Path && q.Base == r.Base {
				dup = true
				break
			}
		}
		if !dup {
			roots = append(roots, syscalls.RootSpec{Path: r.Path, Writable: r.Mode == "rw", Base: r.Base})
		}
	}
	return roots
}

// workspaceKey returns the cache key of a workspace of roots for a token
// with ancestors as: the roots in order (the first takes relative paths)
// and the ancestors' roots the workspace holds it to (appendAncestorsKey).
func workspaceKey(roots []syscalls.RootSpec, as []captoken.Ancestor) string {
	key := make([]byte, 0, 256)
	for _, r := range roots {
		mode := "r"
		if r.Writable {
			mode = "rw"
		}
		key = append(append(append(append(append(append(key, mode...), 0), r.Path...), 0), r.Base...), 0)
	}
	return string(appendAncestorsKey(key, as))
}

// workspace returns the opened roots of c's token's fs scopes, holding it
// to its ancestors' read-only paths (ancestorRoots), shared by every token
// with the same roots and ancestors' roots. The call holds it from its
// first use until releaseWorkspace, which run defers: the resources it
// resolved point into it.
func (k *Kernel) workspace(c *call) (*syscalls.Workspace, error) {
	if c.ws != nil {
		return c.ws.e.w, nil
	}
	tok := c.token
	if len(tok.Claims.Cap.FS) == 0 {
		return nil, &syscalls.ScopeError{Reason: "the capability token grants no file system roots"}
	}
	roots := workspaceRoots(tok)
	if len(roots) > captoken.MaxFSRoots {
		// A token signed before Mint bounded its roots.
		return nil, &syscalls.ScopeError{Reason: fmt.Sprintf("the capability token grants %d fs roots; the kernel opens at most %d for a token", len(roots), captoken.MaxFSRoots)}
	}
	h, err := k.workspaces.acquire(agentFamily(c.env.AgentID), workspaceKey(roots, tok.Claims.Cap.Ancestors), len(roots), func() (*syscalls.Workspace, error) {
		if err := k.checkRoots(roots); err != nil {
			return nil, err
		}
		w, err := syscalls.OpenAttenuatedWorkspace(roots, ancestorRoots(tok.Claims.Cap.Ancestors))
		if err != nil {
			return nil, &syscalls.ScopeError{Reason: err.Error()}
		}
		return w, nil
	})
	if err != nil {
		return nil, err
	}
	c.ws = h
	return h.e.w, nil
}

// releaseWorkspace ends c's hold of its workspace, if it took one.
func (k *Kernel) releaseWorkspace(c *call) {
	if c.ws != nil {
		k.workspaces.release(c.ws)
		c.ws = nil
	}
}
