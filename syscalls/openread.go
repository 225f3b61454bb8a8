package syscalls

import (
	"os"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// openat2Missing is set once openat2(2) is found missing (Linux before
// 5.6, or refused by a seccomp filter); openRead then takes os.Root's way.
var openat2Missing atomic.Bool

// openRead opens r's file for reading (O_NONBLOCK: opening a FIFO must not
// wait for a writer) and returns its descriptor, which the caller closes.
//
// It opens as r.Root.OpenFile does, never leaving the root at the time of
// the open whatever changed since the path was resolved, but in one
// openat2(2) call relative to the root directory with RESOLVE_BENEATH (no
// component, symbolic links included, may lead outside it; an absolute
// link is refused) and RESOLVE_NO_MAGICLINKS, and without the *os.File:
// os.Root walks the path one openat(2) per component and wraps the
// descriptor in a File registered with the runtime, which costs an audited
// read a handful of allocations and a failed epoll_ctl(2). Without
// openat2, it falls back to r.Root.OpenFile.
func (r *Resource) openRead() (int, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	if r.dir != nil && !openat2Missing.Load() {
		o := &openat2Call{rel: r.Rel, how: unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}}
		// Control keeps the directory's descriptor open (and so its
		// number not reused by another open) until run returns.
		if err := r.dir.Control(o.run); err != nil {
			return -1, &os.PathError{Op: "openat2", Path: r.Rel, Err: err}
		}
		switch o.err {
		case nil:
			return o.fd, nil
		case unix.ENOSYS, unix.EPERM:
			openat2Missing.Store(true)
		case unix.EINTR, unix.EAGAIN:
			// Still racing after openat2Tries: os.Root's way, this once.
		case unix.EXDEV:
			// RESOLVE_BENEATH's refusal: the path leaves the root.
			return -1, &os.PathError{Op: "openat2", Path: r.Rel, Err: errEscapes}
		default:
			return -1, &os.PathError{Op: "openat2", Path: r.Rel, Err: o.err}
		}
	}
	f, err := r.Root.OpenFile(r.Rel, flags, 0)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "dup", Path: r.Rel, Err: err}
	}
	return fd, nil
}

// openat2Call is one openat2(2) of rel under a directory's descriptor,
// in one allocation for RawConn.Control.
type openat2Call struct {
	rel string
	how unix.OpenHow
	fd  int
	err error
}

func (o *openat2Call) run(dir uintptr) {
	for range openat2Tries {
		// EAGAIN: a concurrent rename raced the lookup, and the kernel
		// asks for a retry under RESOLVE_BENEATH.
		if o.fd, o.err = unix.Openat2(int(dir), o.rel, &o.how); o.err != unix.EINTR && o.err != unix.EAGAIN {
			return
		}
	}
}

// openat2Tries bounds the retries of one openat2 that renames keep
// racing; openRead then opens through os.Root, which walks the path.
const openat2Tries = 16

// preadUpTo appends to b[:0] the file fd from offset off to its end or to
// max bytes; known is how many bytes from off the file held when it was
// stat'd. b is grown to hold those and one more to begin with (at most 1
// MiB: known may be stale or large). A read that returns fewer bytes than
// asked and ends exactly at known bytes ends it: the file is still the
// size stat'd, and one read returning 0 to say so is saved. Any other
// short read reads on until a read returns 0: procfs and sysfs files
// stat as 0 or 4096 bytes and return a buffer's worth a read, and a FUSE
// or network file system may return one anywhere.
func preadUpTo(b []byte, fd int, off, max, known int64) ([]byte, error) {
	b = slices.Grow(b[:0], int(min(known+1, max, 1<<20)))
	for int64(len(b)) < max {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		ask := b[len(b):min(int64(cap(b)), max)]
		n, err := unix.Pread(fd, ask, off+int64(len(b)))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return b, err
		case n == 0:
			return b, nil
		}
		b = b[:len(b)+n]
		if n < len(ask) && known > 0 && int64(len(b)) == known {
			return b, nil
		}
	}
	return b, nil
}
