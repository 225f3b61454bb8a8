package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestMountOf(t *testing.T) {
	mounts := []byte(`proc /proc proc rw,relatime 0 0
/dev/vda / ext4 rw,relatime,discard 0 0
tmpfs /tmp tmpfs rw 0 0
/dev/loop0 /tmp/benchreport-ext4-1/mnt ext4 rw,relatime 0 0
/dev/loop1 /tmp/benchreport-ext4-1/mnt ext4 rw,relatime 0 0
/dev/loop2 /srv/my\040disk ext4 rw 0 0
`)
	cases := []struct {
		path                string
		device, mount, kind string
	}{
		{"/", "/dev/vda", "/", "ext4"},
		{"/home/x", "/dev/vda", "/", "ext4"},
		{"/tmp", "tmpfs", "/tmp", "tmpfs"},
		{"/tmp/a/b", "tmpfs", "/tmp", "tmpfs"},
		{"/tmpfoo/a", "/dev/vda", "/", "ext4"},
		// Mounted over: the later mount is what the path reaches.
		{"/tmp/benchreport-ext4-1/mnt/x", "/dev/loop1", "/tmp/benchreport-ext4-1/mnt", "ext4"},
		{"/srv/my disk/f", "/dev/loop2", "/srv/my disk", "ext4"},
	}
	for _, c := range cases {
		fs, ok := mountOf(mounts, c.path)
		if !ok || fs.Device != c.device || fs.Mount != c.mount || fs.Type != c.kind {
			t.Errorf("mountOf(%s) = %+v, %v; want %s on %s (%s)", c.path, fs, ok, c.device, c.mount, c.kind)
		}
	}
	if fs, ok := mountOf([]byte("proc /proc proc rw 0 0\n"), "/tmp"); ok {
		t.Errorf("mountOf without a mount holding the path = %+v", fs)
	}
}

func TestParseJournal(t *testing.T) {
	tasks := []struct {
		in, want string
		ok       bool
	}{
		{"<none>\n", "no", true},
		{"20550\n", "yes", true},
		{"", "", false},
		{"jbd2\n", "", false},
	}
	for _, c := range tasks {
		if got, ok := parseJournalTask([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("parseJournalTask(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	dumps := []struct {
		in, want string
		ok       bool
	}{
		{"Filesystem volume name:   <none>\nFilesystem features:      has_journal ext_attr resize_inode dir_index filetype extent\n", "yes", true},
		{"Filesystem features:      ext_attr resize_inode dir_index filetype extent 64bit\n", "no", true},
		{"Filesystem features:      ext_attr has_journal_dev\n", "no", true},
		{"dumpe2fs 1.47.0 (5-Feb-2023)\n", "", false},
	}
	for _, c := range dumps {
		if got, ok := parseDumpe2fs([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("parseDumpe2fs(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// writesResults are go test lines of section 4's runs on one file system.
func writesResults(write32, bolt32 string) []result {
	return parseBench([]byte("BenchmarkInvoke/fs.write-1KiB/p=1-2 100 1 ns/op 300 calls/s 90.5 cpu-µs/call 6.00 pages/call 2.00 fsyncs/call\n" +
		"BenchmarkInvoke/fs.write-1KiB/p=32-2 100 1 ns/op " + write32 + " calls/s 412 cpu-µs/call 1.25 pages/call 0.125 fsyncs/call\n" +
		"BenchmarkBaselineBoltPut/p=1-2 100 1 ns/op 400 calls/s\n" +
		"BenchmarkBaselineBoltPut/p=32-2 100 1 ns/op " + bolt32 + " calls/s\n"))
}

// Section 4 reports each file system's own ratios, pages, fsyncs and CPU,
// which file system each was, its create loop, and a goal line for each;
// a journaled file system that could not be made is one line with the
// reason, and its goal is not measured.
func TestWritesSection(t *testing.T) {
	disk := writesFS{Where: onDisk, Dir: "/tmp", Go: writesResults("550", "1000"),
		FS:     fsInfo{Device: "/dev/vda", Mount: "/", Type: "ext4", Journal: "no", JournalFrom: "`/sys/fs/ext4/vda/journal_task` reads `<none>`"},
		Create: createCost{Fresh: 22 * time.Microsecond, Churned: 566 * time.Microsecond}}
	journaled := writesFS{Where: onJournal, Dir: "/tmp/benchreport-ext4-1/mnt", Go: writesResults("2400", "1200"),
		FS:     fsInfo{Device: "/dev/loop0", Mount: "/tmp/benchreport-ext4-1/mnt", Type: "ext4", Journal: "yes", JournalFrom: "`/sys/fs/ext4/loop0/journal_task` reads `20550`"},
		Create: createCost{Fresh: 17 * time.Microsecond, Churned: 7400 * time.Nanosecond}}
	cases := []struct {
		name        string
		writes      []writesFS
		want, never []string
	}{
		{"both", []writesFS{disk, journaled}, []string{
			"| durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, (a) the machine's disk | 0.55× | no |",
			"| durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, (b) journaled ext4 on a loop device | 2.00× | yes |",
			"| (a) the machine's disk | 32 | 550 | 1,000 | 0.55× | 412 | 1.25 | 0.12 |",
			"| (a) the machine's disk | 1 | 300 | 400 | 0.75× | 90.5 | 6.00 | 2.00 |",
			"| (b) journaled ext4 on a loop device | 32 | 2,400 | 1,200 | 2.00× | 412 | 1.25 | 0.12 |",
			"(a) the machine's disk, TMPDIR /tmp: ext4 on /dev/vda mounted at /, without a journal (`/sys/fs/ext4/vda/journal_task` reads `<none>`)",
			"(b) journaled ext4 on a loop device, TMPDIR /tmp/benchreport-ext4-1/mnt: ext4 on /dev/loop0 mounted at /tmp/benchreport-ext4-1/mnt, with a journal (`/sys/fs/ext4/loop0/journal_task` reads `20550`)",
			"took 22.0 µs of CPU per create in a new directory and 566 µs in one whose 2,048 files had just been removed on (a) the machine's disk, against 17.0 and 7.40 µs on (b) journaled ext4 on a loop device.",
		}, []string{"loop device | not measured", "not measured:"}},
		{"journaled skipped", []writesFS{disk, {Where: onJournal, Skipped: "not root (mounting a loop device needs it)"}}, []string{
			"| durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, (a) the machine's disk | 0.55× | no |",
			"| durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, (b) journaled ext4 on a loop device | not measured | n/a |",
			"\n(b) journaled ext4 on a loop device: not measured: not root (mounting a loop device needs it).\n",
			"| (a) the machine's disk | 32 | 550 | 1,000 | 0.55× | 412 | 1.25 | 0.12 |",
		}, []string{"| (b) journaled ext4 on a loop device |", "TMPDIR /tmp/benchreport"}},
		{"not run", nil, []string{
			"| durable fs.write 1 KiB at p=32 ≥ 1.5× bare bbolt Update+fsync, (a) the machine's disk | not measured | n/a |",
			"The file systems: not measured.",
			"The create loop was not measured.",
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &report{Began: time.Unix(0, 0), Writes: c.writes}
			md := string(r.markdown())
			for _, want := range c.want {
				if !strings.Contains(md, want) {
					t.Errorf("report lacks %q", want)
				}
			}
			for _, never := range c.never {
				if strings.Contains(md, never) {
					t.Errorf("report has %q", never)
				}
			}
		})
	}
}

// The create loop measures both directories and leaves nothing behind.
func TestMeasureCreates(t *testing.T) {
	dir := t.TempDir()
	c, err := measureCreates(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fresh <= 0 || c.Churned <= 0 {
		t.Errorf("measureCreates = %+v", c)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("measureCreates left %v (%v)", left, err)
	}
}

// readFS finds the file system of a directory in /proc/self/mounts.
func TestReadFS(t *testing.T) {
	dir := t.TempDir()
	fs := readFS(dir)
	if fs.Type == "" || !strings.HasPrefix(dir, strings.TrimSuffix(fs.Mount, "/")) {
		t.Fatalf("readFS(%s) = %+v", dir, fs)
	}
	if fs.Journal == "" && fs.JournalFrom == "" {
		t.Errorf("readFS(%s) says neither whether it has a journal nor why not: %+v", dir, fs)
	}
}
