package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process joined to a run's pids cgroup cannot fork past its pids.max,
// however slow anyone is to notice: the host refuses the forks (counted in
// pids.events), and the cgroup is gone after remove.
func TestPidsCgroupRefusesForks(t *testing.T) {
	// The shell forks eight sleeps once told to; a refused fork may end it.
	sh := exec.Command("sh", "-c", `read go; for i in 1 2 3 4 5 6 7 8; do sleep 30 & done 2>/dev/null; wait`)
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, _ := sh.StdinPipe()
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
		sh.Wait()
	}()
	const max = 4 // the shell and three sleeps
	c, err := joinPidsCgroup(sh.Process.Pid, max)
	if err != nil {
		t.Skipf("no writable pids cgroup here (%v); the watchdog stands alone", err)
	}
	in.Write([]byte("go\n"))
	events := ""
	for i := 0; i < 100 && (events == "" || events == "max 0"); i++ {
		time.Sleep(50 * time.Millisecond)
		events = readCgroupFile(t, c.dir, "pids.events")
	}
	cur := readCgroupFile(t, c.dir, "pids.current")
	syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
	sh.Wait()
	if n, _ := strconv.Atoi(cur); n > max {
		t.Errorf("pids.current %d > pids.max %d", n, max)
	}
	if !strings.HasPrefix(events, "max ") || events == "max 0" {
		t.Errorf("pids.events %q: no fork was refused", events)
	}
	c.remove()
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		// remove retries in the background while processes linger.
		for i := 0; i < 50; i++ {
			if _, err = os.Stat(c.dir); os.IsNotExist(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind", c.dir)
		}
	}
}

func readCgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A run cgroup left by a process that has exited is removed by the next
// process's first run; one of a live process is kept.
func TestPidsCgroupSweepsStale(t *testing.T) {
	parent, _, err := ownPidsCgroup()
	if err != nil {
		t.Skipf("no writable pids cgroup here (%v)", err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(parent, "capkernel-sandbox-"+strconv.Itoa(dead.Process.Pid)+"-1")
	live := filepath.Join(parent, "capkernel-sandbox-1-1") // pid 1 is always alive
	for _, d := range []string{stale, live} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Skipf("cannot make cgroups here: %v", err)
		}
	}
	defer os.Remove(live)
	sweepStale(parent)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		os.Remove(stale)
		t.Errorf("stale cgroup %s kept", stale)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's cgroup was removed: %v", err)
	}
}

// TestMemCgroupBoundsTCP: on cgroup v1 a run's memory cgroup bounds its
// TCP socket buffers too (maxTCPBytes, or the memory limit if less),
// which v1 otherwise charges to no cgroup, only to the host's pool.
func TestMemCgroupBoundsTCP(t *testing.T) {
	c, err := newMemCgroup()
	if err != nil {
		t.Skipf("no memory cgroup here: %v", err)
	}
	defer c.remove()
	if !c.v1 {
		t.Skip("cgroup v2 charges socket buffers to memory.max")
	}
	for _, n := range []int64{1 << 30, 16 << 20} {
		if err := c.setLimit(n); err != nil {
			t.Fatal(err)
		}
		if got, want := readCgroupFile(t, c.dir, "memory.kmem.tcp.limit_in_bytes"), strconv.FormatInt(min(n, maxTCPBytes), 10); got != want {
			t.Errorf("limit %d: TCP buffers bounded at %s, want %s", n, got, want)
		}
	}
}

// TestSystemDirs: what every run sees whole includes /usr, by real path,
// and only directories (merged-/usr links are the links they are).
func TestSystemDirs(t *testing.T) {
	dirs := SystemDirs()
	usr, _ := filepath.EvalSymlinks("/usr")
	if len(dirs) == 0 || dirs[0] != usr {
		t.Fatalf("SystemDirs %v, want /usr (%s) first", dirs, usr)
	}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// TestVisibleAt: a directory is visible at its own path, where a bind
// mount of it or of a directory above it shows it (its path there), and
// at the mount point of a bind mount of a file inside it.
func TestVisibleAt(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600)
	up, file := filepath.Join(t.TempDir(), "up"), filepath.Join(t.TempDir(), "file")
	os.MkdirAll(up, 0o755)
	os.WriteFile(file, nil, 0o600)
	if syscall.Mount(base, up, "", syscall.MS_BIND, "") != nil {
		t.Skip("no bind mounts here")
	}
	defer syscall.Unmount(up, syscall.MNT_DETACH)
	if err := syscall.Mount(filepath.Join(dir, "secret"), file, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(file, syscall.MNT_DETACH)
	got := VisibleAt(dir)
	for _, want := range []string{dir, filepath.Join(up, "data"), file} {
		if !slices.Contains(got, want) {
			t.Errorf("VisibleAt(%s) = %v, want %s among them", dir, got, want)
		}
	}
}

// TestReadMountsSeesChanges: the mount table ReadMounts keeps between
// calls is read again after every mount and unmount, so a check right
// after one sees it, however often the table was read before.
func TestReadMountsSeesChanges(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) }) // after a failed round
	has := func() bool {
		return slices.ContainsFunc(ReadMounts(), func(m mountEntry) bool { return m.point == dir })
	}
	if has() {
		t.Fatalf("%s is a mount point before the test mounted it", dir)
	}
	for i := range 20 {
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
			if i == 0 {
				t.Skipf("no tmpfs mounts here: %v", err)
			}
			t.Fatal(err)
		}
		if !has() {
			t.Fatalf("round %d: ReadMounts does not show the tmpfs just mounted at %s", i, dir)
		}
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Fatal(err)
		}
		if has() {
			t.Fatalf("round %d: ReadMounts still shows the tmpfs just unmounted from %s", i, dir)
		}
	}
	// Unchanged, the table is the one read last, not read again. Other
	// processes may mount meanwhile (tests of other packages): one pair
	// of reads in ten with none between them is enough.
	for range 10 {
		if a, b := ReadMounts(), ReadMounts(); len(a) > 0 && &a[0] == &b[0] {
			return
		}
	}
	t.Errorf("ten pairs of reads in a row each gave two tables: the table is read every time")
}
