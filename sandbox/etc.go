package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// etcEntries are the only parts of the host's /etc the sandbox sees, as a
// read-only snapshot bound at /etc: name service, dynamic linker, TLS
// roots, Debian alternatives, time zone, a few shell and tool defaults.
// Secrets — /etc/shadow, /etc/ssh, /etc/ssl/private, /etc/sudoers — are
// never copied. passwd and group are not the host's: they are written
// fresh (etcPasswd, etcGroup).
var etcEntries = []string{
	"hosts", "hostname", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
	"ld.so.cache", "ld.so.conf", "ssl/openssl.cnf", "ca-certificates.conf",
	"localtime", "timezone", "protocols", "services", "mime.types", "os-release", "debian_version",
	"profile", "bash.bashrc", "inputrc", "magic", "magic.mime", "gitconfig", "manpath.config",
}

// etcDirs are directories of /etc without secrets, bound read-only as
// they are over the snapshot (copying them would cost hundreds of files);
// the snapshot holds an empty directory as their mount point.
var etcDirs = []string{"alternatives", "ssl/certs", "ld.so.conf.d", "terminfo", "pki/tls/certs", "crypto-policies"}

// etcDirBinds are the bwrap arguments binding etcDirs.
func etcDirBinds() []string {
	var a []string
	for _, d := range etcDirs {
		src, err := filepath.EvalSymlinks(filepath.Join("/etc", d))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(src); err == nil && fi.IsDir() {
			a = append(a, "--ro-bind", src, filepath.Join("/etc", d))
		}
	}
	return a
}

func etcPasswd(uid int) string {
	s := "root:x:0:0:root:/root:/bin/sh\n"
	if uid != 0 {
		s += fmt.Sprintf("sandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n", uid, uid)
	}
	return s + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

func etcGroup(gid int) string {
	s := "root:x:0:\n"
	if gid != 0 {
		s += fmt.Sprintf("sandbox:x:%d:\n", gid)
	}
	return s + "nogroup:x:65534:\n"
}

// etcCache keeps the /etc snapshot for one staging directory and uid,
// shared by the Sandboxes that use them, rebuilt when the host's entries
// change (their type, size or modification time). A snapshot is removed
// once replaced or once no open Sandbox uses the cache, as soon as no run
// binds it any more.
type etcCache struct {
	key     etcKey
	users   int // open Sandboxes; guarded by etcCaches.mu
	mu      sync.Mutex
	cur     *etcSnap
	retired []*etcSnap
}

type etcKey struct {
	parent string
	uid    int
}

var etcCaches = struct {
	sync.Mutex
	m map[etcKey]*etcCache
}{m: map[etcKey]*etcCache{}}

func openEtcCache(parent string, uid int) *etcCache {
	etcCaches.Lock()
	defer etcCaches.Unlock()
	k := etcKey{parent, uid}
	c := etcCaches.m[k]
	if c == nil {
		c = &etcCache{key: k}
		etcCaches.m[k] = c
	}
	c.users++
	return c
}

func (c *etcCache) close() {
	etcCaches.Lock()
	c.users--
	last := c.users == 0
	if last {
		delete(etcCaches.m, c.key)
	}
	etcCaches.Unlock()
	if last {
		c.mu.Lock()
		if c.cur != nil {
			c.retire(c.cur)
			c.cur = nil
		}
		c.mu.Unlock()
	}
}

type etcSnap struct {
	st    *stageDir
	dir   string
	dev   string   // the skeleton of the sandbox's /dev (dev.go), made with the snapshot
	binds []string // etcDirBinds, as the host was when the snapshot was made
	sig   string
	refs  int

	fstabOnce sync.Once
	fstab     string // aheadFstab's file, once written
	fstabErr  error
}

// aheadFstab returns the fstab binding the snapshot's directories (binds)
// at their places in it, read-only, and making its /dev (devFstab), which
// a spare chain mounts ahead (mountAhead), written beside the snapshot
// once: the spare chains of a snapshot share it, so making one
// writes and removes no file (on the disk of the kernel's database, whose
// fsyncs a file made and removed per chain slowed).
func (e *etcSnap) aheadFstab() (string, error) {
	e.fstabOnce.Do(func() {
		var b strings.Builder
		for i := 0; i+2 < len(e.binds); i += 3 {
			dst := filepath.Join(e.dir, strings.TrimPrefix(e.binds[i+2], "/etc"))
			fmt.Fprintf(&b, "%s %s none rbind,ro 0 0\n", fstabEscape(e.binds[i+1]), fstabEscape(dst))
		}
		b.WriteString(devFstab(e.dev))
		e.fstab = filepath.Join(e.st.path, "fstab-ahead")
		e.fstabErr = os.WriteFile(e.fstab, []byte(b.String()), 0o600)
	})
	return e.fstab, e.fstabErr
}

// etcSignature describes the entries of etc (the host's /etc) — mode,
// size and modification time of each, following symbolic links — to
// notice changes. It is on every run's path (and every spare chain's):
// stat(2) into one buffer, without os.Stat's allocations and fmt.
func etcSignature(etc string) string {
	b := make([]byte, 0, 1024)
	var st unix.Stat_t
	for _, names := range [][]string{etcEntries, etcDirs} {
		for _, name := range names {
			if unix.Stat(etc+"/"+name, &st) != nil {
				continue
			}
			b = append(append(b, name...), ' ')
			b = append(strconv.AppendUint(b, uint64(st.Mode), 8), ' ')
			b = append(strconv.AppendInt(b, st.Size, 10), ' ')
			b = append(strconv.AppendInt(b, st.Mtim.Nano(), 10), '|')
		}
	}
	return string(b)
}

// acquire returns the current snapshot, building it if needed, and a
// release function.
func (c *etcCache) acquire() (*etcSnap, func(), error) {
	sig := etcSignature("/etc")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.sig != sig {
		snap, err := buildEtc(c.key.parent, c.key.uid)
		if err != nil {
			return nil, nil, err
		}
		snap.sig = sig
		if c.cur != nil {
			c.retire(c.cur)
		}
		c.cur = snap
	}
	snap := c.cur
	snap.refs++
	return snap, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		snap.refs--
		c.sweep()
	}, nil
}

func (c *etcCache) retire(s *etcSnap) {
	c.retired = append(c.retired, s)
	c.sweep()
}

func (c *etcCache) sweep() {
	kept := c.retired[:0]
	for _, s := range c.retired {
		if s.refs == 0 {
			s.st.remove()
		} else {
			kept = append(kept, s)
		}
	}
	c.retired = kept
}

func buildEtc(parent string, uid int) (*etcSnap, error) {
	st, err := newStageDir(parent, "etc-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(st.path, "etc")
	err = os.Mkdir(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "passwd"), []byte(etcPasswd(uid)), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "group"), []byte(etcGroup(uid)), 0o644)
	}
	for _, name := range etcEntries {
		if err != nil {
			break
		}
		err = copyEtcEntry(filepath.Join("/etc", name), filepath.Join(dir, name))
	}
	for _, d := range etcDirs {
		if err == nil {
			err = os.MkdirAll(filepath.Join(dir, d), 0o755)
		}
	}
	dev := filepath.Join(st.path, "dev")
	if err == nil {
		err = makeDevSkeleton(dev)
	}
	if err == nil {
		err = os.Chmod(st.path, 0o755) // bwrap binds it as the kernel's user
	}
	if err != nil {
		st.remove()
		return nil, fmt.Errorf("sandbox: /etc snapshot: %w", err)
	}
	return &etcSnap{st: st, dir: dir, dev: dev, binds: etcDirBinds()}, nil
}

// copyEtcEntry copies one entry: a top-level link into /usr stays a link
// (it resolves in the sandbox); any other link is copied as what it points
// to; directories are copied with their links kept as links.
func copyEtcEntry(src, dst string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		resolved, err := filepath.EvalSymlinks(src)
		if err != nil {
			return nil // dangling: leave it out
		}
		if within(resolved, "/usr") {
			return os.Symlink(target, dst)
		}
		src = resolved
		if fi, err = os.Stat(src); err != nil {
			return nil
		}
	}
	if fi.Mode().IsRegular() {
		return copyRegular(src, dst, fi)
	}
	if !fi.IsDir() {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: left out
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return nil
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			return os.Chmod(out, info.Mode().Perm()|0o500)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil
			}
			return os.Symlink(target, out)
		case info.Mode().IsRegular():
			return copyRegular(p, out, info)
		}
		return nil
	})
}

func copyRegular(src, dst string, fi fs.FileInfo) error {
	err := copyFile(src, dst, fi)
	if errors.Is(err, fs.ErrPermission) {
		return nil // not readable by the kernel: not for the sandbox either
	}
	return err
}
