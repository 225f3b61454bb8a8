package kernel

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/capkernel/capkernel/sandbox"
	"github.com/capkernel/capkernel/syscalls"
)

// privateDir is a directory of the kernel's own — the data dir (its keys,
// the admin credential, kernel.db with every payload, kernel.json), the
// sandbox dir (other runs' staging and proxy sockets), the policy dir —
// by real path and by identity.
type privateDir struct {
	what, path string
	dev, ino   uint64
	// writes marks a directory that only writes threaten (the policy
	// dir: its bundle is no secret, but what the next start loads).
	writes bool
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
		out = append(out, privateDir{what: d.what, path: real, dev: uint64(st.Dev), ino: st.Ino, writes: d.what == "policy dir"})
	}
	return out
}

// checkRoots refuses fs roots that reach one of the kernel's own
// directories — for the policy dir, an rw root only: a root that is one,
// lies inside one (found by identity on its way up, so a bind mount of
// the data dir elsewhere is found too), holds one, or holds a mount that
// shows one whole or in part (seenIn). No token may read the admin
// credential or the audit payloads, nor write the configuration or policy
// the next start reads, however its roots were granted; the operator
// moves the data dir out of the tree, or grants a narrower root.
func (k *Kernel) checkRoots(roots []syscalls.RootSpec) error {
	return k.checkRootsIn(k.privateSeen(sandbox.ReadMounts()), roots)
}

// privateSeen returns where each of the kernel's directories is visible
// in mounts (MountTable.VisibleAt), computed once for a check.
func (k *Kernel) privateSeen(mounts sandbox.MountTable) map[string][]string {
	seen := make(map[string][]string, len(k.private))
	for _, d := range k.private {
		seen[d.path] = mounts.VisibleAt(d.path)
	}
	return seen
}

// checkRootsIn is checkRoots with the directories' places (privateSeen)
// at hand.
func (k *Kernel) checkRootsIn(seen map[string][]string, roots []syscalls.RootSpec) error {
	for _, r := range roots {
		real, err := filepath.EvalSymlinks(r.Path)
		if err != nil {
			continue // the workspace reports a root it cannot open
		}
		for _, d := range k.private {
			if d.writes && !r.Writable {
				continue
			}
			if within(d.path, real) || within(real, d.path) || insideByIdentity(real, d) || seenIn(seen[d.path], real) {
				return &syscalls.ScopeError{Path: r.Path, Reason: fmt.Sprintf("reaches the kernel's %s %s: no token's root may hold it or lie in it", d.what, d.path)}
			}
		}
	}
	return nil
}

// checkSystemBinds refuses a sandboxed run when one of the kernel's own
// directories is visible in a host directory every run sees whole (a
// data dir under /usr/local, or bound into it whole or in part:
// sandbox.SystemDirs, sandbox.VisibleAt): whatever its roots, the
// command could read it there.
func (k *Kernel) checkSystemBinds(seen map[string][]string) error {
	for _, d := range k.private {
		if d.writes {
			continue // system dirs are read-only to every run
		}
		for _, at := range seen[d.path] {
			for _, sys := range k.systemDirs {
				if within(at, sys) {
					return &syscalls.ScopeError{Path: at, Reason: fmt.Sprintf("the kernel's %s %s is seen at %s, in %s, which every sandboxed command sees read-only: proc.exec is refused until it is moved out", d.what, d.path, at, sys)}
				}
			}
		}
	}
	return nil
}

// seenIn reports whether one of the places a kernel directory, or a part
// of it, is visible at (privateSeen: a bind mount of the data dir, or of
// a file in it) lies within root, or holds it.
func seenIn(places []string, root string) bool {
	for _, at := range places {
		if within(at, root) || within(root, at) {
			return true
		}
	}
	return false
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
