package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Spares recycles the inodes of files that applied writes replaced, as the
// staging files of later writes.
//
// Why: a staged write creates one inode and frees another (the file it
// replaces). On ext4 without a journal, creating an inode scans past every
// inode freed in the last 10 to 15 seconds (recently_deleted), so at a
// thousand writes a second each create cost ~170 µs of CPU, growing with the
// write rate; reusing an inode costs a few cheap syscalls.
//
// Where the inodes wait: a pool directory private to the kernel (its data
// directory), never in a workspace, so no agent and no sandbox can open a
// spare. An inode becomes a spare only when nothing else can reach it: it
// is a regular file with no other link, no open descriptor in any process
// (a write lease, F_SETLEASE, is granted only then), no extended attribute
// (no ACL or label travels to another path), and it is owned by the
// kernel's user and group, as a file it creates would be. A spare keeps
// its content until a write reuses it: the new content overwrites it in
// place and the file is cut to the new length, so no block is freed and
// allocated again (freeing blocks was the next cost: ext4 truncation, and
// a discard on a file system mounted with it). Old content thus waits in
// the kernel's private data directory, which holds call results anyway,
// for at most spareLimit files, until reused or removed at the next open.
//
// Ordering: a replaced inode is linked into the pool before the write's
// rename, and is offered for reuse (Release) only after the rename is
// durable, so no crash can leave a workspace name on an inode that a later
// write overwrites. A spare taken for staging is an ordinary staging file
// from then on: made durable before commit, removed by rollback.
//
// A spare is only used on the file system of the pool (rename across file
// systems fails, and the write creates its staging file as before), and
// not in a setgid directory or one with a default ACL, where a created
// file would take attributes from the directory.
type Spares struct {
	dir   *os.File // the pool directory
	limit int

	mu   sync.Mutex
	free []spare // in dir, durable there, reachable by nothing else
	next uint64
}

// spare is a file of the pool and its size.
type spare struct {
	name string
	size int64
}

// spareLimit bounds the spares kept: enough for the writes of many
// concurrent calls; the rest are removed.
const spareLimit = 256

// OpenSpares opens the pool directory dir (made if absent), emptied: the
// spares of an earlier process may have been taken or released at a crash,
// so none is trusted.
func OpenSpares(dir string) (*Spares, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("txn: spares %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("txn: spares %s: %w", dir, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("txn: spares %s: %w", dir, err)
	}
	return &Spares{dir: d, limit: spareLimit}, nil
}

// Close closes the pool directory. Spares left in it are removed by the
// next OpenSpares.
func (sp *Spares) Close() error { return sp.dir.Close() }

// Free returns how many spares wait for reuse.
func (sp *Spares) Free() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.free)
}

func (sp *Spares) fd() int { return int(sp.dir.Fd()) }

func (sp *Spares) take() (spare, bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if len(sp.free) == 0 {
		return spare{}, false
	}
	n := sp.free[len(sp.free)-1]
	sp.free = sp.free[:len(sp.free)-1]
	return n, true
}

func (sp *Spares) give(n spare) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if len(sp.free) >= sp.limit {
		return false
	}
	sp.free = append(sp.free, n)
	return true
}

func (sp *Spares) name() string {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.next++
	return strconv.FormatUint(sp.next, 10)
}

// create opens a staging file name (a single name in directory d) for
// writing, reusing a spare when there is one and d allows it, and returns
// the size of the content the spare holds, for the caller to cut the file
// to what it writes. ok false means no spare was used; the caller creates
// the file.
func (sp *Spares) create(d *os.File, name string) (f *os.File, size int64, ok bool) {
	if sp == nil || !plainDir(d) {
		return nil, 0, false
	}
	s, ok := sp.take()
	if !ok {
		return nil, 0, false
	}
	dfd := int(d.Fd())
	if err := unix.Renameat2(sp.fd(), s.name, dfd, name, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EXDEV) && sp.give(s) {
			return nil, 0, false
		}
		unix.Unlinkat(sp.fd(), s.name, 0)
		return nil, 0, false
	}
	// No O_TRUNC: the content is overwritten in place (see Spares).
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(dfd, name, 0)
		return nil, 0, false
	}
	return os.NewFile(uintptr(fd), name), s.size, true
}

// plainDir reports whether a file created in d takes nothing from d: d is
// not setgid and has no default ACL.
func plainDir(d *os.File) bool {
	var st unix.Stat_t
	if unix.Fstat(int(d.Fd()), &st) != nil || st.Mode&unix.S_ISGID != 0 {
		return false
	}
	_, err := unix.Fgetxattr(int(d.Fd()), "system.posix_acl_default", nil)
	return errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP)
}

// Retired holds the inodes an Apply replaced and linked into the pool,
// until Release.
type Retired struct {
	files []retiredFile
}

type retiredFile struct {
	name string
	f    *os.File
}

// Apply is txn.Apply that keeps, for each write, the inode of the file it
// replaces in the pool (when nothing else can reach it, see Spares). The
// caller passes the result to Release once the applied changes are durable,
// or could not be made so.
func (sp *Spares) Apply(effects []Effect, root func(dir string) (*os.Root, error)) (*Retired, error) {
	ret := &Retired{}
	for i, e := range effects {
		if e.Op != OpWrite {
			if err := Apply(effects[i:i+1], root); err != nil {
				return ret, err
			}
			continue
		}
		r, err := root(e.Root)
		if err != nil {
			return ret, fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
		if err := sp.replace(r, e, ret); err != nil {
			return ret, fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
	}
	return ret, nil
}

// replace renames write e's staging file onto its target, first linking
// the target's inode into the pool, and adds it to ret if it may be
// reused. A staging file that is gone was renamed already.
func (sp *Spares) replace(r *os.Root, e Effect, ret *Retired) error {
	dir := path.Dir(e.Path)
	d, err := r.Open(dir)
	if err != nil {
		// No parent: the rename fails the same way, or was done.
		if err := r.Rename(e.Stage, e.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	defer d.Close()
	n := sp.name()
	linked := unix.Linkat(int(d.Fd()), path.Base(e.Path), sp.fd(), n, 0) == nil
	if path.Dir(e.Stage) == dir {
		// One directory, opened safely inside the root: rename by
		// name, without resolving the path again.
		err = unix.Renameat(int(d.Fd()), path.Base(e.Stage), int(d.Fd()), path.Base(e.Path))
		if err != nil {
			err = &os.LinkError{Op: "rename", Old: e.Stage, New: e.Path, Err: err}
		}
	} else {
		err = r.Rename(e.Stage, e.Path)
	}
	if err != nil {
		if linked {
			// The rename did not happen (or happened before: the link
			// is then to the new content): no spare.
			unix.Unlinkat(sp.fd(), n, 0)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if linked {
		if f := sp.retire(n); f != nil {
			ret.files = append(ret.files, retiredFile{n, f})
		}
	}
	return nil
}

// retire opens spare n, replaced by a rename, if nothing else can reach
// it (see Spares); otherwise it removes n and returns nil.
func (sp *Spares) retire(n string) *os.File {
	fd, err := unix.Openat(sp.fd(), n, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == nil {
		if reachable(fd) {
			unix.Close(fd)
		} else {
			return os.NewFile(uintptr(fd), n)
		}
	}
	unix.Unlinkat(sp.fd(), n, 0)
	return nil
}

// reachable reports whether the open file fd may be reached by anything
// but the pool and fd itself: it is not a regular file, has another link,
// is owned by someone else, is open elsewhere, or carries an extended
// attribute.
func reachable(fd int) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 ||
		st.Uid != uint32(os.Geteuid()) || st.Gid != uint32(os.Getegid()) {
		return true
	}
	// A write lease is granted only while no other descriptor, in any
	// process, has the file open; the pool is private, so none can
	// open it later.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return true
	}
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	if sz, err := unix.Flistxattr(fd, nil); err != nil || sz != 0 {
		return true
	}
	return false
}

// Release ends retired: when durable is true (the renames that replaced
// the inodes are durable), each is offered for reuse; otherwise, or beyond
// the pool's bound, each is removed from the pool.
func (sp *Spares) Release(retired *Retired, durable bool) {
	if retired == nil {
		return
	}
	for _, r := range retired.files {
		var st unix.Stat_t
		ok := durable && unix.Fstat(int(r.f.Fd()), &st) == nil && st.Nlink == 1
		r.f.Close()
		if !ok || !sp.give(spare{r.name, st.Size}) {
			unix.Unlinkat(sp.fd(), r.name, 0)
		}
	}
}
