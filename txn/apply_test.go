package txn

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/syscalls"
)

// tree returns the entries under dir: a file's content, "/" for a
// directory.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out[filepath.ToSlash(rel)] = "/"
			return nil
		}
		b, err := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// plant makes the entries of want under dir (content "/" for a directory).
func plant(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for _, rel := range sortedKeys(want) {
		p := filepath.Join(dir, rel)
		var err error
		if want[rel] == "/" {
			err = os.Mkdir(p, 0o755)
		} else {
			err = os.WriteFile(p, []byte(want[rel]), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// sortedKeys returns the keys of m sorted: parents before their children.
func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}

// treeStep is one change of a delta, staged the way proc.exec stages its
// sandbox's delta (deletions children first, then directories, then files
// through WriteFrom's pool).
type treeStep struct{ op, rel, content string }

// replaceCases are deltas as proc.exec stages them, among them paths
// replaced by another kind of entry, with the tree before and after.
var replaceCases = []struct {
	name          string
	before, after map[string]string
	steps         []treeStep
}{
	{"empty dir replaced by a file", map[string]string{"d": "/"}, map[string]string{"d": "new"},
		[]treeStep{{"delete", "d", ""}, {"write", "d", "new"}}},
	{"dir with files replaced by a file", map[string]string{"d": "/", "d/old.txt": "old", "d/e": "/", "d/e/x": "x"}, map[string]string{"d": "new"},
		[]treeStep{{"delete", "d/old.txt", ""}, {"delete", "d/e/x", ""}, {"delete", "d/e", ""}, {"delete", "d", ""}, {"write", "d", "new"}}},
	{"file replaced by a dir", map[string]string{"f": "old"}, map[string]string{"f": "/", "f/y": "y"},
		[]treeStep{{"delete", "f", ""}, {"mkdir", "f", ""}, {"write", "f/y", "y"}}},
	{"file replaced by an empty dir", map[string]string{"f": "old"}, map[string]string{"f": "/"},
		[]treeStep{{"delete", "f", ""}, {"mkdir", "f", ""}}},
	{"file rewritten, another deleted", map[string]string{"a": "old", "b": "b"}, map[string]string{"a": "new"},
		[]treeStep{{"delete", "b", ""}, {"write", "a", "new"}}},
	{"dir tree deleted", map[string]string{"d": "/", "d/x": "x", "k": "k"}, map[string]string{"k": "k"},
		[]treeStep{{"delete", "d/x", ""}, {"delete", "d", ""}}},
}

// TestRedoReplacedPaths: an intent that replaces a path with another kind
// of entry (a directory with a file, a file with a directory) is applied
// again, after a crash at every point of its apply or after the apply
// completed (crash point "applied": the intent is not finished yet), by
// Redo, twice, and by Apply as the kernel's in-process retry does: each
// leaves exactly the call's result, reports no conflict and no error.
// Before, Redo deleted the call's own new file (a delete of a directory
// removed whatever was at the path) or failed with ENOTDIR on a deleted
// child of the directory, and Apply's retry did the same.
func TestRedoReplacedPaths(t *testing.T) {
	cases := replaceCases
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Stage once to learn the effects, so each crash point below
			// can be named by an index.
			n := len(stageSteps(t, t.TempDir(), tc.before, tc.steps))
			for crash := 0; crash <= 2*n; crash++ {
				for _, retry := range []string{"redo", "apply"} {
					dir := t.TempDir()
					effects := stageSteps(t, dir, tc.before, tc.steps)
					open, closeAll := OpenRoots()
					// crash/2 effects applied, and for odd crash the next
					// delete's target moved to a trash name only, as a
					// build before in-place deletes did, its intent naming
					// the trash.
					if err := Apply(effects[:crash/2], open); err != nil {
						t.Fatal(err)
					}
					if crash%2 == 1 {
						e := &effects[crash/2]
						if e.Op != OpDelete {
							closeAll()
							continue
						}
						e.Stage = TrashPrefix + "op-" + strconv.Itoa(crash/2)
						r, _ := open(dir)
						if err := r.Rename(e.Path, e.Stage); err != nil {
							t.Fatal(err)
						}
					}
					for pass := range 2 {
						var conflicts []Conflict
						var err error
						if retry == "redo" {
							conflicts, err = Redo("op", effects, open)
						} else {
							err = Apply(effects, open)
						}
						if err != nil || len(conflicts) != 0 {
							t.Errorf("%s after %d effects applied (crash %d), pass %d: %v, conflicts %+v", retry, crash/2, crash, pass+1, err, conflicts)
						}
						if got := tree(t, dir); !maps.Equal(got, tc.after) {
							t.Errorf("%s after %d effects applied (crash %d), pass %d: tree %v, want %v", retry, crash/2, crash, pass+1, got, tc.after)
						}
					}
					closeAll()
				}
			}
		})
	}
}

// TestRedoDeleteHalfDone: a delete of a directory tree, removed in part
// when the process stopped (Apply removes it where it is, children
// first), is finished by Redo and by Apply, with no conflict, and a
// second pass changes nothing.
func TestRedoDeleteHalfDone(t *testing.T) {
	for _, retry := range []string{"redo", "apply"} {
		dir := t.TempDir()
		effects := stageSteps(t, dir, map[string]string{"d": "/", "d/x": "x", "d/e": "/", "d/e/y": "y", "k": "k"},
			[]treeStep{{"delete", "d", ""}})
		if err := os.Remove(filepath.Join(dir, "d/e/y")); err != nil {
			t.Fatal(err)
		}
		open, closeAll := OpenRoots()
		for pass := range 2 {
			var conflicts []Conflict
			var err error
			if retry == "redo" {
				conflicts, err = Redo("op", effects, open)
			} else {
				err = Apply(effects, open)
			}
			if got, want := tree(t, dir), map[string]string{"k": "k"}; err != nil || len(conflicts) != 0 || !maps.Equal(got, want) {
				t.Errorf("%s, pass %d: %v, conflicts %+v, tree %v, want %v", retry, pass+1, err, conflicts, got, want)
			}
		}
		closeAll()
	}
}

// stageSteps plants before under dir and stages steps through a Stage,
// returning its effects.
func stageSteps(t *testing.T, dir string, before map[string]string, steps []treeStep) []Effect {
	t.Helper()
	plant(t, dir, before)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	s := NewSyncer()
	t.Cleanup(s.Close)
	stage := NewStage("op", nil, s)
	for _, st := range steps {
		r := &syscalls.Resource{Root: root, RootPath: dir, Rel: st.rel}
		switch st.op {
		case "delete":
			err = stage.Delete(r)
		case "mkdir":
			err = stage.Mkdir(r, 0o755)
		case "write":
			_, err = stage.WriteFrom(r, strings.NewReader(st.content), 0o644)
		}
		if err != nil {
			t.Fatalf("stage %s %s: %v", st.op, st.rel, err)
		}
	}
	return stage.Effects()
}

// TestVerifyReplacedPaths: after a commit that replaces a path with
// another kind of entry is applied, the workspace check finds it as the
// delta says: a deleted child of a directory that is now a file is
// absent, not an error.
func TestVerifyReplacedPaths(t *testing.T) {
	for _, tc := range replaceCases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := newPrepare("op", "key")
			if _, err := e.prepare(p); err != nil {
				t.Fatal(err)
			}
			effects := stageSteps(t, e.ws, tc.before, tc.steps)
			e.commit(&p.Intent, effects, `{}`)
			open, closeAll := OpenRoots()
			defer closeAll()
			if err := Apply(effects, open); err != nil {
				t.Fatal(err)
			}
			if err := e.update(func(tx *bbolt.Tx) error { return Finish(tx, "op") }); err != nil {
				t.Fatal(err)
			}
			e.view(func(tx *bbolt.Tx) error {
				rep, err := VerifyWorkspace(tx, open)
				if err != nil || len(rep.Problems) != 0 {
					t.Errorf("workspace check: %+v, %v", rep, err)
				}
				return nil
			})
		})
	}
}
