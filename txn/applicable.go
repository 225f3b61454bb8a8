package txn

import (
	"errors"
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// Before the commit, staging checks that Apply will be able to carry an
// effect out: once committed, an effect the file system refuses can no
// longer be undone, and the kernel would fail stop on it. Each check
// looks for a refusal that trying again cannot cure (see lasting): the
// entry is a mount point (rename(2) and unlink(2) say EBUSY), a proc.exec
// file would be renamed from its staging pool into another mount (EXDEV),
// the file system is read-only (EROFS), the entry is immutable or
// append-only (chattr +i, +a: EPERM), its directory is not writable by
// the kernel's user (EACCES), or the entry belongs to another user in a
// sticky directory (EPERM). A delete checks every entry of the tree it
// removes. A change made to the workspace between the check and the
// apply (a mount made meanwhile) is still possible: recovery reports
// such an effect as a ConflictRefused rather than failing.

// NotApplicableError is the error of a staging refused because Apply
// could not carry the effect out after the commit.
type NotApplicableError struct {
	Path   string // the entry refused, relative to its root
	Reason string // why, in words
	Err    error  // the errno apply would meet
}

func (e *NotApplicableError) Error() string {
	return fmt.Sprintf("%s: %s; refused before the commit, since the change could not be applied", e.Path, e.Reason)
}

// Unwrap returns the errno apply would meet.
func (e *NotApplicableError) Unwrap() error { return e.Err }

func notApplicable(p string, err error, format string, args ...any) error {
	return &NotApplicableError{Path: p, Reason: fmt.Sprintf(format, args...), Err: err}
}

// openDir opens directory rel of root as an O_PATH descriptor.
func openDir(root *os.Root, rel string) (*os.File, error) {
	return root.OpenFile(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// checkReplace checks that a file staged beside rel can be renamed over
// it: rel, if present, is no mount point, not immutable or append-only,
// nor another user's in a sticky directory, and its directory is not
// append-only. That the directory is writable, the staging file's
// creation there shows. It returns the mount of rel's directory; ok is
// false when that directory does not exist.
func checkReplace(root *os.Root, rel string) (m mountID, ok bool, err error) {
	dir, err := openDir(root, path.Dir(rel))
	if absent(err) {
		return mountID{}, false, nil // the staging file's creation says so
	}
	if err != nil {
		return mountID{}, false, fmt.Errorf("open %s: %w", path.Dir(rel), err)
	}
	defer dir.Close()
	fd := int(dir.Fd())
	parent, err := statEntry(fd, "")
	if err != nil {
		return mountID{}, false, fmt.Errorf("stat %s: %w", path.Dir(rel), err)
	}
	if parent.attrs&unix.STATX_ATTR_APPEND != 0 {
		return mountID{}, false, notApplicable(rel, unix.EPERM, "directory %s is append-only (chattr +a): nothing in it can be removed or renamed", path.Dir(rel))
	}
	if _, err = checkEntry(fd, path.Base(rel), rel, parent); err != nil {
		return mountID{}, false, err
	}
	return parent.mount, true, nil
}

// checkDelete checks that rel can be removed: its
// directory is writable and not append-only, and neither rel nor any
// entry under it is a mount point, immutable or append-only, another
// user's in a sticky directory, or in a directory the kernel's user
// cannot list and write.
func checkDelete(root *os.Root, rel string) (mountID, error) {
	dir, err := openDir(root, path.Dir(rel))
	if err != nil {
		return mountID{}, fmt.Errorf("open %s: %w", path.Dir(rel), err)
	}
	defer dir.Close()
	fd := int(dir.Fd())
	parent, err := statEntry(fd, "")
	if err != nil {
		return mountID{}, fmt.Errorf("stat %s: %w", path.Dir(rel), err)
	}
	if err := checkWritable(fd, rel, path.Dir(rel), parent, unix.W_OK|unix.X_OK); err != nil {
		return mountID{}, err
	}
	e, err := checkEntry(fd, path.Base(rel), rel, parent)
	if err == nil && e.isDir() {
		err = checkTree(fd, path.Base(rel), rel, e)
	}
	return parent.mount, err
}

// checkCreate checks that rel, absent or replaced, can be made: the
// nearest directory at or above its parent that exists now (the others
// are made by earlier effects of the call) is writable, and rel, if
// present, passes checkReplace's entry checks. With a pool (proc.exec's
// staging files, at the top of root), that directory must be on the
// pool's mount, since a file is renamed from the pool into it. It returns
// that directory's mount, which rel's directory will be on.
func checkCreate(root *os.Root, rel string, pool *mountID) (mountID, error) {
	d := path.Dir(rel)
	dir, err := openDir(root, d)
	for absent(err) && d != "." {
		d = path.Dir(d)
		dir, err = openDir(root, d)
	}
	if err != nil {
		return mountID{}, fmt.Errorf("open %s: %w", d, err)
	}
	defer dir.Close()
	fd := int(dir.Fd())
	parent, err := statEntry(fd, "")
	if err != nil {
		return mountID{}, fmt.Errorf("stat %s: %w", d, err)
	}
	if pool != nil && parent.mount.id != pool.id {
		return mountID{}, notApplicable(rel, unix.EXDEV, "%s is on another mount than the top of the workspace root, where the call's files are staged: it cannot be written by proc.exec (fs.write can)", d)
	}
	if err := checkWritable(fd, rel, d, parent, unix.W_OK|unix.X_OK); err != nil {
		return mountID{}, err
	}
	if d == path.Dir(rel) {
		_, err = checkEntry(fd, path.Base(rel), rel, parent)
	}
	return parent.mount, err
}

// checkWritable checks that directory dir (descriptor fd, entry self)
// grants the kernel's user mode (faccessat with the effective ids: a
// read-only file system and an immutable directory refuse root too) and
// is not append-only; a refusal names target, the entry to change.
func checkWritable(fd int, target, dir string, self entry, mode uint32) error {
	label := "directory " + dir
	if dir == "." {
		label = "the root directory"
	}
	err := unix.Faccessat2(fd, ".", mode, unix.AT_EACCESS)
	if errors.Is(err, unix.ENOSYS) {
		// Before Linux 5.8: x/sys emulates AT_EACCESS from the mode bits.
		err = unix.Faccessat(fd, ".", mode, unix.AT_EACCESS)
	}
	switch {
	case err == nil:
	case errors.Is(err, unix.EROFS):
		return notApplicable(target, err, "%s is on a read-only file system", label)
	case errors.Is(err, unix.EPERM):
		return notApplicable(target, err, "%s is immutable (chattr +i)", label)
	case errors.Is(err, unix.EACCES):
		return notApplicable(target, err, "%s is not writable by the kernel's user (uid %d)", label, os.Geteuid())
	default:
		return fmt.Errorf("access %s: %w", dir, err)
	}
	if self.attrs&unix.STATX_ATTR_APPEND != 0 {
		return notApplicable(target, unix.EPERM, "%s is append-only (chattr +a): nothing in it can be removed or renamed", label)
	}
	return nil
}

// checkEntry checks entry name of directory fd (entry dir), shown as
// where, for what prevents renaming or removing it, and returns it. An
// absent entry passes.
func checkEntry(fd int, name, where string, dir entry) (entry, error) {
	e, err := statEntry(fd, name)
	if absent(err) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("stat %s: %w", where, err)
	}
	switch uid := uint32(os.Geteuid()); {
	case e.crosses(dir):
		return e, notApplicable(where, unix.EBUSY, "it is a mount point (another file system, or a bind mount)")
	case e.attrs&(unix.STATX_ATTR_IMMUTABLE|unix.STATX_ATTR_APPEND) != 0:
		return e, notApplicable(where, unix.EPERM, "it is immutable or append-only (chattr +i, +a)")
	case dir.mode&unix.S_ISVTX != 0 && uid != 0 && e.uid != uid && dir.uid != uid:
		return e, notApplicable(where, unix.EPERM, "it belongs to another user (uid %d) in a sticky directory", e.uid)
	}
	return e, nil
}

// checkTree checks every entry under directory name of dirfd (entry
// self, shown as where) as checkEntry does, and that each directory of
// the tree can be listed and, when it holds entries to remove, written
// (an empty one goes with its parent's permission alone).
func checkTree(dirfd int, name, where string, self entry) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		return notApplicable(where, err, "directory %s cannot be listed by the kernel's user (uid %d)", where, os.Geteuid())
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", where, err)
	}
	f := os.NewFile(uintptr(fd), where)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list %s: %w", where, err)
	}
	if len(names) == 0 {
		return nil
	}
	if err := checkWritable(fd, where, where, self, unix.W_OK|unix.X_OK); err != nil {
		return err
	}
	for _, n := range names {
		p := where + "/" + n
		e, err := checkEntry(fd, n, p, self)
		if err != nil {
			return err
		}
		if e.isDir() {
			if err := checkTree(fd, n, p, e); err != nil {
				return err
			}
		}
	}
	return nil
}
