package kernel

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/capkernel/capkernel/syscalls"
)

// privateDir is a directory of the kernel's own — the data dir (its keys,
// the admin credential, kernel.db with every payload, kernel.json), the
// sandbox dir (other runs' staging and proxy sockets), the policy dir —
// by real path and by identity.
type privateDir struct {
	what, path string
	dev, ino   uint64
}

// privateDirs finds the kernel's directories of cfg (after Open made
// them absolute and the sandbox dir exists); one that does not exist is
// left out (nothing in it to reach).
func privateDirs(cfg Config) []privateDir {
	var out []privateDir
	for _, d := range []struct{ what, path string }{{"data dir", cfg.DataDir}, {"sandbox dir", cfg.SandboxDir}, {"policy dir", cfg.PolicyDir}} {
		if d.path == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(d.path)
		if err != nil {
			continue
		}
		if abs, err := filepath.Abs(real); err == nil {
			real = abs
		}
		var st syscall.Stat_t
		if syscall.Stat(real, &st) != nil {
			continue
		}
		out = append(out, privateDir{what: d.what, path: real, dev: uint64(st.Dev), ino: st.Ino})
	}
	return out
}

// checkRoots refuses fs roots that reach one of the kernel's own
// directories: a root that is one, lies inside one (found by identity on
// its way up, so a bind mount of the data dir elsewhere is found too), or
// holds one. No token may read the admin credential or the audit
// payloads, nor write the configuration or policy the next start reads,
// however its roots were granted; the operator moves the data dir out of
// the tree, or grants a narrower root.
func (k *Kernel) checkRoots(roots []syscalls.RootSpec) error {
	for _, r := range roots {
		real, err := filepath.EvalSymlinks(r.Path)
		if err != nil {
			continue // the workspace reports a root it cannot open
		}
		for _, d := range k.private {
			if within(d.path, real) || within(real, d.path) || insideByIdentity(real, d) {
				return &syscalls.ScopeError{Path: r.Path, Reason: fmt.Sprintf("reaches the kernel's %s %s: no token's root may hold it or lie in it", d.what, d.path)}
			}
		}
	}
	return nil
}

// checkSystemBinds refuses a sandboxed run when one of the kernel's own
// directories lies in a host directory every run sees whole (a data dir
// under /usr/local, say: sandbox.SystemDirs): whatever its roots, the
// command could read it there.
func (k *Kernel) checkSystemBinds() error {
	for _, d := range k.private {
		for _, sys := range k.systemDirs {
			if within(d.path, sys) {
				return &syscalls.ScopeError{Path: d.path, Reason: fmt.Sprintf("the kernel's %s lies in %s, which every sandboxed command sees read-only: proc.exec is refused until it is moved out", d.what, sys)}
			}
		}
	}
	return nil
}

// within reports whether path p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// insideByIdentity reports whether p, or a directory on its way up, is d
// by device and inode.
func insideByIdentity(p string, d privateDir) bool {
	for {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil && uint64(st.Dev) == d.dev && st.Ino == d.ino {
			return true
		}
		up := filepath.Dir(p)
		if up == p {
			return false
		}
		p = up
	}
}
