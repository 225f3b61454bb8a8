package kernel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// benchSettle is BenchmarkExecVsBareBwrap's pause after each side.
const benchSettle = 15 * time.Millisecond

// BenchmarkExecVsBareBwrap runs `true` end to end through Invoke (token
// check, policy, prepare, sandbox, commit, audit record and receipt with
// fsync) and, interleaved in the same loop, bare `bwrap … true` with
// comparable namespaces and binds (no staging, limits or init), and
// reports both and their ratio. The rw cases add the staging of a rw root:
// empty (staged by copy: a small root), and of 1,000 files (overlay), so
// their difference is the staging setup cost at that size.
//
// What proc.exec adds to bare bwrap, on the call's path (sandbox/doc.go
// has the why of each; sandbox's BenchmarkProtections measures the bwrap
// options one by one): the kernel's checks and policy (~0.1 ms CPU); the
// sandbox's protections in bwrap (a nested user namespace for uid 1000,
// --disable-userns, cgroup and uts namespaces, the /etc snapshot);
// the sh init as pid 1 and its ready/go handshake, in which the kernel
// applies the rlimits and niceness and waits for the intent's fsync
// (which overlaps bwrap's setup: a durable intent before the command runs,
// the crash contract); after the command, the durable commit of the
// record (one fsync: the only durable commit the call waits for after the
// command; a call that wrote files finishes its intent in a third
// transaction, off its path). unshare's user namespace and bwrap's exec
// are off the path: the Sandbox keeps a chain started ahead (sandbox
// spare chain), which the loop's first call starts.
//
// Each side is timed alone: the loop pauses benchSettle after each, so the
// work either leaves in the background once answered (the Sandbox making
// its next spare chain, the kernel tearing a sandbox's namespaces down)
// is not counted against the other, and proc.exec finds its spare chain
// made, as a call after an agent's think time does.
//
//	GOEXPERIMENT=jsonv2 go test -run='^$' -bench=ExecVsBareBwrap -benchtime=50x ./kernel/
func BenchmarkExecVsBareBwrap(b *testing.B) {
	cases := []struct {
		name  string
		mode  string
		files int
	}{
		{"r-root", "r", 0},
		{"rw-empty", "rw", 0},
		{"rw-1000-files", "rw", 1000},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := newExecHarness(b, func(c *Config) { c.NoSync = os.Getenv("CAPK_BENCH_NOSYNC") != "" })
			for i := range c.files {
				p := filepath.Join(h.ws, fmt.Sprintf("d%02d", i/50), fmt.Sprintf("f%04d.txt", i))
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, []byte(fmt.Sprintf("file %d\n", i)), 0o644)
			}
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"proc.exec"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: c.mode}}})
			bare := []string{"--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
				"--unshare-net", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
				"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", h.ws, h.ws, "--chdir", h.ws,
				"--clearenv", "--", "/usr/bin/true"}
			var tBare, tInvoke time.Duration
			i := 0
			for b.Loop() {
				t0 := time.Now()
				if out, err := exec.Command("bwrap", bare...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				t1 := time.Now()
				time.Sleep(benchSettle)
				t2 := time.Now()
				r := h.invoke("proc.exec", execArgs("true"), key(fmt.Sprint("bench-", i)))
				tInvoke += time.Since(t2)
				tBare += t1.Sub(t0)
				time.Sleep(benchSettle)
				i++
				if r.Status != StatusOK {
					b.Fatalf("%+v", r.Error)
				}
			}
			n := float64(i)
			b.ReportMetric(float64(tBare.Microseconds())/n/1000, "bare-ms/op")
			b.ReportMetric(float64(tInvoke.Microseconds())/n/1000, "invoke-ms/op")
			b.ReportMetric(float64(tInvoke)/float64(tBare), "ratio")
		})
	}
}
