package sandbox

import "golang.org/x/sys/unix"

const (
	auditArch    = unix.AUDIT_ARCH_AARCH64
	abiBit       = 0
	sysFcntl     = unix.SYS_FCNTL
	sysSetrlimit = unix.SYS_SETRLIMIT
	sysPrlimit64 = unix.SYS_PRLIMIT64
)

var deniedCalls = []deniedCall{
	{unix.SYS_ADD_KEY, unix.EPERM}, {unix.SYS_REQUEST_KEY, unix.EPERM}, {unix.SYS_KEYCTL, unix.EPERM},
	{unix.SYS_FANOTIFY_INIT, unix.EPERM},
	{unix.SYS_PTRACE, unix.EPERM}, {unix.SYS_PROCESS_VM_READV, unix.EPERM}, {unix.SYS_PROCESS_VM_WRITEV, unix.EPERM},
	{unix.SYS_IO_SETUP, unix.ENOSYS}, {unix.SYS_IO_URING_SETUP, unix.ENOSYS},
	{unix.SYS_INOTIFY_INIT1, unix.ENOSYS},
}
