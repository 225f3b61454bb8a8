package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// overlayOptions are the overlayfs options besides the layers: user.*
// xattrs (the only kind a user namespace may write), no directory
// redirects (a renamed directory is copied, so every upper directory holds
// its whole content), no metacopy (every upper file holds its data), no
// index.
const overlayOptions = "userxattr,redirect_dir=nofollow,metacopy=off,index=off"

const stagePrefix = "capsandbox-"

// stageDir is one run's private staging directory, locked while in use so
// that CleanupStale leaves it alone.
type stageDir struct {
	path string
	lock *os.File
}

func newStageDir(parent, kind string) (*stageDir, error) {
	dir, err := os.MkdirTemp(parent, stagePrefix+kind)
	if err != nil {
		return nil, fmt.Errorf("sandbox: staging: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sandbox: staging lock: %w", err)
	}
	return &stageDir{path: dir, lock: lock}, nil
}

func (d *stageDir) remove() error {
	err := removeTree(d.path)
	d.lock.Close()
	return err
}

// removeTree removes dir even where the sandboxed command left directories
// without write or search permission.
func removeTree(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			os.Chmod(p, 0o700)
			if err != nil { // unreadable before the chmod: walk it again
				filepath.WalkDir(p, func(q string, e fs.DirEntry, _ error) error {
					if e != nil && e.IsDir() {
						os.Chmod(q, 0o700)
					}
					return nil
				})
			}
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// CleanupStale removes the staging directories under dir (os.TempDir() if
// empty) that no live run holds: what a killed kernel left behind. No
// mount outlives a run (overlays live in the run's own mount namespace),
// so removing the files is all there is to do, after killing any process
// still naming such a directory (a sandbox a kernel was killed while
// setting up; see killStale). It returns how many it removed.
func CleanupStale(dir string) (int, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), stagePrefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		lock, err := os.OpenFile(filepath.Join(p, ".lock"), os.O_RDWR, 0)
		if err == nil {
			if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				lock.Close()
				continue // in use
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			continue
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // being created right now, or gone
		}
		killStale(p)
		if err := removeTree(p); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
		if lock != nil {
			lock.Close()
		}
	}
	return n, errors.Join(errs...)
}

// setupOverlay prepares the layers of an rw root; the mount itself happens
// in the run's mount namespace.
func setupOverlay(st *stageDir, r *rootPlan) error {
	i := strconv.Itoa(r.index)
	r.lower = filepath.Join(st.path, "l"+i)
	r.upper = filepath.Join(st.path, "u"+i)
	r.work = filepath.Join(st.path, "w"+i)
	r.merged = filepath.Join(st.path, "m"+i)
	fi, err := os.Stat(r.real)
	if err != nil {
		return err
	}
	if err := os.Symlink(r.real, r.lower); err != nil {
		return err
	}
	for _, d := range []string{r.upper, r.work, r.merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// The merged root directory shows the upper directory's attributes.
	return os.Chmod(r.upper, fi.Mode().Perm())
}

// overlayPathOK reports whether p can go into overlay mount options.
func overlayPathOK(p string) bool { return !strings.ContainsAny(p, ",:\\\"' \t\n=") }

// stamp is what the copy mode remembers of each copied entry, to tell
// entries the command touched from those it did not.
type stamp struct {
	dir   bool
	typ   FileType
	perm  fs.FileMode
	ino   uint64
	ctime syscall.Timespec
}

func stampOf(fi fs.FileInfo) stamp {
	st := fi.Sys().(*syscall.Stat_t)
	s := stamp{dir: fi.IsDir(), typ: typeOf(fi), perm: fi.Mode().Perm(), ino: st.Ino, ctime: st.Ctim}
	return s
}

func typeOf(fi fs.FileInfo) FileType {
	switch {
	case fi.IsDir():
		return TypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		return TypeSymlink
	}
	return TypeFile
}

// setupCopy copies an rw root into the staging directory: directories,
// regular files and symbolic links (as links), with permissions and
// modification times; nested roots and deny paths become empty
// placeholders; special files are left out. It returns the manifest of
// what it copied.
func setupCopy(st *stageDir, r *rootPlan) (map[string]stamp, error) {
	r.upper = filepath.Join(st.path, "c"+strconv.Itoa(r.index))
	r.merged = r.upper
	manifest := map[string]stamp{}
	type dirMeta struct {
		dst  string
		rel  string
		perm fs.FileMode
		mt   time.Time
	}
	var dirs []dirMeta
	err := filepath.WalkDir(r.real, func(src string, d fs.DirEntry, err error) error {
		if err != nil {
			if src == r.real {
				return err
			}
			return nil // unreadable: neither copied nor diffed
		}
		rel := ""
		if src != r.real {
			rel = filepath.ToSlash(strings.TrimPrefix(src, r.real+"/"))
		}
		dst := filepath.Join(r.upper, filepath.FromSlash(rel))
		if rel != "" && r.skip[rel] {
			if d.IsDir() {
				if err := os.Mkdir(dst, 0o700); err != nil {
					return err
				}
				return fs.SkipDir
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			return f.Close()
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMeta{dst, rel, fi.Mode().Perm(), fi.ModTime()})
		case fi.Mode().IsRegular():
			if err := copyFile(src, dst, fi); err != nil {
				if errors.Is(err, fs.ErrPermission) {
					r.skip[rel] = true
					return nil
				}
				return err
			}
			r.copied += fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		default:
			return nil // special files are not copied, nor reported deleted
		}
		if !d.IsDir() {
			cfi, err := os.Lstat(dst)
			if err != nil {
				return err
			}
			manifest[rel] = stampOf(cfi)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: copying %s: %w", r.Path, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := os.Chmod(d.dst, d.perm); err != nil {
			return nil, err
		}
		os.Chtimes(d.dst, d.mt, d.mt)
		if d.rel != "" {
			manifest[d.rel] = stamp{dir: true, typ: TypeDir, perm: d.perm}
		}
	}
	return manifest, nil
}

func copyFile(src, dst string, fi fs.FileInfo) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Chmod(dst, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// deltaBuilder collects the changes of all rw roots and enforces the caps
// and the symlink policy.
type deltaBuilder struct {
	limits    Limits
	symlinks  SymlinkPolicy
	changes   []Change
	bytes     int64
	pathBytes int64           // of the changes' paths and link targets
	deleted   map[string]bool // paths already recorded as deleted
}

func (b *deltaBuilder) add(c Change) error {
	if c.Kind == Deleted {
		if b.deleted == nil {
			b.deleted = map[string]bool{}
		}
		if b.deleted[c.Path()] {
			return nil
		}
		b.deleted[c.Path()] = true
	}
	if c.Type == TypeSymlink && c.Kind != Deleted && b.symlinks == SymlinksRefuse {
		return fmt.Errorf("%w: %s -> %s (the sandbox does not stage links)", ErrSymlink, c.Path(), c.Target)
	}
	if b.limits.DeltaFiles > 0 && len(b.changes) >= b.limits.DeltaFiles {
		return fmt.Errorf("%w: more than %d changed paths", ErrDeltaTooLarge, b.limits.DeltaFiles)
	}
	b.pathBytes += int64(jsonLen(c.Root) + 1 + jsonLen(c.Rel) + jsonLen(c.Target))
	if b.limits.DeltaPathBytes > 0 && b.pathBytes > b.limits.DeltaPathBytes {
		return fmt.Errorf("%w: more than %d bytes of changed paths", ErrDeltaTooLarge, b.limits.DeltaPathBytes)
	}
	if c.Type == TypeFile && c.Kind != Deleted {
		b.bytes += c.Size
		if b.limits.DeltaBytes > 0 && b.bytes > b.limits.DeltaBytes {
			return fmt.Errorf("%w: more than %d bytes of changed files", ErrDeltaTooLarge, b.limits.DeltaBytes)
		}
	}
	b.changes = append(b.changes, c)
	return nil
}

// jsonLen is about the length of s as a JSON string holds it, which is
// how the delta's copies (the result, the record, the stored delta) hold
// a path: a control character, an HTML one or a byte of invalid UTF-8 is
// six ("\u0001", "\u003c", "\ufffd"), a quote or backslash two.
func jsonLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1, r < 0x20, r == '<', r == '>', r == '&', r == 0x2028, r == 0x2029:
			n += 6
		case r == '"', r == '\\':
			n += 2
		default:
			n += size
		}
		i += size
	}
	return n
}

func (b *deltaBuilder) delta() *Delta {
	order(b.changes)
	return &Delta{Changes: b.changes, Bytes: b.bytes}
}

// order sorts changes into application order: deletions in reverse path
// order (so everything under a directory comes before it), then
// directories in path order (parents first), then files and links in path
// order.
func order(cs []Change) {
	group := func(c Change) int {
		switch {
		case c.Kind == Deleted:
			return 0
		case c.Type == TypeDir:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(cs, func(a, b Change) int {
		ga, gb := group(a), group(b)
		if ga != gb {
			return ga - gb
		}
		if ga == 0 {
			return strings.Compare(b.Path(), a.Path())
		}
		return strings.Compare(a.Path(), b.Path())
	})
}

func joinRel(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// lstatLower is Lstat of rel in the root's real directory, or nil when it
// does not exist there. Only called when every parent of rel is known to
// be a real directory of the root, so no link is ever followed.
func (r *rootPlan) lstatLower(rel string) fs.FileInfo {
	fi, err := os.Lstat(filepath.Join(r.real, filepath.FromSlash(rel)))
	if err != nil {
		return nil
	}
	return fi
}

// ensureAccess gives the kernel's user read access to a staged entry the
// command left unreadable (a directory without u+rx, a file without u+r),
// so that the delta can be read. Only staging entries are touched, and
// the delta records the modes they had.
func ensureAccess(p string, fi fs.FileInfo) {
	perm := fi.Mode().Perm()
	switch {
	case fi.IsDir() && perm&0o500 != 0o500:
		os.Chmod(p, perm|0o700)
	case fi.Mode().IsRegular() && perm&0o400 == 0:
		os.Chmod(p, perm|0o600)
	}
}

func ensureDirAccess(p string) {
	if fi, err := os.Lstat(p); err == nil {
		ensureAccess(p, fi)
	}
}

// file records a regular file at rel whose new content is at src.
func (b *deltaBuilder) file(r *rootPlan, rel, src string, fi, lower fs.FileInfo) error {
	ensureAccess(src, fi)
	kind := Added
	if lower != nil {
		switch {
		case lower.IsDir():
			if err := b.deleteTree(r, rel, lower); err != nil {
				return err
			}
		case lower.Mode().IsRegular():
			same, err := sameContent(src, filepath.Join(r.real, filepath.FromSlash(rel)), fi.Size(), lower.Size())
			if err != nil {
				return err
			}
			if same && fi.Mode().Perm() == lower.Mode().Perm() {
				return nil
			}
			kind = Modified
		default:
			kind = Modified
		}
	}
	return b.add(Change{Root: r.Path, Rel: rel, Kind: kind, Type: TypeFile, Mode: fi.Mode().Perm(), Size: fi.Size(), Source: src})
}

// symlink records a symbolic link at rel (read, never followed).
func (b *deltaBuilder) symlink(r *rootPlan, rel, src string, lower fs.FileInfo) error {
	target, err := os.Readlink(src)
	if err != nil {
		return err
	}
	kind := Added
	if lower != nil {
		switch {
		case lower.IsDir():
			if err := b.deleteTree(r, rel, lower); err != nil {
				return err
			}
		case lower.Mode()&fs.ModeSymlink != 0:
			if old, err := os.Readlink(filepath.Join(r.real, filepath.FromSlash(rel))); err == nil && old == target {
				return nil
			}
			kind = Modified
		default:
			kind = Modified
		}
	}
	return b.add(Change{Root: r.Path, Rel: rel, Kind: kind, Type: TypeSymlink, Mode: 0o777, Target: target})
}

// dir records a directory at rel that is new, or replaces a non-directory.
func (b *deltaBuilder) newDir(r *rootPlan, rel string, fi, lower fs.FileInfo) error {
	if lower != nil {
		if err := b.deleteTree(r, rel, lower); err != nil {
			return err
		}
	}
	return b.add(Change{Root: r.Path, Rel: rel, Kind: Added, Type: TypeDir, Mode: fi.Mode().Perm()})
}

// deleteTree records the deletion of rel in the root's real directory and,
// for a directory, of everything under it.
func (b *deltaBuilder) deleteTree(r *rootPlan, rel string, lower fs.FileInfo) error {
	if b.deleted[filepath.Join(r.Path, filepath.FromSlash(rel))] {
		return nil
	}
	if lower.IsDir() {
		ents, err := os.ReadDir(filepath.Join(r.real, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		for _, e := range ents {
			crel := joinRel(rel, e.Name())
			if r.skip[crel] {
				// Hidden from the command (.env, .ssh, … or another
				// root): deleting the directory would take it along,
				// which the command neither saw nor could change.
				return fmt.Errorf("%w: deleting %s would delete %s", ErrProtected, rel, crel)
			}
			if ci := r.lstatLower(crel); ci != nil {
				if err := b.deleteTree(r, crel, ci); err != nil {
					return err
				}
			}
		}
	}
	return b.add(Change{Root: r.Path, Rel: rel, Kind: Deleted, Type: typeOf(lower), Mode: lower.Mode().Perm()})
}

func sameContent(a, b string, asize, bsize int64) (bool, error) {
	if asize != bsize {
		return false, nil
	}
	fa, err := os.OpenFile(a, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.OpenFile(b, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil // unreadable original: count as changed
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			return (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF), nil
		}
	}
}

// Overlay upper-directory markers (with the userxattr option).
const (
	xattrOpaque    = "user.overlay.opaque"
	xattrWhiteout  = "user.overlay.whiteout"
	xattrRedirect  = "user.overlay.redirect"
	xattrMetacopy  = "user.overlay.metacopy"
	xattrTrustedOp = "trusted.overlay.opaque"
)

func getxattr(p, name string) (string, bool) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

func isWhiteout(p string, fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice != 0 {
		return fi.Sys().(*syscall.Stat_t).Rdev == 0
	}
	if fi.Mode().IsRegular() && fi.Size() == 0 {
		_, ok := getxattr(p, xattrWhiteout)
		return ok
	}
	return false
}

func isOpaque(p string) bool {
	v, _ := getxattr(p, xattrOpaque)
	if v == "y" {
		return true
	}
	v, _ = getxattr(p, xattrTrustedOp)
	return v == "y"
}

// overlayDelta walks an rw root's upper directory. rel's upper directory
// is read; lowerDir says whether rel is a real directory in the lower
// layer; opaque whether the lower layer's content of rel was hidden (rel
// or a parent was removed and made again).
func (b *deltaBuilder) overlayDelta(r *rootPlan, rel string, opaque, lowerDir bool) error {
	updir := filepath.Join(r.upper, filepath.FromSlash(rel))
	ensureDirAccess(updir)
	ents, err := os.ReadDir(updir)
	if err != nil {
		return err
	}
	if opaque && lowerDir {
		inUpper := map[string]bool{}
		for _, e := range ents {
			inUpper[e.Name()] = true
		}
		lents, err := os.ReadDir(filepath.Join(r.real, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		for _, le := range lents {
			crel := joinRel(rel, le.Name())
			if inUpper[le.Name()] || r.skip[crel] {
				continue
			}
			if li := r.lstatLower(crel); li != nil {
				if err := b.deleteTree(r, crel, li); err != nil {
					return err
				}
			}
		}
	}
	for _, e := range ents {
		crel := joinRel(rel, e.Name())
		if r.skip[crel] {
			continue
		}
		up := filepath.Join(updir, e.Name())
		ui, err := os.Lstat(up)
		if err != nil {
			return err
		}
		for _, x := range []string{xattrRedirect, xattrMetacopy} {
			if _, ok := getxattr(up, x); ok {
				return fmt.Errorf("%w: %s has %s", ErrOverlay, crel, x)
			}
		}
		var li fs.FileInfo
		if lowerDir {
			li = r.lstatLower(crel)
		}
		switch {
		case isWhiteout(up, ui):
			if li != nil {
				if err := b.deleteTree(r, crel, li); err != nil {
					return err
				}
			}
		case ui.IsDir():
			if li != nil && li.IsDir() {
				if ui.Mode().Perm() != li.Mode().Perm() {
					if err := b.add(Change{Root: r.Path, Rel: crel, Kind: Modified, Type: TypeDir, Mode: ui.Mode().Perm()}); err != nil {
						return err
					}
				}
				if err := b.overlayDelta(r, crel, opaque || isOpaque(up), true); err != nil {
					return err
				}
			} else {
				if err := b.newDir(r, crel, ui, li); err != nil {
					return err
				}
				if err := b.overlayDelta(r, crel, false, false); err != nil {
					return err
				}
			}
		case ui.Mode().IsRegular():
			if err := b.file(r, crel, up, ui, li); err != nil {
				return err
			}
		case ui.Mode()&fs.ModeSymlink != 0:
			if err := b.symlink(r, crel, up, li); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %s (%s)", ErrSpecialFile, path.Join(r.Path, crel), ui.Mode().Type())
		}
	}
	return nil
}

// copyDelta walks an rw root's copy. Entries the manifest shows untouched
// (same inode and ctime) are unchanged whatever happened to the original
// meanwhile; touched and new entries are compared with the original;
// manifest entries gone from the copy were deleted.
func (b *deltaBuilder) copyDelta(r *rootPlan, manifest map[string]stamp) error {
	seen := map[string]bool{}
	var walk func(rel string, lowerDir bool) error
	walk = func(rel string, lowerDir bool) error {
		cdir := filepath.Join(r.upper, filepath.FromSlash(rel))
		ensureDirAccess(cdir)
		ents, err := os.ReadDir(cdir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			crel := joinRel(rel, e.Name())
			if r.skip[crel] {
				continue
			}
			seen[crel] = true
			cp := filepath.Join(cdir, e.Name())
			ci, err := os.Lstat(cp)
			if err != nil {
				return err
			}
			m, inManifest := manifest[crel]
			if inManifest && !ci.IsDir() && m.typ == typeOf(ci) {
				cs := stampOf(ci)
				if cs.ino == m.ino && cs.ctime == m.ctime {
					continue // untouched
				}
			}
			var li fs.FileInfo
			if lowerDir {
				li = r.lstatLower(crel)
			}
			switch {
			case ci.IsDir():
				if inManifest && m.dir {
					if ci.Mode().Perm() != m.perm {
						if err := b.add(Change{Root: r.Path, Rel: crel, Kind: Modified, Type: TypeDir, Mode: ci.Mode().Perm()}); err != nil {
							return err
						}
					}
					if err := walk(crel, li != nil && li.IsDir()); err != nil {
						return err
					}
				} else if li != nil && li.IsDir() {
					// Made while the run went on, in the original too.
					if ci.Mode().Perm() != li.Mode().Perm() {
						if err := b.add(Change{Root: r.Path, Rel: crel, Kind: Modified, Type: TypeDir, Mode: ci.Mode().Perm()}); err != nil {
							return err
						}
					}
					if err := walk(crel, true); err != nil {
						return err
					}
				} else {
					if err := b.newDir(r, crel, ci, li); err != nil {
						return err
					}
					if err := walk(crel, false); err != nil {
						return err
					}
				}
			case ci.Mode().IsRegular():
				if err := b.file(r, crel, cp, ci, li); err != nil {
					return err
				}
			case ci.Mode()&fs.ModeSymlink != 0:
				if err := b.symlink(r, crel, cp, li); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%w: %s (%s)", ErrSpecialFile, path.Join(r.Path, crel), ci.Mode().Type())
			}
		}
		return nil
	}
	if err := walk("", true); err != nil {
		return err
	}
	// Deleted: copied, gone from the copy. Only the top of a deleted tree
	// is looked at; deleteTree records the rest from the original.
	var gone []string
	for rel := range manifest {
		if !seen[rel] {
			gone = append(gone, rel)
		}
	}
	slices.Sort(gone)
	var last string
	for _, rel := range gone {
		if last != "" && strings.HasPrefix(rel, last+"/") {
			continue
		}
		last = rel
		if li := lstatLowerSafe(r, rel); li != nil {
			if err := b.deleteTree(r, rel, li); err != nil {
				return err
			}
		}
	}
	return nil
}

// lstatLowerSafe is lstatLower for a rel whose parents are not known to be
// directories: it checks each component without following links.
func lstatLowerSafe(r *rootPlan, rel string) fs.FileInfo {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		fi := r.lstatLower(strings.Join(parts[:i], "/"))
		if fi == nil || !fi.IsDir() {
			return nil
		}
	}
	return r.lstatLower(rel)
}
