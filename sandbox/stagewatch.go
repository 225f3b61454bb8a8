package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
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
// it) and entries (files, directories and the rest).
type stageUse struct{ bytes, entries int64 }

// stageBytes samples the rw roots' staging. A directory the kernel cannot
// read is made readable to it (ensureAccess) and read once more: a
// command cannot hide its writes from the watchdog by taking its own
// access to them away.
func stageBytes(roots []*rootPlan) stageUse {
	var u stageUse
	for _, r := range roots {
		dirUse(r.upper, &u)
	}
	return u
}

func dirUse(dir string, u *stageUse) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		ensureDirAccess(dir)
		if ents, err = os.ReadDir(dir); err != nil {
			return
		}
	}
	u.entries += int64(len(ents))
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch t := e.Type(); {
		case t.IsDir():
			dirUse(p, u)
		case t.IsRegular():
			fi, err := e.Info()
			if err != nil {
				continue
			}
			size := fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				size = min(size, st.Blocks*512)
			}
			u.bytes += size
		}
	}
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
