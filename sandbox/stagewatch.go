package sandbox

import (
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Staging watchdog. The delta's caps (Limits.DeltaBytes) are checked
// when the delta is made, after the command has exited; meanwhile its
// writes land in the staging directory, on the kernel's own disk. The
// watchdog samples the bytes of regular files in the rw roots' staging
// (the overlay upper directories, or the copies) while the command runs
// and kills the run once they exceed what the staging held at the start
// plus DeltaBytes: such a delta could never be accepted. So the staging
// holds at most DeltaBytes more than its start, plus what the command
// writes between two samples.

// stageWatchInterval is the least time between two samples; a walk that
// takes longer than a tenth of it stretches the interval to ten times the
// walk, so the watchdog costs at most about a tenth of a CPU on a command
// that makes many files.
const stageWatchInterval = 50 * time.Millisecond

// stageBytes is the bytes of regular files under the rw roots' staging:
// per file the smaller of its size and its allocated blocks, so a sparse
// file counts what it takes on disk, and no file more than the delta
// would count for it. A directory the kernel cannot read is made readable
// to it (ensureAccess) and read once more: a command cannot hide its
// writes from the watchdog by taking its own access to them away.
func stageBytes(roots []*rootPlan) int64 {
	var n int64
	for _, r := range roots {
		n += dirBytes(r.upper)
	}
	return n
}

func dirBytes(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		ensureDirAccess(dir)
		if ents, err = os.ReadDir(dir); err != nil {
			return 0
		}
	}
	var n int64
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch t := e.Type(); {
		case t.IsDir():
			n += dirBytes(p)
		case t.IsRegular():
			fi, err := e.Info()
			if err != nil {
				continue
			}
			size := fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				size = min(size, st.Blocks*512)
			}
			n += size
		}
	}
	return n
}

// watchStaging samples the staging of the rw roots while the run goes on
// and reports the bytes it holds above base once they exceed limit.
func watchStaging(roots []*rootPlan, base, limit int64, stop <-chan struct{}) <-chan int64 {
	ch := make(chan int64, 1)
	go func() {
		t := time.NewTimer(stageWatchInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			start := time.Now()
			if n := stageBytes(roots) - base; n > limit {
				ch <- n
				return
			}
			t.Reset(max(stageWatchInterval, 10*time.Since(start)))
		}
	}()
	return ch
}
