package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// token mint and attenuate refuse an fs root the kernel could not open
// (missing, a file), and explain a root that looks like a glob, since
// roots are taken literally: the kernel refuses them, in the process
// (--data) and through a server alike, so a client reaching the kernel
// through a tunnel or from another mount namespace is not judged by its
// own file system.
func TestMintFSRootMustBeADirectory(t *testing.T) {
	srv := initServed(t)
	dir := srv.dir
	data := srv.data
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(filepath.Join(ws, "docs"), 0o755)
	os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("n\n"), 0o644)
	star := filepath.Join(dir, "odd", "*")
	os.MkdirAll(star, 0o755)
	mint := []string{"token", "mint", "--agent", "fr", "--tools", "fs.*"}
	server := []string{"--server", srv.url, "--admin-token", srv.adminFile}
	missing := filepath.Join(dir, "nonexist")
	for _, tt := range []struct {
		name   string
		target []string
		fs     []string
		want   string // "" for a token
	}{
		{"a directory", server, []string{ws + ":rw", ws + "/docs:r"}, ""},
		{"a directory literally named *", server, []string{star + ":r"}, ""},
		{"a file", server, []string{ws + "/notes.txt:r", ws + "/docs:r"}, "refused (invalid_args, HTTP 400): fs root " + ws + "/notes.txt is not a directory"},
		{"missing", server, []string{missing + ":rw"}, "refused (invalid_args, HTTP 400): fs root " + missing + " does not exist where the kernel runs: a root must be an existing directory"},
		{"a glob", server, []string{ws + "/*:rw"}, "not a pattern ('*' is no wildcard there)"},
		// In the process the kernel says the same, as a usage error.
		{"missing, --data", []string{"--data", data}, []string{missing + ":rw"}, "fs root " + missing + " does not exist where the kernel runs"},
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
	// attenuate: the kernel refuses a missing root the child names.
	parent := filepath.Join(dir, "parent.token")
	os.WriteFile(parent, []byte(mustRun(t, append(mint, append(server, "--fs", ws+":rw")...)...)), 0o600)
	_, stderr, code := run(t, "token", "attenuate", "--server", srv.url, "--parent", parent, "--fs", ws+"/nonexist:r")
	if code != 2 || !strings.Contains(stderr, "refused (invalid_args, HTTP 400): fs root "+ws+"/nonexist does not exist") {
		t.Fatalf("attenuate --fs of a missing dir: exit %d: %s", code, stderr)
	}

	// POST /v1/tokens, as any client sends it: the root is the server's to
	// judge, and one it sees as a directory is minted (links resolved), as
	// a missing one is refused, whatever the client's file system holds.
	c := &httpapi.Client{BaseURL: srv.url, Credential: srv.admin}
	link := filepath.Join(dir, "wslink")
	os.Symlink(ws, link)
	m, err := c.Mint(t.Context(), kernel.TokenRequest{AgentID: "fr", Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: link, Mode: "r"}}})
	if err != nil || m.Cap.FS[0].Path != ws {
		t.Fatalf("POST /v1/tokens with an existing root: %v %+v, want the root %s", err, m, ws)
	}
	_, err = c.Mint(t.Context(), kernel.TokenRequest{AgentID: "fr", Tools: []string{"fs.*"}, FS: []captoken.FSRoot{{Path: missing, Mode: "r"}}})
	var api *httpapi.APIError
	if !errors.As(err, &api) || api.Status != 400 || api.Class != kernel.ErrInvalidArgs || !strings.Contains(api.Message, "fs root "+missing+" does not exist") {
		t.Fatalf("POST /v1/tokens with a missing root: %v, want 400 invalid_args naming it", err)
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
