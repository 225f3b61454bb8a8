package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Root is a host directory made visible in the sandbox at the same path.
type Root struct {
	Path     string // absolute; the sandbox path, and the host path it comes from
	Writable bool   // rw: writes go to the staging layer; r: read-only bind
}

// NetMode is the network posture of a run.
type NetMode int

// Network postures.
const (
	NetOff       NetMode = iota // new network namespace with loopback only
	NetAllowlist                // as NetOff, plus HTTP(S)_PROXY relayed to Profile.ProxySocket
	NetFull                     // the host's network namespace
)

func (m NetMode) String() string {
	switch m {
	case NetOff:
		return "off"
	case NetAllowlist:
		return "allowlist"
	case NetFull:
		return "full"
	}
	return fmt.Sprintf("NetMode(%d)", int(m))
}

// Limits bound a run. A zero field takes the default named in its comment;
// a negative one means no limit.
type Limits struct {
	CPUTime   time.Duration // RLIMIT_CPU of every process, whole seconds rounded up (SIGXCPU, SIGKILL 1 s later); default none
	FileSize  int64         // RLIMIT_FSIZE in bytes (SIGXFSZ / EFBIG beyond it); default none
	Processes int           // RLIMIT_NPROC and the supervisor's process watchdog; default 256
	OpenFiles int           // RLIMIT_NOFILE; default none
	// Memory bounds the bytes the whole process tree holds (its memory
	// cgroup's limit: anonymous memory, /tmp and /dev/shm pages, page
	// cache), where the host offers a memory cgroup (MemoryCgroup): past
	// it the host's OOM killer kills a process of the run and
	// LimitExceeded is "memory"; default DefaultMemory.
	Memory       int64
	AddressSpace int64 // RLIMIT_AS in bytes, per process (ENOMEM beyond it); default DefaultAddressSpace
	Tmp          int64 // size in bytes of the tmpfs at /tmp (ENOSPC beyond it); default DefaultTmp

	Stdout int64 // bytes of stdout kept; default 1 MiB
	Stderr int64 // bytes of stderr kept; default 1 MiB

	DeltaFiles int   // entries in the delta (added, modified, deleted); default 10,000
	DeltaBytes int64 // bytes of added and modified file content in the delta; default 1 GiB
	// DeltaPathBytes bounds the bytes of the delta's paths (and link
	// targets), which its result, record and stored delta each hold;
	// default DefaultDeltaPathBytes.
	DeltaPathBytes int64
}

// Limit defaults.
const (
	DefaultProcesses  = 256
	DefaultOutput     = 1 << 20
	DefaultDeltaFiles = 10000
	DefaultDeltaBytes = 1 << 30
	// DefaultDeltaPathBytes is DeltaPathBytes's default: paths of 400
	// bytes on average for DefaultDeltaFiles entries (a tree of 10,000
	// files under paths of 255-byte names took 39 MB, three times over).
	DefaultDeltaPathBytes = 4 << 20
	DefaultMemory         = 4 << 30
	// DefaultAddressSpace is generous on purpose: it is address space,
	// not memory used, and runtimes reserve far more than they use (node
	// 20 does not start with 8 GiB; the JVM reserves its heap, a quarter
	// of the host's RAM, up front).
	DefaultAddressSpace = 16 << 30
	// DefaultTmp holds a build's caches (HOME is /tmp: a Go build of a
	// large module fills over 512 MiB of GOCACHE there); where runs get a
	// memory cgroup, its pages count against DefaultMemory too.
	DefaultTmp = 2 << 30
)

// DevShmSize is the size of the tmpfs at /dev/shm (POSIX shared memory,
// semaphores), the only writable place under /dev: 64 MiB, as Docker's.
const DevShmSize = 64 << 20

// Profile is what a run may see and use.
type Profile struct {
	Roots       []Root            // bound at their own paths; none may be "/"
	Net         NetMode           // default NetOff
	ProxySocket string            // NetAllowlist: the host path of the proxy's unix socket
	Env         map[string]string // the whole environment; PATH defaults to DefaultPath
	Limits      Limits
	// ReadOnly are extra host paths (toolchains, …) bound read-only at the
	// same path, hidden in and refused as doc.go says: a directory hides
	// what a root hides (secret names, sockets, fifos, devices).
	ReadOnly []string
}

// DefaultPath is the PATH of a run whose Env sets none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

// Command is what to run.
type Command struct {
	Argv    []string      // argv[0] is looked up in the sandbox's PATH; no shell unless argv names one
	Dir     string        // working directory: an existing directory in a root; default the first root
	Stdin   []byte        // nil: none (end of file at once)
	Timeout time.Duration // 0: none besides the context's
	// Channel, if set, is inherited by the command as file descriptor
	// ChannelFD: a supervisor's channel to a sandboxed agent.
	Channel *os.File
	// Stdout and Stderr, if set, also receive the command's output as it
	// comes (Result keeps its capped copy either way).
	Stdout, Stderr io.Writer
	// Gate, if set, is called once the sandbox is set up and its limits
	// are applied, before anything of the command runs (it may block):
	// the command runs only if it returns nil. Otherwise nothing of the
	// command runs and Run fails with its error wrapped. A caller uses it
	// to overlap its own preparation with the sandbox's set-up (the
	// kernel makes its intent durable meanwhile).
	Gate func() error
	// Spare, if set, is given the start of the Sandbox's next spare chain
	// when Run ends, instead of Run starting it then (as it does without
	// Channel): the caller runs it once its own work after the run is done
	// (proc.exec: once the call is recorded, syscalls.Call.After), which
	// making the spare would otherwise compete with for the CPU.
	Spare func(start func())
}

// ChannelFD is the file descriptor a command finds Command.Channel on.
const ChannelFD = 6

// StagingMode is how writes to rw roots are kept from the workspace.
type StagingMode int

// Staging modes.
const (
	StagingAuto    StagingMode = iota // overlay, falling back to copy where overlayfs is refused
	StagingOverlay                    // overlay only; Run fails where it is refused
	StagingCopy                       // a private copy of each rw root, diffed after the run
)

func (m StagingMode) String() string {
	switch m {
	case StagingAuto:
		return "auto"
	case StagingOverlay:
		return "overlay"
	case StagingCopy:
		return "copy"
	}
	return fmt.Sprintf("StagingMode(%d)", int(m))
}

// SymlinkPolicy says what the delta does with symbolic links the command
// created or changed in an rw root.
type SymlinkPolicy int

// Symlink policies.
const (
	SymlinksRefuse SymlinkPolicy = iota // the delta fails with ErrSymlink
	SymlinksRecord                      // the delta records them (Type TypeSymlink, Target), never following them
)

// DefaultKillGrace is Options.KillGrace unless set: the time between
// SIGTERM and SIGKILL on a timeout or cancellation.
const DefaultKillGrace = 3 * time.Second

// Options configure a Sandbox.
type Options struct {
	Bwrap      string        // bwrap binary, a name looked up in PATH or a path; default "bwrap"
	Staging    StagingMode   // default StagingAuto
	StagingDir string        // where per-run staging directories go; default os.TempDir()
	KillGrace  time.Duration // SIGTERM → SIGKILL grace on timeout or cancellation; default 3 s
	Symlinks   SymlinkPolicy // default SymlinksRefuse
	ProxyPort  int           // loopback TCP port of the in-sandbox proxy relay; default 3128
	RootInside bool          // run as uid/gid 0 inside the sandbox instead of 1000 (never with capabilities)
	Nice       int           // scheduling niceness of the command and every process it starts (so the kernel and its watchdog keep the CPU); default 10, negative: unchanged
}

// Sandbox runs commands under bubblewrap. It is safe for concurrent use.
type Sandbox struct {
	opts           Options
	overlayRefused atomic.Bool
	refusedWhy     atomic.Value // string

	mu     sync.Mutex
	etc    *etcCache
	closed bool
	paths  map[string]string // tools found in PATH (lookPath)

	spare    *forker // made ahead for the next run (forker.go)
	making   bool    // a spare is being made
	noForker bool    // making one failed: runs join their cgroups

	spareChain  *chain         // started ahead for the next run (chain.go)
	makingChain chan struct{}  // a spare chain is being made: closed once it is the spare (or failed)
	chains      sync.WaitGroup // the goroutine making it
}

// acquireEtc acquires the current /etc snapshot from the Sandbox's cache
// (opened on first use); release gives it back.
func (s *Sandbox) acquireEtc() (etc *etcSnap, release func(), err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errors.New("sandbox: closed")
	}
	if s.etc == nil {
		s.etc = openEtcCache(s.opts.StagingDir, s.uid())
	}
	ec := s.etc
	s.mu.Unlock()
	return ec.acquire()
}

// Close releases what the Sandbox keeps between runs (its /etc snapshot,
// once no other Sandbox with the same staging directory uses it; runs in
// flight finish first). Results already returned stay valid until their
// own Close. Run fails after Close.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.spare != nil {
		s.spare.discard()
		s.spare = nil
	}
	spare := s.spareChain
	s.spareChain = nil
	s.mu.Unlock()
	// The spare chain holds a reference to the /etc snapshot: it is gone
	// before the snapshot is released, so Close returns with both gone
	// (runs in flight aside).
	s.chains.Wait() // one being made is ended by its maker, seeing closed
	if spare != nil {
		spare.end()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etc != nil {
		s.etc.close()
	}
	return nil
}

// uid is the user and group id of the command inside the sandbox.
func (s *Sandbox) uid() int {
	if s.opts.RootInside {
		return 0
	}
	return 1000
}

// New returns a Sandbox with opts.
func New(opts Options) *Sandbox {
	if opts.Bwrap == "" {
		opts.Bwrap = "bwrap"
	}
	if opts.StagingDir == "" {
		opts.StagingDir = os.TempDir()
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	if opts.ProxyPort <= 0 {
		opts.ProxyPort = 3128
	}
	if opts.Nice == 0 {
		opts.Nice = 10
	}
	closeInheritedOnExec()
	return &Sandbox{opts: opts}
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own so; one the process inherited open (a shell's
// redirection, a supervisor's socket) would otherwise pass through
// unshare, bwrap and the init into every command, which could write or
// read through it outside its roots. A run's own descriptors are handed to
// the chain by os/exec (ExtraFiles), which clears the flag in the child
// alone.
func closeInheritedOnExec() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Kernels before 5.11: one by one.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// ErrUnavailable is returned by Available and Run when bubblewrap is not
// installed: the sandbox fails closed.
var ErrUnavailable = errors.New("sandbox unavailable: install bubblewrap")

// Errors of the delta (Result.DeltaErr), wrapped with details.
var (
	ErrDeltaTooLarge = errors.New("sandbox: delta too large")
	ErrSymlink       = errors.New("sandbox: symbolic link in the delta")
	ErrSpecialFile   = errors.New("sandbox: special file in the delta")
	ErrOverlay       = errors.New("sandbox: unsupported overlay upper entry")
	// ErrProtected refuses a delta that deletes a directory holding a
	// path the command could not see (a hidden secret, see Secret, a
	// covered socket, fifo or device, or a nested root).
	ErrProtected = errors.New("sandbox: the delta deletes a path hidden from the command")
)

// Available reports whether Run can work with the default Options.
func Available() error { return New(Options{}).Available() }

// Available reports whether the tools Run needs are installed: bwrap
// (ErrUnavailable), and sh (and unshare, for a root kernel) from the base
// system.
func (s *Sandbox) Available() error {
	_, err := s.tools(false, os.Geteuid() == 0, false)
	return err
}

type tools struct {
	bwrap, sh, mount, nsenter, unshare, socat string
}

// tools finds the programs a run needs: bwrap and sh always, nsenter and
// mount for overlays, unshare for a chain that starts in a user namespace
// of its own (overlays, a root kernel), socat for the allowlist relay.
func (s *Sandbox) tools(overlay, userns, relay bool) (*tools, error) {
	var t tools
	var err error
	if t.bwrap, err = s.lookPath(s.opts.Bwrap); err != nil {
		return nil, ErrUnavailable
	}
	if t.sh, err = s.lookPath("sh"); err != nil {
		return nil, fmt.Errorf("sandbox unavailable: sh not found")
	}
	if overlay {
		if t.mount, err = s.lookPath("mount"); err != nil {
			return nil, fmt.Errorf("sandbox unavailable: mount not found (install mount)")
		}
		if t.nsenter, err = s.lookPath("nsenter"); err != nil {
			return nil, fmt.Errorf("sandbox unavailable: nsenter not found (install util-linux)")
		}
	}
	if userns {
		if t.unshare, err = s.lookPath("unshare"); err != nil {
			return nil, fmt.Errorf("sandbox unavailable: unshare not found (install util-linux)")
		}
	}
	if relay {
		if t.socat, err = s.lookPath("socat"); err != nil {
			return nil, fmt.Errorf("sandbox unavailable: socat not found (install socat; needed for the network allowlist relay)")
		}
	}
	return &t, nil
}

// lookPath is exec.LookPath, remembered once found: the search costs a
// stat per PATH entry on every run otherwise. A program removed later
// fails the run at its start (closed, as without it).
func (s *Sandbox) lookPath(name string) (string, error) {
	s.mu.Lock()
	p, ok := s.paths[name]
	s.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	if s.paths == nil {
		s.paths = map[string]string{}
	}
	s.paths[name] = p
	s.mu.Unlock()
	return p, nil
}

// OverlayRefused reports whether a StagingAuto sandbox has found overlayfs
// refused and now stages by copy, and why.
func (s *Sandbox) OverlayRefused() (bool, string) {
	why, _ := s.refusedWhy.Load().(string)
	return s.overlayRefused.Load(), why
}

// Result is the outcome of a run that started.
type Result struct {
	ExitCode        int    // the command's exit status; 128+n when killed by signal n
	Signal          string // the killing signal's name, when bwrap itself was killed
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	Duration        time.Duration
	UserTime        time.Duration // CPU time of the whole process tree, background processes the init killed at the end included (doc.go, Limits)
	SystemTime      time.Duration

	TimedOut      bool   // Command.Timeout expired: SIGTERM, then SIGKILL after the grace
	Cancelled     bool   // the context was cancelled: likewise
	LimitExceeded string // "processes" when the watchdog killed the run or the run's pids cgroup refused a fork; "memory" when the OOM killer killed a process of the run's memory cgroup

	Staging  StagingMode // the mode used for rw roots (StagingOverlay or StagingCopy)
	Delta    *Delta      // the writes to rw roots; nil if the run was killed or DeltaErr is set
	DeltaErr error       // why the delta could not be made (ErrDeltaTooLarge, ErrSymlink, …); ErrDeltaTooLarge also when the staging watchdog killed the run (its staging is then already removed)

	stage *stageDir
}

// CPUTime is UserTime + SystemTime.
func (r *Result) CPUTime() time.Duration { return r.UserTime + r.SystemTime }

// Killed reports whether the supervisor ended the run (timeout,
// cancellation or a limit).
func (r *Result) Killed() bool { return r.TimedOut || r.Cancelled || r.LimitExceeded != "" }

// Close removes the staging directory; the Source files of the delta are
// gone afterwards. Call it once the delta is staged or discarded.
func (r *Result) Close() error {
	if r == nil || r.stage == nil {
		return nil
	}
	err := r.stage.remove()
	r.stage = nil
	return err
}

// ChangeKind is what happened to a path.
type ChangeKind int

// Change kinds.
const (
	Added ChangeKind = iota + 1
	Modified
	Deleted
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Modified:
		return "modified"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("ChangeKind(%d)", int(k))
}

// MarshalText renders the kind as its name.
func (k ChangeKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// FileType is the type of a changed path.
type FileType int

// File types.
const (
	TypeFile FileType = iota + 1
	TypeDir
	TypeSymlink
)

func (t FileType) String() string {
	switch t {
	case TypeFile:
		return "file"
	case TypeDir:
		return "dir"
	case TypeSymlink:
		return "symlink"
	}
	return fmt.Sprintf("FileType(%d)", int(t))
}

// MarshalText renders the type as its name.
func (t FileType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Change is one entry of a delta.
type Change struct {
	Root   string      `json:"root"` // the Root.Path it belongs to
	Rel    string      `json:"rel"`  // slash-separated, relative to Root, never "." and never with ".."
	Kind   ChangeKind  `json:"kind"`
	Type   FileType    `json:"type"` // the new type; for Deleted, the old one
	Mode   fs.FileMode `json:"mode"` // permission bits (0o777) of the new file or directory
	Size   int64       `json:"size"` // content bytes of a file
	Source string      `json:"-"`    // host path of the new content (TypeFile, not Deleted); valid until Result.Close
	Target string      `json:"target,omitempty"`
}

// Path is the change's absolute path (Root joined with Rel).
func (c Change) Path() string { return filepath.Join(c.Root, filepath.FromSlash(c.Rel)) }

// Delta is what a run wrote to its rw roots, relative to their state when
// it started, in an order that can be applied as is: deletions (deepest
// first), then directories (shallowest first), then files and links.
type Delta struct {
	Changes []Change
	Bytes   int64 // content bytes of added and modified files
}

// Empty reports whether the run changed nothing.
func (d *Delta) Empty() bool { return d == nil || len(d.Changes) == 0 }

func (l Limits) withDefaults() Limits {
	l.Processes = cmp.Or(l.Processes, DefaultProcesses)
	l.Stdout = cmp.Or(l.Stdout, DefaultOutput)
	l.Stderr = cmp.Or(l.Stderr, DefaultOutput)
	l.DeltaFiles = cmp.Or(l.DeltaFiles, DefaultDeltaFiles)
	l.DeltaBytes = cmp.Or(l.DeltaBytes, DefaultDeltaBytes)
	l.DeltaPathBytes = cmp.Or(l.DeltaPathBytes, DefaultDeltaPathBytes)
	l.Memory = cmp.Or(l.Memory, DefaultMemory)
	l.AddressSpace = cmp.Or(l.AddressSpace, DefaultAddressSpace)
	l.Tmp = cmp.Or(l.Tmp, DefaultTmp)
	return l
}

// within reports whether p is dir or lies under it (both clean, absolute).
func within(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}
