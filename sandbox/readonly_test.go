package sandbox_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/sandbox"
)

// A Profile.ReadOnly directory hides what a root hides: secret names,
// sockets and fifos (rev-runner #1: kernelctl run --ro over a parent of
// the data dir showed the agent keys/issuer.pem and let it connect to
// control.sock). A root nested in it is still bound over it.
func TestReadOnlyHides(t *testing.T) {
	requireSandbox(t)
	needCommand(t, "socat")
	const secret = "TOPSECRET-ro-51c2"
	base := t.TempDir()
	ro, ws := filepath.Join(base, "ro"), filepath.Join(base, "ro", "ws")
	mkTree(t, ro, map[string]string{
		"ok.txt":           "visible",
		"keys/issuer.pem":  secret,
		".ssh/id_ed25519":  secret,
		"proj/.env":        secret,
		"proj/readme.md":   "visible too",
		"ws/in-root.txt":   "rooted",
		"ws/.aws/config":   secret,
		"deep/a/b/id_rsa":  secret,
		"deep/a/b/plain.c": "",
	})
	ln, err := net.Listen("unix", filepath.Join(ro, "deep", "control.sock"))
	must(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HOST-SERVICE-REACHED\n"))
			c.Close()
		}
	}()
	must(t, unix.Mkfifo(filepath.Join(ro, "pipe"), 0o666))
	go func() { // a host reader of the fifo
		if f, err := os.OpenFile(filepath.Join(ro, "pipe"), os.O_RDONLY, 0); err == nil {
			f.Close()
		}
	}()
	defer func() { // unblock the reader
		if f, err := os.OpenFile(filepath.Join(ro, "pipe"), os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}()
	s := newSandbox(t, sandbox.Options{})
	p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}, ReadOnly: []string{ro}}
	res := run(t, s, p, `cd `+ro+`
cat keys/issuer.pem .ssh/id_ed25519 proj/.env ws/.aws/config deep/a/b/id_rsa 2>/dev/null
ls -A keys .ssh ws/.aws
grep -r TOPSECRET . 2>/dev/null
socat -u UNIX-CONNECT:deep/control.sock - 2>&1
[ -p pipe ] && (echo x > pipe) 2>/dev/null && echo fifo-opened
echo x > ok.txt 2>/dev/null && echo wrote
cat ok.txt proj/readme.md ws/in-root.txt; echo
echo new > ws/new.txt && echo root-writable`)
	out := string(res.Stdout) + string(res.Stderr)
	for _, bad := range []string{secret, "HOST-SERVICE-REACHED", "fifo-opened", "wrote\n"} {
		if strings.Contains(out, bad) {
			t.Fatalf("%q in the output of a read-only bind: %s", bad, out)
		}
	}
	if !strings.Contains(out, "visiblevisible toorooted\n") || !strings.Contains(out, "root-writable") {
		t.Fatalf("the read-only path's ordinary files or the nested root are gone: %s", out)
	}
}

// Read-only paths that cannot be bound safely are refused.
func TestReadOnlyRefused(t *testing.T) {
	requireSandbox(t)
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	mkTree(t, base, map[string]string{"ws/": "", "certs/ca.pem": "x", ".ssh/known_hosts": "x", "ok.txt": "x"})
	must(t, os.Symlink(filepath.Join(base, ".ssh"), filepath.Join(base, "innocent")))
	must(t, os.Symlink("/", filepath.Join(base, "slash")))
	sock := filepath.Join(base, "svc.sock")
	ln, err := net.Listen("unix", sock)
	must(t, err)
	defer ln.Close()
	must(t, unix.Mkfifo(filepath.Join(base, "pipe"), 0o666))
	tests := []struct{ name, path, want string }{
		{"slash", "/", `"/" cannot be bound`},
		{"link to slash", filepath.Join(base, "slash"), `cannot be bound`},
		{"relative", "ok.txt", "not absolute"},
		{"secret file", filepath.Join(base, "certs", "ca.pem"), `"ca.pem" names a secret`},
		{"in a secret dir", filepath.Join(base, ".ssh", "known_hosts"), `".ssh" names a secret`},
		{"link to a secret dir", filepath.Join(base, "innocent"), `".ssh" names a secret`},
		{"socket", sock, "is a socket"},
		{"fifo", filepath.Join(base, "pipe"), "is a fifo"},
		{"device", "/dev/null", "is a device"},
		{"proc", "/proc", "a proc or sysfs mount"},
		{"a process", "/proc/self", "a proc or sysfs mount"},
		{"sys", "/sys", "a proc or sysfs mount"},
		{"missing", filepath.Join(base, "nope"), "no such file"},
	}
	s := newSandbox(t, sandbox.Options{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, ReadOnly: []string{tc.path}}
			res, err := s.Run(context.Background(), p, sandbox.Command{Argv: []string{"true"}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				res.Close()
				t.Fatalf("Run = %v, %v; want an error containing %q", res, err, tc.want)
			}
		})
	}
}
