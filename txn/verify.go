package txn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
)

// WorkspaceReport is what VerifyWorkspace found. The workspace agrees
// with the committed deltas when Problems is empty.
type WorkspaceReport struct {
	// Deltas is the number of committed deltas read, in commit order.
	Deltas int `json:"deltas"`
	// Unindexed counts deltas stored before the commit-order index
	// existed; their changes are not checked.
	Unindexed int `json:"unindexed"`
	// Pending counts decided intents not yet applied (a running or
	// interrupted kernel): the paths they touch are not checked.
	Pending int `json:"pending"`
	// Files and Keys are the paths and kv keys checked.
	Files int `json:"files"`
	Keys  int `json:"keys"`
	// Problems names every path, key or leftover staging file that
	// disagrees with the last committed delta touching it.
	Problems []WorkspaceProblem `json:"problems"`
}

// WorkspaceProblem is one disagreement: Kind is "file" (Root, Path),
// "kv" (Key) or "staging" (a staging or trash file left in Root at Path).
// Want is the state the last committed delta (of OperationID, DeltaID)
// left; Found what is there now.
type WorkspaceProblem struct {
	Kind        string `json:"kind"`
	Root        string `json:"root,omitempty"`
	Path        string `json:"path,omitempty"`
	Key         string `json:"key,omitempty"`
	OperationID string `json:"operation_id,omitempty"`
	DeltaID     string `json:"commit_delta_id,omitempty"`
	Want        string `json:"want"`
	Found       string `json:"found"`
}

// States a WorkspaceProblem names besides content digests.
const (
	stateAbsent    = "absent"
	stateDirectory = "directory"
	stateOther     = "not a regular file"
)

// expect is the state the last committed change of a path or key left.
type expect struct {
	op, hash, opID, delta string
	version               uint64
}

// VerifyWorkspace checks the current state of every file and kv key a
// committed delta touched against the last committed delta touching it:
// a written file must hold the delta's new_hash, a deleted path must be
// absent, a made directory must be one, and a kv key must hold the value
// of new_hash at new_version. It also reports staging and trash files
// left in the roots. root opens a root directory named by a delta.
func VerifyWorkspace(tx *bbolt.Tx, root func(dir string) (*os.Root, error)) (*WorkspaceReport, error) {
	rep := &WorkspaceReport{Problems: []WorkspaceProblem{}}
	files := map[[2]string]expect{} // (root, path) -> state
	keys := map[string]expect{}
	pending := map[[2]string]bool{}
	if b := tx.Bucket(bucketIntent); b != nil {
		ins, err := Intents(tx)
		if err != nil {
			return nil, err
		}
		for _, in := range ins {
			if in.State != Decided {
				continue
			}
			rep.Pending++
			for _, e := range in.Effects {
				pending[[2]string{e.Root, e.Path}] = true
			}
		}
	}
	deltas, order := tx.Bucket(bucketDelta), tx.Bucket(bucketOrder)
	if deltas == nil {
		return rep, nil
	}
	indexed := 0
	if order != nil {
		err := order.ForEach(func(k, id []byte) error {
			indexed++
			var d Delta
			if err := json.Unmarshal(deltas.Get(id), &d); err != nil {
				return fmt.Errorf("txn: delta %s (commit %d): %w", id, binary.BigEndian.Uint64(k), err)
			}
			rep.Deltas++
			for _, c := range d.Changes {
				ex := expect{op: c.Op, hash: c.NewHash, opID: d.OperationID, delta: string(id), version: c.NewVersion}
				if c.Op == OpKVPut {
					keys[c.Key] = ex
					continue
				}
				// A write or a delete of a path settles what is below it
				// too (a deleted tree takes its files along); a mkdir
				// leaves it.
				if c.Op != OpMkdir {
					prefix := strings.TrimSuffix(c.Path, "/") + "/"
					for f := range files {
						if f[0] == c.Root && strings.HasPrefix(f[1], prefix) {
							delete(files, f)
						}
					}
				}
				files[[2]string{c.Root, c.Path}] = ex
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	rep.Unindexed = deltas.Stats().KeyN - indexed
	paths := make([][2]string, 0, len(files))
	for f := range files {
		paths = append(paths, f)
	}
	sort.Slice(paths, func(i, j int) bool {
		return paths[i][0] < paths[j][0] || paths[i][0] == paths[j][0] && paths[i][1] < paths[j][1]
	})
	roots := map[string]bool{}
	for _, f := range paths {
		roots[f[0]] = true
		if pending[f] {
			continue
		}
		rep.Files++
		ex := files[f]
		found, err := fileState(root, f[0], f[1])
		if err != nil {
			return nil, err
		}
		want := ex.hash
		switch ex.op {
		case OpDelete:
			want = stateAbsent
		case OpMkdir:
			want = stateDirectory
		}
		if found != want {
			rep.Problems = append(rep.Problems, WorkspaceProblem{Kind: "file", Root: f[0], Path: f[1], OperationID: ex.opID, DeltaID: ex.delta, Want: want, Found: found})
		}
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		rep.Keys++
		ex := keys[k]
		v, err := kvGet(tx, k)
		if err != nil {
			return nil, err
		}
		want := fmt.Sprintf("%s at version %d", ex.hash, ex.version)
		found := stateAbsent
		if v.Version > 0 {
			found = fmt.Sprintf("%s at version %d", digest.Sum(v.Value), v.Version)
		}
		if found != want {
			rep.Problems = append(rep.Problems, WorkspaceProblem{Kind: "kv", Key: k, OperationID: ex.opID, DeltaID: ex.delta, Want: want, Found: found})
		}
	}
	dirs := make([]string, 0, len(roots))
	for d := range roots {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		left, err := stagingLeft(root, d)
		if err != nil {
			return nil, err
		}
		for _, p := range left {
			rep.Problems = append(rep.Problems, WorkspaceProblem{Kind: "staging", Root: d, Path: p, Want: stateAbsent, Found: "a staging file"})
		}
	}
	return rep, nil
}

// fileState is the digest of the regular file rel under dir, or absent,
// directory, or not a regular file.
func fileState(root func(string) (*os.Root, error), dir, rel string) (string, error) {
	r, err := root(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return stateAbsent, nil
	}
	if err != nil {
		return "", fmt.Errorf("open root %s: %w", dir, err)
	}
	fi, err := r.Lstat(rel)
	switch {
	case absent(err):
		return stateAbsent, nil
	case err != nil:
		return "", fmt.Errorf("%s: %w", rel, err)
	case fi.IsDir():
		return stateDirectory, nil
	case !fi.Mode().IsRegular():
		return stateOther, nil
	}
	h, _, err := hashFile(r, rel)
	return h, err
}

// stagingLeft lists the staging and trash files under the root dir.
func stagingLeft(root func(string) (*os.Root, error), dir string) ([]string, error) {
	r, err := root(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	var out []string
	err = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n := d.Name(); strings.HasPrefix(n, StagePrefix) || strings.HasPrefix(n, TrashPrefix) {
			out = append(out, p)
			if d.IsDir() {
				return fs.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk root %s: %w", dir, err)
	}
	return out, nil
}

// OpenRoots returns a function that opens root directories by path, each
// once, and a function that closes them all.
func OpenRoots() (open func(dir string) (*os.Root, error), closeAll func()) {
	c := rootCache{}
	return c.open, c.close
}
