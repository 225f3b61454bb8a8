package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Section 4 is measured on two file systems, each ratio within one: the
// machine's disk, where the benchmarks' temp dir is by default, and a
// journaled ext4 the report makes on a loop device. They differ in ext4's
// inode allocator: without a journal it will not reuse an inode freed in
// the last minute or more, and each create scans past every such inode
// (fs/ext4/ialloc.c, find_inode_bit and recently_deleted), while every
// fs.write makes a new staging inode and frees the one it replaces
// (txn/doc.go, "No recycled inodes").

// writeRuns are the go test runs of section 4, made on each file system.
var writeRuns = []struct{ what, pattern string }{
	{"durable writes", "^BenchmarkInvoke$/^fs.write-1KiB$/^p=(1|32)$"},
	{"bare bbolt writes", "^BenchmarkBaselineBoltPut$/^p=(1|32)$"},
}

// writeConcurrencies are those of writeRuns.
var writeConcurrencies = []int{1, 32}

// What section 4 calls its two file systems.
const (
	onDisk    = "(a) the machine's disk"
	onJournal = "(b) journaled ext4 on a loop device"
)

// journalImageSize is the size of the journaled file system's image file
// (sparse: it takes on the disk what the benchmarks write).
const journalImageSize = 4 << 30

// createCount is the number of creates timed in each directory of the
// create loop; createChurn the number of files the churned directory held
// and lost just before.
const (
	createCount = 500
	createChurn = 2048
)

// A writesFS is section 4 measured on one file system.
type writesFS struct {
	Where   string   // onDisk or onJournal
	Dir     string   // the benchmarks' TMPDIR
	FS      fsInfo   // the file system holding Dir
	Go      []result // writeRuns' results
	Create  createCost
	Skipped string // why this file system was not measured, or ""
}

// An fsInfo says which file system holds a directory and whether it has
// a journal, as far as could be read.
type fsInfo struct {
	Device, Mount, Type string // as /proc/self/mounts lists them
	Journal             string // "yes", "no", or "" when it could not be read
	JournalFrom         string // where Journal was read, or why it was not
}

// A createCost is the CPU time (the creating thread's user and system
// time) of one create of an empty file, over createCount creates, in a new
// directory and in one whose createChurn files were just removed; zero
// when not measured.
type createCost struct {
	Fresh, Churned time.Duration
}

// measureWrites runs writeRuns on the machine's disk (the default temp
// dir) and then with TMPDIR on a journaled ext4 made for it
// (mountJournaled), where it also measures the create loop
// (measureCreates), and unmounts it. The disk's results are added to r.Go
// too (section 3 lists them). Whatever keeps the journaled file system
// from being made or measured is recorded as its Skipped reason, not
// returned: the report stands without it. The disk's create loop is
// measureDiskCreates, run after every benchmark, since the inodes it frees
// slow the creates of the next minutes on a disk without a journal.
func (r *report) measureWrites(benchtime string) error {
	disk := writesFS{Where: onDisk, Dir: os.TempDir()}
	disk.FS = readFS(disk.Dir)
	var err error
	if disk.Go, err = benchWrites(benchtime, nil); err != nil {
		return err
	}
	r.Go = append(r.Go, disk.Go...)
	r.Writes = []writesFS{disk, measureJournaled(benchtime)}
	return nil
}

// measureJournaled is measureWrites' run on a journaled ext4.
func measureJournaled(benchtime string) writesFS {
	j := writesFS{Where: onJournal}
	skip := func(err error) writesFS {
		// One line: the reason ends the section's line about it.
		j.Skipped, _, _ = strings.Cut(err.Error(), "\n")
		step("%s: not measured: %s", onJournal, j.Skipped)
		return j
	}
	step("making a journaled ext4 on a loop device")
	dir, release, err := mountJournaled()
	if err != nil {
		return skip(err)
	}
	defer release()
	j.Dir, j.FS = dir, readFS(dir)
	if j.Go, err = benchWrites(benchtime, []string{"TMPDIR=" + dir}); err != nil {
		return skip(err)
	}
	step("create loop on %s", onJournal)
	if j.Create, err = measureCreates(dir); err != nil {
		return skip(err)
	}
	return j
}

// measureDiskCreates measures the create loop on the machine's disk, in
// the default temp dir, once section 4 is measured.
func (r *report) measureDiskCreates() error {
	if len(r.Writes) == 0 {
		return nil
	}
	step("create loop on %s", onDisk)
	c, err := measureCreates(r.Writes[0].Dir)
	if err != nil {
		return err
	}
	r.Writes[0].Create = c
	return nil
}

// benchWrites runs writeRuns with env added to go test's environment.
func benchWrites(benchtime string, env []string) ([]result, error) {
	var rs []result
	for _, run := range writeRuns {
		where := "TMPDIR default"
		if len(env) > 0 {
			where = strings.Join(env, " ")
		}
		step("%s (go test -bench, %s)", run.what, where)
		got, err := goBench("./kernel/", run.pattern, benchtime, env...)
		if err != nil {
			return nil, err
		}
		rs = append(rs, got...)
	}
	return rs, nil
}

// mountJournaled makes an ext4 file system with mkfs.ext4's defaults,
// which give it a journal, in a sparse image file of journalImageSize under
// the OS temp dir and mounts it with -o loop. It returns the mount point
// and release, which unmounts it and removes the image and the directory
// holding both; release also runs if the process is sent SIGINT or
// SIGTERM before, which it then dies of. The error names what is missing
// (root, mkfs.ext4, loop devices) or the command that failed.
func mountJournaled() (dir string, release func(), err error) {
	if os.Geteuid() != 0 {
		return "", nil, errors.New("not root (mounting a loop device needs it)")
	}
	for _, name := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(name); err != nil {
			return "", nil, fmt.Errorf("no %s: %w", name, err)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", nil, fmt.Errorf("no loop devices: %w", err)
	}
	base, err := os.MkdirTemp("", "benchreport-ext4-")
	if err != nil {
		return "", nil, err
	}
	img, mnt := filepath.Join(base, "ext4.img"), filepath.Join(base, "mnt")
	if err := makeImage(img, mnt); err != nil {
		os.RemoveAll(base)
		return "", nil, err
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		os.RemoveAll(base)
		return "", nil, fmt.Errorf("mount -o loop %s: %w: %s", img, err, bytes.TrimSpace(out))
	}
	sigs, done := make(chan os.Signal, 1), make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var once sync.Once
	release = func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
			if err := unmount(mnt); err != nil {
				// Removing base now would empty the file system
				// still mounted there: leave both, and say so.
				step("%v; %s left as it is", err, base)
				return
			}
			os.RemoveAll(base)
		})
	}
	go func() {
		select {
		case s := <-sigs:
			release()
			signal.Reset(s)
			syscall.Kill(os.Getpid(), s.(syscall.Signal))
		case <-done:
		}
	}()
	return mnt, release, nil
}

// makeImage makes the image file img, an ext4 file system, and the mount
// point mnt.
func makeImage(img, mnt string) error {
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := f.Truncate(journalImageSize); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", img, err, bytes.TrimSpace(out))
	}
	return os.Mkdir(mnt, 0o755)
}

// unmount unmounts mnt, retrying while it is busy (a go test interrupted
// with the report may still be closing its files there), and detaches it
// lazily (umount -l) if it stays busy: the loop device is then freed when
// its last user goes.
func unmount(mnt string) error {
	var out []byte
	var err error
	for range 10 {
		if out, err = exec.Command("umount", mnt).CombinedOutput(); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	if lazy, errLazy := exec.Command("umount", "-l", mnt).CombinedOutput(); errLazy != nil {
		return fmt.Errorf("umount %s: %w: %s; umount -l: %v: %s", mnt, err, bytes.TrimSpace(out), errLazy, bytes.TrimSpace(lazy))
	}
	return nil
}

// measureCreates runs the create loop in a new directory under dir: it
// times createCount creates of empty files (open with O_CREAT|O_EXCL,
// close) in a new directory, then makes createChurn files in another one,
// removes them, waits for the next second (ext4 reuses an inode freed in
// the current second as if it had a journal: recently_deleted counts only
// earlier seconds) and times createCount creates there. The time is the
// CPU time of the thread making the files. It removes what it made.
func measureCreates(dir string) (createCost, error) {
	root, err := os.MkdirTemp(dir, "benchreport-creates-")
	if err != nil {
		return createCost{}, err
	}
	defer os.RemoveAll(root)
	fresh, churned := filepath.Join(root, "fresh"), filepath.Join(root, "churned")
	for _, d := range []string{fresh, churned} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return createCost{}, err
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var c createCost
	if c.Fresh, err = timeCreates(fresh, "f", createCount); err != nil {
		return createCost{}, err
	}
	if _, err := timeCreates(churned, "old", createChurn); err != nil {
		return createCost{}, err
	}
	for i := range createChurn {
		if err := os.Remove(filepath.Join(churned, fmt.Sprint("old", i))); err != nil {
			return createCost{}, err
		}
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	if c.Churned, err = timeCreates(churned, "f", createCount); err != nil {
		return createCost{}, err
	}
	return c, nil
}

// timeCreates creates the empty files prefix0 … prefix(n-1) in dir and
// returns the calling thread's CPU time per create (the caller has locked
// its goroutine to the thread).
func timeCreates(dir, prefix string, n int) (time.Duration, error) {
	before, err := threadCPU()
	if err != nil {
		return 0, err
	}
	for i := range n {
		p := filepath.Join(dir, prefix+strconv.Itoa(i))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return 0, fmt.Errorf("create %s: %w", p, err)
		}
		unix.Close(fd)
	}
	after, err := threadCPU()
	if err != nil {
		return 0, err
	}
	return (after - before) / time.Duration(n), nil
}

// threadCPU is the calling thread's user and system CPU time.
func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// readFS reads which file system holds dir (/proc/self/mounts) and
// whether it has a journal (journalOf).
func readFS(dir string) fsInfo {
	var fs fsInfo
	path, err := filepath.EvalSymlinks(dir)
	if err != nil {
		fs.JournalFrom = err.Error()
		return fs
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		fs.JournalFrom = err.Error()
		return fs
	}
	fs, ok := mountOf(mounts, path)
	if !ok {
		fs.JournalFrom = "no mount of " + path + " in /proc/self/mounts"
		return fs
	}
	fs.Journal, fs.JournalFrom = journalOf(path, fs)
	return fs
}

// mountOf finds the mount holding path (absolute, links resolved) in
// mounts, the text of /proc/self/mounts: the one with the longest mount
// point, and of those the last, which is mounted over the others.
func mountOf(mounts []byte, path string) (fsInfo, bool) {
	var fs fsInfo
	found := false
	sc := bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		mnt := unescapeMount(f[1])
		if path != mnt && mnt != "/" && !strings.HasPrefix(path, mnt+"/") {
			continue
		}
		if !found || len(mnt) >= len(fs.Mount) {
			fs, found = fsInfo{Device: unescapeMount(f[0]), Mount: mnt, Type: f[2]}, true
		}
	}
	return fs, found
}

// unescapeMount undoes the octal escapes (\040 for a space, …) of a field
// of /proc/self/mounts.
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// journalOf says whether fs, the ext4 file system holding path, has a
// journal, and where it read that: ext4's /sys/fs/ext4/<device>/
// journal_task ("<none>" without a journal, else the journal thread's
// pid), the device found from path's st_dev, or else the features
// `dumpe2fs -h` lists. It claims nothing for other file systems.
func journalOf(path string, fs fsInfo) (journal, from string) {
	if fs.Type != "ext4" && fs.Type != "ext3" {
		return "", "not read: not an ext3 or ext4 file system"
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if dev, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))); err == nil {
			task := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "journal_task")
			if b, err := os.ReadFile(task); err == nil {
				if j, ok := parseJournalTask(b); ok {
					return j, fmt.Sprintf("`%s` reads `%s`", task, strings.TrimSpace(string(b)))
				}
			}
		}
	}
	out, err := exec.Command("dumpe2fs", "-h", fs.Device).Output()
	if err != nil {
		return "", fmt.Sprintf("not read: no journal_task in /sys/fs/ext4, and dumpe2fs -h %s: %v", fs.Device, err)
	}
	if j, ok := parseDumpe2fs(out); ok {
		return j, fmt.Sprintf("`dumpe2fs -h %s` lists the features it has", fs.Device)
	}
	return "", fmt.Sprintf("not read: no journal_task in /sys/fs/ext4, and no features in dumpe2fs -h %s", fs.Device)
}

// parseJournalTask reads ext4's sysfs journal_task: "<none>" for no
// journal, else the pid of the journal's thread.
func parseJournalTask(b []byte) (journal string, ok bool) {
	s := strings.TrimSpace(string(b))
	if s == "<none>" {
		return "no", true
	}
	if _, err := strconv.Atoi(s); err == nil {
		return "yes", true
	}
	return "", false
}

// parseDumpe2fs reads whether the "Filesystem features:" line of
// `dumpe2fs -h` output lists has_journal.
func parseDumpe2fs(out []byte) (journal string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found || strings.TrimSpace(k) != "Filesystem features" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "has_journal" {
				return "yes", true
			}
		}
		return "no", true
	}
	return "", false
}

// describe is fs in a phrase of the report.
func (fs fsInfo) describe() string {
	if fs.Type == "" {
		return "file system not read (" + fs.JournalFrom + ")"
	}
	s := fmt.Sprintf("%s on %s mounted at %s, ", fs.Type, fs.Device, fs.Mount)
	switch fs.Journal {
	case "yes":
		return s + "with a journal (" + fs.JournalFrom + ")"
	case "no":
		return s + "without a journal (" + fs.JournalFrom + ")"
	}
	return s + "journal " + fs.JournalFrom
}

// writesGoals are the goal lines of durable writes, one per file system.
func (r *report) writesGoals() []goal {
	var out []goal
	for _, where := range []string{onDisk, onJournal} {
		text := "durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, " + where
		w, ok := r.writes(where)
		q, err := w.ratio(32)
		switch {
		case !ok || w.Skipped != "" || err != nil:
			out = append(out, goal{text, "not measured", "n/a"})
		default:
			out = append(out, goal{text, fmt.Sprintf("%.2f×", q), yes(q >= 1.5)})
		}
	}
	return out
}

// writes returns section 4 as measured on the file system where.
func (r *report) writes(where string) (writesFS, bool) {
	for _, w := range r.Writes {
		if w.Where == where {
			return w, true
		}
	}
	return writesFS{}, false
}

// ratio is fs.write's throughput at concurrency p over bare bbolt's.
func (w writesFS) ratio(p int) (float64, error) {
	v, err := find(w.Go, fmt.Sprintf("BenchmarkInvoke/fs.write-1KiB/p=%d", p), "calls/s")
	if err != nil {
		return 0, err
	}
	b, err := find(w.Go, fmt.Sprintf("BenchmarkBaselineBoltPut/p=%d", p), "calls/s")
	if err != nil {
		return 0, err
	}
	if b == 0 {
		return 0, errors.New("bare bbolt made no puts")
	}
	return v / b, nil
}

// writesMarkdown is the report's section 4.
func (r *report) writesMarkdown(w func(string, ...any)) {
	w("## 4. Durable writes: fs.write 1 KiB against bare bbolt")
	w("")
	w("fs.write runs as a transaction (intent, staged content, commit, audit record), all durable. The baseline is one bbolt `Update` with one 1 KiB `Put` per operation, fsync each (`BenchmarkBaselineBoltPut`). Both are measured on two file systems, each ratio from one of them: (a) the machine's disk, where the benchmarks' temp dir is by default, and (b) an ext4 file system with a journal (mkfs.ext4's defaults) that this report makes in a %d GiB image file on the machine's disk, mounts with `-o loop` as the benchmarks' TMPDIR and removes afterwards. CPU is the benchmark process's user+system time per call, pages are bbolt page writes and fsyncs the fdatasyncs per call (section 3).", journalImageSize>>30)
	w("")
	w("| file system | p | fs.write calls/s | bare bbolt puts/s | ratio | fs.write CPU µs/call | pages/call | fsyncs/call |")
	w("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, fs := range r.Writes {
		if fs.Skipped != "" {
			continue
		}
		m := &report{Go: fs.Go}
		for _, p := range writeConcurrencies {
			n, base := fmt.Sprintf("BenchmarkInvoke/fs.write-1KiB/p=%d", p), fmt.Sprintf("BenchmarkBaselineBoltPut/p=%d", p)
			w("| %s | %d | %s | %s | %s | %s | %s | %s |", fs.Where, p, m.metric(n, "calls/s"), m.metric(base, "calls/s"), m.ratio(n, "calls/s", base, "calls/s"),
				m.metric(n, "cpu-µs/call"), m.metric(n, "pages/call"), m.metric(n, "fsyncs/call"))
		}
	}
	w("")
	for _, fs := range r.Writes {
		if fs.Skipped != "" {
			w("%s: not measured: %s.", fs.Where, strings.TrimSuffix(fs.Skipped, "."))
			w("")
		}
	}
	w("The file systems: %s.", r.fsLines())
	w("")
	w("Each fs.write makes its staged content a new inode and frees the one it replaces (txn/doc.go, \"No recycled inodes\"), and ext4 without a journal reuses no inode freed less than 60 s before (360 s while its inode table block is unwritten): each create scans its block group's inode bitmap from the start and tests every such inode on the way, whoever freed it, where with a journal it takes the first free inode (fs/ext4/ialloc.c, `find_inode_bit` and `recently_deleted`). %s", r.createLine())
	w("")
}

// fsLines states the file system of each measurement of section 4.
func (r *report) fsLines() string {
	var parts []string
	for _, fs := range r.Writes {
		if fs.Skipped == "" {
			parts = append(parts, fmt.Sprintf("%s, TMPDIR %s: %s", fs.Where, fs.Dir, fs.FS.describe()))
		}
	}
	if len(parts) == 0 {
		return "not measured"
	}
	return strings.Join(parts, "; ")
}

// createLine gives the create loop's figures of each file system.
func (r *report) createLine() string {
	var parts []string
	for _, fs := range r.Writes {
		switch {
		case fs.Skipped != "" || fs.Create.Fresh == 0:
		case len(parts) == 0:
			parts = append(parts, fmt.Sprintf("%s µs of CPU per create in a new directory and %s µs in one whose %s files had just been removed on %s", µs(fs.Create.Fresh), µs(fs.Create.Churned), num(createChurn), fs.Where))
		default:
			parts = append(parts, fmt.Sprintf("%s and %s µs on %s", µs(fs.Create.Fresh), µs(fs.Create.Churned), fs.Where))
		}
	}
	if len(parts) == 0 {
		return "The create loop was not measured."
	}
	return fmt.Sprintf("A loop of %d creates of an empty file (open with O_CREAT|O_EXCL, close; CPU of the creating thread), measured in this run, took %s.", createCount, strings.Join(parts, ", against "))
}
