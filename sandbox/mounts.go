package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// MountTable is this process's mount namespace as /proc/self/mountinfo
// describes it (ReadMounts), read once for several questions.
type MountTable []mountEntry

// ReadMounts returns the mount table as it is now; without mountinfo it
// is empty. The table is shared between callers: read it, never modify
// it.
//
// It is read again only when the mounts have changed since it was last
// read: the kernel marks an open /proc/self/mountinfo with POLLPRI when a
// mount or unmount changes the namespace's table (proc(5)), and a poll
// that reports it also clears it (fs/proc_namespace.c, mounts_poll), so a
// table read after such a poll is current until the next one reports a
// change. Reading mountinfo costs ~40 µs of kernel time with a few dozen
// mounts, on the path of every sandboxed call (kernel.resolveReach); a
// poll costs ~1 µs. Where mountinfo cannot be opened and polled, every
// call reads it.
func ReadMounts() MountTable {
	mounts.mu.Lock()
	defer mounts.mu.Unlock()
	if mounts.fd < 0 {
		// Opened before the first read: a change after the open is
		// reported by the first poll, one before it is in the read.
		fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t, _ := readMountinfo()
			return t
		}
		mounts.fd = fd
	} else if !mountsChanged(mounts.fd) {
		return mounts.table
	}
	t, err := readMountinfo()
	if err != nil {
		// Not cached: the next call polls (and reads) again.
		unix.Close(mounts.fd)
		mounts.fd = -1
		return nil
	}
	mounts.table = t
	return t
}

// mounts is the table ReadMounts read last, and the open mountinfo whose
// poll says whether it is still current (fd -1: none yet).
var mounts = struct {
	mu    sync.Mutex
	fd    int
	table MountTable
}{fd: -1}

// mountsChanged polls the open mountinfo fd without waiting: true when a
// mount changed the table since the last poll, or when the poll fails
// (the caller then reads the table).
func mountsChanged(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n != 0 && p[0].Revents&(unix.POLLPRI|unix.POLLERR|unix.POLLNVAL) != 0
	}
}

// VisibleAt is ReadMounts().VisibleAt(dir).
func VisibleAt(dir string) []string { return ReadMounts().VisibleAt(dir) }

// VisibleAt returns the paths at which dir (a file or directory, by real
// path), or a part of it, is visible in the mount namespace: dir itself;
// where a mount shows it whole (a bind mount of it or of a directory
// above it: the path it has there); and the mount point of every mount
// that shows a part of it (a bind mount of a file or directory inside
// it). Mounts are matched by device and by the path within the device's
// file system each one shows; it errs on the side of more paths (a mount
// hidden under another still counts). With an empty table it returns dir
// alone.
func (t MountTable) VisibleAt(dir string) []string {
	out := []string{dir}
	// The mount dir is reached through: the last of those whose mount
	// point holds it (a later mount covers an earlier one).
	home := -1
	for i, m := range t {
		if within(dir, m.point) && (home < 0 || len(m.point) >= len(t[home].point)) {
			home = i
		}
	}
	if home < 0 {
		return out
	}
	h := t[home]
	rel := filepath.Join(h.root, strings.TrimPrefix(dir, h.point))
	seen := map[string]bool{dir: true}
	for _, m := range t {
		if m.dev != h.dev {
			continue
		}
		var p string
		switch {
		case within(rel, m.root):
			p = filepath.Join(m.point, strings.TrimPrefix(rel, m.root))
		case within(m.root, rel):
			p = m.point
		default:
			continue
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// mountEntry is one line of mountinfo: the mount's device, the path
// within its file system it shows, where, and its file system type.
type mountEntry struct{ dev, root, point, fstype string }

// readMountinfo parses /proc/self/mountinfo:
// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPER.
func readMountinfo() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for line := range strings.Lines(string(b)) {
		pre, post, _ := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 {
			continue
		}
		e := mountEntry{dev: f[2], root: unescapeMount(f[3]), point: unescapeMount(f[4])}
		if len(g) > 0 {
			e.fstype = g[0]
		}
		out = append(out, e)
	}
	return out, nil
}
