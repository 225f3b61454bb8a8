package syscalls

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// RootSpec is one file system root a capability token grants.
type RootSpec struct {
	Path     string // absolute
	Writable bool
	// Base, when set, is a directory Path lies in: Path is opened from it
	// and refused when the way from Base to Path passes a symbolic link
	// (an attenuated token's root; see captoken.FSRoot.Base).
	Base string
}

// AncestorRoots are the fs roots of a token the workspace's token was
// attenuated from (captoken.Ancestor.FS): a path's mode for that token is
// that of the innermost of these roots holding it, and a write or delete
// the workspace's token makes must not land where that mode is read-only.
type AncestorRoots struct {
	Roots []RootSpec // Path and Writable; Base is not used
}

// Workspace is a set of roots opened with os.Root, through which every
// file access of a call goes. It is safe for concurrent use.
type Workspace struct {
	mounts    []mount
	ancestors []AncestorRoots // their paths clean
}

type mount struct {
	RootSpec
	root *os.Root
	dir  *os.File        // the root directory
	conn syscall.RawConn // dir's, for openat2 (openRead)
	real string          // the root directory's path with symlinks resolved
}

// OpenWorkspace opens roots. Each must be an absolute path to an existing
// directory.
func OpenWorkspace(roots []RootSpec) (*Workspace, error) {
	return OpenAttenuatedWorkspace(roots, nil)
}

// OpenAttenuatedWorkspace opens roots as OpenWorkspace does, for a token
// attenuated from ancestors: besides its own roots' modes, Resolve then
// refuses a write or delete whose physical target lies where one of the
// ancestors' innermost root is read-only, or a delete taking such a root
// with it. The ancestors' root paths are resolved (ResolveLinks) at each
// such check, not once: a path through a link that dangles when the
// workspace opens comes to lead somewhere once its target is made, by
// the host or by the token's own calls.
//
// This holds a child to its ancestors' read-only paths however its own
// roots came to reach them: through a link made, or completed, after
// attenuation compared the roots' real paths.
func OpenAttenuatedWorkspace(roots []RootSpec, ancestors []AncestorRoots) (*Workspace, error) {
	w := &Workspace{}
	for _, a := range ancestors {
		roots := make([]RootSpec, len(a.Roots))
		for i, r := range a.Roots {
			if !filepath.IsAbs(r.Path) {
				return nil, fmt.Errorf("root %q of an ancestor token is not absolute", r.Path)
			}
			roots[i] = RootSpec{Path: filepath.Clean(r.Path), Writable: r.Writable}
		}
		w.ancestors = append(w.ancestors, AncestorRoots{Roots: roots})
	}
	for _, r := range roots {
		if !filepath.IsAbs(r.Path) {
			w.Close()
			return nil, fmt.Errorf("workspace root %q is not absolute", r.Path)
		}
		root, err := openRoot(r)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("workspace root: %w", err)
		}
		real, err := realPath(root, ".")
		if err != nil {
			root.Close()
			w.Close()
			return nil, fmt.Errorf("workspace root %s: %w", r.Path, err)
		}
		// The root directory itself, as a descriptor for openat2 (see
		// openRead); opened through root, so it is the very directory.
		dir, err := root.Open(".")
		var conn syscall.RawConn
		if err == nil {
			if conn, err = dir.SyscallConn(); err != nil {
				dir.Close()
			}
		}
		if err != nil {
			root.Close()
			w.Close()
			return nil, fmt.Errorf("workspace root %s: %w", r.Path, err)
		}
		w.mounts = append(w.mounts, mount{RootSpec: RootSpec{Path: filepath.Clean(r.Path), Writable: r.Writable}, root: root, dir: dir, conn: conn, real: real})
	}
	return w, nil
}

// openRoot opens r.Path, from r.Base when set: an os.Root of Base opens
// the relative path without leaving Base, and the directory it reached
// must be the one Path names, with no symbolic link on the way. The open
// root is then fixed: a link put in later changes nothing.
func openRoot(r RootSpec) (*os.Root, error) {
	if r.Base == "" || r.Base == r.Path {
		return os.OpenRoot(r.Path)
	}
	rel, err := filepath.Rel(r.Base, r.Path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not inside its base %s", r.Path, r.Base)
	}
	base, err := os.OpenRoot(r.Base)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	baseReal, err := realPath(base, ".")
	if err != nil {
		return nil, err
	}
	root, err := base.OpenRoot(rel)
	if err != nil {
		return nil, fmt.Errorf("%s from its base %s: %w", r.Path, r.Base, err)
	}
	if real, err := realPath(root, "."); err != nil || real != filepath.Join(baseReal, rel) {
		root.Close()
		return nil, fmt.Errorf("%s: the way from its base %s passes a symbolic link", r.Path, r.Base)
	}
	return root, nil
}

// Roots returns the opened roots, in the order of the specs it was opened
// with (a path named twice once); they are the Workspace's and close with
// it.
func (w *Workspace) Roots() []*os.Root {
	roots := make([]*os.Root, len(w.mounts))
	for i, m := range w.mounts {
		roots[i] = m.root
	}
	return roots
}

// Close closes the roots.
func (w *Workspace) Close() error {
	var errs []error
	for _, m := range w.mounts {
		errs = append(errs, m.root.Close(), m.dir.Close())
	}
	return errors.Join(errs...)
}

// Resource is a path argument resolved inside a root (or, with a nil Root,
// a kv key in Rel).
type Resource struct {
	Arg      string   // the argument that named it; set by the kernel
	Root     *os.Root // the opened root; owned by the Workspace
	RootPath string   // the root directory as the token names it
	RealRoot string   // the root directory with symlinks resolved
	Rel      string   // slash-separated, cleaned, relative to the root; "." is the root
	Real     string   // Rel with symlinks inside the root resolved (see Resolve)
	// Links, for a read through a symlink as the last component, are
	// that link and every link it leads through to Real (for a dangling
	// one, to the missing name, which is last), each in Real's form (its
	// resolved parent plus its name): what a write or delete of that name
	// acts on; nil otherwise.
	Links []string
	// OtherPaths are Real as seen from each other root of the workspace
	// that holds it (the token's roots nest), in the roots' order: a
	// path resolves in one root by how it is spelled (a relative one in
	// the first, an absolute one in the innermost holding it), and a check
	// of where a file lies — the policy's sensitive and secret paths —
	// must see it from every root, or the spelling picks what it sees.
	// Nil when no other root holds it.
	OtherPaths []string
	Exists     bool
	IsDir      bool
	Size       int64
	Access     Access
	dir        syscall.RawConn // the root directory's (the Workspace's), for openRead; nil for none
}

// ScopeError is a path outside the token's scopes; the kernel reports it as
// scope_denied.
type ScopeError struct {
	Path   string
	Reason string
}

func (e *ScopeError) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return fmt.Sprintf("path %q: %s", e.Path, e.Reason)
}

// Resolve maps the path argument p to a resource for access a.
//
// Relative paths are relative to the first root; an absolute path must lie,
// lexically, inside a root (the longest match wins). All access then goes
// through that root's os.Root, which refuses ".." escapes and symlinks
// leading out in any component. Resolve refuses a path longer than
// MaxPathBytes or of more than MaxPathComponents components with a
// *PathSizeError, first; then with a *ScopeError: an
// empty path, a NUL byte, an absolute path outside every root, any escape
// (including a symlink, as the last component or a parent directory, that
// leads outside, even for writes and deletes), a write or delete in a
// read-only root, and deleting a root itself.
//
// Reads, lists and stats follow symlinks inside the root, and Real is the
// followed path. Writes and deletes act on the named path itself — a
// symlink there is replaced or removed, never followed, like rename(2) and
// unlink(2) — so Real is the resolved parent directory plus the last name.
func (w *Workspace) Resolve(p string, a Access) (*Resource, error) {
	if err := CheckPathSize(p); err != nil {
		return nil, err
	}
	return w.resolveAnySize(p, a)
}

// resolveAnySize is Resolve without the bounds on p's size: for the
// paths of a command's delta (stageDelta), which the file system made
// and which may nest deeper than any path an agent names; it locks none
// of them (proc.exec locks its roots whole).
func (w *Workspace) resolveAnySize(p string, a Access) (*Resource, error) {
	r, err := w.resolve(p, a)
	if err != nil {
		return r, err
	}
	r.OtherPaths = w.otherPaths(r)
	if !a.Writes() {
		return r, nil
	}
	return r, w.checkWritable(p, r)
}

// checkWritable refuses a write or delete whose physical target lies in a
// read-only root, or a delete that would take a root with it, however the
// path was spelled (relative to an outer root, through a symlink).
func (w *Workspace) checkWritable(p string, r *Resource) error {
	abs := filepath.Join(r.RealRoot, filepath.FromSlash(r.Real))
	var inner *mount
	for i := range w.mounts {
		m := &w.mounts[i]
		if within(abs, m.real) && (inner == nil || len(m.real) > len(inner.real)) {
			inner = m
		}
		if r.Access == AccessDelete && within(m.real, abs) {
			return &ScopeError{Path: p, Reason: "would delete the root " + m.Path}
		}
	}
	if inner != nil && !inner.Writable {
		return &ScopeError{Path: p, Reason: "lies in root " + inner.Path + ", which is read-only for this token"}
	}
	for i := range w.ancestors {
		if err := w.ancestors[i].checkWritable(p, abs, r.Access); err != nil {
			return err
		}
	}
	return nil
}

// checkWritable refuses a write or delete of the physical path abs that
// lies where a's innermost root is read-only, or a delete that would take
// one of a's read-only roots with it. A path outside all of a's roots is
// a's to refuse only through the token's own roots, which lie in them.
func (a *AncestorRoots) checkWritable(p, abs string, access Access) error {
	var inner *RootSpec
	innerReal := ""
	for i := range a.Roots {
		m := &a.Roots[i]
		real := ResolveLinks(m.Path)
		// Of two roots at one path the read-only one counts, as
		// attenuation reads a doubled root of a parent (captoken.Narrows).
		if within(abs, real) && (inner == nil || len(real) > len(innerReal) || (real == innerReal && !m.Writable)) {
			inner, innerReal = m, real
		}
		if access == AccessDelete && !m.Writable && within(real, abs) {
			return &ScopeError{Path: p, Reason: "would delete " + m.Path + ", which is read-only for a token this one was attenuated from"}
		}
	}
	if inner != nil && !inner.Writable {
		return &ScopeError{Path: p, Reason: "lies in " + inner.Path + ", which is read-only for a token this one was attenuated from"}
	}
	return nil
}

// ResolveLinks returns the absolute path p with its links resolved: those
// of its deepest existing directory, the missing rest kept as spelled.
func ResolveLinks(p string) string {
	rest := ""
	for q := filepath.Clean(p); ; q = filepath.Dir(q) {
		if real, err := filepath.EvalSymlinks(q); err == nil {
			return filepath.Join(real, rest)
		}
		if filepath.Dir(q) == q {
			return filepath.Clean(p)
		}
		rest = filepath.Join(filepath.Base(q), rest)
	}
}

// RemovableLink follows the absolute path p component by component, as
// the file system does (a ".." after a link climbs from where the link
// led), and returns the first link met that dangles (dangles true) or
// that a token writing in the dirs writable could remove: one lying in
// one of them whose target lies in the same one (a link leading out of
// its root no call can remove: Resolve refuses it). It returns "" when
// there is none; a path missing from some component on, through no link,
// is met by no link there.
func RemovableLink(p string, writable []string) (link string, dangles bool) {
	cur, rest := "/", strings.Split(filepath.Clean(p), "/")
	for hops := 0; len(rest) > 0; {
		comp := rest[0]
		rest = rest[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, comp)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", false // missing from here on: no link
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return next, true // a loop leads nowhere
		}
		target, err := os.Readlink(next)
		if err != nil {
			return next, true
		}
		real, err := filepath.EvalSymlinks(next)
		if err != nil {
			return next, true
		}
		for _, w := range writable {
			if within(next, w) && within(real, w) {
				return next, false
			}
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return "", false
}

// within reports whether path p is dir or inside it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/"
}

// Bounds on a path an fs syscall or an fs precondition ref names, as
// spelled, checked by Resolve before anything else: Linux's PATH_MAX, and
// a component count no real tree reaches. Every later step (the lock
// plan's ancestors, the policy input, the audit record) is bounded by
// them; without them, a path of megabytes of "a/" was walked component
// by component wherever it went.
const (
	MaxPathBytes      = 4096
	MaxPathComponents = 255
)

// PathSizeError is a path over MaxPathBytes or MaxPathComponents. It
// tells the path's size, never the path (which may be megabytes); the
// kernel reports it as invalid_args.
type PathSizeError struct {
	Bytes      int // len(path)
	Components int // its non-empty components; 0 when Bytes alone is over
}

func (e *PathSizeError) Error() string {
	if e.Components == 0 {
		return fmt.Sprintf("a path of %d bytes is longer than the limit of %d bytes", e.Bytes, MaxPathBytes)
	}
	return fmt.Sprintf("a path of %d components (%d bytes) has more than the limit of %d components", e.Components, e.Bytes, MaxPathComponents)
}

// CheckPathSize returns a *PathSizeError when p is longer than
// MaxPathBytes or has more than MaxPathComponents non-empty components.
// It reads at most MaxPathBytes of p.
func CheckPathSize(p string) error {
	if len(p) > MaxPathBytes {
		return &PathSizeError{Bytes: len(p)}
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] != '/' && (i == 0 || p[i-1] == '/') {
			n++
		}
	}
	if n > MaxPathComponents {
		return &PathSizeError{Bytes: len(p), Components: n}
	}
	return nil
}

func (w *Workspace) resolve(p string, a Access) (*Resource, error) {
	switch {
	case p == "":
		return nil, &ScopeError{Path: p, Reason: "empty path"}
	case strings.IndexByte(p, 0) >= 0:
		return nil, &ScopeError{Path: p, Reason: "path contains a NUL byte"}
	case len(w.mounts) == 0:
		return nil, &ScopeError{Path: p, Reason: "the capability token grants no file system roots"}
	}
	m, rel, err := w.mountFor(p)
	if err != nil {
		return nil, err
	}
	if a.Writes() && !m.Writable {
		return nil, &ScopeError{Path: p, Reason: "root " + m.Path + " is read-only for this token"}
	}
	if a == AccessDelete && rel == "." {
		return nil, &ScopeError{Path: p, Reason: "a root cannot be deleted"}
	}
	r := &Resource{Root: m.root, RootPath: m.Path, RealRoot: m.real, Rel: filepath.ToSlash(rel), Access: a, dir: m.conn}
	lfi, err := m.root.Lstat(rel)
	switch {
	case isEscape(err):
		return nil, &ScopeError{Path: p, Reason: "escapes its root"}
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		// Nothing there yet (a path under a file is nothing either: a
		// command's delta may replace that file by a directory); the
		// parent must still resolve inside the root.
		dir, err := m.realRel(path.Dir(r.Rel))
		switch {
		case isEscape(err):
			return nil, &ScopeError{Path: p, Reason: "escapes its root"}
		case err == nil:
			r.Real = joinRel(dir, path.Base(r.Rel))
		default:
			r.Real = r.Rel // no parent directory: nothing to resolve
		}
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	r.Exists, r.IsDir, r.Size = true, lfi.IsDir(), lfi.Size()
	if lfi.Mode()&fs.ModeSymlink == 0 || a.Writes() {
		// Not a link, or acting on the link itself: resolve the parent.
		if lfi.Mode()&fs.ModeSymlink != 0 {
			// A link leading out is refused whatever the access.
			if _, err := m.realRel(r.Rel); isEscape(err) {
				return nil, &ScopeError{Path: p, Reason: "is a symlink leading outside its root"}
			}
		}
		if r.Rel == "." {
			r.Real = "."
			return r, nil
		}
		dir, err := m.realRel(path.Dir(r.Rel))
		if isEscape(err) {
			return nil, &ScopeError{Path: p, Reason: "escapes its root"}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		r.Real = joinRel(dir, path.Base(r.Rel))
		return r, nil
	}
	real, err := m.follow(r.Rel, &r.Links)
	switch {
	case isEscape(err):
		return nil, &ScopeError{Path: p, Reason: "is a symlink leading outside its root"}
	case errors.Is(err, fs.ErrNotExist):
		r.Exists, r.IsDir, r.Size = false, false, 0 // a dangling link
		r.Real = r.Rel
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	fi, err := m.root.Stat(r.Rel)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	r.IsDir, r.Size, r.Real = fi.IsDir(), fi.Size(), real
	return r, nil
}

// LockNames returns the absolute paths a call on r locks (kernel's path
// locks): Real's and, for a read through links, each link's own (Links),
// which a write or delete of that link locks; holding them all, a read
// with a precondition cannot have a link of its chain replaced between
// its check and its open. (A link among the parent directories is not
// locked: the precondition's guarantee covers the last name's chain.)
func (r *Resource) LockNames() []string {
	names := []string{path.Join(r.RealRoot, r.Real)}
	for _, l := range r.Links {
		if l != r.Real {
			names = append(names, path.Join(r.RealRoot, l))
		}
	}
	return names
}

// maxLinks bounds the symlinks followed while resolving one path.
const maxLinks = 40

var errEscapes = errors.New("path escapes from parent")

// realRel returns rel with every symlink resolved, relative to the root.
// Directories on the way are resolved by the kernel through os.Root (opened
// with O_PATH, so nothing is read); a symlink as the last component is
// followed here, by its text, from its directory's real path.
func (m *mount) realRel(rel string) (string, error) { return m.follow(rel, nil) }

// follow is realRel, appending to links, when not nil, each symlink it
// follows as the last component, in realRel's form (its directory's real
// path plus its name), the first the one rel names; for a dangling link,
// last, the missing name it leads to, in the same form.
func (m *mount) follow(rel string, links *[]string) (string, error) {
	if rel == "." {
		// The root itself, the parent of every top-level name: its real
		// path is the mount's by definition, without the four system
		// calls of resolving it again.
		return ".", nil
	}
	for range maxLinks {
		fi, err := m.root.Lstat(rel)
		if err != nil {
			if links != nil && len(*links) > 0 && errors.Is(err, fs.ErrNotExist) {
				// A dangling link: the missing name it leads to, as a
				// write creating it locks it (resolve).
				missing := rel
				if dir, err := m.realRel(path.Dir(rel)); err == nil {
					missing = joinRel(dir, path.Base(rel))
				}
				*links = append(*links, missing)
			}
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			abs, err := realPath(m.root, rel)
			if err != nil {
				return "", err
			}
			return relTo(m.real, abs), nil
		}
		target, err := m.root.Readlink(rel)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			return "", &fs.PathError{Op: "readlink", Path: rel, Err: errEscapes}
		}
		dir := "."
		if d := path.Dir(rel); d != "." {
			if dir, err = m.realRel(d); err != nil {
				return "", err
			}
		}
		if links != nil {
			*links = append(*links, joinRel(dir, path.Base(rel)))
		}
		rel = path.Join(dir, filepath.ToSlash(target))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return "", &fs.PathError{Op: "readlink", Path: rel, Err: errEscapes}
		}
	}
	return "", fmt.Errorf("%s: more than %d symlinks", rel, maxLinks)
}

// otherPaths returns Resource.OtherPaths of r.
func (w *Workspace) otherPaths(r *Resource) []string {
	if len(w.mounts) < 2 || r.RealRoot == "" {
		return nil
	}
	abs := path.Join(r.RealRoot, r.Real)
	var out []string
	for i := range w.mounts {
		m := &w.mounts[i]
		if m.real == r.RealRoot || !within(abs, m.real) {
			continue
		}
		rel := "."
		if abs != m.real {
			rel = strings.TrimPrefix(abs, strings.TrimSuffix(m.real, "/")+"/")
		}
		out = append(out, rel)
	}
	return out
}

// mountFor picks the root for p and returns p relative to it.
func (w *Workspace) mountFor(p string) (*mount, string, error) {
	if !filepath.IsAbs(p) {
		rel := filepath.Clean(p)
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, "", &ScopeError{Path: p, Reason: "escapes its root"}
		}
		return &w.mounts[0], rel, nil
	}
	c := filepath.Clean(p)
	var best *mount
	for i := range w.mounts {
		m := &w.mounts[i]
		if (c == m.Path || strings.HasPrefix(c, m.Path+"/") || m.Path == "/") && (best == nil || len(m.Path) > len(best.Path)) {
			best = m
		}
	}
	if best == nil {
		return nil, "", &ScopeError{Path: p, Reason: "is outside every root the capability token grants"}
	}
	rel, err := filepath.Rel(best.Path, c)
	if err != nil {
		return nil, "", &ScopeError{Path: p, Reason: err.Error()}
	}
	return best, rel, nil
}

// realPath opens rel through root, which resolves its directories, and
// returns the opened file's absolute path as the kernel sees it. O_PATH
// does not follow a symlink as the last component; realRel does that.
func realPath(root *os.Root, rel string) (string, error) {
	f, err := root.OpenFile(rel, os.O_RDONLY|unix.O_PATH, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
}

// relTo returns the slash path of abs relative to base ("." for base).
func relTo(base, abs string) string {
	rel, err := filepath.Rel(base, abs)
	if err != nil {
		return ".."
	}
	return filepath.ToSlash(rel)
}

func joinRel(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// isEscape reports whether err is os.Root refusing a path that leaves the
// root. The os package does not export that error, so match its text.
func isEscape(err error) bool {
	if err == nil {
		return false // before errors.As, whose target would escape to the heap
	}
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == errEscapes.Error()
}
