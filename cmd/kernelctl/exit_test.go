package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// cwdAbs is rel resolved against the test's working directory.
func cwdAbs(t *testing.T, rel string) string {
	abs, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestExitCodes runs the real binary over the command lines README.md
// promises exit statuses for: 2 for every usage error, including a value
// the kernel refuses as malformed (on a stopped data dir, through a
// running kernel's control socket and over --server alike) and an unknown
// or missing subcommand; 1 for a failure. Each error is one line that
// says nothing twice.
func TestExitCodes(t *testing.T) {
	sv := initServed(t)
	dir := t.TempDir()
	stopped := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", stopped)
	tokFile := filepath.Join(dir, "tok")
	os.WriteFile(tokFile, []byte(mustRun(t, "token", "mint", "--data", stopped, "--agent", "a", "--tools", "echo")), 0o600)
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("garbage.x.y\n"), 0o600)
	// A token of the served kernel, which the stopped one does not trust,
	// and the reverse.
	servedTok := filepath.Join(dir, "served.token")
	os.WriteFile(servedTok, []byte(mustRun(t, "token", "mint", "--data", sv.server.data, "--agent", "a", "--tools", "echo")), 0o600)
	// The three ways to reach a kernel.
	targets := map[string][]string{
		"data":   {"--data", stopped},
		"socket": {"--data", sv.server.data},
		"server": {"--server", sv.url},
	}
	t.Setenv("CAPKERNEL_ADMIN_TOKEN", sv.admin)
	mint := []string{"token", "mint", "--agent", "a", "--tools", "echo"}
	rows := []struct {
		name   string
		args   []string
		target bool // run once per target, the target's flags appended
		code   int
		stderr string // a part of the error line
	}{
		{"no verb", nil, false, 2, "give a command"},
		{"unknown verb", []string{"nosuchverb"}, false, 2, `unknown command "nosuchverb"`},
		{"unknown subcommand", []string{"token", "bogus"}, false, 2, `kernelctl token: unknown command "bogus": want one of attenuate, inspect, mint, revoke`},
		{"missing subcommand", []string{"ledger"}, false, 2, "give a command"},
		{"unknown flag", []string{"ledger", "verify", "--bogus"}, false, 2, "unknown flag: --bogus"},
		{"extra argument", []string{"demo", "extra-arg"}, false, 2, `"extra-arg"`},
		{"version", []string{"--version"}, false, 0, ""},
		{"help of a verb", []string{"help", "token", "mint"}, false, 0, ""},
		{"help of no verb", []string{"help", "nosuchverb"}, false, 2, `no command "nosuchverb"`},
		{"autonomy yolo", append(mint, "--autonomy", "yolo"), true, 2, `cap.autonomy "yolo" is not autopilot`},
		{"ttl too long", append(mint, "--ttl", "2400h"), true, 2, "--ttl 2400h0m0s is longer than a token may live"},
		{"unknown budget", append(mint, "--budget", "foo=1"), true, 2, `cap.budgets has unknown key "foo"`},
		{"outcome bogus", []string{"receipts", "list", "--outcome", "bogus"}, true, 2, `outcome "bogus" is not one of committed`},
		// Flags that would filter nothing, or pass vacuously, are refused.
		{"limit negative", []string{"receipts", "list", "--limit", "-3"}, true, 2, "--limit -3: want 1 or more (without --limit, every receipt is listed)"},
		{"limit zero", []string{"receipts", "list", "--limit", "0"}, true, 2, "--limit 0: want 1 or more"},
		{"since negative", []string{"receipts", "list", "--since", "-1h"}, true, 2, "--since -1h: a duration is how long ago, and it is negative"},
		{"conformance matching nothing", []string{"conformance", "--server", sv.url, "--run", "NOSUCH"}, false, 1, `kernelctl conformance: no case id matches "NOSUCH" (the ids are in docs/conformance.md)`},
		{"format foo", []string{"tools", "--token", tokFile, "--format", "foo"}, true, 2, `--format "foo" is not openai, anthropic or mcp`},
		{"revoke not a jti", []string{"token", "revoke", "not-a-jti"}, true, 1, `"not-a-jti" is not a token id`},
		{"revoke an upper-case jti", []string{"token", "revoke", "01A21C2B-7F01-7EE8-90F2-5CACA2498B1C"}, true, 1,
			`"01A21C2B-7F01-7EE8-90F2-5CACA2498B1C" is not a token id: the kernel's are lower-case UUIDs (did you mean 01a21c2b-7f01-7ee8-90f2-5caca2498b1c?)`},
		// Argument counts are usage errors pointing to --help, as
		// unknown flags are.
		{"call without a tool", []string{"call"}, false, 2, "kernelctl call: accepts 1 arg(s), received 0 (see kernelctl call --help)"},
		{"receipts show without an id", []string{"receipts", "show"}, false, 2, "(see kernelctl receipts show --help)"},
		{"token revoke without a jti", []string{"token", "revoke"}, false, 2, "(see kernelctl token revoke --help)"},
		{"completion without a shell", []string{"completion"}, false, 2, "give a command: one of bash, fish, powershell, zsh (see kernelctl completion --help)"},
		{"completion extra argument", []string{"completion", "bash", "x"}, false, 2, "(see kernelctl completion bash --help)"},
		// A receipt id or a bundle file with nothing to verify it against
		// is the same mistake, and the same usage error.
		{"receipt id without a target", []string{"receipts", "verify", "r1-0123abcd", "--jwks", garbage}, false, 2, "(a receipt id needs --data or --server) (see kernelctl receipts verify --help)"},
		{"bundle without a key", []string{"receipts", "verify", garbage}, false, 2, "give --jwks FILE, or --data/--server to fetch the key"},
		// A call's error line names its class once, and the HTTP status
		// of the answer when there is one.
		{"call refused over the server", []string{"call", "echo", "--token", tokFile, "--arg", "text=x", "--server", sv.url}, false, 1, "kernelctl call: token_invalid (HTTP 401): "},
		{"call refused over the socket", []string{"call", "echo", "--token", tokFile, "--arg", "text=x", "--data", sv.server.data}, false, 1, "kernelctl call: token_invalid (HTTP 401): "},
		{"call refused in process", []string{"call", "echo", "--token", servedTok, "--arg", "text=x", "--data", stopped}, false, 1, "kernelctl call: token_invalid: "},
		{"an argument twice", []string{"call", "echo", "--token", tokFile, "--arg-str", "text=x", "--arg-str", "text=y"}, true, 2, `--arg-str "text=y": argument text is given twice`},
		{"inspect garbage", []string{"token", "inspect", garbage}, true, 1, "the kernel refuses this token (token_invalid): token is not a compact JWS"},
		{"no such receipt", []string{"receipts", "show", "01a2173e-0000-7000-8000-000000000000"}, true, 1, ""},
		{"no target", []string{"ledger", "head"}, false, 2, "give --data DIR or --server URL"},
		// Relative paths are relative to the working directory, and the
		// error names the path as given and as resolved.
		{"relative policy", []string{"serve", "--data", stopped, "--listen", "127.0.0.1:0", "--policy", "./no-such-bundle"}, false, 2, "--policy ./no-such-bundle (" + cwdAbs(t, "no-such-bundle") + ", from the working directory)"},
		{"policy hash of no dir", []string{"policy", "hash", "no-such-bundle"}, false, 2, "policy hash: no-such-bundle (" + cwdAbs(t, "no-such-bundle") + ", from the working directory): no such file or directory"},
		{"mcp off loopback", []string{"mcp", "--data", stopped, "--token", tokFile, "--http", "0.0.0.0:0"}, false, 2, "mcp serves streamable HTTP on loopback only"},
	}
	for _, r := range rows {
		runs := map[string][]string{"": r.args}
		if r.target {
			runs = map[string][]string{}
			for name, flags := range targets {
				runs[name] = append(append([]string{}, r.args...), flags...)
			}
		}
		for target, args := range runs {
			t.Run(strings.TrimSpace(r.name+" "+target), func(t *testing.T) {
				out, stderr, code := run(t, args...)
				if code != r.code {
					t.Fatalf("kernelctl %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, r.code, out, stderr)
				}
				if !strings.Contains(stderr, r.stderr) {
					t.Errorf("stderr %q does not say %q", stderr, r.stderr)
				}
				if code == 0 {
					return
				}
				// One line, saying nothing twice, with no Go value dumped.
				if n := strings.Count(strings.TrimSpace(stderr), "\n"); n > 0 {
					t.Errorf("a %d-line error: %q", n+1, stderr)
				}
				for _, stutter := range []string{"captoken:", "token_invalid: token_invalid", "mint: mint", "server: 400", "&{", "map["} {
					if strings.Contains(stderr, stutter) {
						t.Errorf("stderr %q contains %q", stderr, stutter)
					}
				}
			})
		}
	}
	if out, _, _ := run(t, "--version"); !strings.HasPrefix(out, "kernelctl ") || !strings.Contains(out, "go1.") {
		t.Errorf("--version printed %q", out)
	}
}

// runEnv runs kernelctl with env added to the environment, without
// CAPKERNEL_ADMIN_TOKEN unless env sets it.
func runEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(kernelctl, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envAdmin+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	return runExec(t, cmd)
}

// TestCredentialErrors: a credential error says what is wrong with what
// was given (not an admin credential, a wrong one, a path where the value
// belongs, the value where a path belongs, none at all), and the public
// reads need no credential.
func TestCredentialErrors(t *testing.T) {
	sv := initServed(t)
	dir := t.TempDir()
	jws := filepath.Join(dir, "a.token")
	os.WriteFile(jws, []byte(mustRun(t, "token", "mint", "--data", sv.server.data, "--agent", "a", "--tools", "echo")), 0o600)
	tok, _ := readSecret(jws)
	mint := []string{"token", "mint", "--server", sv.url, "--agent", "x", "--tools", "echo"}
	for _, c := range []struct {
		name   string
		env    []string
		args   []string
		code   int
		stderr string
	}{
		{"wrong admin credential", []string{envAdmin + "=" + kernel.AdminPrefix + "wrong"}, mint, 1,
			"refused (token_invalid, HTTP 401): the admin credential is wrong: it has the form of one but is not this kernel's (the kernel's is the content of admin.token in its data dir) (the credential in env CAPKERNEL_ADMIN_TOKEN)"},
		{"a path in the env", []string{envAdmin + "=" + sv.adminFile}, mint, 2,
			"CAPKERNEL_ADMIN_TOKEN holds a path (" + sv.adminFile + "); it takes the credential itself"},
		{"the value in the flag", nil, append(mint, "--admin-token", sv.admin), 2,
			"--admin-token takes the path of a file holding the admin credential, not the credential itself"},
		{"a capability token as admin", []string{envAdmin + "=" + tok}, mint, 2,
			"is not an admin credential: it is a capability token"},
		{"no credential", nil, mint, 2, "needs the admin credential: --admin-token FILE or env CAPKERNEL_ADMIN_TOKEN"},
		{"no credential for a private read", nil, []string{"receipts", "list", "--server", sv.url}, 1,
			"this endpoint needs a bearer credential: the admin credential or a capability token of this kernel (give the admin credential: --admin-token FILE or env CAPKERNEL_ADMIN_TOKEN)"},
		{"public head", nil, []string{"ledger", "head", "--server", sv.url}, 0, ""},
		{"public checkpoint", nil, []string{"ledger", "checkpoint", "--server", sv.url}, 0, ""},
		{"public jwks", nil, []string{"receipts", "jwks", "--server", sv.url}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, code := runEnv(t, c.env, c.args...)
			if code != c.code || !strings.Contains(stderr, c.stderr) {
				t.Fatalf("kernelctl %s: exit %d (want %d)\n%s%s\nwant stderr with %q", strings.Join(c.args, " "), code, c.code, out, stderr, c.stderr)
			}
		})
	}
}

// TestServerURL: a --server (or CAPKERNEL_SERVER) that is not an http or
// https URL with a host, such as the HOST:PORT --listen takes, is a usage
// error naming where it came from and suggesting http://HOST:PORT, where
// the URL parser or the transport failed with exit 1.
func TestServerURL(t *testing.T) {
	noScheme := func(from, s string) string {
		return from + ` "` + s + `" is not a kernel's URL: it needs the scheme http:// or https:// and a host (did you mean http://` + s + `?)`
	}
	for _, c := range []struct {
		name   string
		env    []string
		args   []string
		stderr string
	}{
		{"ip:port", nil, []string{"ledger", "head", "--server", "127.0.0.1:7391"}, noScheme("--server", "127.0.0.1:7391")},
		{"localhost:port", nil, []string{"ledger", "head", "--server", "localhost:7391"}, noScheme("--server", "localhost:7391")},
		{"call", nil, []string{"call", "echo", "--token", "t", "--server", "localhost:7391"}, noScheme("--server", "localhost:7391")},
		{"another scheme", nil, []string{"receipts", "list", "--server", "ftp://127.0.0.1:7391"}, `--server "ftp://127.0.0.1:7391" is not a kernel's URL: it needs the scheme http:// or https:// and a host (e.g. http://127.0.0.1:7070)`},
		{"no host", nil, []string{"receipts", "list", "--server", "http://"}, `--server "http://" is not a kernel's URL`},
		{"env", []string{envServer + "=localhost:7391"}, []string{"ledger", "head"}, noScheme("env "+envServer, "localhost:7391")},
		{"demo", nil, []string{"demo", "--server", "localhost:7391"}, noScheme("--server", "localhost:7391")},
		{"conformance", []string{envAdmin + "=" + kernel.AdminPrefix + "x"}, []string{"conformance", "--server", "localhost:7391"}, noScheme("--server", "localhost:7391")},
		{"conformance env", []string{envAdmin + "=" + kernel.AdminPrefix + "x", envServer + "=127.0.0.1:7391"}, []string{"conformance"}, noScheme("env "+envServer, "127.0.0.1:7391")},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, code := runEnv(t, c.env, c.args...)
			if code != 2 || !strings.Contains(stderr, c.stderr) || !strings.Contains(stderr, "--help)") {
				t.Fatalf("kernelctl %s: exit %d (want 2)\n%s%s\nwant stderr with %q", strings.Join(c.args, " "), code, out, stderr, c.stderr)
			}
		})
	}
}
