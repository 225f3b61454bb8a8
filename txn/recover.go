package txn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"sort"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
)

// Recovered reports what Recover did.
type Recovered struct {
	Redone     []Intent // decided intents whose effects were applied again
	RolledBack []Intent // prepared intents that were undone
	Unknown    []Intent // prepared external intents: outcome_unknown
	// Conflicts are effects of decided intents that recovery did not
	// apply because their target no longer held the content they were
	// staged against, or their staging file no longer held the committed
	// content, or the file system refused them for good (see Redo); and
	// staging files, of any intent, that the file system refused to
	// remove (Op OpCleanup, Reason ConflictRefused).
	Conflicts []Conflict
}

// Conflict is a decided effect left unapplied by recovery, for Reason:
// ConflictTarget, the target Path (under Root) holds content of digest
// Found ("" when absent or not a regular file) while the effect was
// staged against Want ("" for a write of a new file, and for a delete of
// a directory or a link); or
// ConflictStaging, the staging file holds content of digest Found instead
// of the committed content Want, and the target was left as it was; or
// ConflictRefused, the file system refused the effect for a reason that
// trying again cannot cure (Error says which: a read-only file system, a
// mount point, an immutable file, a directory without write permission),
// Want being the effect's new content (a write) or its pre-image (a
// delete); for Op OpCleanup, Path is a staging file that could not be
// removed and is left.
type Conflict struct {
	OperationID string `json:"operation_id"`
	Op          string `json:"op"`
	Root        string `json:"root"`
	Path        string `json:"path"`
	Reason      string `json:"reason"`
	Want        string `json:"want"`
	Found       string `json:"found"`
	Error       string `json:"error,omitempty"`
}

// Conflict reasons.
const (
	ConflictTarget  = "target_changed"  // the target no longer holds the pre-image
	ConflictStaging = "staging_damaged" // the staged content is not the committed content
	ConflictRefused = "apply_refused"   // the file system refuses the effect for good
)

// Recover finishes what a crash or a fail stop interrupted; run it at
// open, before any call. Decided intents are applied again in commit
// order (Redo: each file's pre-image is checked, so an older staged
// version never replaces newer content), their leftover staging files
// are removed, and they are removed;
// prepared ones lose their staging files and are rolled back, and
// onRollback is called in the same transaction so the caller can audit
// each one. A prepared External intent (an effect elsewhere may have
// happened) is not rolled back: onRollback alone ends it, and must call
// Unknown with the outcome_unknown result it records — unless it is a
// Read, which is rolled back (its key released) before onRollback
// records it.
func Recover(ctx context.Context, db *store.DB, onRollback func(*bbolt.Tx, *Intent) error) (Recovered, error) {
	var rec Recovered
	var intents []Intent
	if err := db.View(func(tx *bbolt.Tx) error {
		var err error
		intents, err = Intents(tx)
		return err
	}); err != nil {
		return rec, err
	}
	roots := recoveryRoots{roots: rootCache{}}
	defer roots.close()
	// Decided intents first, in commit order: a later commit of a path
	// was staged on the content an earlier one left.
	sort.SliceStable(intents, func(i, j int) bool {
		a, b := &intents[i], &intents[j]
		if (a.State == Decided) != (b.State == Decided) {
			return a.State == Decided
		}
		return a.CommitSeq < b.CommitSeq
	})
	for i := range intents {
		in := &intents[i]
		switch in.State {
		case Decided:
			conflicts, err := Redo(in.OperationID, in.Effects, roots.open)
			if err == nil {
				var left []Conflict
				left, err = removeStaging(in, roots.open)
				conflicts = append(conflicts, unreported(in, conflicts, left)...)
			}
			if err != nil {
				return rec, fmt.Errorf("txn: redo operation %s: %w", in.OperationID, err)
			}
			rec.Conflicts = append(rec.Conflicts, conflicts...)
			if err := roots.sync(); err != nil {
				return rec, fmt.Errorf("txn: redo operation %s: %w", in.OperationID, err)
			}
			if err := db.Update(ctx, func(tx *bbolt.Tx) error { return Finish(tx, in.OperationID) }); err != nil {
				return rec, err
			}
			rec.Redone = append(rec.Redone, *in)
		case Prepared:
			left, err := removeStaging(in, roots.open)
			if err != nil {
				return rec, fmt.Errorf("txn: roll back operation %s: %w", in.OperationID, err)
			}
			rec.Conflicts = append(rec.Conflicts, left...)
			if err := db.Update(ctx, func(tx *bbolt.Tx) error {
				if !in.External || in.Read {
					if err := Rollback(tx, in); err != nil {
						return err
					}
				}
				return abortIf(onRollback(tx, in))
			}); err != nil {
				return rec, err
			}
			if in.External {
				rec.Unknown = append(rec.Unknown, *in)
			} else {
				rec.RolledBack = append(rec.RolledBack, *in)
			}
		default:
			return rec, fmt.Errorf("txn: intent %s has unknown state %q", in.OperationID, in.State)
		}
	}
	return rec, nil
}

// removeStaging deletes every staging file of in from its staging dirs
// (never crossing into another file system: removeTree). One the file
// system refuses to remove for good (lasting) is left and reported as a
// ConflictRefused of op OpCleanup, so that it never blocks recovery.
func removeStaging(in *Intent, root func(string) (*os.Root, error)) ([]Conflict, error) {
	var left []Conflict
	leave := func(d StageDir, name string, err error) error {
		if !lasting(err) {
			return err
		}
		left = append(left, Conflict{OperationID: in.OperationID, Op: OpCleanup, Root: d.Root, Path: path.Join(d.Dir, name),
			Reason: ConflictRefused, Error: err.Error()})
		return nil
	}
	for _, d := range in.Dirs {
		r, err := root(d.Root)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return left, err
		}
		f, err := r.Open(d.Dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			if err := leave(d, "", err); err != nil {
				return left, err
			}
			continue
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			if err := leave(d, "", err); err != nil {
				return left, err
			}
			continue
		}
		for _, n := range names {
			if !isStaging(n, in.OperationID) {
				continue
			}
			if err := removeTree(r, path.Join(d.Dir, n)); err != nil && !absent(err) {
				if err := leave(d, n, err); err != nil {
					return left, err
				}
			}
		}
	}
	return left, nil
}

// unreported returns the conflicts of left (staging files left by
// removeStaging) but those of a staging or trash file whose effect of in
// is among refused already: one refusal is reported once.
func unreported(in *Intent, refused, left []Conflict) []Conflict {
	seen := map[[2]string]bool{}
	for _, c := range refused {
		if c.Reason != ConflictRefused {
			continue
		}
		for _, e := range in.Effects {
			if e.Op == c.Op && e.Root == c.Root && e.Path == c.Path {
				seen[[2]string{e.Root, e.Stage}] = true
			}
		}
	}
	return slices.DeleteFunc(left, func(c Conflict) bool { return seen[[2]string{c.Root, c.Path}] })
}

type rootCache map[string]*os.Root

func (c rootCache) open(dir string) (*os.Root, error) {
	if r, ok := c[dir]; ok {
		return r, nil
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	c[dir] = r
	return r, nil
}

func (c rootCache) close() {
	for _, r := range c {
		r.Close()
	}
}

// recoveryRoots are the roots recovery opens, each file system's syncfs
// descriptor opened with the first root on it, before recovery changes
// anything there (see fileSystems).
type recoveryRoots struct {
	roots rootCache
	fs    fileSystems
}

func (c *recoveryRoots) open(dir string) (*os.Root, error) {
	r, err := c.roots.open(dir)
	if err != nil {
		return nil, err
	}
	if _, err := c.fs.watch(r); err != nil {
		return nil, err
	}
	return r, nil
}

func (c *recoveryRoots) sync() error {
	var roots []*os.Root
	for _, r := range c.roots {
		roots = append(roots, r)
	}
	return c.fs.sync(roots)
}

func (c *recoveryRoots) close() {
	c.fs.close()
	c.roots.close()
}
