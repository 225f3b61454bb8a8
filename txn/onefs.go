package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// entry is what statx tells of a directory entry, not followed.
type entry struct {
	mode  uint32 // st_mode: type and permission bits
	uid   uint32
	mount mountID
	attrs uint64 // STATX_ATTR_* the file system reports
}

// mountID names the mount an entry is on: its mount id where the kernel
// reports one (Linux 5.8), else its device; root is set for the root of
// a mount (a mount point).
type mountID struct {
	id   uint64
	root bool
}

// statEntry returns the entry name of directory dirfd ("" for dirfd
// itself).
func statEntry(dirfd int, name string) (entry, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var st unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_UID|unix.STATX_MNT_ID, &st); err != nil {
		return entry{}, err
	}
	e := entry{mode: uint32(st.Mode), uid: st.Uid, attrs: st.Attributes & st.Attributes_mask}
	if st.Mask&unix.STATX_MNT_ID != 0 {
		e.mount.id = st.Mnt_id
	} else {
		e.mount.id = unix.Mkdev(st.Dev_major, st.Dev_minor)
	}
	e.mount.root = e.attrs&unix.STATX_ATTR_MOUNT_ROOT != 0
	return e, nil
}

func (e entry) isDir() bool { return e.mode&unix.S_IFMT == unix.S_IFDIR }

// crosses reports whether e, an entry of directory dir, is on another
// mount than dir: a mount point (of another file system, or a bind
// mount of the same one).
func (e entry) crosses(dir entry) bool { return e.mount.root || e.mount.id != dir.mount.id }

// errMountPoint is wrapped by the error of a removal that met a mount
// point: EBUSY, as rename(2) and rmdir(2) of one say.
func errMountPoint(p string) error {
	return fmt.Errorf("%s is a mount point of another file system: it is not removed, nor anything on it: %w", p, unix.EBUSY)
}

// removeTree removes name under r and, for a directory, everything below
// it, like os.Root.RemoveAll, but never crosses into another file system
// mounted at or below name (as rm --one-file-system): a mount point is
// left, with the directories that lead to it, and the error names it.
// Nothing at name is no error.
func removeTree(r *os.Root, name string) error {
	dir, err := r.OpenFile(path.Dir(name), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	fd := int(dir.Fd())
	parent, err := statEntry(fd, "")
	if err != nil {
		return fmt.Errorf("stat %s: %w", path.Dir(name), err)
	}
	base := path.Base(name)
	e, err := statEntry(fd, base)
	switch {
	case err != nil:
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	case e.crosses(parent):
		return errMountPoint(name)
	case e.isDir():
		if err := clearDir(fd, base, name, e); err != nil {
			return err
		}
		err = unix.Unlinkat(fd, base, unix.AT_REMOVEDIR)
	default:
		err = unix.Unlinkat(fd, base, 0)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	return nil
}

// clearDir removes everything in directory name of dirfd (self, shown as
// where) that is on self's mount, depth first; it goes on past a mount
// point, and returns the errors met.
func clearDir(dirfd int, name, where string, self entry) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: where, Err: err}
	}
	f := os.NewFile(uintptr(fd), where)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: where, Err: err}
	}
	var errs []error
	for _, n := range names {
		p := where + "/" + n
		e, err := statEntry(fd, n)
		switch {
		case errors.Is(err, unix.ENOENT):
			continue
		case err != nil:
			errs = append(errs, &fs.PathError{Op: "stat", Path: p, Err: err})
			continue
		case e.crosses(self):
			errs = append(errs, errMountPoint(p))
			continue
		case e.isDir():
			if err := clearDir(fd, n, p, e); err != nil {
				errs = append(errs, err)
				continue
			}
			err = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
		default:
			err = unix.Unlinkat(fd, n, 0)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &fs.PathError{Op: "remove", Path: p, Err: err})
		}
	}
	return errors.Join(errs...)
}
