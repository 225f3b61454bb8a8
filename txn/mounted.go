package txn

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"

	"golang.org/x/sys/unix"
)

// A root's file system is made durable by the Syncer's syncfs of it, which
// does not reach a file system mounted below the root. An effect whose
// directory is on another mount than the top of its root (Effect.Mounted)
// is made durable by fsync instead: WriteFile fsyncs the staging file and
// its directory before the commit; Apply fsyncs the directory once the
// effect is done, and a directory the effects made once its final mode is
// set (finalModes). Each is opened before the change it covers, since
// Linux reports a writeback error to an fsync only through a descriptor
// opened before the error, once it has been seen (as for syncfs: see
// fileSystems). Redo decides Mounted anew (mountedNow) and syncs the
// directory's whole file system (syncfs through it): an intent decided by
// a build before Effect.Mounted neither says it nor had its staging file
// fsynced, and the file it wrote may be one its mode keeps the kernel's
// user from opening.

// ErrNotDurable is wrapped by the error of a failed fsync of an effect on
// another mount. Trying again cannot cure it: Linux reports the writeback
// error once, and a second fsync returns 0 although the change never
// reached the disk. Apply's caller fails stop instead.
var ErrNotDurable = errors.New("txn: an fsync failed, so the change may not be on disk")

// mountedDir is the directory of an effect on another mount, opened for
// its fsync; the zero mountedDir, for any other effect, does nothing.
type mountedDir struct {
	f    *os.File
	path string
}

// openMounted opens the directory of e under r if e is Mounted. A missing
// directory is no error (there is nothing there to change, and nothing to
// make durable): the effect itself reports what it finds.
func openMounted(r *os.Root, e Effect) (mountedDir, error) {
	if !e.Mounted {
		return mountedDir{}, nil
	}
	return openSyncDir(r, path.Dir(e.Path))
}

// openSyncDir opens directory dir under r for a later sync; nothing
// there is no error, and no directory.
func openSyncDir(r *os.Root, dir string) (mountedDir, error) {
	f, err := r.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if absent(err) {
		return mountedDir{}, nil
	}
	if err != nil {
		return mountedDir{}, fmt.Errorf("open %s (on another mount than the root, made durable by fsync): %w", dir, err)
	}
	return mountedDir{f: f, path: dir}, nil
}

// sync fsyncs the directory, if one is open; with whole, it syncs the
// directory's whole file system (syncfs), which covers the content of a
// file the change put there too, whatever its mode.
func (d mountedDir) sync(whole bool) error {
	switch {
	case d.f == nil:
		return nil
	case !whole:
		return fsync(d.f, d.path)
	}
	if err := unix.Syncfs(int(d.f.Fd())); err != nil {
		return fmt.Errorf("syncfs of %s (on another mount than the root): %w: %w", d.path, ErrNotDurable, err)
	}
	return nil
}

// close closes the directory, if one is open.
func (d mountedDir) close() {
	if d.f != nil {
		d.f.Close()
	}
}

// fsync fsyncs f (named name), wrapping a failure in ErrNotDurable.
// EINVAL, a file system that has no sync (9p, vboxsf, for directories),
// is none to make, as a syncfs of it returns 0.
func fsync(f *os.File, name string) error {
	if err := f.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("fsync %s (on another mount than the root): %w: %w", name, ErrNotDurable, err)
	}
	return nil
}

// change runs an effect's change between opening its directory (if it is
// Mounted) and syncing it (see mountedDir.sync for whole).
func change(r *os.Root, e Effect, whole bool, do func() error) error {
	d, err := openMounted(r, e)
	if err != nil {
		return err
	}
	defer d.close()
	if err := do(); err != nil {
		return err
	}
	return d.sync(whole)
}

// mountedNow returns effects with Mounted set for each write, delete and
// mkdir whose directory (its nearest existing one) lies on another mount
// than the top of its root now, and cleared for the others. An effect
// whose directory cannot be read keeps its flag: the effect itself meets
// the same error and reports it.
func mountedNow(effects []Effect, root func(dir string) (*os.Root, error)) []Effect {
	out := slices.Clone(effects)
	tops := map[string]mountID{}
	for i := range out {
		e := &out[i]
		if e.Op != OpWrite && e.Op != OpDelete && e.Op != OpMkdir {
			continue
		}
		r, err := root(e.Root)
		if err != nil {
			continue
		}
		top, ok := tops[e.Root]
		if !ok {
			if top, err = mountOf(r, "."); err != nil {
				continue
			}
			tops[e.Root] = top
		}
		d := path.Dir(e.Path)
		m, err := mountOf(r, d)
		for absent(err) && d != "." {
			d = path.Dir(d)
			m, err = mountOf(r, d)
		}
		if err == nil {
			e.Mounted = m.id != top.id
		}
	}
	return out
}

// mountOf returns the mount of directory rel under r.
func mountOf(r *os.Root, rel string) (mountID, error) {
	dir, err := openDir(r, rel)
	if err != nil {
		return mountID{}, err
	}
	defer dir.Close()
	e, err := statEntry(int(dir.Fd()), "")
	if err != nil {
		return mountID{}, fmt.Errorf("stat %s: %w", rel, err)
	}
	return e.mount, nil
}
