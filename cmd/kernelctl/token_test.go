package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// token mint and attenuate refuse an fs root the kernel could not open
// (missing, a file) when the kernel is on this host, and explain a root
// that looks like a glob, since roots are taken literally.
func TestMintFSRootMustBeADirectory(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(filepath.Join(ws, "docs"), 0o755)
	os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("n\n"), 0o644)
	star := filepath.Join(dir, "odd", "*")
	os.MkdirAll(star, 0o755)
	mint := []string{"token", "mint", "--agent", "fr", "--tools", "fs.*"}
	for _, tt := range []struct {
		name   string
		target []string
		fs     []string
		want   string // "" for a token
	}{
		{"a directory", []string{"--data", data}, []string{ws + ":rw", ws + "/docs:r"}, ""},
		{"a directory literally named *", []string{"--data", data}, []string{star + ":r"}, ""},
		{"a file", []string{"--data", data}, []string{ws + "/notes.txt:r", ws + "/docs:r"}, ws + "/notes.txt is not a directory"},
		{"missing", []string{"--data", data}, []string{filepath.Join(dir, "nonexist") + ":rw"}, filepath.Join(dir, "nonexist") + " does not exist; a root must be an existing directory"},
		{"a glob", []string{"--data", data}, []string{ws + "/*:rw"}, "not a pattern ('*' is no wildcard there)"},
		{"missing, loopback server", []string{"--server", "http://127.0.0.1:1"}, []string{filepath.Join(dir, "nonexist") + ":rw"}, "does not exist"},
		{"a glob, remote server", []string{"--server", "http://192.0.2.1:1"}, []string{"/srv/ws/*:rw"}, `--fs "/srv/ws/*:rw": /srv/ws/* holds '*', and a root is one directory taken literally, not a pattern`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{}, mint...), tt.target...)
			for _, f := range tt.fs {
				args = append(args, "--fs", f)
			}
			out, stderr, code := run(t, args...)
			switch {
			case tt.want == "" && code != 0:
				t.Fatalf("exit %d: %s", code, stderr)
			case tt.want != "" && (code != 2 || !strings.Contains(stderr, tt.want) || out != ""):
				t.Fatalf("exit %d, want 2 with %q:\n%s%s", code, tt.want, out, stderr)
			}
		})
	}
	// attenuate reads --fs the same way.
	parent := filepath.Join(dir, "parent.token")
	os.WriteFile(parent, []byte(mustRun(t, append(mint, "--data", data, "--fs", ws+":rw")...)), 0o600)
	_, stderr, code := run(t, "token", "attenuate", "--data", data, "--parent", parent, "--fs", ws+"/nonexist:r")
	if code != 2 || !strings.Contains(stderr, ws+"/nonexist does not exist") {
		t.Fatalf("attenuate --fs of a missing dir: exit %d: %s", code, stderr)
	}
}

// token inspect shows a role token's role and a handle-mode token's mode.
func TestInspectShowsRoleAndHandles(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	mustRun(t, "init", "--data", data)
	for _, tt := range []struct {
		flags []string
		want  []string
	}{
		{[]string{"--approver"}, []string{"role approver (decides soft_gate calls)", "tools none"}},
		{[]string{"--approver", "--escalation"}, []string{"role escalation (decides soft_gate and escalated calls)"}},
		{[]string{"--auditor"}, []string{"role auditor (reads every record of the history in full, decides nothing)"}},
		{[]string{"--tools", "echo", "--handles"}, []string{"tools echo", "handles yes"}},
	} {
		tok := strings.TrimSpace(mustRun(t, append([]string{"token", "mint", "--data", data, "--agent", "p"}, tt.flags...)...))
		out := mustRun(t, "token", "inspect", tok, "--data", data)
		words := strings.Join(strings.Fields(out), " ") // the table's padding aside
		for _, w := range tt.want {
			if !strings.Contains(words, w) {
				t.Errorf("token mint %v; token inspect lacks %q:\n%s", tt.flags, w, out)
			}
		}
	}
}
