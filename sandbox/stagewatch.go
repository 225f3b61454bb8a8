package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Staging watchdog. The delta's caps (Limits.DeltaBytes, DeltaFiles) are
// checked when the delta is made, after the command has exited;
// meanwhile its writes land in the staging directory, on the kernel's own
// disk. The watchdog samples the rw roots' staging (the overlay upper
// directories, or the copies) while the command runs and kills the run
// once it holds more bytes of files than what it held at the start plus
// DeltaBytes, or more than twice DeltaFiles entries beyond its start
// (twice: an overlay copies up the directories a written file is in,
// which are entries of the staging but no changes of the delta): such a
// delta could never be accepted. So the staging holds at most that, plus
// what the command writes between two samples. A file the command
// unlinks but keeps open is in no walk; it still takes room on the disk,
// so the watchdog also kills a run once the staging's file system has
// less than stageFloor left (the kernel's own data is on that disk).

// stageWatchInterval is the least time between two samples; a walk that
// takes longer than a tenth of it stretches the interval to ten times the
// walk (the watchdog costs at most about a tenth of a CPU), up to
// stageWatchMax. The walk is bounded: past twice DeltaFiles new entries
// the run is killed.
const (
	stageWatchInterval = 50 * time.Millisecond
	stageWatchMax      = 250 * time.Millisecond
)

// stageFloor is the room the staging's file system must keep while a
// command runs: 2% of it, at least 64 MiB and at most 4 GiB.
func stageFloor(total int64) int64 { return max(64<<20, min(total/50, 4<<30)) }

// stageUse is what a sample found: bytes of regular files (per file the
// smaller of its size and its allocated blocks, so a sparse file counts
// what it takes on disk, and no file more than the delta would count for
// it) and entries (files, directories and the rest); tooLong, a directory
// whose path in the staging is too long to open by its path (longer than
// PATH_MAX): what is below it could not be counted, and no delta holding
// it could be applied, so the run is ended.
type stageUse struct {
	bytes, entries int64
	tooLong        string
}

// stageBytes samples the rw roots' staging. The walk never resolves a
// path the command could have made a symbolic link: each directory is
// opened from the staging's own descriptor by openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS, each file is measured by
// fstatat without following, and no descriptor is held while a
// subdirectory is walked (a deep tree costs no descriptors). The command
// runs meanwhile and may swap a directory for a link at any moment; a
// walk by path would follow it out of the staging (and, making a
// directory readable, chmod what it points to: a host file). A directory
// the kernel cannot read is made readable to it through a descriptor of
// that very directory (makeReadable; a directory it can open but not
// search, by fchmod of the descriptor it opened), so a command cannot
// hide its writes from the watchdog by taking its own access to them
// away.
func stageBytes(roots []*rootPlan) stageUse {
	var u stageUse
	for _, r := range roots {
		root, err := unix.Open(r.upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		dirUse(root, ".", &u)
		unix.Close(root)
	}
	return u
}

// searchesAll: the kernel's user reads and searches every directory
// whatever its mode (root's CAP_DAC_READ_SEARCH), and the walk changes no
// mode. A variable for the tests.
var searchesAll = os.Geteuid() == 0

// beneath resolves a path below the directory it starts from, through
// no link of any kind and no mount point.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// dirUse adds what the directory rel (below root) holds to u.
func dirUse(root int, rel string, u *stageUse) {
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath}
	fd, err := unix.Openat2(root, rel, how)
	if errors.Is(err, unix.EACCES) {
		makeReadable(root, rel)
		fd, err = unix.Openat2(root, rel, how)
	}
	if errors.Is(err, unix.ENAMETOOLONG) && u.tooLong == "" {
		u.tooLong = rel
	}
	if err != nil {
		return
	}
	var st unix.Stat_t
	if !searchesAll && unix.Fstat(fd, &st) == nil && st.Mode&0o500 != 0o500 {
		// Readable, not searchable (0400): its entries could not be
		// measured.
		unix.Fchmod(fd, st.Mode&0o7777|0o700)
	}
	dir := os.NewFile(uintptr(fd), rel)
	ents, _ := dir.ReadDir(-1)
	var subdirs []string
	for _, e := range ents {
		u.entries++
		switch t := e.Type(); {
		case t.IsDir():
			subdirs = append(subdirs, path.Join(rel, e.Name()))
		case t.IsRegular():
			var st unix.Stat_t
			if unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			// The smaller of its size and its allocated blocks: a sparse
			// file counts what it takes on disk.
			u.bytes += min(st.Size, st.Blocks*512)
		}
	}
	dir.Close()
	for _, d := range subdirs {
		dirUse(root, d, u)
	}
}

// makeReadable gives the kernel's user read and search access to the
// directory rel below root (ensureAccess's rule), changing the mode of the
// inode it opened without following anything: chmod of its descriptor's
// /proc/self/fd link, which names that inode and no path.
func makeReadable(root int, rel string) {
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: beneath})
	if err != nil {
		return
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o500 == 0o500 {
		return
	}
	unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), st.Mode&0o7777|0o700)
}

// freeRoom is the room left, and the size, of the file system holding
// the first staging of roots (they share the kernel's staging directory).
func freeRoom(roots []*rootPlan) (avail, total int64, ok bool) {
	for _, r := range roots {
		var st syscall.Statfs_t
		if syscall.Statfs(r.upper, &st) == nil {
			return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, true
		}
	}
	return 0, 0, false
}

// watchStaging samples the staging of the rw roots while the run goes on
// and reports, once, why it must end: over lim's bytes or entries above
// what it held at the start (base bytes), or its file system below
// stageFloor. done is closed once the watchdog has returned (after stop is
// closed): the roots' plans are reused, by a retried run, only then.
func watchStaging(roots []*rootPlan, base int64, lim Limits, stop <-chan struct{}) (why <-chan string, done <-chan struct{}) {
	ch, end := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(end)
		t := time.NewTimer(stageWatchInterval)
		defer t.Stop()
		baseEntries := stageBytes(roots).entries
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			start := time.Now()
			u := stageBytes(roots)
			switch avail, total, ok := freeRoom(roots); {
			case u.tooLong != "":
				ch <- fmt.Sprintf("the command made a path in its staging longer than the kernel can open by its path (%d bytes and more, under %.64q…): it cannot be measured or applied", len(u.tooLong), u.tooLong)
				return
			case lim.DeltaBytes > 0 && u.bytes-base > lim.DeltaBytes:
				ch <- fmt.Sprintf("the command wrote %d bytes of files into its staging while it ran, more than %d", u.bytes-base, lim.DeltaBytes)
				return
			case lim.DeltaFiles > 0 && u.entries-baseEntries > 2*int64(lim.DeltaFiles):
				ch <- fmt.Sprintf("the command made %d entries in its staging while it ran, more than twice the %d changed paths a delta may hold", u.entries-baseEntries, lim.DeltaFiles)
				return
			case ok && avail < stageFloor(total):
				ch <- fmt.Sprintf("the staging's file system has %d bytes left while the command runs, less than the %d it must keep", avail, stageFloor(total))
				return
			}
			t.Reset(min(max(stageWatchInterval, 10*time.Since(start)), stageWatchMax))
		}
	}()
	return ch, end
}
