package txn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/syscalls"
)

// Effect kinds.
const (
	OpWrite  = "write"
	OpDelete = "delete"
	OpKVPut  = "kv_put"
	// OpMkdir makes directory Path (mode Mode); it is not staged, and
	// applying it again is a no-op.
	OpMkdir = "mkdir"
	// OpCleanup removes the staging pool Stage once its files are renamed
	// into place; it is not part of the delta.
	OpCleanup = "cleanup"
)

// Effect is one staged change. For OpWrite, Stage is the staging file that
// Apply renames onto Path; an OpDelete has none (Apply removes Path where
// it is), but one decided by an older build may name the trash entry it
// moved Path to before removing it, which Apply and Redo remove too.
// Paths are relative to Root.
type Effect struct {
	Op      string          `json:"op"`
	Root    string          `json:"root,omitempty"`
	Path    string          `json:"path,omitempty"`
	Stage   string          `json:"stage,omitempty"`
	Key     string          `json:"key,omitempty"`
	Value   json.RawMessage `json:"value,omitempty"`
	Version uint64          `json:"version,omitempty"`
	OldHash string          `json:"old_hash,omitempty"`
	NewHash string          `json:"new_hash,omitempty"`
	Size    int64           `json:"size"`
	Mode    uint32          `json:"mode,omitempty"` // OpMkdir: permission bits
	// Mounted says that Path's directory is on another mount than the top
	// of Root, which the Syncer's syncfs of Root's file system does not
	// reach: the effect is made durable by fsync (see mounted.go).
	Mounted bool `json:"mounted,omitempty"`
}

func (e Effect) change() DeltaChange {
	c := DeltaChange{Op: e.Op, Root: e.Root, Path: e.Path, Key: e.Key, OldHash: e.OldHash, NewHash: e.NewHash, Size: e.Size}
	if e.Op == OpKVPut {
		c.NewVersion = e.Version
		c.OldVersion = e.Version - 1
	}
	return c
}

// StagePrefix starts the names of staging files; TrashPrefix the names that
// deleted targets took just before removal, in builds before deletes were
// made in place (recovery and the workspace check still know them). Both
// are followed by the operation id, "-" and a sequence number.
const (
	StagePrefix = ".capk-stage-"
	TrashPrefix = ".capk-trash-"
)

// Stage collects the effects of one call without making them visible. It
// implements syscalls.Stager. After Discard, staging fails, so a handler
// that outlives its call's timeout cannot leave files behind.
type Stage struct {
	opID string
	kv   syscalls.KVReader
	sync *Syncer

	mu      sync.Mutex
	closed  bool
	effects []Effect
	touched []*syscalls.Resource // the fs resources effects were staged for (Touched)
	roots   map[string]*os.Root
	kvSeen  map[string]bool
	pools   map[string]string // root path -> staging pool dir (WriteFrom)
}

// NewStage starts staging for operation opID; kv reads current versions.
// Before anything is staged under a root, sync watches its file system
// (Syncer.Watch), so that the Syncer's later rounds report any writeback
// error of what is staged there; sync must not be nil.
func NewStage(opID string, kv syscalls.KVReader, sync *Syncer) *Stage {
	return &Stage{opID: opID, kv: kv, sync: sync, roots: map[string]*os.Root{}, kvSeen: map[string]bool{}, pools: map[string]string{}}
}

var errStageClosed = errors.New("txn: the call's transaction is over; nothing more can be staged")

func (s *Stage) name(prefix, rel string) string {
	return path.Join(path.Dir(rel), prefix+s.opID+"-"+strconv.Itoa(len(s.effects)))
}

// WriteFile stages content for r: a new file beside the target. perm 0
// keeps the mode of an existing file (0644 for a new one). The caller makes
// staged files durable (Syncer) before it commits. A target Apply could
// not replace (a mount point, an immutable file, another user's file in
// a sticky directory: see checkReplace), or a new one on a file system
// too full to take its directory entry (see checkRoom), is refused with a
// *NotApplicableError.
func (s *Stage) WriteFile(r *syscalls.Resource, content []byte, perm fs.FileMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStageClosed
	}
	top, err := s.top(r)
	if err != nil {
		return err
	}
	dirMount, ok, err := checkReplace(r.Root, r.Rel)
	if err != nil {
		return err
	}
	mounted := ok && dirMount.id != top.id
	old, oldMode, err := hashFile(r.Root, r.Rel)
	if err != nil {
		return err
	}
	if perm == 0 {
		perm = 0o644
		if old != "" {
			perm = oldMode.Perm()
		}
	}
	if err := s.use(r); err != nil {
		return err
	}
	name := s.name(StagePrefix, r.Rel)
	e := Effect{
		Op: OpWrite, Root: r.RootPath, Path: r.Rel, Stage: name,
		OldHash: old, NewHash: digest.Sum(content), Size: int64(len(content)), Mounted: mounted,
	}
	// On another mount, the staging file and its name are fsynced here,
	// through descriptors opened before they are written (see mounted.go).
	dir, err := openMounted(r.Root, e)
	if err != nil {
		return fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	defer dir.close()
	f, err := r.Root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: parent directory does not exist", r.Rel)
	}
	if err != nil {
		return fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	// The entry goes in before the write so Discard removes a partial file.
	s.effects = append(s.effects, e)
	s.touched = append(s.touched, r)
	_, err = f.Write(content)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && old == "" {
		// A new name: the rename onto it adds a directory entry. Checked
		// after the content took its blocks, and before the fsync on
		// another mount (see checkRoom for the syncfs elsewhere), whose
		// journal commit most likely holds the check's freeing too.
		if err = checkRoom(r.Root, path.Dir(r.Rel), r.Rel); err != nil {
			f.Close()
			return err
		}
	}
	if err == nil && mounted {
		err = fsync(f, name)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = dir.sync(false)
	}
	if err != nil {
		return fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	return nil
}

// use adds r's root to the roots the stage touches, having the Syncer
// watch its file system first: before anything is staged under it.
func (s *Stage) use(r *syscalls.Resource) error {
	if _, ok := s.roots[r.RootPath]; ok {
		return nil
	}
	if err := s.sync.Watch(r.Root); err != nil {
		return fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	s.roots[r.RootPath] = r.Root
	return nil
}

// WriteFrom stages the content read from src for r with mode perm and
// returns its digest. Unlike WriteFile, the staging file goes into a pool
// directory at the top of r's root (.capk-stage-<op>-pool), so the target's
// parent may be a directory that an earlier Mkdir of this stage makes; the
// content is streamed, never held in memory. Apply renames it into place
// and a cleanup effect, added by Effects, removes the pool. A target Apply
// could not write (on another mount than the pool, in a directory the
// kernel's user cannot write: see checkCreate), or a new one on a file
// system too full to take its directory entry (see checkRoom), is
// refused with a *NotApplicableError.
func (s *Stage) WriteFrom(r *syscalls.Resource, src io.Reader, perm fs.FileMode) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errStageClosed
	}
	top, err := s.top(r)
	if err != nil {
		return "", err
	}
	if _, err := checkCreate(r.Root, r.Rel, &top); err != nil {
		return "", err
	}
	old, _, err := hashFile(r.Root, r.Rel)
	if err != nil && !errors.Is(err, errNotRegular) {
		return "", err
	}
	pool, ok := s.pools[r.RootPath]
	if !ok {
		if err := s.use(r); err != nil {
			return "", err
		}
		pool = StagePrefix + s.opID + "-pool"
		if err := r.Root.Mkdir(pool, 0o700); err != nil {
			return "", fmt.Errorf("stage %s: %w", r.Rel, err)
		}
		s.pools[r.RootPath] = pool
	}
	name := pool + "/" + strconv.Itoa(len(s.effects))
	f, err := r.Root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	h := blake3.New()
	n, err := io.Copy(io.MultiWriter(f, h), src)
	if err == nil {
		err = f.Chmod(perm.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	var sum [digest.Size]byte
	h.Sum(sum[:0])
	e := Effect{Op: OpWrite, Root: r.RootPath, Path: r.Rel, Stage: name, OldHash: old, NewHash: digest.Format(sum), Size: n}
	s.effects, s.touched = append(s.effects, e), append(s.touched, r)
	if old == "" {
		// A new name (or one a directory or link holds now, which an
		// earlier delete of the call removes): the rename adds an entry.
		if err := checkRoom(r.Root, path.Dir(r.Rel), r.Rel); err != nil {
			return "", err
		}
	}
	return e.NewHash, nil
}

// Mkdir stages making directory r (absent now) with mode perm. A
// directory Apply could not make (see checkCreate; on a file system too
// full to take it, see checkRoom) is refused with a *NotApplicableError.
func (s *Stage) Mkdir(r *syscalls.Resource, perm fs.FileMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStageClosed
	}
	top, err := s.top(r)
	if err != nil {
		return err
	}
	dirMount, err := checkCreate(r.Root, r.Rel, nil)
	if err != nil {
		return err
	}
	if err := checkRoom(r.Root, path.Dir(r.Rel), r.Rel); err != nil {
		return err
	}
	if err := s.use(r); err != nil {
		return err
	}
	s.effects = append(s.effects, Effect{Op: OpMkdir, Root: r.RootPath, Path: r.Rel, Mode: uint32(perm.Perm()), Mounted: dirMount.id != top.id})
	s.touched = append(s.touched, r)
	return nil
}

// Delete stages the removal of r (a file, a symlink or a directory tree).
// An entry Apply could not remove, or a tree holding one (a mount point,
// an immutable file, a directory the kernel's user cannot write: see
// checkDelete), is refused with a *NotApplicableError.
func (s *Stage) Delete(r *syscalls.Resource) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStageClosed
	}
	fi, err := r.Root.Lstat(r.Rel)
	if err != nil {
		return fmt.Errorf("delete %s: %w", r.Rel, err)
	}
	top, err := s.top(r)
	if err != nil {
		return err
	}
	dirMount, err := checkDelete(r.Root, r.Rel)
	if err != nil {
		return err
	}
	var old string
	if fi.Mode().IsRegular() {
		if old, _, err = hashFile(r.Root, r.Rel); err != nil {
			return err
		}
	}
	if err := s.use(r); err != nil {
		return err
	}
	s.effects = append(s.effects, Effect{
		Op: OpDelete, Root: r.RootPath, Path: r.Rel,
		OldHash: old, Size: fi.Size(), Mounted: dirMount.id != top.id,
	})
	s.touched = append(s.touched, r)
	return nil
}

// top returns the mount of the top of r's root, where WriteFrom's pool
// goes and the Syncer's syncfs of r's root reaches (the Syncer watches
// r's root first).
func (s *Stage) top(r *syscalls.Resource) (mountID, error) {
	fs, err := s.sync.fs.watch(r.Root)
	if err != nil {
		return mountID{}, fmt.Errorf("stage %s: %w", r.Rel, err)
	}
	return fs.top, nil
}

// PutKV stages value under key and returns the version it will have.
func (s *Stage) PutKV(key string, value json.RawMessage) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errStageClosed
	}
	if s.kvSeen[key] {
		return 0, fmt.Errorf("kv %q is already put by this call", key)
	}
	_, v, _, err := s.kv.GetKV(key)
	if err != nil {
		return 0, err
	}
	s.kvSeen[key] = true
	s.effects = append(s.effects, Effect{
		Op: OpKVPut, Key: key, Value: append(json.RawMessage(nil), value...), Version: v + 1,
		NewHash: digest.Sum(value), Size: int64(len(value)),
	})
	return v + 1, nil
}

// Touched returns the fs resources effects were staged for so far, in
// staging order, as the syscall resolved them (Access says write or
// delete; a made directory is a write): what a call changed, for a
// syscall that changes what its arguments do not name (proc.exec's
// delta, which the kernel decides again by policy before it commits).
func (s *Stage) Touched() []*syscalls.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.touched)
}

// Effects closes the stage and returns what it holds, in staging order,
// followed by the removal of each staging pool.
func (s *Stage) Effects() []Effect {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		roots := make([]string, 0, len(s.pools))
		for root := range s.pools {
			roots = append(roots, root)
		}
		sort.Strings(roots)
		for _, root := range roots {
			s.effects = append(s.effects, Effect{Op: OpCleanup, Root: root, Stage: s.pools[root]})
		}
	}
	return s.effects
}

// Discard closes the stage and removes its staging files.
func (s *Stage) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for _, e := range s.effects {
		if e.Op != OpWrite {
			continue
		}
		if err := s.roots[e.Root].Remove(e.Stage); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for root, pool := range s.pools {
		if err := s.roots[root].RemoveAll(pool); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Root returns the opened root of a staged effect's Root path, if any.
func (s *Stage) Root(dir string) (*os.Root, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.roots[dir]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("no staged effect under %s", dir)
}

// Roots returns the roots the staged effects touch.
func (s *Stage) Roots() []*os.Root {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*os.Root, 0, len(s.roots))
	for _, r := range s.roots {
		out = append(out, r)
	}
	return out
}

// FileRoots returns the roots under which the stage holds staging files:
// what must be made durable (Syncer.Sync) before the commit. A delete, a
// directory or a kv put stages nothing on disk before Apply, so a stage
// of only those needs no sync before its commit.
func (s *Stage) FileRoots() []*os.Root {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*os.Root
	seen := map[string]bool{}
	for _, e := range s.effects {
		if e.Op == OpWrite && !seen[e.Root] {
			seen[e.Root] = true
			out = append(out, s.roots[e.Root])
		}
	}
	return out
}

// errNotRegular marks a path that exists but is not a regular file.
var errNotRegular = errors.New("not a regular file")

// hashFile returns the digest and mode of the regular file rel, or "" when
// nothing exists there (nor can: a parent is not a directory, as when a
// proc.exec delta replaces the file f with a directory and writes f/y).
func hashFile(root *os.Root, rel string) (string, fs.FileMode, error) {
	// O_NONBLOCK: a fifo put there by anyone opens at once (and is
	// refused below) rather than blocking the call, its locks held.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if absent(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", rel, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, fmt.Errorf("stat %s: %w", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fi.Mode(), fmt.Errorf("%s: %w", rel, errNotRegular)
	}
	hb := hashers.Get().(*hashBuf)
	defer hashers.Put(hb)
	hb.h.Reset()
	// Read only through Read: *os.File's WriteTo would copy through a
	// 32 KiB buffer of its own, per file.
	if _, err := io.CopyBuffer(&hb.h, struct{ io.Reader }{f}, hb.buf[:]); err != nil {
		return "", 0, fmt.Errorf("read %s: %w", rel, err)
	}
	var sum [digest.Size]byte
	hb.h.Sum(sum[:0])
	return digest.Format(sum), fi.Mode(), nil
}

// hashBuf is a BLAKE3 hasher and a read buffer, reused across hashFile
// calls: each would otherwise allocate 8 KiB of hasher and 32 KiB of
// buffer, several times per fs.write (the old content, preconditions,
// the staged file at apply).
type hashBuf struct {
	h   blake3.Hasher
	buf [32 << 10]byte
}

var hashers = sync.Pool{New: func() any { return &hashBuf{h: *blake3.New()} }}

// isStaging reports whether name is a staging or trash file of operation op.
func isStaging(name, op string) bool {
	for _, p := range []string{StagePrefix, TrashPrefix} {
		if rest, ok := strings.CutPrefix(name, p+op+"-"); ok && rest != "" {
			return true
		}
	}
	return false
}
