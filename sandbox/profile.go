package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Secret reports whether a path component names a secret: ".env" or
// ".env.*", ".ssh", ".aws", ".gnupg", a name ending in ".pem", or one
// starting with "id_rsa", "id_dsa", "id_ecdsa" or "id_ed25519". It is the
// Go twin of secret_component in policy/rego/capkernel.rego (the policy
// refuses fs calls on any path with such a component) and must agree with
// it; it depends on name alone. Inside every bound root the sandbox hides
// each directory (and so everything in it) and each file so named.
func Secret(name string) bool {
	switch name {
	case ".env", ".ssh", ".aws", ".gnupg":
		return true
	}
	if strings.HasPrefix(name, ".env.") || strings.HasSuffix(name, ".pem") {
		return true
	}
	for _, p := range []string{"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// systemDirs are bound read-only when they are directories and recreated
// as the same symlinks when they are links (merged /usr).
var systemDirs = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// SystemDirs returns the host directories every run sees whole, read-only
// (/usr, and those of systemDirs that are directories rather than links),
// by real path: what lies in them (a data dir under /usr/local, say) every
// command can read, whatever its roots.
func SystemDirs() []string {
	out := []string{"/usr"}
	for _, d := range systemDirs {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	for i, d := range out {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			out[i] = real
		}
	}
	return out
}

type rootPlan struct {
	Root
	real   string          // the host directory, symlinks resolved
	index  int             // position in Profile.Roots
	skip   map[string]bool // rel paths (slash) not staged nor diffed: nested roots and deny paths
	lower  string          // overlay: staging symlink to real
	upper  string          // overlay upper dir, or the copy
	work   string          // overlay work dir
	merged string          // the directory bound at Path (overlay mount point or the copy)
	size   int64           // rw: entries plus content bytes / 4 KiB seen by walkDenies, counted up to smallRoot+1
	copied int64           // copy staging: content bytes copied (where the staging watchdog starts)
	// readOnly marks a Profile.ReadOnly directory, planned as an r root
	// only to be walked for what it hides.
	readOnly bool
}

// smallRoot is the size (entries, plus a unit per 4 KiB of file content)
// up to which StagingAuto stages an rw root by copy: copying a handful of
// small files costs less than the overlay's mount (nsenter and mount
// processes on the run's path).
const smallRoot = 32

type denyPath struct {
	path string // in the sandbox (and on the host, under a root's Path)
	dir  bool
}

type plan struct {
	roots    []*rootPlan // sorted by depth, then path: outer before inner
	denies   []denyPath
	readOnly [][2]string // src (real), dest
	env      []string    // sorted K=V
	dir      string
	limits   Limits
	net      NetMode
	proxy    string
	argv     []string
	stdin    []byte
	timeout  time.Duration
	cmd      Command
}

func (p *plan) writable() []*rootPlan {
	var out []*rootPlan
	for _, r := range p.roots {
		if r.Writable {
			out = append(out, r)
		}
	}
	return out
}

// small reports whether every rw root is small (smallRoot).
func (p *plan) small() bool {
	for _, r := range p.writable() {
		if r.size > smallRoot {
			return false
		}
	}
	return true
}

func depth(p string) int { return strings.Count(p, "/") }

// makePlan validates a profile and a command and finds the deny paths.
func makePlan(pr Profile, c Command) (*plan, error) {
	p := &plan{limits: pr.Limits.withDefaults(), net: pr.Net, stdin: c.Stdin, timeout: c.Timeout, cmd: c}
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return nil, errors.New("sandbox: empty argv")
	}
	for _, a := range c.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errors.New("sandbox: NUL byte in argv")
		}
	}
	p.argv = c.Argv
	if len(pr.Roots) == 0 {
		return nil, errors.New("sandbox: no roots")
	}
	seen := map[string]bool{}
	for i, r := range pr.Roots {
		if !filepath.IsAbs(r.Path) {
			return nil, fmt.Errorf("sandbox: root %q is not absolute", r.Path)
		}
		path := filepath.Clean(r.Path)
		if path == "/" {
			return nil, errors.New(`sandbox: root "/" cannot be bound`)
		}
		if seen[path] {
			return nil, fmt.Errorf("sandbox: root %s named twice", path)
		}
		seen[path] = true
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, fmt.Errorf("sandbox: root: %w", err)
		}
		if fi, err := os.Stat(real); err != nil {
			return nil, fmt.Errorf("sandbox: root: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("sandbox: root %s is not a directory", path)
		}
		p.roots = append(p.roots, &rootPlan{Root: Root{Path: path, Writable: r.Writable}, real: real, index: i, skip: map[string]bool{}})
	}
	first := p.roots[0]
	slices.SortFunc(p.roots, func(a, b *rootPlan) int {
		if d := depth(a.Path) - depth(b.Path); d != 0 {
			return d
		}
		return strings.Compare(a.Path, b.Path)
	})

	// Nested roots are bound over their outer root: the outer root neither
	// stages nor diffs them, and its deny walk leaves them to their own.
	nested := map[*rootPlan][]string{}
	for _, a := range p.roots {
		for _, b := range p.roots {
			if a != b && within(b.Path, a.Path) {
				rel := filepath.ToSlash(strings.TrimPrefix(b.Path, a.Path+"/"))
				a.skip[rel] = true
				nested[a] = append(nested[a], rel)
			}
		}
	}
	// Read-only paths: a directory is bound, and hidden in, as an r root
	// is (walkDenies), leaving the roots and the read-only directories
	// nested in it to their own walks.
	roDirs, err := p.planReadOnly(pr.ReadOnly)
	if err != nil {
		return nil, err
	}
	walked := append(slices.Clone(p.roots), roDirs...)
	for _, a := range roDirs {
		for _, b := range walked {
			if b.Path != a.Path && within(b.Path, a.Path) {
				a.skip[filepath.ToSlash(strings.TrimPrefix(b.Path, a.Path+"/"))] = true
			}
		}
	}
	denied := map[string]bool{}
	for _, r := range walked {
		if err := walkDenies(r, func(rel string, dir bool) {
			r.skip[rel] = true
			path := filepath.Join(r.Path, filepath.FromSlash(rel))
			if !denied[path] {
				denied[path] = true
				p.denies = append(p.denies, denyPath{path: path, dir: dir})
			}
		}); err != nil {
			return nil, err
		}
	}

	// Working directory: inside a root, existing, reached without leaving it.
	p.dir = first.Path
	if c.Dir != "" {
		if !filepath.IsAbs(c.Dir) {
			return nil, fmt.Errorf("sandbox: working directory %q is not absolute", c.Dir)
		}
		p.dir = filepath.Clean(c.Dir)
	}
	var owner *rootPlan
	for _, r := range p.roots {
		if within(p.dir, r.Path) {
			owner = r // the innermost, as roots are sorted outer first
		}
	}
	if owner == nil {
		return nil, fmt.Errorf("sandbox: working directory %s is not in a root", p.dir)
	}
	if rel := strings.TrimPrefix(strings.TrimPrefix(p.dir, owner.Path), "/"); rel != "" {
		root, err := os.OpenRoot(owner.real)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		fi, err := root.Stat(rel)
		root.Close()
		if err != nil {
			return nil, fmt.Errorf("sandbox: working directory: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("sandbox: working directory %s is not a directory", p.dir)
		}
	}

	env := map[string]string{"PATH": DefaultPath}
	for k, v := range pr.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("sandbox: bad environment variable %q", k)
		}
		if strings.HasPrefix(k, initEnvPrefix) {
			return nil, fmt.Errorf("sandbox: environment variable %q: the %s prefix is reserved for the sandbox's init", k, initEnvPrefix)
		}
		env[k] = v
	}
	switch pr.Net {
	case NetOff, NetFull:
	case NetAllowlist:
		if pr.ProxySocket == "" {
			return nil, errors.New("sandbox: network allowlist without a proxy socket")
		}
		fi, err := os.Stat(pr.ProxySocket)
		if err != nil {
			return nil, fmt.Errorf("sandbox: proxy socket: %w", err)
		}
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("sandbox: proxy socket %s is not a socket", pr.ProxySocket)
		}
		p.proxy = pr.ProxySocket
	default:
		return nil, fmt.Errorf("sandbox: unknown network posture %d", pr.Net)
	}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	slices.Sort(p.env)
	return p, nil
}

// planReadOnly checks the Profile.ReadOnly paths and sets p.readOnly, in
// the order they are bound: outer directories before the paths in them,
// which an outer bind would cover otherwise. A path is refused when it is
// "/" (which holds everything the sandbox leaves out), when a component
// of it, as given or with its links resolved, names a secret (Secret),
// when it is a socket, fifo or device, which reaches a host service or
// device whatever the network posture, and when it is, holds or lies in a
// proc or sysfs mount (the host's /proc/PID/root of a process of the
// kernel's user is the host's whole file system). It returns the directories, as
// read-only root plans for walkDenies.
func (p *plan) planReadOnly(paths []string) ([]*rootPlan, error) {
	var dirs []*rootPlan
	var mounts []string
	seen := map[string]bool{}
	for _, ro := range paths {
		if !filepath.IsAbs(ro) {
			return nil, fmt.Errorf("sandbox: read-only path %q is not absolute", ro)
		}
		dest := filepath.Clean(ro)
		if dest == "/" {
			return nil, errors.New(`sandbox: read-only path "/" cannot be bound`)
		}
		real, err := filepath.EvalSymlinks(dest)
		if err != nil {
			return nil, fmt.Errorf("sandbox: read-only path: %w", err)
		}
		for _, path := range []string{dest, real} {
			if name := secretComponent(path); name != "" {
				return nil, fmt.Errorf("sandbox: read-only path %s: %q names a secret, which the sandbox never shows", dest, name)
			}
		}
		if real == "/" {
			return nil, fmt.Errorf(`sandbox: read-only path %s is "/", which cannot be bound`, dest)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("sandbox: read-only path: %w", err)
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("sandbox: read-only path %s is a %s: the sandbox binds no sockets, fifos or devices", dest, fileKind(fi.Mode()))
		}
		if fi.IsDir() {
			if mounts == nil {
				if mounts, err = kernelFSMounts(); err != nil {
					return nil, fmt.Errorf("sandbox: read-only path %s: %w", dest, err)
				}
			}
			for _, m := range mounts {
				if within(m, real) || within(real, m) {
					return nil, fmt.Errorf("sandbox: read-only path %s holds or is in %s, a proc or sysfs mount: its process links lead out of any sandbox", dest, m)
				}
			}
		}
		if seen[dest] {
			continue
		}
		seen[dest] = true
		p.readOnly = append(p.readOnly, [2]string{real, dest})
		if fi.IsDir() {
			dirs = append(dirs, &rootPlan{Root: Root{Path: dest}, real: real, readOnly: true, skip: map[string]bool{}})
		}
	}
	slices.SortStableFunc(p.readOnly, func(a, b [2]string) int { return depth(a[1]) - depth(b[1]) })
	return dirs, nil
}

// kernelFSMounts returns the mount points of the proc and sysfs file
// systems in this process's mount namespace (/proc/self/mountinfo).
func kernelFSMounts() ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	out := []string{} // not nil: read
	for _, m := range mounts {
		if m.fstype == "proc" || m.fstype == "sysfs" {
			out = append(out, m.point)
		}
	}
	return out, nil
}

// unescapeMount decodes the octal escapes (\040 for a space, …) of a
// mountinfo path.
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// secretComponent returns the first component of path that names a
// secret, or "".
func secretComponent(path string) string {
	for name := range strings.SplitSeq(path, "/") {
		if Secret(name) {
			return name
		}
	}
	return ""
}

// fileKind names the type of a file that is neither a directory nor a
// regular file.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// walkDenies finds the directories and files a root, or a read-only
// directory, hides (Secret names, every socket, fifo and device, and
// every directory the kernel cannot list), without following symbolic
// links, and without entering nested roots.
func walkDenies(r *rootPlan, deny func(rel string, dir bool)) error {
	return filepath.WalkDir(r.real, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == r.real {
				what := "root"
				if r.readOnly {
					what = "read-only path"
				}
				return fmt.Errorf("sandbox: %s %s: %w", what, r.Path, err)
			}
			if d != nil && d.IsDir() {
				// A directory the kernel may enter but not list (mode
				// 0311, another user's 0711) still opens its files by
				// name: what it holds cannot be checked, so all of it
				// is hidden.
				deny(filepath.ToSlash(strings.TrimPrefix(path, r.real+"/")), true)
				return fs.SkipDir
			}
			return nil // unreadable here, unreadable in the sandbox too
		}
		if path == r.real {
			return nil
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, r.real+"/"))
		if d.IsDir() {
			if r.skip[rel] {
				return fs.SkipDir // a nested root, walked on its own
			}
			if Secret(d.Name()) {
				deny(rel, true)
				return fs.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			// Never followed, and never covered: a bind over a link
			// would land on its target. Whatever it points to in a
			// root is hidden there by its own name.
		case t.IsRegular() && Secret(d.Name()):
			deny(rel, false)
		case !t.IsRegular():
			// A socket (or fifo, or device) reaches a host service
			// whatever the network posture: /dev/null over it refuses
			// connect(2) and open(2).
			deny(rel, false)
		}
		if r.Writable && r.size <= smallRoot {
			r.size++
			if d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					r.size += fi.Size() / 4096
				}
			}
		}
		return nil
	})
}

const (
	sandboxProxyDir  = "/run/capkernel"
	sandboxProxySock = sandboxProxyDir + "/proxy.sock"
)

// bwrapArgs is bwrap's options for the plan, on a chain that has made
// ahead what ah says (its /etc binds and /dev, its network namespace's
// loopback): bwrap makes the rest.
func (s *Sandbox) bwrapArgs(p *plan, t *tools, etc *etcSnap, ah ahead) []string {
	id := strconv.Itoa(s.uid())
	a := []string{
		"--die-with-parent", "--new-session",
		"--unshare-user", "--uid", id, "--gid", id, "--disable-userns",
		"--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--hostname", "sandbox",
		"--cap-drop", "ALL", "--info-fd", strconv.Itoa(infoFD), "--seccomp", strconv.Itoa(seccompFD),
	}
	if p.net != NetFull && !ah.loopback {
		a = append(a, "--unshare-net")
	}
	a = append(a, "--ro-bind", "/usr", "/usr")
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", target, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	a = append(a, "--ro-bind", etc.dir, "/etc")
	if !ah.mounted {
		a = append(a, etc.binds...)
	}
	// /proc read-only: a root kernel's sandbox user is the host's uid 0,
	// and the kernel grants the owner's write to sysctls by uid alone
	// (/proc/sys/kernel/core_pattern among them), which bwrap leaves
	// open: it covers what its own user may write, and finds /proc/sys
	// itself unwritable.
	a = append(a, "--proc", "/proc", "--remount-ro", "/proc")
	if ah.mounted {
		// Devices allowed (--dev-bind): the nodes of the /dev made ahead.
		a = append(a, "--dev-bind", etc.dev, "/dev")
	} else {
		a = append(a, "--dev", "/dev")
	}
	// No tmpfs the command can write is unbounded: /dev is read-only but
	// for its binds (the devices, /dev/pts) and /dev/shm, sized; /tmp is
	// sized; the root (which holds the mount points) is made read-only
	// last.
	a = append(a, "--remount-ro", "/dev", "--size", strconv.Itoa(DevShmSize), "--tmpfs", "/dev/shm")
	if p.limits.Tmp > 0 {
		a = append(a, "--size", strconv.FormatInt(p.limits.Tmp, 10))
	}
	a = append(a, "--tmpfs", "/tmp")
	for _, ro := range p.readOnly {
		a = append(a, "--ro-bind", ro[0], ro[1])
	}
	for _, r := range p.roots {
		if r.Writable {
			a = append(a, "--bind", r.merged, r.Path)
		} else {
			a = append(a, "--ro-bind", r.real, r.Path)
		}
	}
	for _, d := range p.denies {
		if d.dir {
			a = append(a, "--tmpfs", d.path, "--remount-ro", d.path)
		} else {
			a = append(a, "--ro-bind", "/dev/null", d.path)
		}
	}
	env := p.env
	if p.net == NetAllowlist {
		a = append(a, "--ro-bind", p.proxy, sandboxProxySock)
		url := "http://127.0.0.1:" + strconv.Itoa(s.opts.ProxyPort)
		env = setEnv(env, "HTTP_PROXY", url, "HTTPS_PROXY", url, "http_proxy", url, "https_proxy", url,
			"ALL_PROXY", url, "all_proxy", url, "NO_PROXY", "", "no_proxy", "")
	}
	a = append(a, "--remount-ro", "/", "--chdir", p.dir, "--clearenv")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	// The init's arguments (see initScript), which the chain's command
	// line, fixed before the run, cannot carry.
	var args []string
	if p.net == NetAllowlist {
		args = append(args, "relay", t.socat, strconv.Itoa(s.opts.ProxyPort), fmt.Sprintf("%04X", s.opts.ProxyPort))
	}
	args = append(append(args, "--"), p.argv...)
	return append(a, initEnv(args)...)
}

// initEnvPrefix starts the names of the environment variables that carry
// the init's arguments; the init unsets them before it starts anything,
// and a profile may not name one.
const initEnvPrefix = "CAPKERNEL_INIT_"

// initEnv is the bwrap options that pass args to the init: one variable
// per argument, and CAPKERNEL_INIT_ARGV, the shell command that sets the
// init's positional parameters from them, made of the variables' names
// only (the init evaluates it: no argument's text is ever evaluated), and
// CAPKERNEL_INIT_VARS, their names, which the init unsets.
func initEnv(args []string) []string {
	var a, names []string
	set := "set --"
	for i, v := range args {
		name := initEnvPrefix + strconv.Itoa(i)
		a = append(a, "--setenv", name, v)
		names = append(names, name)
		set += ` "$` + name + `"`
	}
	return append(a, "--setenv", initEnvPrefix+"ARGV", set, "--setenv", initEnvPrefix+"VARS", strings.Join(names, " "))
}

func setEnv(env []string, kv ...string) []string {
	m := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// initScript is pid 1 of the sandbox's pid namespace (bwrap --as-pid-1).
// It takes its arguments from the CAPKERNEL_INIT_* variables (initEnv),
// writes "ready" to fd 3 and waits on fd 5 for the kernel's "go": by then
// the kernel has set the rlimits and the niceness on the init
// (Sandbox.release), which everything it starts afterwards inherits;
// end-of-file instead (the kernel could not, or is gone: only the kernel
// holds the write end) makes it exit 125 having run nothing, and with it
// the whole namespace. With the allowlist posture it then starts socat as
// a loopback TCP listener relaying to the proxy's unix socket and waits
// until the port listens (read from the sandbox's /proc/net/tcp, so no
// probe connection reaches the proxy). Then it runs the command as its
// child, with the original stdin and stderr, forwards SIGTERM, SIGINT and
// SIGHUP to it, reaps orphans while it waits, and exits with the
// command's status (128+n for signal n) — but first it kills every other
// process of the namespace (kill -KILL -1: the command's background
// processes, the relay) and reaps them, so that their CPU time reaches
// its own rusage, and so bwrap's and the kernel's: the namespace's
// teardown would reap them unaccounted. While any process but itself is
// left in the sandbox's /proc it kills again and waits for a 1 ms sleep
// of its own (dash's wait reaps every child that has exited meanwhile),
// at most 2000 times (then it exits, and the teardown kills the rest).
// Once ready it writes "started"
// to fd 3, which it closes before the command runs: the command can
// neither fake nor hide a setup failure.
//
// The init dies with the kernel without a watcher process of its own:
// bwrap arms its parent-death signal (SIGKILL, --die-with-parent) before
// it execs the init, and bwrap dies with the kernel (Go's Pdeathsig, and
// its own); a kernel killed while bwrap was still setting the sandbox up,
// before that signal was armed, leaves fd 3 without a reader and fd 5 at
// end-of-file, so the init dies on its "ready" (SIGPIPE) or exits at its
// "go". The death of pid 1 kills every process of the namespace.
//
// Why a shell as init rather than bwrap's own: bwrap's init reports the
// exit status through an eventfd and is then killed unreaped, so the CPU
// time of the command would be lost; this init is reaped by bwrap, and
// bwrap by the kernel, so the rusage of the whole tree reaches Result.
// And a plain command as pid 1 (the init exec'ing it, to save its fork)
// would ignore every signal it has no handler for — SIGTERM sent from
// outside, and the kernel's own SIGXCPU and SIGXFSZ of RLIMIT_CPU and
// RLIMIT_FSIZE (measured: a loop with a 1 s soft, 3 s hard CPU limit ran
// 3 s and died by SIGKILL as pid 1, 1 s and SIGXCPU as the init's child;
// a loop of 0.33 s CPU under bwrap's own init showed 0.05 s in bwrap's
// rusage). The shell is the only process between bwrap and the command,
// and execs nothing on the way.
const initScript = `eval "$CAPKERNEL_INIT_ARGV"
unset $CAPKERNEL_INIT_VARS CAPKERNEL_INIT_VARS CAPKERNEL_INIT_ARGV
exec 9<&-
printf ready >&3
read -r _ <&5 || exit 125
exec 5<&-
if [ "$1" = relay ]; then
	socat="$2"; port="$3"; hex="$4"; shift 4
	"$socat" "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:` + sandboxProxySock + `" 2>/dev/null &
	i=0
	while ! grep -q "^ *[0-9]*: 0100007F:$hex 00000000:0000 0A " /proc/net/tcp; do
		i=$((i+1))
		if [ "$i" -gt 5000 ]; then echo "capkernel sandbox: network relay did not start" >&2; exit 125; fi
		sleep 0.001 2>/dev/null || :
	done
fi
shift
printf started >&3
exec 3>&- 9<&0 8>&2 2>/dev/null
trap 'kill -TERM "$child"' TERM INT HUP
"$@" <&9 2>&8 9<&- 8>&- &
child=$!
exec 9<&- 8>&-
while :; do
	wait "$child"; rc=$?
	if [ "$rc" -gt 128 ] && kill -0 "$child"; then continue; fi
	break
done
kill -KILL -1 2>/dev/null
i=0
while set -- /proc/[0-9]*; [ "$#" -gt 1 ] && [ "$i" -lt 2000 ]; do
	kill -KILL -1 2>/dev/null
	sleep 0.001 2>/dev/null &
	wait "$!"
	i=$((i+1))
done
exit "$rc"`
