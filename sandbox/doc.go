// Package sandbox runs one command under bubblewrap for proc.exec: it sees
// only what a capability token grants, its writes to read-write roots are
// staged instead of applied, and what it wrote comes back as a delta the
// caller commits (stages through the transaction) or discards.
//
// # Use
//
//	s := sandbox.New(sandbox.Options{})
//	defer s.Close()
//	res, err := s.Run(ctx, sandbox.Profile{
//		Roots:  []sandbox.Root{{Path: "/work/repo", Writable: true}, {Path: "/work/docs"}},
//		Net:    sandbox.NetOff,
//		Env:    map[string]string{"HOME": "/tmp", "LANG": "C.UTF-8"},
//		Limits: sandbox.Limits{CPUTime: 10 * time.Second, FileSize: 64 << 20, Processes: 128},
//	}, sandbox.Command{Argv: []string{"make", "test"}, Dir: "/work/repo", Timeout: time.Minute})
//	if err != nil { … }          // could not run at all (ErrUnavailable, bad profile, setup failure)
//	defer res.Close()            // removes the staging (and the delta's Source files)
//	if res.Killed() || res.DeltaErr != nil { /* roll back: nothing to undo */ }
//	for _, c := range res.Delta.Changes { /* stage c: WriteFile(c.Source content, c.Mode) or Delete */ }
//
// Run never touches a root. Rolling back is dropping the Result; the
// workspace is byte-identical to before the run, whatever the command did.
//
// # The profile
//
// The command runs as uid/gid 1000 ("sandbox"; 0 with Options.RootInside)
// with no capabilities — but to the host's checks by uid alone it is the
// kernel's uid, the host's root on a root kernel — under a seccomp filter
// (seccomp.go: no keyrings, leases, inotify or fanotify, no other ABI),
// without core files, in new user, mount, pid, ipc, uts and (where the
// kernel allows) cgroup namespaces, in a new session, in a file system
// that holds only:
//
//   - /usr read-only, and /bin, /sbin, /lib, /lib32, /lib64, /libx32 as the
//     host has them (the same symlinks on merged-/usr systems, else
//     read-only binds);
//   - /etc: a read-only snapshot of a fixed list of harmless entries
//     (hosts, resolv.conf, nsswitch.conf, ld.so.cache, os-release,
//     localtime, …) with passwd and group written fresh (root, sandbox,
//     nobody), plus read-only binds of /etc/alternatives, /etc/ssl/certs,
//     /etc/ld.so.conf.d, /etc/terminfo and the like. /etc/shadow,
//     /etc/ssh, /etc/ssl/private, /etc/sudoers are never there. The
//     snapshot is rebuilt when the host's entries change;
//   - a fresh /proc (the sandbox's pid namespace only), read-only (a
//     root kernel's sandbox user is the host's uid 0, which may write any
//     sysctl whose mode lets its owner: kernel/core_pattern among them),
//     a minimal /dev
//     (null, zero, full, random, urandom, tty, pts), read-only but for
//     the devices themselves (a root kernel's nodes are read-only binds
//     too: dev.go), its pts and /dev/shm, an empty tmpfs of DevShmSize
//     (64 MiB), and an
//     empty private tmpfs /tmp of Limits.Tmp (DefaultTmp, 2 GiB);
//     the sandbox's own root directory, which holds the mount points, is
//     made read-only once everything is mounted. So every file system the
//     command can write is bounded: /tmp and /dev/shm by their sizes
//     (ENOSPC), rw roots by the staging watchdog (see Limits);
//   - Profile.ReadOnly paths, read-only, outer before inner: a directory
//     gets the deny overlays a root gets (below), and is refused when it
//     is "/" or is, holds or lies in a proc or sysfs mount; any path is
//     refused when a component of it (as given, or with its links
//     resolved) names a secret, or when it is a socket, fifo or device;
//   - each root at its own path, outer roots before the roots nested in
//     them: r roots read-only, rw roots through the staging layer;
//   - deny overlays, last: inside every bound root, each directory whose
//     name is a secret (Secret: .env, .env.*, .ssh, .aws, .gnupg, *.pem,
//     id_rsa*, id_dsa*, id_ecdsa*, id_ed25519* — the policy's
//     secret_component) is covered by an empty read-only tmpfs, hiding
//     everything in it, and each regular file so named by /dev/null
//     (unopenable: nodev), in r and rw roots alike, whatever the staging.
//     This covers the host user's ~/.ssh, ~/.aws and ~/.gnupg whenever
//     their home is, or is under, a root. The roots are walked for these
//     names at every run, without following links; a symbolic link so
//     named is left as it is (a bind over it would land on its target;
//     what it points to inside a root is hidden there by its own name,
//     and nothing outside the roots is there to reach). Every socket,
//     fifo and device node in a bound root is covered by /dev/null too,
//     whatever its name: connect(2) to it is refused and open(2) fails,
//     so no host service listening on a socket file in a root (a
//     docker.sock, an agent's socket) is reachable under any posture.
//     A directory holding one is thus protected like a secret's
//     (ErrProtected).
//
// Nothing else of the host is visible: not /root, /home, /var, /run, the
// kernel's own files, or any sibling of a root. The working directory is
// Command.Dir (default the first root); it must be in a root.
//
// The environment is cleared, then set to Profile.Env exactly, with PATH
// defaulting to DefaultPath; bwrap adds PWD. With NetAllowlist, HTTP_PROXY,
// HTTPS_PROXY, ALL_PROXY (and their lower-case forms) are set to the
// relay and NO_PROXY is emptied.
//
// The network: NetOff runs in a network namespace of its own, holding
// only the loopback interface, up (a spare chain's made ahead: netns.go;
// otherwise bwrap's --unshare-net);
// with the special files of the roots covered (above), a NetOff command
// can reach no process outside the sandbox but through what the caller
// hands it (stdin, Command.Channel) and the rw roots' staged files,
// which only the caller reads (abstract unix sockets belong to the
// network namespace, so the host's are out of reach too).
// NetAllowlist does too, and binds Profile.ProxySocket (a netproxy unix
// socket) at /run/capkernel/proxy.sock; the sandbox's init starts socat
// listening on 127.0.0.1:Options.ProxyPort (3128) and relaying each
// connection to that socket, and waits until the port listens before the
// command starts (each relayed connection is a socat process, counted
// in Limits.Processes). socat was chosen for the relay because it is a Debian
// package that needs nothing from the caller's binary (a re-executed Go
// helper would have had to be bound into every sandbox). NetFull shares
// the host's network namespace (and is never run on a spare chain that
// has a network namespace of its own).
//
// # How a run is put together
//
// The kernel starts:
//
//	[unshare …]  bwrap --args 9 -- sh initScript capkernel-init ETC
//
// Every run of a kernel running as root, and every run with overlays,
// starts in a new user namespace that maps only the kernel's own uid and
// gid (to 0) and a new mount namespace, private: bwrap then never holds
// the host's capabilities, and the overlays are mounted there, so no
// mount is ever visible on the host or outlives the run. unshare(1)
// (util-linux) makes them and execs bwrap: one exec, and the kernel
// starts the chain with vfork (Go cannot vfork a child that makes a user
// namespace: it would fork, copying the kernel's page tables, which costs
// tens of milliseconds with a large heap). Any other run starts bwrap
// directly, as a bare bwrap would be. The overlays are mounted before
// bwrap has its options, without a shell: nsenter(1) joins the chain's
// user and mount namespaces, as their root, and execs mount(8), which
// mounts them all from an fstab in the run's staging directory (two
// execs, whatever the number of rw roots).
//
// bwrap reads its options (the mounts, namespaces and environment above)
// from a pipe on fd 9 (--args), and the init its arguments (the command's
// argv) from environment variables (CAPKERNEL_INIT_*, which it unsets
// before it starts anything; a profile may not name one): the chain's
// command line is fixed before the run is known, and only names ETC, the
// run's /etc snapshot (so CleanupStale finds a chain a killed kernel left
// behind). So each Sandbox keeps one chain started ahead of its next run
// — unshare's and bwrap's execs done, bwrap blocked reading its options,
// in unshare's namespaces: no sandbox and nothing of any run's yet, only
// what every run has (a root kernel's: the /etc binds, the /dev of
// dev.go, a network namespace with its loopback up; see below) — and a run without Command.Channel takes it (1–2 ms less per run on
// the loaded 2-core machine; an ordinary user's run with overlays starts
// its own, since that spare has no namespaces of its own); the next one
// is started once that run has ended (with Command.Spare, when the caller
// says: proc.exec starts it once the call is answered, since making it
// while the call's record commits slowed that commit 3-fold on the loaded
// machine), and a run that comes while it is
// still being made (a call right after the last) waits for it rather
// than start a second chain beside it. A spare killed from outside (not
// yet reaped when a run takes it) is found dead before its command could
// start — its options or its overlays refused, or it ended by a signal
// before its init said "ready", so before its "go" — and the run runs
// once more, on a chain started for it; a chain that dies after its init
// said "ready" is never run again (the command may have started): its
// Result says how it ended. A spare chain is forked from the
// spare thread (below) made ahead, when one is ready, not from a thread
// made for it: that thread's move into its cgroup (an RCU grace period,
// 6–12 ms measured) is longer than the gap between two calls, and a
// third of the runs of BenchmarkExecVsBareBwrap found no spare chain
// ready (and started unshare and bwrap on their path) while each spare
// made its own. A root kernel's spare also has the /etc directories
// below bound into the snapshot, read-only, and the sandbox's /dev made
// (dev.go), in its mount namespace (nsenter and mount, off the run's
// path): bwrap's one recursive, read-only, nosuid, nodev bind of the
// snapshot carries them, instead of a bind of each (each costs bwrap a
// mount, a remount and a read of the mount table: ~0.1 ms per directory
// measured), and one bind carries /dev, instead of --dev's tmpfs, node
// binds and devpts (~0.7 ms measured); and it has a network namespace of
// its own with the loopback up (netns.go), instead of the one
// --unshare-net makes on the path (~0.5–0.8 ms measured). The spare
// holds a process, an OS thread and, on cgroup v1, a pids cgroup of its
// own until the Sandbox is closed; making it costs CPU off the run's path
// (unshare, bwrap and, for the /etc binds, nsenter and mount: measured
// about 1 ms of CPU per run more in all, for 1–3 ms less on the path).
//
// bwrap runs with --as-pid-1; the
// sandbox's pid 1 is a small POSIX sh init that runs the command as its
// child (stdin and stderr passed through), forwards SIGTERM, SIGINT and
// SIGHUP to it, reaps orphans and exits with its status. Because bwrap
// waits for that init, and the kernel for bwrap, Result's CPU time is the
// whole tree's (bwrap's own init is killed unreaped, which would lose it);
// the init kills and reaps whatever is left once the command has exited,
// so background processes are counted too (see Limits).
// The command, as a background job of a non-interactive shell, starts
// with SIGINT and SIGQUIT ignored (POSIX). Between the kernel and the
// command there are thus bwrap (one process, plus its sandbox child) and
// the init (no other process of its own; see "dies with the kernel").
//
// The kernel waits for the chain through a pidfd its runtime's poller
// watches: a thread blocked in wait(2) would hold its scheduler slot, and
// the goroutine it had just woken would wait for the runtime to take the
// slot back (measured: 0.5–1.8 ms per run).
//
// The init waits, before it starts anything else, until the kernel has
// set the rlimits and the niceness (Options.Nice, default 10) on it
// (prlimit(2) and setpriority(2) on its host pid, which bwrap reports on
// its --info-fd as soon as it has cloned it, before the child runs
// anything): the command and everything it starts inherit both, so the
// kernel and its watchdog keep the CPU against a runaway command, while
// bwrap's own setup runs at the kernel's priority. If the kernel cannot
// set them, the init exits having run nothing and Run fails. Then, if
// Command.Gate is set, the init waits until it returns: nil starts the
// command, an error ends the run having run nothing (the kernel makes
// its intent durable meanwhile, overlapping that fsync with bwrap's
// setup).
//
// The chain is forked from an OS thread locked for the chain's lifetime:
// parent-death signals follow the forking thread.
//
// The chain dies with the kernel: Go's Pdeathsig kills bwrap, bwrap's
// --die-with-parent (armed in the sandbox's init before bwrap execs it)
// kills the init, and the death of pid 1 kills every process of the
// namespace. A kernel killed while bwrap was still setting the sandbox up
// (before that signal was armed) leaves the init's "ready" pipe without a
// reader and its "go" pipe at end-of-file: the init dies or exits having
// run nothing (and CleanupStale kills a bwrap child left blocked before
// the init). No watcher process is needed in the sandbox (the lifeline
// watcher of earlier versions cost a fork and its teardown per run).
//
// # What the protections cost
//
// Against a bare bwrap running true (BenchmarkBareBwrap), a run adds, on
// its path: bwrap options for the profile above (a nested user namespace
// for uid 1000, --disable-userns, cgroup and uts namespaces, the /etc
// snapshot, /dev read-only with a sized /dev/shm, a sized /tmp and the
// root made read-only — these three mounts measured 0.1–0.25 ms of CPU
// per run, interleaved with the old profile in one loop, and no
// difference in wall time: BenchmarkProtections measures each option,
// interleaved with the bare floor in one loop); the sh init as pid 1 (an exec of sh instead of the
// command, and a fork for the command) with its ready/go handshake with
// the kernel (rlimits, niceness, the caller's Gate); the staging of rw
// roots and the delta (with the staging watchdog's goroutine, which
// samples only runs longer than 50 ms), and the init's kill and reap of
// what is left (a kill(2) and a glob of /proc when nothing is: about
// 20 µs). Moved off the path, and so free for a run: unshare
// and bwrap's execs (the spare chain), the pids cgroup move (the spare
// forker), the /etc directories' binds (the spare chain's mount
// namespace). Measured before these moves, on the loaded 2-core machine:
// unshare's exec 0.8–1.5 ms, the four /etc directory binds 0.4–0.8 ms,
// the lifeline watcher (now gone) 0.5–1 ms, waiting for the chain with a
// thread blocked in wait(2) 0.5–1.8 ms.
//
// # Limits
//
// rlimits (per process, inherited; set on the sandbox's init before the
// command starts, see above): CPUTime as RLIMIT_CPU (soft = the limit
// rounded up to whole seconds: SIGXCPU; hard one second later: SIGKILL),
// FileSize as RLIMIT_FSIZE (SIGXFSZ), OpenFiles as RLIMIT_NOFILE,
// AddressSpace as RLIMIT_AS (DefaultAddressSpace, 16 GiB, unless set),
// Processes as RLIMIT_NPROC. Go's os/exec cannot set a
// child's rlimits and bwrap has no option for them; setting them on the
// init from outside saves a prlimit(1) process per run.
//
// Memory: where the host offers a writable memory cgroup (MemoryCgroup:
// cgroup v1's memory hierarchy, or v2 with the memory controller
// delegated), every process of the command's is in a memory cgroup of
// the run's own, limited to Limits.Memory (DefaultMemory, 4 GiB; swap
// included where accounted): the whole tree's anonymous memory, the
// pages of its /tmp and /dev/shm and the page cache it dirties. Past it
// the host reclaims what it can, then its OOM killer kills a process of
// the cgroup; the run ends with LimitExceeded "memory" (read from the
// cgroup's oom_kill count), whatever the command did next. No thread of
// the kernel's is ever in that cgroup (the OOM killer picks the largest
// process in it, which would be the kernel), so unlike the pids cgroup
// it is not the forker's: a spare chain's bwrap is moved into a memory
// cgroup of its own as soon as the chain is started, in the background
// (a move waits for an RCU grace period: 7–22 ms measured, shared with
// the next forker's move, which starts at the same time), and the run
// that takes the chain sets the limit and waits for the move if it has
// not ended (measured with runs back to back: 1.4 ms on average; 0.14 ms
// 15 ms after the last run; none 30 ms after). A run on a chain started
// for it (the first, a Channel's, concurrent runs) has its init moved
// into its cgroup while bwrap sets the sandbox up, right after the pids
// cgroup's move whose grace period it shares. A move that fails fails
// the run (closed). Without a memory cgroup on the host, only RLIMIT_AS
// bounds memory, per process.
//
// Limits.AddressSpace (DefaultAddressSpace, 16 GiB) is RLIMIT_AS, for
// every process: an allocation past it fails (ENOMEM), which the command
// sees and reports as it does (a MemoryError, an exit status); the run is
// not ended for it. The default is generous because runtimes reserve far
// more address space than they use (node 20 does not start under 8 GiB).
//
// RLIMIT_NPROC counts, thanks to the user namespaces, only the sandbox's
// processes — but the kernel does not enforce it at all for processes of
// the host's uid 0. When the kernel runs as root the sandbox's processes
// are uid 0 on the host (the user namespace maps the kernel's own uid; a
// mapping to another uid would make a root-owned workspace unwritable, and
// these machines refuse mounts in a user namespace that maps both uid and
// gid 0 to another id). So a watchdog counts the sandbox's processes every
// 10 ms (in the sandbox's own /proc, through its init) and, above
// Processes, kills the whole sandbox: Result.LimitExceeded = "processes".
// Where the host offers a writable pids cgroup (the cgroup v1 pids
// hierarchy, or cgroup v2 with pids delegated), every process of the
// command's is also in a cgroup of the run's own, removed after the run.
// Moving a process into a cgroup waits for an RCU grace period (a cold
// move took 12–23 ms on the loaded 2-core test machine, HZ 250), so no run
// waits for one: on cgroup v1 each Sandbox keeps a spare OS thread already
// moved into a fresh cgroup (made off the path, while the previous run
// goes on), and the run forks its chain from that thread, so the whole
// chain is born in the cgroup, with pids.max = Processes + 3 (the thread,
// bwrap and the init). Without a spare (the first
// run, concurrent runs, cgroup v2), the init is moved, before it starts
// anything of the command's, into a cgroup with pids.max = Processes + 1
// (the init) while bwrap sets the sandbox up (the init's
// pid comes from bwrap's info fd). Either way the host then refuses every
// fork past the limit at once, so a fork bomb cannot take the host's pids
// while the watchdog waits for the CPU on a loaded machine (seen: other
// processes' forks failing with EAGAIN).
// A fork the cgroup refused (its pids.events "max" count) is the limit
// too: the watchdog reports it, and so does Run when the command ends on
// its own first, since at the cap a sample rarely finds every slot full.
// The kill goes to the init (whose exit makes the kernel kill the
// namespace) and, from the kernel's own priority, to every process of the
// namespace until none is left. A fork bomb is thus contained within a
// few hundred milliseconds; with an ordinary-user kernel RLIMIT_NPROC
// refuses the forks first.
//
// RLIMIT_CPU bounds each process, not the tree; the tree's CPU time is
// reported (UserTime, SystemTime), and Command.Timeout bounds wall time.
// What is counted: bwrap's own, the init's, and every process of the
// sandbox the init has reaped — the command, its descendants, and the
// processes still running when the command exits, which the init kills
// and reaps before it exits (initScript). Not counted: processes still
// alive when the kernel ends the run by SIGKILL (a timeout or
// cancellation past its grace, a limit, the staging watchdog), which die
// with the namespace unreaped by the init; such a run fails anyway, and
// its CPU is bounded by its wall time (Command.Timeout) times the CPUs.
//
// The delta's caps (Limits.DeltaFiles, DeltaBytes) are checked when the
// delta is made, after the command has exited; while it runs, a staging
// watchdog bounds its writes: every 50 ms (longer when a sample's walk
// takes more than 5 ms: ten times the walk) it sums the bytes of the
// regular files in the rw roots' staging (per file the smaller of its
// size and its allocated blocks) and, once they exceed DeltaBytes above
// what the staging held at the start (the copies' bytes, nothing for an
// overlay), kills the run: DeltaErr is ErrDeltaTooLarge, Delta nil, and
// the staging is removed before Run returns. So the staging takes at most
// DeltaBytes, plus what the command writes in one interval (each file at
// most Limits.FileSize), plus the directories' own blocks, on the disk
// holding Options.StagingDir.
//
// Output: the first Limits.Stdout and Limits.Stderr bytes (1 MiB each by
// default) are kept, the rest is read and dropped, with the Truncated
// flags set.
//
// # Timeouts and cancellation
//
// When Command.Timeout expires or ctx is cancelled: SIGTERM to every
// process in the sandbox's pid namespace (the command's process group and
// anything that left it with setsid), then, after Options.KillGrace (3 s
// by default), SIGKILL as for the process limit. Result.TimedOut or
// Result.Cancelled is set, ExitCode is 128+signal, and there is no delta.
// Run returns only once every process of the sandbox is gone.
//
// # Staging
//
// Writes to an rw root never reach it. Two modes, with the same delta:
//
// Overlay (StagingOverlay; the first choice of StagingAuto): the root is
// the lower layer of an overlayfs whose upper and work directories are in
// a private staging directory under Options.StagingDir, mounted with
// userxattr (the only xattrs a user namespace may write),
// redirect_dir=nofollow (a renamed directory is copied, so every upper
// directory holds its whole content), metacopy=off (every upper file holds
// its data) and index=off. The merged directory is bound at the root's
// path. Cost: independent of the root's size.
//
// Copy (StagingCopy, and StagingAuto's fallback once the kernel refuses
// the overlay mount — Sandbox.OverlayRefused says why): the root is copied
// (directories, regular files and links, with permissions and modification
// times; special files left out) into the staging directory, and the copy
// is bound at the root's path. A manifest records each copied entry's
// inode and ctime. Cost: proportional to the root (on a slow disk, put
// StagingDir on a tmpfs).
//
// Nested roots and deny paths are neither staged nor diffed in their
// outer root (they are mount points there; a nested rw root has its own
// layer and its own part of the delta). Roots are not expected to change
// while a run is staged; the delta is computed against them as they are
// after the run.
//
// # The delta
//
// After a run that was not killed, the delta compares the final state of
// each rw root, as the command left it, with the root, entry by entry,
// never following a symbolic link (parents are only ever traversed as
// real directories, so no comparison reads outside a root):
//
//   - Added: a path absent from the root (TypeFile, TypeDir or
//     TypeSymlink). A type change is a Deleted of the old entry (with
//     everything under it, if a directory) and an Added.
//   - Modified: a regular file whose content or permission bits differ
//     (content compared byte for byte: a copy-up, a touch or a rewrite with
//     the same bytes is no change); a directory whose permissions differ;
//     a link with a new target; a link or special file replaced by a
//     regular file.
//   - Deleted: a path of the root gone from the final state, and
//     everything under it: overlay whiteouts (character devices 0:0, or
//     user.overlay.whiteout files), entries hidden by an opaque directory
//     (user.overlay.opaque=y: a directory removed and made again, whose
//     old content not remade is gone), and in copy mode, manifest entries
//     gone from the copy.
//
// Modes are permission bits only (0o777): setuid, setgid and sticky bits
// are dropped; owners and times are not part of the delta. A file's new
// content is at Change.Source (in the staging directory, until
// Result.Close). Changes come in application order: deletions in reverse
// path order (children first), then directories in path order (parents
// first), then files and links. Delta.Bytes is the content size of added
// and modified files, what disk_write_bytes is charged.
//
// The delta fails (Result.DeltaErr; Delta nil; roll back) when:
//   - it would exceed Limits.DeltaFiles entries or Limits.DeltaBytes bytes
//     (ErrDeltaTooLarge);
//   - the command made or changed a symbolic link and Options.Symlinks is
//     SymlinksRefuse, the default (ErrSymlink): the kernel stages files,
//     not links. With SymlinksRecord a link is a Change with its Target,
//     read with readlink and never followed: applying it is the caller's
//     decision (a link pointing out of the root is only a name);
//   - it holds a fifo, socket or device (ErrSpecialFile);
//   - the upper layer holds a redirect or metacopy entry (ErrOverlay; not
//     expected with the mount options above).
//
// Writes through a link that leads out of a root land nowhere on the
// host: outside the roots the sandbox has only its own tmpfs /tmp and
// read-only system directories, and the delta only ever names paths
// inside a root.
//
// # Failing closed
//
// Without bwrap, Run and Available return ErrUnavailable ("sandbox
// unavailable: install bubblewrap"); without sh, unshare (a root
// kernel, overlays), nsenter and mount (overlays) or
// socat (allowlist) a similar "sandbox unavailable" error. A bwrap
// failure before the command starts (the init never reported "started")
// is an error from Run, not a Result. A command that is not found exits
// 127.
//
// # Staging directories
//
// Each run's staging directory (capsandbox-run-*) and each Sandbox's /etc
// snapshot (capsandbox-etc-*) under StagingDir hold a lock while in use.
// Result.Close and Sandbox.Close remove them; CleanupStale removes those
// a killed kernel left (call it at start-up). No mount needs undoing.
package sandbox
