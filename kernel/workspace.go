package kernel

import (
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/txn"
)

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
