package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
)

// Apply makes decided effects visible: staged files are renamed onto their
// targets, deleted targets are moved aside and removed, and the parent
// directories are fsynced. It is idempotent, so recovery can run it again
// after a crash: a staging file that is gone was renamed already, a target
// that is gone was deleted already. root returns the opened root directory
// named by an effect.
func Apply(effects []Effect, root func(dir string) (*os.Root, error)) error {
	type dir struct{ root, rel string }
	var synced []dir
	seen := map[dir]bool{}
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
		d := dir{e.Root, path.Dir(e.Path)}
		if !seen[d] {
			seen[d] = true
			synced = append(synced, d)
		}
	}
	for _, d := range synced {
		r, err := root(d.root)
		if err != nil {
			return err
		}
		if err := syncDir(r, d.rel); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(r *os.Root, rel string) error {
	f, err := r.Open(rel)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", rel, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", rel, err)
	}
	return nil
}
