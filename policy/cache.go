package policy

import (
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// cacheGeneration bounds the decision cache: it holds at most two
// generations of this many decisions.
const cacheGeneration = 4096

// decisionCache remembers the decisions of one engine by input. A decision
// is a function of the input, the bundle's modules and its data, and an
// engine never changes its modules or data (a new bundle is a new engine),
// so the input alone is the key — as long as no rule calls a
// nondeterministic builtin (time.now_ns, http.send, rand.intn, …), which
// Load checks before it makes a cache.
//
// Eviction is by generation, an O(1) approximation of LRU: a hit in the
// old generation moves to the new one; when the new one is full, the old
// one is dropped and the new one becomes old.
type decisionCache struct {
	mu       sync.Mutex
	cur, old map[string]Decision
	hits     uint64 // for tests
}

func newDecisionCache() *decisionCache {
	return &decisionCache{cur: make(map[string]Decision), old: make(map[string]Decision)}
}

// get returns a copy of the decision for key: callers may append to its
// risk basis.
func (c *decisionCache) get(key []byte) (Decision, bool) {
	c.mu.Lock()
	d, ok := c.cur[string(key)]
	if !ok {
		if d, ok = c.old[string(key)]; ok {
			c.putLocked(string(key), d)
		}
	}
	if ok {
		c.hits++
	}
	c.mu.Unlock()
	d.RiskBasis = slices.Clone(d.RiskBasis)
	return d, ok
}

// maxCachedInput is the largest input remembered: larger ones (a command's
// delta of thousands of paths) are decided afresh each time, so that the
// cache's two generations hold at most about 2 × cacheGeneration × 64 KiB.
const maxCachedInput = 64 << 10

func (c *decisionCache) put(key []byte, d Decision) {
	if len(key) > maxCachedInput {
		return
	}
	d.RiskBasis = slices.Clone(d.RiskBasis)
	c.mu.Lock()
	c.putLocked(string(key), d)
	c.mu.Unlock()
}

func (c *decisionCache) putLocked(key string, d Decision) {
	if len(c.cur) >= cacheGeneration {
		c.old, c.cur = c.cur, make(map[string]Decision, cacheGeneration)
	}
	c.cur[key] = d
}

// nondeterministic returns the first nondeterministic builtin (as OPA
// marks them: time.now_ns, http.send, rand.intn, uuid.rfc4122, …) that a
// module calls, or "" when none does. Calls of the bundle's own functions
// are not builtins and are looked through by checking every module.
func nondeterministic(modules []*ast.Module) string {
	found := ""
	check := func(name string) {
		if b, ok := ast.BuiltinMap[name]; ok && b.Nondeterministic && found == "" {
			found = name
		}
	}
	for _, m := range modules {
		ast.WalkTerms(m, func(t *ast.Term) bool {
			if call, ok := t.Value.(ast.Call); ok && len(call) > 0 {
				check(call[0].String())
			}
			return found != ""
		})
		ast.WalkExprs(m, func(e *ast.Expr) bool {
			if e.IsCall() {
				check(e.Operator().String())
			}
			return found != ""
		})
		if found != "" {
			break
		}
	}
	return found
}
