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

// workspaceCache holds opened workspaces by root set (appendWorkspaceKey), each
// shared by the calls of every token with that set. A call holds its
// workspace from its first use to the end of the call (acquire, release);
// one no call holds is kept for the next, and closed, least recently
// used first, when a workspace to open would take the roots open past
// limit. It never closes a workspace a call holds.
type workspaceCache struct {
	limit, familyLimit int // MaxOpenRoots and MaxFamilyRoots but in tests
	// closing runs before the cache closes a workspace (the kernel's
	// Syncer forgets its roots); nil for none.
	closing func(*syscalls.Workspace)

	mu          sync.Mutex
	byKey       map[string]*cachedWorkspace
	idle        list.List             // of *cachedWorkspace no call holds, least recently used first
	open        int                   // roots of the workspaces in byKey
	familyRoots map[string]int        // roots of the workspaces each agent family's calls hold
	familyCalls map[workspaceHold]int // calls holding each (family, workspace)
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

// workspaceHold is one call's hold of a workspace (acquire); the zero
// value holds none.
type workspaceHold struct {
	e      *cachedWorkspace
	family string
}

func newWorkspaceCache(limit, familyLimit int) *workspaceCache {
	return &workspaceCache{limit: limit, familyLimit: familyLimit, byKey: map[string]*cachedWorkspace{},
		familyRoots: map[string]int{}, familyCalls: map[workspaceHold]int{}}
}

// acquire returns the workspace of key, holding it for a call of agent
// family family until release, opening it with open (roots being its
// number of roots) if no entry has it. Opening happens outside the
// cache's lock: a slow file system delays the calls needing that
// workspace, not every call. It returns a workspaceBusyError, and opens
// nothing, when the family's calls would hold more than familyLimit roots,
// or when roots more would pass limit even with every idle workspace
// closed.
func (c *workspaceCache) acquire(family string, key []byte, roots int, open func() (*syscalls.Workspace, error)) (workspaceHold, error) {
	c.mu.Lock()
	e, cached := c.byKey[string(key)]
	if (!cached || c.familyCalls[workspaceHold{e, family}] == 0) && c.familyRoots[family]+roots > c.familyLimit {
		err := workspaceBusyError(fmt.Sprintf("the calls in flight of agent %s and its sub-agents hold workspaces of %d roots; with this one's %d they would pass the limit of %d: try again when they are done", family, c.familyRoots[family], roots, c.familyLimit))
		c.mu.Unlock()
		return workspaceHold{}, err
	}
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
			err := workspaceBusyError(fmt.Sprintf("calls in flight hold workspaces of %d roots; with this one's %d they would pass the kernel's limit of %d: try again when they are done", c.open, roots, c.limit))
			c.mu.Unlock()
			c.closeAll(evicted)
			return workspaceHold{}, err
		}
		e = &cachedWorkspace{key: string(key), roots: roots, ready: make(chan struct{}), users: 1}
		c.byKey[e.key] = e
		c.open += roots
	}
	h := workspaceHold{e, family}
	if c.familyCalls[h]++; c.familyCalls[h] == 1 {
		c.familyRoots[family] += roots
	}
	c.mu.Unlock()
	c.closeAll(evicted)

	if cached {
		<-e.ready
	} else {
		e.w, e.err = open()
		if e.err != nil {
			// Not kept: the next call opens it again (a root may be
			// made meanwhile). Calls waiting for it see the error.
			c.mu.Lock()
			delete(c.byKey, e.key)
			c.open -= roots
			c.mu.Unlock()
		}
		close(e.ready)
	}
	if e.err != nil {
		c.release(h)
		return workspaceHold{}, e.err
	}
	return h, nil
}

// release ends the hold h (acquire). Once no call holds its workspace, it
// is the most recently used idle one.
func (c *workspaceCache) release(h workspaceHold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := h.e
	if c.familyCalls[h]--; c.familyCalls[h] == 0 {
		delete(c.familyCalls, h)
		if c.familyRoots[h.family] -= e.roots; c.familyRoots[h.family] == 0 {
			delete(c.familyRoots, h.family)
		}
	}
	if e.users--; e.users == 0 && e.err == nil && c.byKey[e.key] == e {
		e.elem = c.idle.PushBack(e)
	}
}

// close closes every workspace, held or not; no call may be in flight.
func (c *workspaceCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.byKey {
		if e.w != nil {
			c.closeAll([]*syscalls.Workspace{e.w})
		}
		delete(c.byKey, key)
	}
	c.idle.Init()
	c.open = 0
}

// closeAll closes ws: workspaces evicted, closed outside the cache's lock.
func (c *workspaceCache) closeAll(ws []*syscalls.Workspace) {
	for _, w := range ws {
		if c.closing != nil {
			c.closing(w)
		}
		w.Close()
	}
}

// workspaceRoots returns the roots of tok's workspace: its fs roots in
// order, each (path, base) once, the first of a path named twice kept
// (repeated). The workspace resolves a path in the first of its roots
// with that path (syscalls.Workspace.Resolve), so a later copy changed
// nothing but the descriptors it took; tokens minted now cannot name a
// path twice (captoken.Mint), ones minted before may.
func workspaceRoots(tok *captoken.Token) []syscalls.RootSpec {
	fsr := tok.Claims.Cap.FS
	roots := make([]syscalls.RootSpec, 0, len(fsr))
	for i, r := range fsr {
		if !repeated(fsr, i) {
			roots = append(roots, syscalls.RootSpec{Path: r.Path, Writable: r.Mode == "rw", Base: r.Base})
		}
	}
	return roots
}

// repeated reports whether a root before fsr[i] has its path and base.
func repeated(fsr []captoken.FSRoot, i int) bool {
	for _, q := range fsr[:i] {
		if q.Path == fsr[i].Path && q.Base == fsr[i].Base {
			return true
		}
	}
	return false
}

// appendWorkspaceKey appends to key the cache key of tok's workspace and
// returns it with the number of its roots (workspaceRoots): the roots in
// order (the first takes relative paths) and the ancestors' roots the
// workspace holds it to (appendAncestorsKey).
func appendWorkspaceKey(key []byte, tok *captoken.Token) ([]byte, int) {
	fsr, n := tok.Claims.Cap.FS, 0
	for i, r := range fsr {
		if !repeated(fsr, i) {
			key = append(append(append(append(append(append(key, r.Mode...), 0), r.Path...), 0), r.Base...), 0)
			n++
		}
	}
	return appendAncestorsKey(key, tok.Claims.Cap.Ancestors), n
}

// workspace returns the opened roots of c's token's fs scopes, holding it
// to its ancestors' read-only paths (ancestorRoots), shared by every token
// with the same roots and ancestors' roots. The call holds it from its
// first use until releaseWorkspace, which run defers: the resources it
// resolved point into it.
func (k *Kernel) workspace(c *call) (*syscalls.Workspace, error) {
	if c.ws.e != nil {
		return c.ws.e.w, nil
	}
	tok := c.token
	if len(tok.Claims.Cap.FS) == 0 {
		return nil, &syscalls.ScopeError{Reason: "the capability token grants no file system roots"}
	}
	if len(tok.Claims.Cap.FS) > captoken.MaxFSRoots {
		// A token signed before Mint bounded its roots (repeats
		// aside, which it had no reason to make).
		return nil, &syscalls.ScopeError{Reason: fmt.Sprintf("the capability token grants %d fs roots; the kernel opens at most %d for a token", len(tok.Claims.Cap.FS), captoken.MaxFSRoots)}
	}
	// The key is built on the stack; the cache's lookup of it does not
	// allocate.
	key, n := appendWorkspaceKey(make([]byte, 0, 256), tok)
	h, err := k.workspaces.acquire(agentFamily(c.env.AgentID), key, n, func() (*syscalls.Workspace, error) {
		roots := workspaceRoots(tok)
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
	if c.ws.e != nil {
		k.workspaces.release(c.ws)
		c.ws = workspaceHold{}
	}
}
