package sandbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/sandbox"
)

// newSandbox returns a Sandbox closed when the test ends.
func newSandbox(tb testing.TB, opts sandbox.Options) *sandbox.Sandbox {
	s := sandbox.New(opts)
	tb.Cleanup(func() { s.Close() })
	return s
}

// requireSandbox skips nothing: the sandbox tests need bubblewrap, and a
// machine without it fails them (make test installs it).
func requireSandbox(t *testing.T) {
	t.Helper()
	if err := sandbox.Available(); err != nil {
		t.Fatalf("%v (apt-get install -y bubblewrap)", err)
	}
}

// tree describes files to create: "dir/" makes a directory, "name" a file
// with that content, "name@0755" a file with a mode, "link->target" a
// symlink.
func mkTree(t *testing.T, root string, entries map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := entries[k]
		mode := fs.FileMode(0o644)
		if name, m, ok := strings.Cut(k, "@"); ok {
			var n int
			fmt.Sscanf(m, "%o", &n)
			k, mode = name, fs.FileMode(n)
		}
		p := filepath.Join(root, filepath.FromSlash(k))
		switch {
		case strings.HasSuffix(k, "/"):
			must(t, os.MkdirAll(p, 0o755))
		case strings.Contains(k, "->"):
			name, target, _ := strings.Cut(k, "->")
			p = filepath.Join(root, filepath.FromSlash(name))
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.Symlink(target, p))
		default:
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.WriteFile(p, []byte(v), mode))
			must(t, os.Chmod(p, mode))
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// treeHash is a digest of every entry under root: type, permissions,
// content or link target. Equal hashes mean byte-identical trees.
func treeHash(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			desc += " " + hex.EncodeToString(h[:])
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	if len(before) != len(after) {
		t.Errorf("%s: %d entries before, %d after", what, len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: %s was %q, now %q", what, k, v, after[k])
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}

// run runs a shell script in a sandbox and fails the test on a Run error.
func run(t *testing.T, s *sandbox.Sandbox, p sandbox.Profile, script string) *sandbox.Result {
	t.Helper()
	res, err := s.Run(context.Background(), p, sandbox.Command{Argv: []string{"sh", "-c", script}, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { res.Close() })
	return res
}

// unique replaces each "@" in s with this test process's id, zero-padded
// to a fixed width. Tests that look for leftover processes by command line
// (hostProcsWith) put it in the sleep durations they run and look for, so
// they never see the sandboxes of another copy of the tests running on the
// machine at the same time.
func unique(s string) string { return strings.ReplaceAll(s, "@", fmt.Sprintf("%07d", os.Getpid())) }

// hostProcsWith lists host processes whose command line contains s.
func hostProcsWith(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, s) {
			out = append(out, e.Name()+": "+cl)
		}
	}
	return out
}

func needCommand(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s not installed (apt-get install -y %s)", name, name)
	}
}

// runStages lists the per-run staging directories in dir (not the /etc
// snapshot a Sandbox keeps there).
func runStages(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "capsandbox-etc-") {
			out = append(out, e.Name())
		}
	}
	return out
}
