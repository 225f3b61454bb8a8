package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The sandbox's /dev is what bwrap's --dev makes, but for its nodes'
// binds, read-only here (devFstab): a read-only directory holding the
// host's null, zero, full, random, urandom and tty nodes, a devpts
// instance of the sandbox's own at pts (ptmx links to its ptmx), an empty
// shm (the run mounts a sized tmpfs there) and the fd, stdin, stdout,
// stderr and core links. Every chain of a root kernel makes it in its own
// mount namespace (mountAhead), a spare chain ahead of its run: bwrap then
// binds it whole, one recursive bind, where --dev costs it a tmpfs, a bind
// and a remount per node and the devpts mount on the run's path (~0.7 ms
// measured on the 2-core machine). An ordinary user's chain has no mount
// namespace of its own and gets bwrap's --dev: its sandbox user is the
// kernel's uid, which owns no host node. The skeleton, mount points and
// links, is a directory beside the /etc snapshot (makeDevSkeleton), made
// with it and shared by the chains of that snapshot, as the snapshot is: a
// command watching /dev with inotify sees another run's command open it,
// no more than it sees of /etc.

// devNodes are the host's device nodes bound into the sandbox's /dev.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are the symbolic links of the sandbox's /dev: name, target.
var devLinks = [][2]string{
	{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"},
	{"stderr", "/proc/self/fd/2"}, {"core", "/proc/kcore"}, {"ptmx", "pts/ptmx"},
}

// devptsOptions are bwrap's own for the devpts it mounts with --dev.
const devptsOptions = "nosuid,noexec,newinstance,ptmxmode=0666,mode=620"

// makeDevSkeleton makes dir, the skeleton of the sandbox's /dev: an empty
// file per node (its mount point), the pts and shm directories, the links.
func makeDevSkeleton(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for _, n := range devNodes {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], filepath.Join(dir, l[0])); err != nil {
			return err
		}
	}
	return nil
}

// devFstab returns the fstab lines that make the skeleton dir the
// sandbox's /dev in a chain's mount namespace: each node bound from the
// host's /dev, read-only and nosuid (bwrap's bind of the whole keeps them
// device nodes), a new devpts instance at pts. Read-only because a root
// kernel's sandbox user is the host's uid 0 to the host's files, the
// owner of the host's nodes: on a writable bind (bwrap's --dev makes
// those) a command could chmod the host's /dev/null; a read-only bind
// refuses that (EROFS) and still lets it write to the device.
func devFstab(dir string) string {
	var b strings.Builder
	for _, n := range devNodes {
		fmt.Fprintf(&b, "/dev/%s %s none bind,ro,nosuid 0 0\n", n, fstabEscape(filepath.Join(dir, n)))
	}
	fmt.Fprintf(&b, "devpts %s devpts %s 0 0\n", fstabEscape(filepath.Join(dir, "pts")), devptsOptions)
	return b.String()
}
