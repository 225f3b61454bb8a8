package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
)

// Apply makes decided effects visible: staged files are renamed onto their
// targets, deleted targets are removed where they are (needing no new
// directory entry, so a full file system cannot refuse it), directories are
// made, and a cleanup effect removes a staging pool emptied by the
// renames. A directory is made with owner rwx added to its mode, and is
// given its final mode only after every other effect has landed, so that
// a directory the call made read-only still takes the files the call put
// in it. A removal never crosses into another file system mounted below
// the removed entry (see removeTree). It is idempotent, so recovery can
// run it again after a crash,
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
		if !onDisk(e.Op) {
			continue
		}
		r, err := root(e.Root)
		if err == nil {
			err = change(r, e, false, func() error { return applyEffect(r, effects, i, later) })
		}
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
		}
	}
	return finalModes(effects, root, func(e Effect, err error) error {
		return fmt.Errorf("apply %s %s: %w", e.Op, e.Path, err)
	})
}

// onDisk reports whether op is an effect Apply carries out in a root.
func onDisk(op string) bool {
	return op == OpWrite || op == OpDelete || op == OpMkdir || op == OpCleanup
}

// applyEffect carries out effects[i] under r, as Apply does; later is
// laterWrites(effects). Nothing at a path counts as done.
func applyEffect(r *os.Root, effects []Effect, i int, later []int) error {
	var err error
	switch e := effects[i]; e.Op {
	case OpWrite:
		if err = noRoom(r.Rename(e.Stage, e.Path)); absent(err) {
			var done bool
			if done, err = renamedAlready(r, effects, i); err == nil && !done {
				err = fmt.Errorf("staging file %s is gone and %s does not hold the committed content %s", e.Stage, e.Path, e.NewHash)
			}
		}
	case OpDelete:
		// Removed where it is: a rename aside would need a new entry
		// in the directory, which a full file system refuses (ENOSPC)
		// after the commit. A tree removed in part before a crash is
		// still a directory, and Redo removes the rest.
		if !landed(r, effects, later[i]) {
			err = removeTree(r, e.Path)
		}
		if err == nil || absent(err) {
			err = removeTrash(r, e)
		}
	case OpMkdir:
		// Owner rwx until finalModes: see Apply.
		err = noRoom(r.Mkdir(e.Path, fs.FileMode(e.Mode).Perm()|0o700))
		if errors.Is(err, fs.ErrExist) {
			err = nil
		}
	case OpCleanup:
		err = removeTree(r, e.Stage)
	}
	if absent(err) {
		return nil
	}
	return err
}

// removeTrash removes the trash entry of delete e, if it names one: a
// build before in-place deletes moved the deleted entry aside under
// e.Stage (TrashPrefix) and removed it there, and may have stopped in
// between. Deletes staged now name none.
func removeTrash(r *os.Root, e Effect) error {
	if e.Stage == "" {
		return nil
	}
	return removeTree(r, e.Stage)
}

// renamedAlready reports, of a write, effects[i], whose staging file is
// gone, whether it was renamed already (by an earlier attempt of Apply,
// or before a crash): its target holds its content, or a later effect of
// the same call at or above its path may have changed it since. Anything
// else — the staging file removed, or hidden by a mount that appeared
// over its directory — means the committed content is not where the call
// put it.
func renamedAlready(r *os.Root, effects []Effect, i int) (bool, error) {
	e := effects[i]
	for _, l := range effects[i+1:] {
		if l.Root == e.Root && l.Path != "" && (l.Path == e.Path || strings.HasPrefix(e.Path, l.Path+"/")) {
			return true, nil
		}
	}
	cur, _, present, err := currentHash(r, e.Path)
	return present && cur == e.NewHash, err
}

// chmodDurably gives directory e.Path, which mkdir e made, its final
// mode; on another mount than its root (Mounted) it is opened first and
// fsynced after, since the final mode may deny the kernel's user the read
// an open after it needs.
func chmodDurably(r *os.Root, e Effect) error {
	var d mountedDir
	if e.Mounted {
		var err error
		if d, err = openSyncDir(r, e.Path); err != nil {
			return err
		}
		defer d.close()
	}
	if err := r.Chmod(e.Path, fs.FileMode(e.Mode).Perm()); err != nil {
		return err
	}
	return d.sync(false)
}

// finalModes gives each directory a mkdir of effects made its mode, the
// deepest first (a parent made unsearchable would hide its children
// from chmod); a path that is not a directory is left. A failure is
// passed to fail, which returns the error that stops finalModes or nil
// to go on.
func finalModes(effects []Effect, root func(dir string) (*os.Root, error), fail func(Effect, error) error) error {
	for _, e := range slices.Backward(effects) {
		if e.Op != OpMkdir {
			continue
		}
		r, err := root(e.Root)
		if err == nil {
			var fi fs.FileInfo
			if fi, err = r.Lstat(e.Path); err == nil && fi.IsDir() {
				err = chmodDurably(r, e)
			}
		}
		if err != nil && !absent(err) {
			if err := fail(e, err); err != nil {
				return err
			}
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
// target left as it was. An effect the file system refuses for a reason
// that trying again cannot cure (see lasting: a read-only file system, a
// mount point, an immutable file, a directory without write permission)
// is left undone and reported as a Conflict (ConflictRefused, its error
// in Error); the other effects still apply, so one refused effect never
// blocks recovery. Staging and trash files of the effects are gone
// afterwards (but those the file system refuses to remove), and a second
// Redo of the same effects changes nothing. An error is returned only for
// a failure that may pass (a disk error, a full disk) or for a root that
// cannot be opened.
func Redo(operationID string, effects []Effect, root func(dir string) (*os.Root, error)) ([]Conflict, error) {
	var conflicts []Conflict
	refuse := func(e Effect, err error) error {
		if !lasting(err) {
			return fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
		conflicts = append(conflicts, refusal(operationID, e, err))
		return nil
	}
	// Which effects lie on another mount than their root's top is read
	// now, where the changes land, not taken from the intent: an intent
	// decided by a build before Effect.Mounted has none, and a mount may
	// have come or gone since the staging.
	effects = mountedNow(effects, root)
	later := laterWrites(effects)
	for i, e := range effects {
		if !onDisk(e.Op) {
			continue
		}
		r, err := root(e.Root)
		if err != nil {
			return conflicts, fmt.Errorf("redo %s %s: %w", e.Op, e.Path, err)
		}
		var c *Conflict
		err = change(r, e, true, func() (err error) {
			if e.Op == OpWrite || e.Op == OpDelete {
				c, err = redoEffect(operationID, r, effects, i, later)
				return err
			}
			return applyEffect(r, effects, i, later)
		})
		if c != nil {
			conflicts = append(conflicts, *c)
		}
		if err == nil {
			continue
		}
		if err := refuse(e, err); err != nil {
			return conflicts, err
		}
		if e.Op == OpWrite {
			// The write is not applied: its staging file goes, if the
			// file system lets it (Recover's removeStaging tries again).
			r.Remove(e.Stage)
		}
	}
	err := finalModes(effects, root, refuse)
	return conflicts, err
}

// redoEffect redoes the write or delete effects[i] under r, as Redo
// describes; it returns the conflict it finds, if any.
func redoEffect(operationID string, r *os.Root, effects []Effect, i int, later []int) (*Conflict, error) {
	e := effects[i]
	cur, mode, present, err := currentHash(r, e.Path)
	if err != nil {
		return nil, err
	}
	var c *Conflict
	conflict := func(reason, want, found string) {
		c = &Conflict{OperationID: operationID, Op: e.Op, Root: e.Root, Path: e.Path, Reason: reason, Want: want, Found: found}
	}
	switch e.Op {
	case OpWrite:
		if _, serr := r.Lstat(e.Stage); absent(serr) {
			done, err := renamedAlready(r, effects, i)
			if err == nil && !done {
				conflict(ConflictStaging, e.NewHash, cur)
			}
			return c, err
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
				err = noRoom(r.Rename(e.Stage, e.Path))
				if absent(err) {
					// The staging file is there (above), so the target's
					// directory is missing or is no directory (its mkdir was
					// refused, or something else stands there): the write
					// cannot land, and is reported, never taken for done.
					rc := refusal(operationID, e, err)
					c, err = &rc, r.Remove(e.Stage)
				}
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
			err = removeTree(r, e.Path)
		case madeLater(effects[i+1:], e, cur, mode):
		default:
			conflict(ConflictTarget, e.OldHash, cur)
		}
		if err == nil || absent(err) {
			err = removeTrash(r, e)
		}
	}
	if absent(err) {
		err = nil
	}
	return c, err
}

// escapes is the text of os.Root's error for a path that leads out of
// the root (a directory of it replaced by a link outward since the
// effect was staged): os does not export it, and TestRedoUnderLinkOut
// fails should its wording change.
const escapes = "path escapes from parent"

// refusal is the conflict reporting effect e of operation op refused by
// the file system with err.
func refusal(op string, e Effect, err error) Conflict {
	want := e.NewHash
	if e.Op == OpDelete {
		want = e.OldHash
	}
	return Conflict{OperationID: op, Op: e.Op, Root: e.Root, Path: e.Path, Reason: ConflictRefused, Want: want, Error: err.Error()}
}

// Refused reports whether err, from Apply, is a refusal by the file
// system that trying again cannot cure, or a rename or mkdir that found
// no room for its entry (see lasting): Redo reports such an effect as a
// ConflictRefused instead of failing.
func Refused(err error) bool { return lasting(err) }

// lasting reports whether err is a refusal by the file system that trying
// again cannot cure: no permission (EACCES, EPERM: a directory without
// write permission, a sticky directory, an immutable or append-only
// file), a mount point or another file system (EBUSY, EXDEV), a read-only
// file system (EROFS), an entry the operation cannot take (ENOTEMPTY,
// EISDIR, ELOOP, ENAMETOOLONG, EMLINK, EINVAL), a path that now leads
// out of its root (os.Root refuses to follow it), or a rename or mkdir
// refused for want of room for its directory entry (ENOSPC, EDQUOT: see
// noRoom). A disk error (EIO), a full disk or quota met by anything else
// (a write, whose data may be partly on the disk), a failed fsync of a
// change made (ErrNotDurable, whatever its errno) and anything else may
// pass, or mean that what is on the disk cannot be trusted: they are not
// lasting.
func lasting(err error) bool {
	if errors.Is(err, ErrNotDurable) {
		return false // an fsync failed after the change: see ErrNotDurable
	}
	var nr *noRoomError
	if errors.As(err, &nr) {
		return true
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err.Error() == escapes {
		return true
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EACCES, syscall.EPERM, syscall.EBUSY, syscall.EXDEV, syscall.EROFS, syscall.ENOTEMPTY,
		syscall.EISDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EMLINK, syscall.EINVAL:
		return true
	}
	return false
}

// noRoomError is the error of a rename(2) or mkdir(2) that the file
// system refused for want of room for the new directory entry (ENOSPC,
// EDQUOT). Either call is atomic, so the refusal changed nothing; and
// it lasts as long as the file system stays full, which may be as long
// as an agent keeps it full. Unlike a write's ENOSPC, it says nothing
// about the disk: recovery reports the effect as a ConflictRefused
// rather than refusing to start (staging checks the room before the
// commit, see checkRoom, so only a file system filled meanwhile by
// someone else gets here).
type noRoomError struct{ err error }

func (e *noRoomError) Error() string { return e.err.Error() }
func (e *noRoomError) Unwrap() error { return e.err }

// noRoom returns err, from a rename or a mkdir, as a *noRoomError if it
// is ENOSPC or EDQUOT.
func noRoom(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return &noRoomError{err}
	}
	return err
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
