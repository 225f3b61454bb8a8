package txn

import (
	"errors"
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// A write of a new name, or a mkdir, adds an entry to a directory when
// Apply carries it out, after the commit: on ext4 rename(2) adds the new
// name before it removes the staging file's, so a directory whose blocks
// hold the staging entry but not both needs a new block, and mkdir(2)
// needs one for the directory it makes. On a full file system (or quota)
// that is ENOSPC (EDQUOT), and a committed effect would be refused. No
// choice of staging name avoids it: an indexed (htree) directory puts an
// entry in the block its name's hash selects, so room freed elsewhere in
// it, or a staging name as long as the target's, does not make room for
// the target. So staging checks before the commit that the file system
// can take the blocks a directory grows by (checkRoom), and refuses the
// call otherwise, as it refuses the other effects Apply could not carry
// out (NotApplicableError).
//
// When statfs shows plentyBlocks available (f_bavail, what an
// unprivileged user may take, which root may take too), the room is taken
// as given. Below that, the check allocates the blocks (fallocate of an
// unnamed O_TMPFILE file in the directory, freed when it is closed)
// rather than trusting statfs: the file system then applies its own rules
// for the kernel's user — root's reserved blocks (which f_bavail leaves
// out), ext4's reserved clusters (which f_bfree counts but root cannot
// take either), quotas (which statfs does not show; so a quota is checked
// only on a file system low on room). Blocks that ext4 frees return to
// its allocator only once its journal commits; the syncfs before the
// commit (Stage.FileRoots) commits it (on another mount than the root's
// top, the staging file's fsync most likely does), and ext4's mkdir(2)
// forces a commit itself before it refuses. A file system or process that takes
// the room between the check and the apply can still refuse the apply:
// the kernel then fails stop once, and recovery reports the effect as a
// ConflictRefused (see noRoomError), so the next start is not kept from
// serving.

// roomBlocks is how many blocks checkRoom asks for: an ext4 directory
// grows by at most four for one entry (two when a one-block directory
// becomes indexed, a leaf and an index block when its index splits, one
// more for a new level, an extent block), with room to spare for the
// calls staged beside this one.
const roomBlocks = 16

// plentyBlocks is the number of available blocks (statfs f_bavail) from
// which checkRoom takes the room as given: the allocation costs ~0.1 ms
// of ext4 journal work per call (an inode made and freed), a statfs
// ~0.5 µs.
const plentyBlocks = 1024

// checkRoom checks that the file system of directory dir under root (or
// of its nearest existing parent, for a directory an earlier effect
// makes) can take roomBlocks blocks for the kernel's user now, for an
// effect that adds entry target there; it refuses with a
// *NotApplicableError when it cannot (ENOSPC, EDQUOT). A file system
// with plentyBlocks available is not probed, nor one without O_TMPFILE
// or fallocate.
func checkRoom(root *os.Root, dir, target string) error {
	d, err := openDir(root, dir)
	for absent(err) && dir != "." {
		dir = path.Dir(dir)
		d, err = openDir(root, dir)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(d.Fd()), &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Bavail >= plentyBlocks {
		return nil
	}
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if unsupported(err) {
		return nil
	}
	if err == nil {
		if err = unix.Fallocate(fd, 0, 0, roomBlocks*st.Bsize); unsupported(err) {
			err = nil
		}
		// The file has no name: closing it frees what it holds.
		unix.Close(fd)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return notApplicable(target, err, "the file system holding %s is full (it cannot take %d more blocks for the kernel's user: %v), "+
			"and the new directory entry could not be made", dirLabel(dir), roomBlocks, err)
	}
	return fmt.Errorf("check room in %s for %s: %w", dir, target, err)
}

// unsupported reports whether err says that the file system has no
// O_TMPFILE or no fallocate (EOPNOTSUPP; EISDIR from a kernel before
// O_TMPFILE; ENOSYS; EINVAL from a file system that refuses the mode).
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL)
}

// dirLabel names directory dir of a root in a message.
func dirLabel(dir string) string {
	if dir == "." {
		return "the root directory"
	}
	return "directory " + dir
}
