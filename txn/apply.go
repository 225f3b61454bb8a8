package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Apply makes decided effects visible: staged files are renamed onto their
// targets, deleted targets are moved aside and removed. It is idempotent,
// so recovery can run it again after a crash: a staging file that is gone
// was renamed already, a target that is gone was deleted already. root
// returns the opened root directory named by an effect. The caller makes the
// renames durable (Syncer) before it forgets the intent.
func Apply(effects []Effect, root func(dir string) (*os.Root, error)) error {
	for _, e := range effects {
		if e.Op != OpWrite && e.Op != OpDelete {
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
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
	}
	return nil
}
