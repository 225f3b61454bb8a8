//go:build !amd64 && !arm64

package sandbox

const (
	auditArch    = 0 // no filter: Run refuses (errNoSeccomp)
	abiBit       = 0
	sysFcntl     = 0
	sysSetrlimit = 0
	sysPrlimit64 = 0
)

var deniedCalls []deniedCall
