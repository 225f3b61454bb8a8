package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Apply makes decided effects visible: staged files are renamed onto their
// targets, deleted targets are moved aside and removed, directories are
// made, and a cleanup effect removes a staging pool emptied by the renames. It is idempotent,
// so recovery can run it again after a crash: a staging file that is gone
// was renamed already, a target that is gone was deleted already. root
// returns the opened root directory named by an effect. The caller makes the
// renames durable (Syncer) before it forgets the intent.
func Apply(effects []Effect, root func(dir string) (*os.Root, error)) error {
	for _, e := range effects {
		if e.Op != OpWrite && e.Op != OpDelete && e.Op != OpMkdir && e.Op != OpCleanup {
			continue
		}
		r, err := root(e.Root)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
		switch e.Op {
		case OpWrite:
			err = r.Rename(e.Stage, e.Path)
		case OpDelete:
			err = r.Rename(e.Path, e.Stage)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				err = r.RemoveAll(e.Stage)
			}
		case OpMkdir:
			err = r.Mkdir(e.Path, fs.FileMode(e.Mode).Perm())
			if errors.Is(err, fs.ErrExist) {
				err = nil
			} else if err == nil {
				err = r.Chmod(e.Path, fs.FileMode(e.Mode).Perm())
			}
		case OpCleanup:
			err = r.RemoveAll(e.Stage)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
	}
	return nil
}
