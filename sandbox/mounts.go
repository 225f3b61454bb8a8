package sandbox

import (
	"os"
	"path/filepath"
	"strings"
)

// MountTable is this process's mount namespace as /proc/self/mountinfo
// describes it (ReadMounts), read once for several questions.
type MountTable []mountEntry

// ReadMounts reads the mount table; without mountinfo it is empty.
func ReadMounts() MountTable {
	t, _ := readMountinfo()
	return t
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
