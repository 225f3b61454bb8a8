package kernel

import (
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// proc.exec's sandbox against the review of the sandbox (findings 1, 3,
// 4, 5 and 6): what the policy calls a secret, a command cannot read;
// host sockets in a root are out of reach; the staging and the RAM file
// systems are bounded while the command runs; background processes are
// charged.

// A command reads no file the policy refuses to fs.read as a secret,
// whatever the staging (copy for a small root, overlay for a larger one).
func TestExecHidesPolicySecrets(t *testing.T) {
	for _, pad := range []int{0, 40} {
		t.Run(fmt.Sprintf("pad=%d", pad), func(t *testing.T) {
			h := newExecHarness(t)
			h.write("certs/server.pem", "PRIVATE-KEY-PEM\n")
			h.write("deploy/id_rsa", "PRIVATE-KEY-RSA\n")
			h.write("keys.pem/inner", "PRIVATE-KEY-DIR\n")
			h.write("certs/readme", "visible\n")
			for i := range pad { // more than 32 entries: staged by overlay
				h.write(fmt.Sprintf("pad/f%d", i), "x")
			}
			for _, p := range []string{"certs/server.pem", "deploy/id_rsa", "keys.pem/inner"} {
				if r := h.invoke("fs.read", map[string]any{"path": p}); errClass(r) != "policy_denied" {
					t.Fatalf("fs.read %s: %s %q, want policy_denied", p, r.Status, errClass(r))
				}
			}
			e := decodeExec(t, h.invoke("proc.exec", execArgs("sh", "-c",
				"cat certs/server.pem deploy/id_rsa keys.pem/inner 2>/dev/null; grep -r PRIVATE-KEY . 2>/dev/null; cat certs/readme"), key("x")))
			if strings.Contains(e.Stdout, "PRIVATE-KEY") || !strings.Contains(e.Stdout, "visible") {
				t.Fatalf("stdout %q", e.Stdout)
			}
		})
	}
}

// With network off, a host service listening on a unix socket inside a
// token root (r or rw) is out of reach.
func TestExecHostSocketUnreachable(t *testing.T) {
	h := newExecHarness(t)
	ro := filepath.Join(filepath.Dir(h.ws), "ro")
	must(t, os.MkdirAll(ro, 0o755))
	for i := range 40 {
		h.write(fmt.Sprintf("pad/f%d", i), "x")
	}
	serve := func(path string) {
		l, err := net.Listen("unix", path)
		must(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "HOST-SERVICE-REACHED")
		})}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	serve(filepath.Join(ro, "docker.sock"))
	serve(filepath.Join(h.ws, "api.sock"))
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}, {Path: ro, Mode: "r"}}})
	for i, sock := range []string{filepath.Join(ro, "docker.sock"), filepath.Join(h.ws, "api.sock")} {
		e := decodeExec(t, h.invoke("proc.exec", execArgs("curl", "-sS", "--max-time", "5", "--unix-socket", sock, "http://localhost/"), key(fmt.Sprint("s", i))))
		if strings.Contains(e.Stdout, "REACHED") || e.ExitCode == 0 {
			t.Fatalf("%s: exit %d, stdout %q", sock, e.ExitCode, e.Stdout)
		}
	}
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// A command's staged writes stay near the delta's cap (here what is left
// of disk_write_bytes) while it runs: the call is ended budget_exceeded
// before it has written much more, and nothing stays staged.
func TestExecStagingBounded(t *testing.T) {
	h := newExecHarness(t)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		Budgets: map[string]int64{"disk_write_bytes": 8 << 20}})
	done := make(chan *Result)
	go func() {
		done <- h.invoke("proc.exec", with(execArgs("sh", "-c",
			"i=0; while [ $i -lt 20 ]; do i=$((i+1)); head -c 10000000 /dev/zero > big$i || exit 9; sleep 0.05; done"), "timeout_s", 120), key("fill"))
	}()
	var peak int64
	var r *Result
	for r == nil {
		select {
		case r = <-done:
		case <-time.After(20 * time.Millisecond):
			peak = max(peak, dirBytes(h.k.cfg.SandboxDir))
		}
	}
	if errClass(r) != "budget_exceeded" {
		t.Fatalf("status %s class %q: %s", r.Status, errClass(r), r.Error.Message)
	}
	if peak > 60<<20 {
		t.Fatalf("the staging held %d MiB with 8 MiB of disk_write_bytes left", peak>>20)
	}
	assertNoStaging(t, h.ws)
}

// /tmp is a bounded tmpfs (sandbox.DefaultTmp, 2 GiB): a command cannot
// hold 2.5 GB of RAM there, in files of 250 MB (under proc.exec's 256 MiB
// RLIMIT_FSIZE, so that only the tmpfs can stop them). The first 1 GB
// goes in: /tmp holds a build's caches.
func TestExecTmpBounded(t *testing.T) {
	h := newExecHarness(t)
	e := decodeExec(t, h.invoke("proc.exec", execArgs("sh", "-c",
		"for i in $(seq 10); do head -c 250000000 /dev/zero > /tmp/big$i || { echo stopped at $i; exit 0; }; done; echo unbounded"), key("tmp")))
	var at int
	if _, err := fmt.Sscanf(e.Stdout, "stopped at %d", &at); err != nil || at < 5 {
		t.Fatalf("/tmp: %q", e.Stdout)
	}
}

// CPU burnt by a background process the command leaves running is charged
// to cpu_ms: a background loop's 0.5 s reaches the budget.
func TestExecChargesBackgroundCPU(t *testing.T) {
	h := newExecHarness(t)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		Budgets: map[string]int64{"cpu_ms": 100000}})
	e := decodeExec(t, h.invoke("proc.exec", execArgs("sh", "-c",
		"sh -c 'while :; do :; done' & p=$!; while [ \"$(cut -d' ' -f14 /proc/$p/stat)\" -lt 50 ]; do sleep 0.05; done; exit 0"), key("cpu")))
	if e.CPUMS < 500 {
		t.Fatalf("cpu_ms %d for a background loop of 0.5 s", e.CPUMS)
	}
}
