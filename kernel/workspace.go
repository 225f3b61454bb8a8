package kernel

import (
	"slices"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// ancestorRoots returns the fs roots of the ancestors that carry them
// (those with a read-only root; captoken.AsAncestor), each set once, for
// the workspace to refuse a write where one of them is read-only:
// attenuation compared the roots' real paths once, and a link made or
// completed afterwards must not let the child write where an ancestor
// could not.
func ancestorRoots(as []captoken.Ancestor) []syscalls.AncestorRoots {
	var out []syscalls.AncestorRoots
	for i, a := range as {
		if !distinctFS(as, i) {
			continue
		}
		roots := make([]syscalls.RootSpec, len(a.FS))
		for j, r := range a.FS {
			roots[j] = syscalls.RootSpec{Path: r.Path, Writable: r.Mode == "rw"}
		}
		out = append(out, syscalls.AncestorRoots{Roots: roots})
	}
	return out
}

// appendAncestorsKey appends to a workspace cache key the roots
// ancestorRoots takes from as, so that tokens share a workspace only when
// they share those too (and do across families with the same roots).
func appendAncestorsKey(key []byte, as []captoken.Ancestor) []byte {
	for i, a := range as {
		if !distinctFS(as, i) {
			continue
		}
		key = append(key, 1)
		for _, r := range a.FS {
			key = append(append(append(append(key, r.Mode...), 0), r.Path...), 0)
		}
	}
	return key
}

// distinctFS reports whether as[i] carries fs roots that no ancestor
// before it carries.
func distinctFS(as []captoken.Ancestor, i int) bool {
	if len(as[i].FS) == 0 {
		return false
	}
	for _, b := range as[:i] {
		if slices.Equal(b.FS, as[i].FS) {
			return false
		}
	}
	return true
}

// VerifyWorkspace checks the workspace against the committed deltas (see
// txn.VerifyWorkspace): every file and kv key a delta touched must be as
// the last committed delta touching it left it, and no staging file may
// be left. Run it on a data dir no kernel is serving (a serving kernel
// changes files while it reads them).
func (i *Inspector) VerifyWorkspace() (*txn.WorkspaceReport, error) {
	return verifyWorkspace(i.view)
}

// VerifyWorkspace checks the workspace of the open kernel k, as
// Inspector.VerifyWorkspace does; calls running meanwhile may show as
// disagreements.
func (k *Kernel) VerifyWorkspace() (*txn.WorkspaceReport, error) {
	return verifyWorkspace(k.db.View)
}

func verifyWorkspace(view func(func(*bbolt.Tx) error) error) (*txn.WorkspaceReport, error) {
	open, closeAll := txn.OpenRoots()
	defer closeAll()
	var rep *txn.WorkspaceReport
	err := view(func(tx *bbolt.Tx) error {
		var err error
		rep, err = txn.VerifyWorkspace(tx, open)
		return err
	})
	return rep, err
}
