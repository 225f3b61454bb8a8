package captoken

import (
	"fmt"
	"slices"
	"strings"
)

// MaxChainDepth bounds how many attenuations separate a token from its
// root token: a root has depth 0, its child 1. Verification cost and
// token size grow with depth (every ancestor's revocation is checked, and
// its budgets travel in the token).
const MaxChainDepth = 8

// Ancestor is a token a token was attenuated from, as the attenuated token
// carries it: its jti, so that revoking it revokes the descendant, and its
// budget limits, so that a descendant's use is charged to it too. Both are
// fixed when the ancestor is minted, so carrying them is exact.
type Ancestor struct {
	ID      string           `json:"jti"`
	Budgets map[string]int64 `json:"budgets,omitempty"`
}

// A WideningError says how a child capability would grant more than its
// parent: Field names the claim ("tools", "fs", "net", "budgets",
// "autonomy", "exp", "nbf", "role", "ancestors").
type WideningError struct {
	Field  string
	Reason string
}

func (e *WideningError) Error() string {
	return fmt.Sprintf("captoken: attenuation widens %s: %s", e.Field, e.Reason)
}

func widens(field, format string, a ...any) error {
	return &WideningError{Field: field, Reason: fmt.Sprintf(format, a...)}
}

// Narrows reports whether child grants nothing parent does not: every
// tool pattern of child is covered by one of parent's; every fs root lies
// inside a parent root that is its base, and no path is writable for
// child that is read-only for parent (fsWidening); every net pattern is covered
// by one of parent's; every kv scope lies inside a parent scope of at
// least its mode; every budget parent limits is limited in child, no
// higher; child's autonomy ceiling is at least as strict; child's validity
// window lies inside parent's; neither is an approver token; and child
// names parent as its last ancestor, within MaxChainDepth; and child's
// agent is parent's or one of its sub-agents (SubAgent). The error is a
// *WideningError for the first widening found.
func Narrows(parent, child Claims) error {
	p, c := parent.Cap, child.Cap
	if p.Role != "" || c.Role != "" {
		return widens("role", "approver tokens cannot be attenuated or be attenuations")
	}
	if !SubAgent(parent.Subject, child.Subject) {
		return widens("sub", "%q is neither the parent's agent %q nor one of its sub-agents (%q)", child.Subject, parent.Subject, parent.Subject+"/…")
	}
	for _, t := range c.Tools {
		if !coversTool(p.Tools, t) {
			return widens("tools", "%q is not within the parent's tools %q", t, p.Tools)
		}
	}
	if why := fsWidening(p.FS, c.FS); why != "" {
		return widens("fs", "%s", why)
	}
	for _, n := range c.Net {
		ok, err := coversHost(p.Net, n)
		if err != nil {
			return widens("net", "%v", err)
		}
		if !ok {
			return widens("net", "%q is not within the parent's net patterns %q", n, p.Net)
		}
	}
	for _, k := range c.KV {
		if !coversKeys(p.KV, k) {
			return widens("kv", "%s:%s is not within a parent kv scope of that mode (%v)", k.Keys, k.Mode, p.KV)
		}
	}
	for name, limit := range p.Budgets {
		v, ok := c.Budgets[name]
		switch {
		case !ok:
			return widens("budgets", "%s is limited to %d in the parent and unlimited in the child", name, limit)
		case v > limit:
			return widens("budgets", "%s %d is beyond the parent's %d", name, v, limit)
		}
	}
	if p.Handles && !c.Handles {
		return widens("handles", "the parent calls tools only by handle; the child must too")
	}
	if strictness(c.Autonomy) < strictness(p.Autonomy) {
		return widens("autonomy", "%q is more autonomous than the parent's ceiling %q", c.Autonomy, orAutopilot(p.Autonomy))
	}
	if child.Expiry.After(parent.Expiry) {
		return widens("exp", "%s is after the parent's expiry %s", child.Expiry.UTC(), parent.Expiry.UTC())
	}
	if child.NotBefore.Before(parent.NotBefore) {
		return widens("nbf", "%s is before the parent's not-before %s", child.NotBefore.UTC(), parent.NotBefore.UTC())
	}
	n := len(c.Ancestors)
	switch {
	case n == 0 || c.Ancestors[n-1].ID != parent.ID || c.Parent != parent.ID:
		return widens("ancestors", "the child does not name %q as its parent", parent.ID)
	case n > MaxChainDepth:
		return widens("ancestors", "a chain of %d attenuations exceeds the limit of %d", n, MaxChainDepth)
	case n != len(p.Ancestors)+1:
		return widens("ancestors", "the child's chain is not the parent's chain plus the parent")
	}
	for i, a := range p.Ancestors {
		if c.Ancestors[i].ID != a.ID {
			return widens("ancestors", "the child's ancestor %d is %q, the parent's is %q", i, c.Ancestors[i].ID, a.ID)
		}
	}
	return nil
}

// SubAgent reports whether agent id child may be given an attenuation of
// a token of agent parent: it is parent itself or lies in parent's
// namespace, "parent/name" at any depth, no name empty. A child of another id would speak
// for that agent: read its history in full, replay its idempotency keys,
// cancel its calls.
func SubAgent(parent, child string) bool {
	name, ok := strings.CutPrefix(child, parent+"/")
	return child == parent || (ok && !slices.Contains(strings.Split(name, "/"), ""))
}

// coversTool reports whether a pattern of ps matches every id pattern t
// matches.
func coversTool(ps []string, t string) bool {
	tPrefix, tWild := strings.CutSuffix(t, "*")
	for _, p := range ps {
		switch {
		case p == "*" || p == t:
			return true
		case t == "*":
			continue
		}
		prefix, wild := strings.CutSuffix(p, "*")
		if !wild {
			continue
		}
		// p is "x.*": it covers the id "x.y…" and the pattern "x.y.*".
		if tWild && len(tPrefix) > len(prefix) && strings.HasPrefix(tPrefix, prefix) {
			return true
		}
		if !tWild && len(t) > len(prefix) && strings.HasPrefix(t, prefix) {
			return true
		}
	}
	return false
}

// fsWidening says how roots cs grant a path more than roots ps, or
// returns "". Each root of cs must lie inside a root of ps that is its
// base (see FSRoot.Base). A token's mode at a path is that of the deepest
// of its roots holding the path: a read-only root inside a writable one
// keeps its files read-only (syscalls.Workspace refuses writes by the
// innermost root). Either token's mode changes only at a root's path, so
// comparing the two at every root path of either, where cs grants
// anything, compares them at every path: a child's rw root over the
// parent's read-only one inside it (or over the root holding it) is
// refused unless the child keeps that root read-only too.
func fsWidening(ps, cs []FSRoot) string {
	for _, r := range cs {
		if !slices.ContainsFunc(ps, func(p FSRoot) bool { return within(r.Path, p.Path) && r.Base == p.BaseOrPath() }) {
			return fmt.Sprintf("%s:%s (base %q) is not within a parent root of that base (%v)", r.Path, r.Mode, r.Base, ps)
		}
	}
	return modeWidening(ps, cs)
}

// WritableWidening is Narrows' test of fs modes alone (see fsWidening):
// a *WideningError naming a path roots cs make writable that roots ps
// keep read-only, or nil. The kernel runs it again on the roots' real
// paths, links resolved, since a root's path may pass a link that puts
// a read-only root below another that its spelling does not contain.
func WritableWidening(ps, cs []FSRoot) error {
	if why := modeWidening(ps, cs); why != "" {
		return widens("fs", "%s", why)
	}
	return nil
}

// modeWidening is fsWidening's comparison of the two tokens' modes at
// every root path of either.
func modeWidening(ps, cs []FSRoot) string {
	for _, roots := range [][]FSRoot{cs, ps} {
		for _, z := range roots {
			c, ok := deepestRoot(cs, z.Path, "rw")
			if !ok || c.Mode != "rw" {
				continue
			}
			if p, _ := deepestRoot(ps, z.Path, "r"); p.Mode != "rw" {
				return fmt.Sprintf("%s would be writable for the child (its root %s:rw) and is read-only for the parent (its root %s:%s)", z.Path, c.Path, p.Path, p.Mode)
			}
		}
	}
	return ""
}

// deepestRoot returns the root of roots whose path is the longest holding
// path p, or false; of roots with that same path, one of mode tie if any,
// so that a doubled root is read as the more permissive one in a child and
// the less in a parent.
func deepestRoot(roots []FSRoot, p, tie string) (FSRoot, bool) {
	var best FSRoot
	found := false
	for _, r := range roots {
		if !within(p, r.Path) {
			continue
		}
		if !found || len(r.Path) > len(best.Path) || (r.Path == best.Path && r.Mode == tie) {
			best, found = r, true
		}
	}
	return best, found
}

// CoveringRoot returns the deepest root of roots that r lies inside, or
// false: the root whose base an attenuated r takes. Whether r's mode is
// granted there is Narrows' to judge.
func CoveringRoot(roots []FSRoot, r FSRoot) (FSRoot, bool) {
	return deepestRoot(roots, r.Path, "")
}

// within reports whether the clean absolute path p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// coversHost reports whether a pattern of ps allows every host and port
// pattern s allows, and names explicitly every host s names explicitly:
// the SSRF guards let an explicitly named host (an IP literal or a DNS
// name, not a wildcard) reach loopback and private addresses, so a child
// naming "a.example.com" under a parent's "*.example.com" or "*" would
// gain what the parent does not have.
func coversHost(ps []string, s string) (bool, error) {
	c, err := parseHostPattern(s)
	if err != nil {
		return false, err
	}
	named := c.addr.IsValid() || (!c.any && !c.wildcard)
	for _, ptext := range ps {
		p, err := parseHostPattern(ptext)
		if err != nil {
			return false, err
		}
		if p.any {
			if named {
				continue
			}
			return true, nil
		}
		if c.any || (p.port != 0 && p.port != c.port) {
			continue
		}
		switch {
		case p.addr.IsValid():
			if c.addr == p.addr {
				return true, nil
			}
		case c.addr.IsValid():
		case !p.wildcard:
			if !c.wildcard && c.name == p.name {
				return true, nil
			}
		case !named && (c.name == p.name || strings.HasSuffix(c.name, "."+p.name)):
			// "*.d" covers "*.d" and "*.x.d".
			return true, nil
		}
	}
	return false, nil
}

func orAutopilot(m string) string {
	if m == "" {
		return "autopilot"
	}
	return m
}

// strictness ranks autonomy ceilings by autonomyModes' order, "" being
// autopilot.
func strictness(m string) int {
	return slices.Index(autonomyModes[1:], orAutopilot(m))
}
