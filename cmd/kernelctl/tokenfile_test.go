package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTokenFileForm: every verb taking a token file refuses one that does
// not hold a compact JWS alone (token mint --json's output, the admin
// credential, a token broken over two lines), naming the flag and the file
// and saying what it holds, where net/http complained about an invalid
// Authorization header. Surrounding white space is still accepted.
func TestTokenFileForm(t *testing.T) {
	sv := initServed(t)
	dir := t.TempDir()
	stopped := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", stopped)
	tok := strings.TrimSpace(mustRun(t, "token", "mint", "--data", sv.server.data, "--agent", "a", "--tools", "echo"))
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		return p
	}
	spaced := file("spaced.token", "  "+tok+"\r\n\n")
	bad := []struct{ file, says string }{
		{file("minted.json", mustRun(t, "token", "mint", "--data", sv.server.data, "--agent", "a", "--tools", "echo", "--json")),
			"it holds JSON, not the token alone (token mint --json prints JSON; save what token mint prints without --json)"},
		{file("admin.token", sv.admin+"\n"), "it holds the admin credential"},
		{file("broken.token", tok[:20]+"\n"+tok[20:]), "holds a line break at byte 20"},
		{file("dots.token", "a.b\n"), "a compact JWS has 3 parts joined by dots, and it has 2"},
	}
	server := []string{"--server", sv.url}
	verbs := map[string][]string{
		"call server":          append([]string{"call", "echo", "--arg", "text=x"}, server...),
		"call data":            {"call", "echo", "--arg", "text=x", "--data", stopped},
		"call socket":          {"call", "echo", "--arg", "text=x", "--data", sv.server.data},
		"tools":                append([]string{"tools"}, server...),
		"receipts list":        append([]string{"receipts", "list"}, server...),
		"approvals list":       append([]string{"approvals", "list"}, server...),
		"events":               append([]string{"events"}, server...),
		"run":                  append([]string{"run", "--no-sandbox"}, server...),
		"mcp":                  append([]string{"mcp"}, server...),
		"token attenuate":      append([]string{"token", "attenuate", "--agent", "a/b", "--tools", "echo"}, server...),
		"token attenuate data": {"token", "attenuate", "--agent", "a/b", "--tools", "echo", "--data", stopped},
	}
	for name, args := range verbs {
		flag := "--token"
		if strings.HasPrefix(name, "token attenuate") {
			flag = "--parent"
		}
		for _, b := range bad {
			t.Run(name+" "+filepath.Base(b.file), func(t *testing.T) {
				full := append(append([]string{}, args...), flag, b.file)
				if name == "run" {
					full = append(full, "--", "true")
				}
				// Bounded: events or mcp given a token they do not check
				// would serve until killed.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				out, stderr, code := runExec(t, exec.CommandContext(ctx, kernelctl, full...))
				want := flag + " " + b.file + " is not a capability token: "
				if code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stderr, b.says) || strings.Contains(stderr, "net/http") {
					t.Fatalf("kernelctl %s: exit %d (want 1)\n%s%s\nwant stderr with %q and %q", strings.Join(full, " "), code, out, stderr, want, b.says)
				}
			})
		}
	}
	if out := mustRun(t, "call", "echo", "--token", spaced, "--arg", "text=x", "--server", sv.url); !strings.HasPrefix(out, "echo ok") {
		t.Fatalf("a token file with white space around the token: %s", out)
	}
	if _, stderr, code := run(t, "call", "echo", "--token", filepath.Join(dir, "nosuch"), "--server", sv.url); code != 1 || !strings.Contains(stderr, "--token "+filepath.Join(dir, "nosuch")+": no such file or directory") {
		t.Fatalf("a missing token file: exit %d: %s", code, stderr)
	}
}
