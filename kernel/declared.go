package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/capkernel/capkernel/netproxy"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream"
)

// upstreamCall is what the kernel resolved of an upstream MCP tool's call
// from the tool's declaration (docs/mcp.md "Declared resources").
type upstreamCall struct {
	undeclared bool
	resources  []policy.Resource
	// locks are the real paths of the declared files, locked for a
	// transactional call as a built-in's are, so that an upstream write
	// and a kernel write of one file never overlap.
	locks []string
	// args are the arguments sent upstream: the call's, with every
	// declared path replaced by the path the kernel resolved, in the
	// upstream's path space; nil sends the call's own.
	args json.RawMessage
}

// MaxDeclaredRefs bounds the declared resources (fs paths, hosts, kv keys)
// one call of an upstream tool may name, as MaxLockKeys bounds what a
// call locks: a wildcard pointer (read_multiple_files's "/paths/*") took
// any number, each resolved in the token's roots and a policy resource,
// and 200,000 paths in an 800 KB call took 3.3 s of CPU (rev16a #3). A
// call naming more is refused invalid_args before any is resolved.
const MaxDeclaredRefs = 512

// resolveDeclared resolves the declared resources of an upstream tool's
// call, as the built-in syscalls' are: every fs path through os.Root
// under the token's roots (traversal, absolute paths outside them and
// symlinks leading out are scope_denied, before the upstream is called),
// every host against the token's net patterns and net.fetch's SSRF rules
// (the first request only: a call reaching a host is marked undeclared
// too), every kv key against the token's kv scopes. A call of another
// syscall is left alone.
func (k *Kernel) resolveDeclared(ctx context.Context, c *call) error {
	t, ok := upstream.Of(c.entry)
	if !ok {
		return nil
	}
	c.up = &upstreamCall{undeclared: !t.Declared}
	refs, doc, err := t.Refs(c.env.Args)
	if err != nil || len(refs) == 0 {
		return err
	}
	if len(refs) > MaxDeclaredRefs {
		return fmt.Errorf("the call names %d declared resources (paths, hosts and keys); the limit is %d: name fewer in one call", len(refs), MaxDeclaredRefs)
	}
	repl := make([]string, len(refs))
	rewrite := false
	for i, r := range refs {
		repl[i] = r.Value
		switch r.Arg.Kind {
		case syscalls.KindFS:
			p, res, lock, err := k.resolveUpstreamPath(c, t, r)
			if err != nil {
				return err
			}
			repl[i], rewrite = p, rewrite || p != r.Value
			c.up.resources = append(c.up.resources, res)
			c.up.locks = append(c.up.locks, lock)
		case syscalls.KindKV:
			op, write := "read", r.Arg.Mode == "rw"
			if write {
				op = "write"
			}
			// The token's kv scopes bound a declared key as they bound
			// kv.get's and kv.put's.
			if !c.token.Claims.Cap.AllowsKey(r.Value, write) {
				return kvScopeError(r.Value, write)
			}
			c.up.resources = append(c.up.resources, policy.Resource{Kind: "kv", Op: op, Key: r.Value})
		default:
			hp, err := r.Arg.Target(r.Value)
			if err != nil {
				return fmt.Errorf("argument %s: %w", r.Where, err)
			}
			if hp.Host == "" {
				continue // a data: URL reaches no host
			}
			if err := k.checkUpstreamHost(ctx, c, hp); err != nil {
				return err
			}
			// The upstream dials by itself: a redirect it follows, or any
			// request past the one named, reaches what the kernel never
			// saw, so the call's effect is not wholly declared.
			c.up.undeclared = true
			c.up.resources = append(c.up.resources, policy.Resource{Kind: "net", Op: "connect", Host: hp.Host, Port: hp.Port})
		}
	}
	if rewrite {
		if c.up.args, err = upstream.Rewrite(doc, refs, repl); err != nil {
			return err
		}
	}
	return nil
}

// resolveUpstreamPath resolves one declared fs argument in the token's
// roots and returns the path to send upstream, its policy resource and its
// lock key.
func (k *Kernel) resolveUpstreamPath(c *call, t *upstream.Tool, r upstream.Ref) (string, policy.Resource, string, error) {
	w, err := k.workspace(c)
	if err != nil {
		return "", policy.Resource{}, "", err
	}
	access, err := r.Arg.Access()
	if err != nil {
		return "", policy.Resource{}, "", err
	}
	res, err := w.Resolve(t.ToKernel(r.Value), access)
	if err != nil {
		return "", policy.Resource{}, "", fmt.Errorf("argument %s: %w", r.Where, err)
	}
	abs := filepath.Join(res.RootPath, filepath.FromSlash(res.Real))
	up, ok := t.ToUpstream(abs)
	if !ok {
		return "", policy.Resource{}, "", &syscalls.ScopeError{Path: r.Value,
			Reason: fmt.Sprintf("lies outside every directory mcp server %s sees (its paths)", t.Server)}
	}
	return up, policy.Resource{Kind: "fs", Op: string(access), Path: res.Rel, RealPath: res.Real, Root: res.RootPath,
		IsDir: res.IsDir, Exists: res.Exists}, path.Join(res.RealRoot, res.Real), nil
}

// checkUpstreamHost admits a host an upstream tool will connect to: the
// token's net patterns must allow it, and a loopback, private, link-local,
// metadata or other special address (an IP literal, or any address the
// name resolves to now) only when a pattern names the host explicitly, as
// for net.fetch. The upstream dials by itself, so a name that resolves
// differently there is beyond the kernel's check (docs/mcp.md).
func (k *Kernel) checkUpstreamHost(ctx context.Context, c *call, hp syscalls.HostPort) error {
	cp := c.token.Claims.Cap
	where := fmt.Sprintf("%s:%d", hp.Host, hp.Port)
	if !cp.AllowsHost(hp.Host, hp.Port) {
		return &syscalls.ScopeError{Path: where, Reason: "is outside the capability token's net patterns"}
	}
	if cp.NamesHost(hp.Host, hp.Port) {
		return nil
	}
	host := strings.TrimSuffix(strings.TrimPrefix(hp.Host, "["), "]")
	addrs := []netip.Addr{}
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, a)
	} else {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lookup := k.cfg.NetLookup
		if lookup == nil {
			lookup = func(ctx context.Context, h string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			}
		}
		if addrs, err = lookup(ctx, host); err != nil {
			return &syscalls.ScopeError{Path: where, Reason: "cannot be resolved to check it against the SSRF rules: " + err.Error()}
		}
	}
	for _, a := range addrs {
		if netproxy.Special(a) {
			return &syscalls.ScopeError{Path: where, Reason: (&netproxy.AddrError{Host: host, Addr: a.Unmap()}).Error()}
		}
	}
	return nil
}

// addTo puts the call's declared resources into the policy input and
// marks a tool without a declaration.
func (u *upstreamCall) addTo(in *policy.Input) {
	if u == nil {
		return
	}
	in.Resources = append(in.Resources, u.resources...)
	in.ResourcesUndeclared = u.undeclared
}

// lockKeys are the fs lock keys of the call's declared files.
func (u *upstreamCall) lockKeys() []string {
	if u == nil {
		return nil
	}
	return u.locks
}

// sendArgs are the arguments Execute gets: the rewritten ones of an
// upstream call, else the call's own.
func (c *call) sendArgs() json.RawMessage {
	if c.up != nil && c.up.args != nil {
		return c.up.args
	}
	return c.env.Args
}
