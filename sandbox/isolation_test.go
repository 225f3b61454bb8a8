package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/sandbox"
)

func TestUnavailable(t *testing.T) {
	s := newSandbox(t, sandbox.Options{Bwrap: "/nonexistent/bwrap"})
	if err := s.Available(); !errors.Is(err, sandbox.ErrUnavailable) || err.Error() != "sandbox unavailable: install bubblewrap" {
		t.Fatalf("Available = %v", err)
	}
	ws := t.TempDir()
	res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}, sandbox.Command{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrUnavailable) || res != nil {
		t.Fatalf("Run = %v, %v; want ErrUnavailable", res, err)
	}
}

func TestBadProfile(t *testing.T) {
	requireSandbox(t)
	ws := t.TempDir()
	mkTree(t, ws, map[string]string{"f": "x", "d/": ""})
	must(t, os.Symlink("/etc", filepath.Join(ws, "out")))
	tests := []struct {
		name string
		p    sandbox.Profile
		c    sandbox.Command
		want string
	}{
		{"no argv", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, sandbox.Command{}, "empty argv"},
		{"no roots", sandbox.Profile{}, sandbox.Command{Argv: []string{"true"}}, "no roots"},
		{"relative root", sandbox.Profile{Roots: []sandbox.Root{{Path: "ws"}}}, sandbox.Command{Argv: []string{"true"}}, "not absolute"},
		{"slash root", sandbox.Profile{Roots: []sandbox.Root{{Path: "/"}}}, sandbox.Command{Argv: []string{"true"}}, `"/" cannot be bound`},
		{"file root", sandbox.Profile{Roots: []sandbox.Root{{Path: filepath.Join(ws, "f")}}}, sandbox.Command{Argv: []string{"true"}}, "not a directory"},
		{"missing root", sandbox.Profile{Roots: []sandbox.Root{{Path: filepath.Join(ws, "nope")}}}, sandbox.Command{Argv: []string{"true"}}, "no such file"},
		{"twice", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}, {Path: ws + "/"}}}, sandbox.Command{Argv: []string{"true"}}, "named twice"},
		{"dir outside", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, sandbox.Command{Argv: []string{"true"}, Dir: "/etc"}, "not in a root"},
		{"dir missing", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, sandbox.Command{Argv: []string{"true"}, Dir: ws + "/nope"}, "working directory"},
		{"dir escapes by link", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, sandbox.Command{Argv: []string{"true"}, Dir: ws + "/out"}, "working directory"},
		{"bad env", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Env: map[string]string{"A=B": "c"}}, sandbox.Command{Argv: []string{"true"}}, "environment"},
		{"reserved env", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Env: map[string]string{"CAPKERNEL_INIT_ARGV": "c"}}, sandbox.Command{Argv: []string{"true"}}, "reserved"},
		{"allowlist without socket", sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Net: sandbox.NetAllowlist}, sandbox.Command{Argv: []string{"true"}}, "proxy socket"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := sandbox.Run(context.Background(), tc.p, tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, %v; want an error containing %q", res, err, tc.want)
			}
		})
	}
}

// The command sees its roots, the system directories read-only, and
// nothing else of the host.
func TestVisibility(t *testing.T) {
	requireSandbox(t)
	base := t.TempDir()
	ws, ro, hidden := filepath.Join(base, "ws"), filepath.Join(base, "ro"), filepath.Join(base, "hidden")
	mkTree(t, ws, map[string]string{"w.txt": "in ws\n"})
	mkTree(t, ro, map[string]string{"r.txt": "in ro\n"})
	mkTree(t, hidden, map[string]string{"h.txt": "HIDDEN-CONTENT\n"})
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Dir(filepath.Dir(file)) // the module's directory
	home, _ := os.UserHomeDir()
	p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}, {Path: ro}}}
	s := newSandbox(t, sandbox.Options{})
	tests := []struct {
		name   string
		script string
		want   string // stdout
	}{
		{"rw root readable", "cat " + ws + "/w.txt", "in ws\n"},
		{"r root readable", "cat " + ro + "/r.txt", "in ro\n"},
		{"r root not writable", fmt.Sprintf("echo x > %s/new 2>/dev/null && echo wrote || echo refused; rm %s/r.txt 2>/dev/null && echo removed || echo refused", ro, ro), "refused\nrefused\n"},
		{"rw root writable", fmt.Sprintf("echo x > %s/new && echo wrote", ws), "wrote\n"},
		{"sibling invisible", fmt.Sprintf("test -e %s && echo visible || echo invisible; ls %s", hidden, base), "invisible\nro\nws\n"},
		{"repo invisible", fmt.Sprintf("test -e %s && echo visible || echo invisible", repo), "invisible\n"},
		{"home invisible", fmt.Sprintf("test -e %s/. && echo visible || echo invisible", home), "invisible\n"},
		{"/root /home invisible", "ls -A /root /home 2>/dev/null | wc -l", "0\n"},
		{"shadow absent", "cat /etc/shadow 2>/dev/null && echo read || echo refused", "refused\n"},
		{"etc minimal", "test -e /etc/ssh -o -e /etc/sudoers -o -e /etc/machine-id -o -e /etc/ssl/private -o -e /etc/gshadow && echo more || echo minimal", "minimal\n"},
		{"etc passwd is the sandbox's", "whoami; cut -d: -f1 /etc/passwd | tr '\\n' ' '", "sandbox\nroot sandbox nobody "},
		{"etc has what tools need", "test -s /etc/ssl/certs/ca-certificates.crt && test -e /etc/resolv.conf && test -e /etc/ld.so.cache && echo ok", "ok\n"},
		{"etc read-only", "echo x > /etc/hosts 2>/dev/null || touch /etc/new 2>/dev/null || echo refused", "refused\n"},
		{"usr read-only", "touch /usr/x 2>/dev/null && echo wrote || echo refused", "refused\n"},
		{"tmp private and writable", "echo x > /tmp/x && cat /tmp/x && ls /tmp | grep -v '^" + strings.Split(strings.TrimPrefix(base, "/tmp/"), "/")[0] + "$' | wc -l", "x\n1\n"},
		{"no capabilities", "grep CapEff /proc/self/status", "CapEff:\t0000000000000000\n"},
		{"no user namespaces", "unshare -U true 2>/dev/null && echo created || echo refused", "refused\n"},
		{"uid 1000", "id -u; id -g", "1000\n1000\n"},
		{"working directory", "pwd", ws + "\n"},
		{"hostname", "hostname", "sandbox\n"},
		{"niced", "cut -d' ' -f19 /proc/self/stat", "10\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, s, p, tc.script)
			if got := string(res.Stdout); got != tc.want {
				t.Fatalf("stdout %q, want %q (stderr %q)", got, tc.want, res.Stderr)
			}
		})
	}
	// Host files are untouched whatever the runs wrote.
	if _, err := os.Stat(filepath.Join(ws, "new")); err == nil {
		t.Fatal("a write reached the workspace")
	}
}

// .env files and ~/.ssh, ~/.aws, ~/.gnupg inside bound roots are hidden,
// in r and rw roots, in both staging modes.
func TestDenyOverlays(t *testing.T) {
	requireSandbox(t)
	const secret = "TOPSECRET-7f3a"
	for _, mode := range []sandbox.StagingMode{sandbox.StagingOverlay, sandbox.StagingCopy} {
		for _, writable := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/rw=%v", mode, writable), func(t *testing.T) {
				home := t.TempDir() // a fake host home bound as a root
				mkTree(t, home, map[string]string{
					".ssh/id_rsa":          secret,
					".ssh/config":          secret,
					".aws/credentials":     secret,
					".gnupg/secring.gpg":   secret,
					".env":                 secret,
					"proj/.env":            secret,
					"proj/.env.local":      secret,
					"proj/deep/.ssh/key":   secret,
					"proj/ok.txt":          "visible",
					"proj/.environment.md": "visible too",
					// The policy's other secret names (secret_component),
					// as files and as directories.
					"certs/server.pem":       secret,
					"deploy/id_rsa":          secret,
					"deploy/id_ed25519.pub":  secret,
					"id_dsa_old":             secret,
					"id_ecdsa":               secret,
					"bundle.pem/inner.txt":   secret,
					"proj/.env.d/x":          secret,
					"sub/.env/inside":        secret,
					"proj/id_rsa_keys/k.txt": secret,
					"certs/readme.txt":       "visible",
				})
				before := treeHash(t, home)
				s := newSandbox(t, sandbox.Options{Staging: mode})
				p := sandbox.Profile{Roots: []sandbox.Root{{Path: home, Writable: writable}}}
				res := run(t, s, p, `
for f in .ssh/id_rsa .ssh/config .aws/credentials .gnupg/secring.gpg .env proj/.env proj/.env.local proj/deep/.ssh/key \
	certs/server.pem deploy/id_rsa deploy/id_ed25519.pub id_dsa_old id_ecdsa bundle.pem/inner.txt proj/.env.d/x proj/id_rsa_keys/k.txt sub/.env/inside; do
	cat "$f" 2>/dev/null
done
ls -A .ssh .aws .gnupg proj/deep/.ssh bundle.pem proj/.env.d proj/id_rsa_keys
cat proj/ok.txt proj/.environment.md
grep -r TOPSECRET . 2>/dev/null
echo pwned > .ssh/authorized_keys 2>/dev/null && echo wrote-ssh
echo pwned > .env 2>/dev/null && echo wrote-env
echo pwned > proj/.env.local 2>/dev/null && echo wrote-env-local
echo pwned > certs/server.pem 2>/dev/null && echo wrote-pem
echo pwned > bundle.pem/new 2>/dev/null && echo wrote-pem-dir
rm -rf .ssh 2>/dev/null
true`)
				out := string(res.Stdout) + string(res.Stderr)
				if strings.Contains(out, secret) {
					t.Fatalf("secret leaked: %s", out)
				}
				if !strings.Contains(out, "visiblevisible too") {
					t.Fatalf("ordinary files hidden too: %s", out)
				}
				for _, w := range []string{"wrote-ssh", "wrote-env", "wrote-env-local", "wrote-pem", "wrote-pem-dir"} {
					if strings.Contains(out, w) {
						t.Errorf("%s: a write into a hidden path succeeded", w)
					}
				}
				sameTree(t, "home", before, treeHash(t, home))
				if writable {
					if res.DeltaErr != nil {
						t.Fatal(res.DeltaErr)
					}
					for _, c := range res.Delta.Changes {
						t.Errorf("delta touches %s %s", c.Kind, c.Rel)
					}
				}
			})
		}
	}
}

func TestEnvironment(t *testing.T) {
	requireSandbox(t)
	t.Setenv("CAPKERNEL_TEST_LEAK", "leaked-from-host")
	ws := t.TempDir()
	s := newSandbox(t, sandbox.Options{})
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		// bwrap sets PWD to the working directory.
		{"default", nil, "PATH=" + sandbox.DefaultPath + "\nPWD=" + ws + "\n"},
		{"explicit", map[string]string{"FOO": "bar baz", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "FOO=bar baz\nLANG=C.UTF-8\nPATH=/usr/bin:/bin\nPWD=" + ws + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Env: tc.env},
				sandbox.Command{Argv: []string{"sh", "-c", "env | LC_ALL=C sort"}})
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tc.want {
				t.Fatalf("env inside:\n%s\nwant:\n%s", res.Stdout, tc.want)
			}
		})
	}
}

func TestPidNamespace(t *testing.T) {
	requireSandbox(t)
	ws := t.TempDir()
	hostInit, _ := os.ReadFile("/proc/1/cmdline")
	res := run(t, newSandbox(t, sandbox.Options{}), sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}},
		`tr '\0\n' '  ' < /proc/1/cmdline | grep -o capkernel-init | head -1; echo $$ $PPID; ls /proc | grep '^[0-9]' | wc -l`)
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if len(lines) != 3 {
		t.Fatalf("output %q", res.Stdout)
	}
	// pid 1 is the sandbox's init shell, not the host's init.
	if lines[0] != "capkernel-init" || strings.Contains(string(hostInit), "capkernel-init") {
		t.Fatalf("pid 1 inside is %q (host init %q)", lines[0], hostInit)
	}
	// The command's parent is the init, and the first process it started.
	if lines[1] != "2 1" {
		t.Fatalf("the command's pid and parent are %s, want 2 1", lines[1])
	}
	// init, sh, and the pipeline (ls, grep, wc): never the host's processes.
	if n, _ := strconv.Atoi(strings.TrimSpace(lines[2])); n < 3 || n > 5 {
		t.Fatalf("%s processes visible", lines[2])
	}
}

// /proc is read-only: a root kernel's sandbox user is the host's uid 0,
// which the kernel lets write any sysctl its mode lets the owner write
// (vm/swappiness, kernel/core_pattern…). The writes are of the value read,
// so a failure of this test changes nothing on the host; the init's pid is
// still read. RLIMIT_CORE is 1 byte, soft and hard: no core file, no
// piped dump (its helper would run as root).
func TestProcReadOnly(t *testing.T) {
	requireSandbox(t)
	res := run(t, newSandbox(t, sandbox.Options{}), sandbox.Profile{Roots: []sandbox.Root{{Path: t.TempDir()}}},
		`v=$(cat /proc/sys/vm/swappiness) && { echo "$v" > /proc/sys/vm/swappiness; } 2>/dev/null || echo sysctl-refused
c=$(cat /proc/sys/kernel/core_pattern) && { echo "$c" > /proc/sys/kernel/core_pattern; } 2>/dev/null || echo core-pattern-refused
{ echo 0 > /proc/self/oom_score_adj; } 2>/dev/null || echo proc-refused
tr '\0' ' ' < /proc/1/cmdline | grep -o capkernel-init
awk '/^Max core file size/ {print "core", $5, $6}' /proc/self/limits`)
	if want := "sysctl-refused\ncore-pattern-refused\nproc-refused\ncapkernel-init\ncore 1 1\n"; string(res.Stdout) != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
}

// The seccomp filter (seccomp.go): keyrings, leases, inotify and
// fanotify, ptrace and process_vm_writev (of the init), AIO contexts and
// io_uring rings, changing RLIMIT_CORE, and any other ABI's system calls are
// refused, the rest works (other limits set, RLIMIT_CORE read).
// Each probe, if it were let through, would leave nothing behind: the key
// goes to the process's own keyring, the lease and the instances end with
// the process.
func TestSeccompFilter(t *testing.T) {
	requireSandbox(t)
	needCommand(t, "python3")
	ws := t.TempDir()
	mkTree(t, ws, map[string]string{"f.txt": "x"})
	x32 := "print('abi-refused')"
	if runtime.GOARCH == "amd64" {
		x32 = fmt.Sprintf("print('abi-refused' if call(0x40000000 | %d) == errno.EPERM else 'abi-allowed')", unix.SYS_GETPID)
	}
	script := fmt.Sprintf(`
import ctypes, errno, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
print('add_key', errno.errorcode.get(call(%d, b'user', b'capk-probe', b'x', 1, -2), 'ok'))
print('request_key', errno.errorcode.get(call(%d, b'user', b'capk-probe', None, 0), 'ok'))
print('keyctl', errno.errorcode.get(call(%d, 0, -2, 0), 'ok'))
print('inotify_init1', errno.errorcode.get(call(%d, 0), 'ok'))
print('fanotify_init', errno.errorcode.get(call(%d, 0, 0), 'ok'))
print('ptrace attach init', errno.errorcode.get(call(%d, 16, 1, 0, 0), 'ok'))
print('process_vm_writev', errno.errorcode.get(call(%d, 1, 0, 0, 0, 0, 0), 'ok'))
ctx = ctypes.c_ulong(0)
print('io_setup', errno.errorcode.get(call(%d, 1, ctypes.byref(ctx)), 'ok'))
print('io_uring_setup', errno.errorcode.get(call(%d, 1, ctypes.create_string_buffer(120)), 'ok'))
fd = os.open('f.txt', os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    print('lease ok')
except OSError as e:
    print('lease', errno.errorcode[e.errno])
print('getfl', 'ok' if fcntl.fcntl(fd, fcntl.F_GETFL) >= 0 else 'failed')
import resource
for how, f in (('setrlimit', lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))), ('prlimit', lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 0)))):
    try:
        f()
        print(how, 'core ok')
    except (OSError, ValueError): # Python says EPERM of setrlimit as ValueError
        print(how, 'core refused')
resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
print('core limit', resource.getrlimit(resource.RLIMIT_CORE), 'nofile ok')
%s
`, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL, unix.SYS_INOTIFY_INIT1, unix.SYS_FANOTIFY_INIT,
		unix.SYS_PTRACE, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_IO_SETUP, unix.SYS_IO_URING_SETUP, x32)
	must(t, os.WriteFile(filepath.Join(ws, "probe.py"), []byte(script), 0o644))
	res := run(t, newSandbox(t, sandbox.Options{}), sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, "cd "+ws+" && python3 probe.py")
	want := "add_key EPERM\nrequest_key EPERM\nkeyctl EPERM\ninotify_init1 ENOSYS\nfanotify_init EPERM\n" +
		"ptrace attach init EPERM\nprocess_vm_writev EPERM\nio_setup ENOSYS\nio_uring_setup ENOSYS\nlease EPERM\ngetfl ok\n" +
		"setrlimit core refused\nprlimit core refused\ncore limit (1, 1) nofile ok\nabi-refused\n"
	if string(res.Stdout) != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr %s", res.Stdout, want, res.Stderr)
	}
}

func TestStdinAndExit(t *testing.T) {
	requireSandbox(t)
	ws := t.TempDir()
	s := newSandbox(t, sandbox.Options{})
	p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}
	tests := []struct {
		name   string
		argv   []string
		stdin  []byte
		code   int
		stdout string
	}{
		{"stdin", []string{"cat"}, []byte("hello\x00world"), 0, "hello\x00world"},
		{"no stdin", []string{"cat"}, nil, 0, ""},
		{"exit code", []string{"sh", "-c", "exit 42"}, nil, 42, ""},
		{"signal", []string{"sh", "-c", "kill -KILL $$"}, nil, 137, ""},
		{"not found", []string{"no-such-command-xyz"}, nil, 127, ""},
		{"argv verbatim", []string{"printf", "%s|", "a b", "$HOME", "'q'"}, nil, 0, "a b|$HOME|'q'|"},
		// The init takes the argv from variables it evaluates by name only.
		{"argv through the init", []string{"printf", "%s|", "", "x\ny", `"$(id)" ` + "`id`", `\\`, "-n", "*", "$CAPKERNEL_INIT_0", "; exit 3"}, nil, 0,
			"|x\ny|\"$(id)\" `id`|\\\\|-n|*|$CAPKERNEL_INIT_0|; exit 3|"},
		{"many arguments", append([]string{"sh", "-c", `echo $#`, "sh"}, make([]string, 500)...), nil, 0, "500\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Run(context.Background(), p, sandbox.Command{Argv: tc.argv, Stdin: tc.stdin})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || string(res.Stdout) != tc.stdout {
				t.Fatalf("exit %d stdout %q (stderr %q), want %d %q", res.ExitCode, res.Stdout, res.Stderr, tc.code, tc.stdout)
			}
		})
	}
}

// Network postures: off (no route to a host server), full (reachable).
// The allowlist posture is in net_test.go.
func TestNetOffAndFull(t *testing.T) {
	requireSandbox(t)
	needCommand(t, "curl")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "reached") }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ws := t.TempDir()
	s := newSandbox(t, sandbox.Options{})
	tests := []struct {
		net  sandbox.NetMode
		want string
	}{
		{sandbox.NetOff, "curl-failed-7\n"},
		{sandbox.NetFull, "reached\n"},
	}
	for _, tc := range tests {
		t.Run(tc.net.String(), func(t *testing.T) {
			res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}, Net: tc.net},
				fmt.Sprintf("curl -sS --max-time 5 http://127.0.0.1:%d/ && echo || echo curl-failed-$?", port))
			if string(res.Stdout) != tc.want {
				t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, tc.want, res.Stderr)
			}
		})
	}
	t.Run("off has only loopback", func(t *testing.T) {
		res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
		if strings.TrimSpace(string(res.Stdout)) != "lo" {
			t.Fatalf("interfaces: %q", res.Stdout)
		}
	})
}

// A bwrap failure before the command starts is an error, not a result.
func TestSetupFailure(t *testing.T) {
	requireSandbox(t)
	// Bound at /proc/<pid>/fdinfo, which the sandbox's own /proc hides.
	res, err := newSandbox(t, sandbox.Options{}).Run(context.Background(),
		sandbox.Profile{Roots: []sandbox.Root{{Path: "/proc/self/fdinfo"}}}, sandbox.Command{Argv: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "setup failed") || !strings.Contains(err.Error(), "bwrap: ") || res != nil {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	// A command that exits 1 printing what bwrap would is still a result.
	res, err = newSandbox(t, sandbox.Options{}).Run(context.Background(),
		sandbox.Profile{Roots: []sandbox.Root{{Path: t.TempDir()}}}, sandbox.Command{Argv: []string{"sh", "-c", "echo 'bwrap: fake' >&2; exit 1"}})
	if err != nil || res.ExitCode != 1 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
}

// Secret is the policy's secret_component, name by name (the kernel's
// tests check it against the rego rule itself).
func TestSecret(t *testing.T) {
	for name, want := range map[string]bool{
		".env": true, ".env.local": true, ".env.": true, ".ssh": true, ".aws": true, ".gnupg": true,
		"server.pem": true, ".pem": true, "id_rsa": true, "id_rsa.pub": true, "id_dsa": true,
		"id_ecdsa_sk": true, "id_ed25519": true,
		".environment": false, "env": false, "x.pem.bak": false, "id_rs": false, "my_id_rsa": false,
		".ssh2": false, "aws": false, "pem": false, "ID_RSA": false, "": false,
	} {
		if got := sandbox.Secret(name); got != want {
			t.Errorf("Secret(%q) = %v, want %v", name, got, want)
		}
	}
}

// A command that removes a directory holding a hidden secret (here a .pem
// file and an id_rsa) never takes the secret along: the delta deletes at
// most the visible siblings, or is refused whole (ErrProtected).
func TestDeleteHiddenKept(t *testing.T) {
	requireSandbox(t)
	for _, mode := range []sandbox.StagingMode{sandbox.StagingOverlay, sandbox.StagingCopy} {
		for _, dir := range []string{"certs", "deploy"} {
			t.Run(fmt.Sprintf("%v/%s", mode, dir), func(t *testing.T) {
				ws := t.TempDir()
				mkTree(t, ws, map[string]string{"certs/server.pem": "k", "certs/a.txt": "a", "deploy/id_rsa": "k", "deploy/b.txt": "b"})
				res := run(t, newSandbox(t, sandbox.Options{Staging: mode}), sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}},
					"rm -rf "+dir+" 2>/dev/null; mv "+dir+" moved 2>/dev/null; true")
				if res.DeltaErr != nil {
					if !errors.Is(res.DeltaErr, sandbox.ErrProtected) {
						t.Fatal(res.DeltaErr)
					}
					return
				}
				for _, c := range res.Delta.Changes {
					if c.Kind == sandbox.Deleted && (c.Rel == dir || sandbox.Secret(filepath.Base(c.Rel))) {
						t.Errorf("delta deletes %s", c.Rel)
					}
				}
			})
		}
	}
}

// A unix socket or fifo in a root reaches a host process whatever the
// network posture: the sandbox covers every one, in r and rw roots.
func TestSpecialFilesCovered(t *testing.T) {
	requireSandbox(t)
	needCommand(t, "socat")
	for _, mode := range []sandbox.StagingMode{sandbox.StagingOverlay, sandbox.StagingCopy} {
		for _, writable := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/rw=%v", mode, writable), func(t *testing.T) {
				ws := t.TempDir()
				mkTree(t, ws, map[string]string{"sub/ok.txt": "ok"})
				// A host service listening on a socket file in the root.
				ln, err := net.Listen("unix", filepath.Join(ws, "sub", "svc.sock"))
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
				must(t, unix.Mkfifo(filepath.Join(ws, "sub", "pipe"), 0o666))
				go func() { // a host reader of the fifo
					f, err := os.OpenFile(filepath.Join(ws, "sub", "pipe"), os.O_RDONLY, 0)
					if err == nil {
						f.Close()
					}
				}()
				defer func() { // unblock the reader
					if f, err := os.OpenFile(filepath.Join(ws, "sub", "pipe"), os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
				}()
				s := newSandbox(t, sandbox.Options{Staging: mode})
				res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: writable}}}, `
socat -u UNIX-CONNECT:sub/svc.sock - 2>&1
[ -p sub/pipe ] && (echo x > sub/pipe) 2>/dev/null && echo fifo-opened
cat sub/ok.txt`)
				out := string(res.Stdout)
				if strings.Contains(out, "HOST-SERVICE-REACHED") || strings.Contains(out, "fifo-opened") {
					t.Fatalf("a host service was reached through a special file: %s", out)
				}
				if !strings.Contains(out, "ok") {
					t.Fatalf("the root's files are gone too: %s", out)
				}
			})
		}
	}
}
