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

// Redo applies decided effects again after a crash or a fail stop, like
// Apply, but checks each target first, since the process that committed
// them may have stopped at any point of Apply: a staged write is renamed
// onto its target only while the target still holds the content it was
// staged against (OldHash; absent for a new file), and a deleted file is
// removed only while it holds OldHash. A target that holds the effect's
// new content already is left as it is; one that holds anything else is
// never overwritten: the staging file goes and the effect is reported as
// a Conflict (ConflictTarget). A staging file is renamed only when it
// holds the committed content (NewHash): one damaged since it was synced
// (a lost or torn write, a change by hand) is removed and the effect is
// reported as a Conflict (ConflictStaging), the target left as it was.
// Staging and trash files of the effects are gone afterwards.
func Redo(operationID string, effects []Effect, root func(dir string) (*os.Root, error)) ([]Conflict, error) {
	var conflicts []Conflict
	for _, e := range effects {
		if e.Op != OpWrite && e.Op != OpDelete {
			if err := Apply([]Effect{e}, root); err != nil {
				return conflicts, err
			}
			continue
		}
		r, err := root(e.Root)
		if err != nil {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
		cur, present, err := currentHash(r, e.Path)
		if err != nil {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
		conflict := func(reason, want, found string) {
			conflicts = append(conflicts, Conflict{OperationID: operationID, Op: e.Op, Root: e.Root, Path: e.Path, Reason: reason, Want: want, Found: found})
		}
		switch e.Op {
		case OpWrite:
			if _, serr := r.Lstat(e.Stage); errors.Is(serr, fs.ErrNotExist) {
				continue // renamed already
			}
			switch {
			case e.OldHash == "" && !present, e.OldHash != "" && cur == e.OldHash:
				var staged string
				staged, _, err = hashFile(r, e.Stage)
				if errors.Is(err, errNotRegular) {
					err = nil // staged is "": damaged
				}
				switch {
				case err != nil:
				case staged == e.NewHash:
					err = r.Rename(e.Stage, e.Path)
				default:
					conflict(ConflictStaging, e.NewHash, staged)
					err = r.RemoveAll(e.Stage)
				}
			case cur == e.NewHash && present:
				err = r.Remove(e.Stage)
			default:
				conflict(ConflictTarget, e.OldHash, cur)
				err = r.Remove(e.Stage)
			}
		case OpDelete:
			switch {
			case !present:
			case e.OldHash == "" || cur == e.OldHash:
				err = r.Rename(e.Path, e.Stage)
			default:
				conflict(ConflictTarget, e.OldHash, cur)
			}
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				err = r.RemoveAll(e.Stage)
			}
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
	}
	return conflicts, nil
}

// currentHash returns the digest of the regular file rel ("" for anything
// else) and whether anything exists at rel.
func currentHash(r *os.Root, rel string) (string, bool, error) {
	if _, err := r.Lstat(rel); errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	} else if err != nil {
		return "", false, err
	}
	h, _, err := hashFile(r, rel)
	if errors.Is(err, errNotRegular) {
		return "", true, nil
	}
	return h, true, err
}
