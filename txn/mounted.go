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
// its directory before the commit; Apply and Redo fsync the directory
// once the effect is done, and a directory the effects made once its
// final mode is set (finalModes). Each directory is opened before the
// change it covers, since Linux reports a writeback error to an fsync only
// through a descriptor opened before the error, once it has been seen (as
// for syncfs: see fileSystems). Redo decides Mounted anew (mountedNow) and
// fsyncs the file a write put there too: an intent decided by a build
// before Effect.Mounted neither says it nor had its staging file fsynced,
// and an error no one has seen is reported to a new descriptor.

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
	dir := path.Dir(e.Path)
	f, err := r.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if absent(err) {
		return mountedDir{}, nil
	}
	if err != nil {
		return mountedDir{}, fmt.Errorf("open %s (on another mount than the root, made durable by fsync): %w", dir, err)
	}
	return mountedDir{f: f, path: dir}, nil
}

// sync fsyncs the directory, if one is open.
func (d mountedDir) sync() error {
	if d.f == nil {
		return nil
	}
	return fsync(d.f, d.path)
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
// Mounted) and fsyncing it.
func change(r *os.Root, e Effect, do func() error) error {
	d, err := openMounted(r, e)
	if err != nil {
		return err
	}
	defer d.close()
	if err := do(); err != nil {
		return err
	}
	return d.sync()
}

// syncPath fsyncs rel under r, a regular file or a directory (anything
// else, or nothing there, has nothing to sync).
func syncPath(r *os.Root, rel string) error {
	f, err := r.OpenFile(rel, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if absent(err) || errors.Is(err, unix.ELOOP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s for fsync: %w", rel, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !(fi.Mode().IsRegular() || fi.IsDir()) {
		return err
	}
	return fsync(f, rel)
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
