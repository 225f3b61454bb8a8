package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/sandbox"
)

var modes = []sandbox.StagingMode{sandbox.StagingOverlay, sandbox.StagingCopy}

// baseTree is the workspace every staging case starts from.
var baseTree = map[string]string{
	"a.txt":           "alpha\n",
	"keep.txt":        "keep\n",
	"same.txt":        "same\n",
	"mode.sh":         "#!/bin/sh\n",
	"sub/b.txt":       "beta\n",
	"sub/deep/c.txt":  "gamma\n",
	"gone/x":          "x\n",
	"gone/y/z":        "z\n",
	"re/r1":           "r1\n",
	"re/r2":           "r2\n",
	"empty/":          "",
	".env":            "SECRET=1\n",
	"link->a.txt":     "",
	"outlink->/etc":   "",
	"big@0600":        strings.Repeat("0123456789", 1000),
	"nested/n.txt":    "n\n",
	"nested/more/m":   "m\n",
	"ro/readonly.txt": "r\n",
}

// change is a delta entry as the tests spell it: "kind type rel [mode]
// [=content]".
func describe(t *testing.T, ws string, c sandbox.Change) string {
	t.Helper()
	if c.Root != ws {
		t.Errorf("change %+v outside root %s", c, ws)
	}
	if strings.Contains(c.Rel, "..") || strings.HasPrefix(c.Rel, "/") || c.Rel == "" || c.Rel == "." {
		t.Errorf("bad rel %q", c.Rel)
	}
	s := fmt.Sprintf("%s %s %s", c.Kind, c.Type, c.Rel)
	switch {
	case c.Kind == sandbox.Deleted:
	case c.Type == sandbox.TypeFile:
		b, err := os.ReadFile(c.Source)
		if err != nil {
			t.Fatalf("source of %s: %v", c.Rel, err)
		}
		if int64(len(b)) != c.Size {
			t.Errorf("%s: size %d, source has %d bytes", c.Rel, c.Size, len(b))
		}
		s += fmt.Sprintf(" %o =%s", c.Mode, strings.TrimSuffix(string(b), "\n"))
	case c.Type == sandbox.TypeDir:
		s += fmt.Sprintf(" %o", c.Mode)
	case c.Type == sandbox.TypeSymlink:
		s += " -> " + c.Target
	}
	return s
}

func TestStagedWrites(t *testing.T) {
	requireSandbox(t)
	tests := []struct {
		name   string
		script string
		want   []string // in delta order
	}{
		{"nothing", "cat a.txt >/dev/null", nil},
		{"add file", "echo new > n.txt", []string{"added file n.txt 644 =new"}},
		{"add in new dirs", "mkdir -p nd/e && echo q > nd/e/q", []string{"added dir nd 755", "added dir nd/e 755", "added file nd/e/q 644 =q"}},
		{"modify", "echo more >> a.txt", []string{"modified file a.txt 644 =alpha\nmore"}},
		{"truncate", ": > keep.txt", []string{"modified file keep.txt 644 ="}},
		{"delete file", "rm sub/b.txt", []string{"deleted file sub/b.txt"}},
		{"delete tree", "rm -rf gone", []string{"deleted file gone/y/z", "deleted dir gone/y", "deleted file gone/x", "deleted dir gone"}},
		{"delete empty dir", "rmdir empty", []string{"deleted dir empty"}},
		{"mkdir", "mkdir nd", []string{"added dir nd 755"}},
		{"chmod file", "chmod 755 mode.sh", []string{"modified file mode.sh 755 =#!/bin/sh"}},
		{"chmod dir", "chmod 700 sub", []string{"modified dir sub 700"}},
		{"same content rewritten", "echo same > same.txt; cp a.txt a2 && mv a2 a.txt", nil},
		{"touch only", "touch keep.txt sub sub/b.txt", nil},
		{"opaque dir", "rm -rf re && mkdir re && echo r1 > re/r1 && echo r3 > re/r3",
			[]string{"deleted file re/r2", "added file re/r3 644 =r3"}},
		{"opaque nested", "rm -rf nested && mkdir -p nested/more && echo m > nested/more/m",
			[]string{"deleted file nested/n.txt"}},
		{"file becomes dir", "rm a.txt && mkdir a.txt && echo q > a.txt/q",
			[]string{"deleted file a.txt", "added dir a.txt 755", "added file a.txt/q 644 =q"}},
		{"dir becomes file", "rm -rf sub/deep && echo f > sub/deep",
			[]string{"deleted file sub/deep/c.txt", "deleted dir sub/deep", "added file sub/deep 644 =f"}},
		{"rename dir", "mv sub sub2",
			[]string{"deleted file sub/deep/c.txt", "deleted dir sub/deep", "deleted file sub/b.txt", "deleted dir sub",
				"added dir sub2 755", "added dir sub2/deep 755", "added file sub2/b.txt 644 =beta", "added file sub2/deep/c.txt 644 =gamma"}},
		{"rename file", "mv keep.txt kept.txt", []string{"deleted file keep.txt", "added file kept.txt 644 =keep"}},
		{"replace link by file", "rm link && echo l > link", []string{"modified file link 644 =l"}},
		{"delete link", "rm outlink", []string{"deleted symlink outlink"}},
		{"write through link", "echo via >> link", []string{"modified file a.txt 644 =alpha\nvia"}},
		// The original outlink points at /etc: the new tree under the
		// same name is compared with nothing, never with the host's /etc.
		{"link becomes dir", "rm outlink && mkdir outlink && echo p > outlink/passwd",
			[]string{"deleted symlink outlink", "added dir outlink 755", "added file outlink/passwd 644 =p"}},
		{"private perms kept", "echo s > secret && chmod 600 secret", []string{"added file secret 600 =s"}},
		{"setuid bits dropped", "echo s > su && chmod 4755 su", []string{"added file su 755 =s"}},
		{"hidden paths unchanged", "{ echo x > .env; } 2>/dev/null || :; rm .env 2>/dev/null || :", nil},
		{"many", "for i in 1 2 3; do echo $i > f$i; done; rm sub/b.txt; echo more >> a.txt",
			[]string{"deleted file sub/b.txt", "modified file a.txt 644 =alpha\nmore", "added file f1 644 =1", "added file f2 644 =2", "added file f3 644 =3"}},
	}
	for _, mode := range modes {
		for _, tc := range tests {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				ws := filepath.Join(t.TempDir(), "ws")
				mkTree(t, ws, baseTree)
				before := treeHash(t, ws)
				s := newSandbox(t, sandbox.Options{Staging: mode})
				res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}, "set -e\n"+tc.script)
				if res.ExitCode != 0 {
					t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
				}
				if res.Staging != mode {
					t.Fatalf("staged by %v, want %v", res.Staging, mode)
				}
				// Nothing reached the workspace.
				sameTree(t, "workspace", before, treeHash(t, ws))
				if res.DeltaErr != nil {
					t.Fatal(res.DeltaErr)
				}
				var got []string
				var bytes int64
				for _, c := range res.Delta.Changes {
					got = append(got, describe(t, ws, c))
					if c.Type == sandbox.TypeFile && c.Kind != sandbox.Deleted {
						bytes += c.Size
					}
				}
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Fatalf("delta:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
				if bytes != res.Delta.Bytes {
					t.Fatalf("Delta.Bytes %d, files sum %d", res.Delta.Bytes, bytes)
				}
			})
		}
	}
}

// Applying a delta to a copy of the workspace gives the tree the command
// saw at its end; an unapplied one leaves the workspace as it was.
func TestDeltaApplies(t *testing.T) {
	requireSandbox(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), "ws")
			mkTree(t, ws, baseTree)
			before := treeHash(t, ws)
			s := newSandbox(t, sandbox.Options{Staging: mode})
			p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}
			res := run(t, s, p, `set -e
rm -rf gone re; mkdir re; echo r9 > re/r9; mv sub sub2; echo more >> a.txt; chmod 700 sub2
rm a.txt.missing 2>/dev/null || true; mkdir -p x/y/z; echo deep > x/y/z/f; rm keep.txt; mkdir keep.txt
rm -rf nested/more; echo m > nested/more
find . -path ./.env -prune -o -print | LC_ALL=C sort | while read -r f; do
	if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; elif [ -d "$f" ]; then echo "$f/ $(stat -c %a "$f")"; else echo "$f $(stat -c %a "$f") $(md5sum < "$f" | cut -c1-32)"; fi
done`)
			if res.ExitCode != 0 || res.DeltaErr != nil {
				t.Fatalf("exit %d %v: %s", res.ExitCode, res.DeltaErr, res.Stderr)
			}
			sameTree(t, "workspace", before, treeHash(t, ws))
			apply(t, res.Delta)
			res2 := run(t, newSandbox(t, sandbox.Options{}), sandbox.Profile{Roots: []sandbox.Root{{Path: ws}}}, `
find . -path ./.env -prune -o -print | LC_ALL=C sort | while read -r f; do
	if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; elif [ -d "$f" ]; then echo "$f/ $(stat -c %a "$f")"; else echo "$f $(stat -c %a "$f") $(md5sum < "$f" | cut -c1-32)"; fi
done`)
			if string(res.Stdout) != string(res2.Stdout) {
				t.Fatalf("tree inside the run:\n%s\ntree after applying the delta:\n%s", res.Stdout, res2.Stdout)
			}
		})
	}
}

// apply is what the kernel does at commit, in the delta's order.
func apply(t *testing.T, d *sandbox.Delta) {
	t.Helper()
	for _, c := range d.Changes {
		p := c.Path()
		switch {
		case c.Kind == sandbox.Deleted:
			must(t, os.Remove(p))
		case c.Type == sandbox.TypeDir:
			if c.Kind == sandbox.Added {
				must(t, os.Mkdir(p, c.Mode))
			}
			must(t, os.Chmod(p, c.Mode))
		case c.Type == sandbox.TypeFile:
			b, err := os.ReadFile(c.Source)
			must(t, err)
			os.Remove(p)
			must(t, os.WriteFile(p, b, c.Mode))
			must(t, os.Chmod(p, c.Mode))
		case c.Type == sandbox.TypeSymlink:
			os.Remove(p)
			must(t, os.Symlink(c.Target, p))
		}
	}
}

func TestDeltaErrors(t *testing.T) {
	requireSandbox(t)
	tests := []struct {
		name   string
		limits sandbox.Limits
		links  sandbox.SymlinkPolicy
		script string
		err    error
		want   []string
	}{
		{"too many files", sandbox.Limits{DeltaFiles: 3}, 0, "for i in 1 2 3 4 5; do echo $i > f$i; done", sandbox.ErrDeltaTooLarge, nil},
		{"files at the cap", sandbox.Limits{DeltaFiles: 3}, 0, "for i in 1 2 3; do echo $i > f$i; done", nil, []string{"added file f1 644 =1", "added file f2 644 =2", "added file f3 644 =3"}},
		{"too many bytes", sandbox.Limits{DeltaBytes: 1000}, 0, "head -c 1001 /dev/zero > z", sandbox.ErrDeltaTooLarge, nil},
		{"bytes at the cap", sandbox.Limits{DeltaBytes: 1000}, 0, "head -c 999 /dev/zero | tr '\\0' a > z; echo >> z", nil, []string{"added file z 644 =" + strings.Repeat("a", 999)}},
		{"deleting is counted too", sandbox.Limits{DeltaFiles: 2}, 0, "rm -rf gone", sandbox.ErrDeltaTooLarge, nil},
		{"symlink refused", sandbox.Limits{}, sandbox.SymlinksRefuse, "ln -s /etc/passwd pw", sandbox.ErrSymlink, nil},
		{"symlink recorded", sandbox.Limits{}, sandbox.SymlinksRecord, "ln -s /etc/passwd pw; ln -sf b.txt sub/l", nil, []string{"added symlink pw -> /etc/passwd", "added symlink sub/l -> b.txt"}},
		{"symlink retargeted", sandbox.Limits{}, sandbox.SymlinksRecord, "ln -sfn keep.txt link", nil, []string{"modified symlink link -> keep.txt"}},
		{"fifo refused", sandbox.Limits{}, sandbox.SymlinksRecord, "mkfifo p", sandbox.ErrSpecialFile, nil},
		{"socket refused", sandbox.Limits{}, sandbox.SymlinksRecord, "timeout 0.2 socat UNIX-LISTEN:s,unlink-close=0 /dev/null; test -S s", sandbox.ErrSpecialFile, nil},
	}
	for _, mode := range modes {
		for _, tc := range tests {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				ws := filepath.Join(t.TempDir(), "ws")
				mkTree(t, ws, baseTree)
				before := treeHash(t, ws)
				s := newSandbox(t, sandbox.Options{Staging: mode, Symlinks: tc.links})
				res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}, Limits: tc.limits}, tc.script)
				sameTree(t, "workspace", before, treeHash(t, ws))
				if tc.err != nil {
					if !errors.Is(res.DeltaErr, tc.err) || res.Delta != nil {
						t.Fatalf("DeltaErr %v, Delta %v; want %v", res.DeltaErr, res.Delta, tc.err)
					}
					return
				}
				if res.DeltaErr != nil {
					t.Fatal(res.DeltaErr)
				}
				var got []string
				for _, c := range res.Delta.Changes {
					got = append(got, describe(t, ws, c))
				}
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Fatalf("delta:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
			})
		}
	}
}

// Writes through links that lead out of the root go nowhere on the host,
// and the delta only ever names paths in the root.
func TestTraversal(t *testing.T) {
	requireSandbox(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			base := t.TempDir()
			ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
			mkTree(t, outside, map[string]string{"o.txt": "outside\n"})
			mkTree(t, ws, map[string]string{
				"f.txt":               "f\n",
				"rel->../outside":     "",
				"abs->" + outside:     "",
				"dotdot->..":          "",
				"etc->/etc":           "",
				"d/up->../../outside": "",
			})
			beforeWS, beforeOut := treeHash(t, ws), treeHash(t, outside)
			s := newSandbox(t, sandbox.Options{Staging: mode, Symlinks: sandbox.SymlinksRecord})
			res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}, fmt.Sprintf(`
echo pwn > rel/o.txt 2>/dev/null && echo wrote-rel
echo pwn > abs/new.txt 2>/dev/null && echo wrote-abs
echo pwn > d/up/x 2>/dev/null && echo wrote-up
echo pwn > etc/passwd 2>/dev/null && echo wrote-etc
mkdir -p %[1]s && echo pwn > %[1]s/o.txt && echo wrote-tmpfs
cat abs/o.txt
echo pwn > dotdot/sibling.txt && echo wrote-dotdot
ln -s /root/.ssh escape
cd ..; echo pwn > ws2.txt 2>/dev/null && echo wrote-parent
true`, outside))
			out := string(res.Stdout)
			for _, w := range []string{"wrote-rel", "wrote-abs", "wrote-up", "wrote-etc"} {
				if strings.Contains(out, w) {
					t.Errorf("%s: wrote through a link out of the root", w)
				}
			}
			// The outside directory does not exist in the sandbox: a
			// command can make one, but only in its private /tmp.
			if !strings.Contains(out, "wrote-tmpfs") || !strings.Contains(out, "pwn") {
				t.Errorf("private /tmp write failed: %q %q", out, res.Stderr)
			}
			sameTree(t, "outside", beforeOut, treeHash(t, outside))
			sameTree(t, "workspace", beforeWS, treeHash(t, ws))
			if _, err := os.Stat(filepath.Join(base, "sibling.txt")); err == nil {
				t.Error("a write through dotdot reached the host")
			}
			if res.DeltaErr != nil {
				t.Fatal(res.DeltaErr)
			}
			var got []string
			for _, c := range res.Delta.Changes {
				if !strings.HasPrefix(c.Path(), ws+"/") {
					t.Errorf("delta names %s, outside the root", c.Path())
				}
				got = append(got, describe(t, ws, c))
			}
			if want := "added symlink escape -> /root/.ssh"; strings.Join(got, "\n") != want {
				t.Fatalf("delta:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
			}
		})
	}
}

// Nested roots: an r root inside an rw root stays read-only; an rw root
// inside another has its own delta; the outer delta never names them.
func TestNestedRoots(t *testing.T) {
	requireSandbox(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), "ws")
			mkTree(t, ws, map[string]string{"top.txt": "t\n", "docs/d.txt": "d\n", "out/o.txt": "o\n", "out/.env": "S\n"})
			before := treeHash(t, ws)
			s := newSandbox(t, sandbox.Options{Staging: mode})
			p := sandbox.Profile{Roots: []sandbox.Root{
				{Path: filepath.Join(ws, "out"), Writable: true},
				{Path: ws, Writable: true},
				{Path: filepath.Join(ws, "docs")},
			}}
			res := run(t, s, p, "cd "+ws+`
echo x >> docs/d.txt 2>/dev/null && echo wrote-docs
echo new > out/new.txt; echo more >> out/o.txt; echo top >> top.txt
cat out/.env 2>/dev/null
rm -rf docs out 2>/dev/null
true`)
			if strings.Contains(string(res.Stdout), "wrote-docs") || strings.Contains(string(res.Stdout), "S") {
				t.Fatalf("stdout %q", res.Stdout)
			}
			sameTree(t, "workspace", before, treeHash(t, ws))
			if res.DeltaErr != nil {
				t.Fatal(res.DeltaErr)
			}
			var got []string
			for _, c := range res.Delta.Changes {
				got = append(got, fmt.Sprintf("%s %s %s", c.Root, c.Kind, c.Rel))
			}
			// rm -rf out removes out's files (in out's own layer; new.txt,
			// made and removed, is no change); the mount points stay.
			wantSet := map[string]bool{ws + "/out deleted o.txt": true, ws + " modified top.txt": true}
			if len(got) != len(wantSet) {
				t.Fatalf("delta %q", got)
			}
			for _, g := range got {
				if !wantSet[g] {
					t.Fatalf("delta %q", got)
				}
			}
		})
	}
}

// Where overlayfs is refused (here: a staging path overlay options cannot
// carry), StagingAuto falls back to the copy and gives the same delta;
// StagingOverlay fails.
func TestOverlayFallback(t *testing.T) {
	requireSandbox(t)
	stage := filepath.Join(t.TempDir(), "no,overlay")
	must(t, os.Mkdir(stage, 0o700))
	ws := filepath.Join(t.TempDir(), "ws")
	mkTree(t, ws, bigTree(baseTree)) // small roots are copied anyway
	before := treeHash(t, ws)
	p := sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}
	script := "echo new > n.txt; rm -rf gone; echo more >> a.txt"
	want := "deleted file gone/y/z\ndeleted dir gone/y\ndeleted file gone/x\ndeleted dir gone\nmodified file a.txt 644 =alpha\nmore\nadded file n.txt 644 =new"

	auto := newSandbox(t, sandbox.Options{StagingDir: stage})
	res := run(t, auto, p, script)
	if res.Staging != sandbox.StagingCopy {
		t.Fatalf("staged by %v", res.Staging)
	}
	if refused, why := auto.OverlayRefused(); !refused || why == "" {
		t.Fatalf("OverlayRefused = %v %q", refused, why)
	}
	var got []string
	for _, c := range res.Delta.Changes {
		got = append(got, describe(t, ws, c))
	}
	if strings.Join(got, "\n") != want {
		t.Fatalf("delta:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	sameTree(t, "workspace", before, treeHash(t, ws))

	_, err := newSandbox(t, sandbox.Options{StagingDir: stage, Staging: sandbox.StagingOverlay}).Run(context.Background(), p, sandbox.Command{Argv: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "overlayfs refused") {
		t.Fatalf("StagingOverlay with a refused overlay: %v", err)
	}
	if ents := runStages(t, stage); len(ents) != 1 { // the auto run's, until Close
		t.Fatalf("staging dir holds %v", ents)
	}
}

// bigTree is tree plus enough untouched files that StagingAuto stages it
// by overlay.
func bigTree(tree map[string]string) map[string]string {
	big := maps.Clone(tree)
	for i := range 40 {
		big[fmt.Sprintf("bulk/f%02d", i)] = "bulk\n"
	}
	return big
}

// StagingAuto copies small roots (no namespace or mount process to set
// up) and overlays the others; both give the same delta.
func TestAutoStagingBySize(t *testing.T) {
	requireSandbox(t)
	script := "echo new > n.txt; rm -rf gone; echo more >> a.txt"
	want := "deleted file gone/y/z\ndeleted dir gone/y\ndeleted file gone/x\ndeleted dir gone\nmodified file a.txt 644 =alpha\nmore\nadded file n.txt 644 =new"
	for _, tc := range []struct {
		name string
		tree map[string]string
		want sandbox.StagingMode
	}{
		{"small", baseTree, sandbox.StagingCopy},
		{"many-files", bigTree(baseTree), sandbox.StagingOverlay},
		{"large-file", func() map[string]string {
			m := maps.Clone(baseTree)
			m["blob"] = strings.Repeat("x", 200<<10)
			return m
		}(), sandbox.StagingOverlay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), "ws")
			mkTree(t, ws, tc.tree)
			before := treeHash(t, ws)
			s := newSandbox(t, sandbox.Options{})
			res := run(t, s, sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}}, script)
			if res.Staging != tc.want {
				t.Fatalf("staged by %v, want %v", res.Staging, tc.want)
			}
			var got []string
			for _, c := range res.Delta.Changes {
				got = append(got, describe(t, ws, c))
			}
			if strings.Join(got, "\n") != want {
				t.Fatalf("delta:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
			}
			sameTree(t, "workspace", before, treeHash(t, ws))
		})
	}
}

// Close removes the staging; CleanupStale removes what dead runs left and
// leaves live ones alone.
func TestStagingCleanup(t *testing.T) {
	requireSandbox(t)
	stage := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	mkTree(t, ws, map[string]string{"a": "a"})
	for _, mode := range modes {
		s := newSandbox(t, sandbox.Options{StagingDir: stage, Staging: mode})
		res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}},
			sandbox.Command{Argv: []string{"sh", "-c", "mkdir -p locked/in && echo x > locked/in/f && chmod 0 locked/in && chmod 500 locked"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.DeltaErr != nil || len(res.Delta.Changes) != 3 {
			t.Fatalf("%v: delta %+v %v", mode, res.Delta, res.DeltaErr)
		}
		// A live run's staging survives CleanupStale.
		if n, err := sandbox.CleanupStale(stage); n != 0 || err != nil {
			t.Fatalf("CleanupStale removed %d live staging dirs (%v)", n, err)
		}
		must(t, res.Close())
		if ents := runStages(t, stage); len(ents) != 0 {
			t.Fatalf("%v: %v left after Close", mode, ents)
		}
	}
	// A dead run's leftovers: unlocked, with unwritable directories.
	dead := filepath.Join(stage, "capsandbox-dead")
	mkTree(t, dead, map[string]string{".lock": "", "u0/d/f": "x"})
	must(t, os.Chmod(filepath.Join(dead, "u0", "d"), 0))
	other := filepath.Join(stage, "unrelated")
	must(t, os.Mkdir(other, 0o700))
	n, err := sandbox.CleanupStale(stage)
	if n != 1 || err != nil {
		t.Fatalf("CleanupStale = %d, %v", n, err)
	}
	if _, err := os.Stat(dead); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("dead staging left")
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatal("unrelated directory removed")
	}
}

// Runs of one Sandbox may overlap, each with its own staging.
func TestConcurrentRuns(t *testing.T) {
	requireSandbox(t)
	s := newSandbox(t, sandbox.Options{})
	ws := filepath.Join(t.TempDir(), "ws")
	mkTree(t, ws, baseTree)
	before := treeHash(t, ws)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			res, err := s.Run(context.Background(), sandbox.Profile{Roots: []sandbox.Root{{Path: ws, Writable: true}}},
				sandbox.Command{Argv: []string{"sh", "-c", fmt.Sprintf("echo %d > mine; rm a.txt; sleep 0.2", i)}})
			if err != nil {
				errs <- err
				return
			}
			defer res.Close()
			if res.DeltaErr != nil || len(res.Delta.Changes) != 2 {
				errs <- fmt.Errorf("run %d: %+v %v", i, res.Delta, res.DeltaErr)
				return
			}
			b, _ := os.ReadFile(res.Delta.Changes[1].Source)
			if c := res.Delta.Changes[1]; c.Rel != "mine" || string(b) != fmt.Sprintf("%d\n", i) || res.Delta.Changes[0].Rel != "a.txt" {
				errs <- fmt.Errorf("run %d: %+v %q", i, res.Delta.Changes, b)
				return
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	sameTree(t, "workspace", before, treeHash(t, ws))
}

// TestCleanupStaleKillsOrphans: a process still naming a stale staging
// directory (bwrap's child, left blocked by a kernel killed mid-setup) is
// killed before the directory is removed; one naming a live run's is not.
func TestCleanupStaleKillsOrphans(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "capsandbox-run-stale")
	live := filepath.Join(dir, "capsandbox-run-live")
	for _, d := range []string{stale, live} {
		must(t, os.MkdirAll(d, 0o700))
		must(t, os.WriteFile(filepath.Join(d, ".lock"), nil, 0o600))
	}
	lock, err := os.OpenFile(filepath.Join(live, ".lock"), os.O_RDWR, 0)
	must(t, err)
	defer lock.Close()
	must(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	start := func(d string) *exec.Cmd {
		c := exec.Command("sh", "-c", "sleep 1000", filepath.Join(d, "m0"))
		must(t, c.Start())
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	orphan, running := start(stale), start(live)
	done := make(chan error, 1)
	go func() { done <- orphan.Wait() }()
	n, err := sandbox.CleanupStale(dir)
	if err != nil || n != 1 {
		t.Fatalf("CleanupStale = %d, %v", n, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the orphan naming the stale directory was not killed")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale dir: %v", err)
	}
	if err := running.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the live run's process was killed: %v", err)
	}
}
