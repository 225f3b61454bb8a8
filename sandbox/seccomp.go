package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// The sandbox's seccomp filter (bwrap --seccomp), loaded into the init
// and so into every process of the command's. A root kernel's sandbox
// user is the host's uid 0 to every check made by uid alone, and an
// ordinary user's is the kernel's own uid; so, without capabilities, it
// could still
//   - add keys to, and read, that uid's keyrings (add_key, request_key,
//     keyctl: root's user keyring outlives the run and is shared by every
//     run, a channel between agents);
//   - take a lease on any file that uid owns in a read-only bind
//     (fcntl F_SETLEASE: the token's r roots, /usr), stalling or failing
//     the host's and other agents' opens of it for 45 s at a time;
//   - use up that uid's inotify and fanotify instances, counted with the
//     host's processes of that uid (128 by default);
//   - change its RLIMIT_CORE (coreLimit, set by release), with which a
//     crash would start a piped core_pattern helper as the host's root;
//   - trace, or read and write the memory of, the sandbox's init (ptrace,
//     process_vm_readv, process_vm_writev: same uid, same namespaces),
//     making it exit before it has reaped, and so charged, the command's
//     processes (their CPU went uncounted); strace and gdb do not run in
//     the sandbox;
//   - take the host-wide AIO contexts (io_setup: fs.aio-max-nr, which
//     every process of the host, root's too, then lacks) and io_uring
//     rings (io_uring_setup, memory outside the run's).
// These fail: EPERM, and ENOSYS for inotify_init and inotify_init1 (a
// tool that watches files takes it for a platform without inotify: tail
// -f polls, Node's fs.watch throws ENOSYS), io_setup and io_uring_setup
// (libaio and liburing users fall back to threads). So does every system call of
// another ABI than the kernel's (32-bit x86, x32), whose numbers the
// filter does not know: 32-bit programs do not run in the sandbox.

// seccompData offsets (struct seccomp_data, little-endian: the arches
// below are): args[i]'s low 32 bits at seccompArg(i), its high at +4.
const (
	seccompNr   = 0
	seccompArch = 4
)

func seccompArg(i uint32) uint32 { return 16 + 8*i }

// coreLimit is the sandbox's RLIMIT_CORE, soft and hard (release): see
// there. The filter refuses changing it.
const coreLimit = 1

// A denied system call and the errno it fails with.
type deniedCall struct {
	nr    uint32
	errno unix.Errno
}

// errNoSeccomp: no filter is known for this architecture.
var errNoSeccomp = errors.New("sandbox: no seccomp filter for this architecture")

// seccompFilter is seccompProgram's, assembled once.
var seccompFilter = sync.OnceValues(seccompProgram)

// seccompProgram returns the filter as bwrap reads it: struct sock_filter
// instructions, native-endian.
func seccompProgram() ([]byte, error) {
	if auditArch == 0 {
		return nil, errNoSeccomp
	}
	var a bpfAsm
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArch, "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, auditArch, "", "eperm")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompNr, "", "")
	if abiBit != 0 {
		a.ins(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, abiBit, "eperm", "")
	}
	for _, d := range deniedCalls {
		to := "eperm"
		if d.errno == unix.ENOSYS {
			to = "enosys"
		}
		a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, d.nr, to, "")
	}
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sysFcntl, "fcntl", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sysSetrlimit, "setrlimit", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sysPrlimit64, "prlimit64", "")
	a.ins(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW, "", "")
	// fcntl(fd, cmd, …): cmd F_SETLEASE.
	a.label("fcntl")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArg(1), "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.F_SETLEASE, "eperm", "allow")
	// setrlimit(resource, …): RLIMIT_CORE.
	a.label("setrlimit")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArg(0), "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.RLIMIT_CORE, "eperm", "allow")
	// prlimit64(pid, resource, new, old): RLIMIT_CORE with a new limit.
	a.label("prlimit64")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArg(1), "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.RLIMIT_CORE, "", "allow")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArg(2), "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, "", "eperm")
	a.ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompArg(2)+4, "", "")
	a.ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, "allow", "eperm")
	a.label("allow")
	a.ins(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW, "", "")
	a.label("eperm")
	a.ins(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM), "", "")
	a.label("enosys")
	a.ins(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS), "", "")
	return a.assemble()
}

// bpfAsm assembles a classic BPF program whose jumps name labels.
type bpfAsm struct {
	code   []bpfIns
	labels map[string]int
}

type bpfIns struct {
	op     uint16
	k      uint32
	jt, jf string // "": the next instruction
}

func (a *bpfAsm) ins(op uint16, k uint32, jt, jf string) {
	a.code = append(a.code, bpfIns{op, k, jt, jf})
}

func (a *bpfAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.code)
}

// assemble resolves the labels: a jump is forward, at most 255
// instructions.
func (a *bpfAsm) assemble() ([]byte, error) {
	out := make([]byte, 0, 8*len(a.code))
	for i, in := range a.code {
		var off [2]uint8
		for j, l := range []string{in.jt, in.jf} {
			if l == "" {
				continue
			}
			to, ok := a.labels[l]
			if !ok || to <= i || to-i-1 > 255 {
				return nil, fmt.Errorf("sandbox: seccomp program: jump to %q from %d", l, i)
			}
			off[j] = uint8(to - i - 1)
		}
		out = binary.NativeEndian.AppendUint16(out, in.op)
		out = append(out, off[0], off[1])
		out = binary.NativeEndian.AppendUint32(out, in.k)
	}
	return out, nil
}
