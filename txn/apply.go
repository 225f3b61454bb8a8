package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"
)

// Apply makes decided effects visible: staged files are renamed onto their
// targets, deleted targets are moved aside and removed, directories are
// made, and a cleanup effect removes a staging pool emptied by the
// renames. It is idempotent, so recovery can run it again after a crash,
// and the kernel after a failed attempt: a staging file that is gone was
// renamed already, a target that is gone (or whose parent is no longer a
// directory) was deleted already, and a delete is skipped once a later
// write of effects at or under its path has landed (see landed): what is
// at the path then was put there after the delete. root returns the
// opened root directory named by an effect. The caller makes the renames
// durable (Syncer) before it forgets the intent.
func Apply(effects []Effect, root func(dir string) (*os.Root, error)) error {
	later := laterWrites(effects)
	for i, e := range effects {
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
			if !landed(r, effects, later[i]) {
				err = r.Rename(e.Path, e.Stage)
			}
			if err == nil || absent(err) {
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
		if err != nil && !absent(err) {
			return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
	}
	return nil
}

// Redo applies decided effects again after a crash or a fail stop, like
// Apply, but checks each target first, since the process that committed
// them may have stopped at any point of Apply: a staged write is renamed
// onto its target only while the target still holds the content it was
// staged against (OldHash; absent for a new file), and a deleted entry is
// removed only while it still is what was deleted: a regular file holding
// OldHash, or, for an empty OldHash, anything but a regular file (a
// directory or a link). A target that holds the effect's new content
// already is left as it is; one that holds anything else is never
// overwritten: the staging file goes and the effect is reported as a
// Conflict (ConflictTarget). A delete is left undone, and no conflict
// reported, when its path holds what a later effect of the same intent
// puts there (a later write has landed at or under it, or the path holds
// the directory a later mkdir makes or a later write's content): the
// path was replaced by another kind of entry, the delete first. A path
// whose parent is no longer a directory counts as absent. A staging file
// is renamed only when it holds the committed content (NewHash): one
// damaged since it was synced (a lost or torn write, a change by hand) is
// removed and the effect is reported as a Conflict (ConflictStaging), the
// target left as it was. Staging and trash files of the effects are gone
// afterwards, and a second Redo of the same effects changes nothing.
func Redo(operationID string, effects []Effect, root func(dir string) (*os.Root, error)) ([]Conflict, error) {
	var conflicts []Conflict
	later := laterWrites(effects)
	for i, e := range effects {
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
		cur, mode, present, err := currentHash(r, e.Path)
		if err != nil {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
		conflict := func(reason, want, found string) {
			conflicts = append(conflicts, Conflict{OperationID: operationID, Op: e.Op, Root: e.Root, Path: e.Path, Reason: reason, Want: want, Found: found})
		}
		switch e.Op {
		case OpWrite:
			if _, serr := r.Lstat(e.Stage); absent(serr) {
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
			case !present, landed(r, effects, later[i]):
			case e.OldHash == "" && !mode.IsRegular(), e.OldHash != "" && mode.IsRegular() && cur == e.OldHash:
				err = r.Rename(e.Path, e.Stage)
			case madeLater(effects[i+1:], e, cur, mode):
			default:
				conflict(ConflictTarget, e.OldHash, cur)
			}
			if err == nil || absent(err) {
				err = r.RemoveAll(e.Stage)
			}
		}
		if err != nil && !absent(err) {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
	}
	return conflicts, nil
}

// laterWrites returns, for each delete of effects, the index of the first
// write after it at or under its path (same root), -1 for none; other
// effects have -1 too. Effects without a delete (most calls) get nil.
func laterWrites(effects []Effect) []int {
	if !slices.ContainsFunc(effects, func(e Effect) bool { return e.Op == OpDelete }) {
		return nil
	}
	later := make([]int, len(effects))
	for i := range later {
		later[i] = -1
	}
	// Backwards: next holds, for a path and each of its parents, the
	// nearest write seen at or under it.
	next := map[[2]string]int{}
	for i := len(effects) - 1; i >= 0; i-- {
		switch e := effects[i]; e.Op {
		case OpDelete:
			if j, ok := next[[2]string{e.Root, e.Path}]; ok {
				later[i] = j
			}
		case OpWrite:
			for p := e.Path; p != "." && p != "/" && p != ""; p = path.Dir(p) {
				next[[2]string{e.Root, p}] = i
			}
		}
	}
	return later
}

// landed reports whether effects[j], a write after a delete at or above
// its path, was applied already: its staging file is gone. Effects apply
// in order, so the delete was applied before it, and what is at the
// delete's path now is the write's (or newer), never the deleted entry.
func landed(r *os.Root, effects []Effect, j int) bool {
	if j < 0 {
		return false
	}
	_, err := r.Lstat(effects[j].Stage)
	return absent(err)
}

// madeLater reports whether the path of del holds what one of later puts
// there: the directory a mkdir makes, or the content a write stages.
func madeLater(later []Effect, del Effect, cur string, mode fs.FileMode) bool {
	for _, e := range later {
		if e.Root != del.Root || e.Path != del.Path {
			continue
		}
		if e.Op == OpMkdir && mode.IsDir() || e.Op == OpWrite && mode.IsRegular() && cur == e.NewHash {
			return true
		}
	}
	return false
}

// absent reports whether err says that nothing is at a path: it does not
// exist, or one of its parents is not a directory (a directory that an
// applied effect replaced with a file).
func absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// currentHash returns the digest of the regular file rel ("" for anything
// else; a link to a regular file has the file's digest, as Stage hashes
// the targets it writes), the type bits of rel itself (not followed), and
// whether anything exists at rel.
func currentHash(r *os.Root, rel string) (string, fs.FileMode, bool, error) {
	fi, err := r.Lstat(rel)
	if absent(err) {
		return "", 0, false, nil
	} else if err != nil {
		return "", 0, false, err
	}
	h, _, err := hashFile(r, rel)
	if errors.Is(err, errNotRegular) || absent(err) {
		return "", fi.Mode().Type(), true, nil
	}
	return h, fi.Mode().Type(), true, err
}
