package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
	"unicode/utf8"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/syscalls"
)

// approvalView is what an approver is shown of a waiting call beyond the
// request itself: its arguments and the files it would write.
type approvalView struct {
	args   json.RawMessage
	writes []*syscalls.Resource
}

func viewOf(c *call) approvalView {
	v := approvalView{args: c.env.Args}
	for _, r := range c.fs {
		if r.Access.Writes() {
			v.writes = append(v.writes, r)
		}
	}
	return v
}

// MaxShownFile bounds the current content of a file an approval detail
// carries.
const MaxShownFile = 256 << 10

// MaxCountedEntries bounds the walk that counts what a directory holds
// for an approval detail (a delete of a tree): past it the count stops
// and FileState.More says so.
const MaxCountedEntries = 10000

// ApprovalDetail is a pending approval request with the call's arguments
// and the current state of every file it would write, so an approver can
// see the change (a diff, for fs.write and fs.patch).
type ApprovalDetail struct {
	ApprovalRequest
	Args  json.RawMessage `json:"args"`
	Files []FileState     `json:"files"`
}

// FileState is what a call would write or delete, as it is now. Path is
// where the call acts, which the detail is to be titled with: a link
// inside the root on the way is resolved, as in the request's
// projected_effects, so a link cannot disguise the file that changes.
type FileState struct {
	Root      string `json:"root"`              // the token's root it lies in
	Path      string `json:"path"`              // where the call acts, relative to Root, links resolved
	Spelled   string `json:"spelled,omitempty"` // the agent's (cleaned) spelling, when it differs from Path
	Exists    bool   `json:"exists"`
	Hash      string `json:"hash,omitempty"`      // blake3 of Content, when shown
	Content   string `json:"content,omitempty"`   // when it is UTF-8 text of at most MaxShownFile bytes
	Binary    bool   `json:"binary,omitempty"`    // not UTF-8, or neither a file, a directory nor a link: no content shown
	Truncated bool   `json:"truncated,omitempty"` // over MaxShownFile: no content shown
	// Link is the target of a symbolic link at Path, which the call
	// replaces or removes (never following it); no content is shown.
	Link string `json:"link,omitempty"`
	// Dir says Path is a directory; Entries counts everything in it, at
	// any depth, and Size is then the bytes of the regular files among
	// them. More says the count stopped at MaxCountedEntries: both are
	// lower bounds.
	Dir     bool  `json:"dir,omitempty"`
	Entries int   `json:"entries,omitempty"`
	More    bool  `json:"more,omitempty"`
	Size    int64 `json:"size"` // of a file; of a directory, see Dir
}

// ApprovalDetail returns the pending approval id with the call's
// arguments and the files it would write as they are now, or an error
// wrapping ErrNotFound when no such request is pending.
func (k *Kernel) ApprovalDetail(id string) (ApprovalDetail, error) {
	k.approvals.mu.Lock()
	a := k.approvals.pending[id]
	var d ApprovalDetail
	if a != nil {
		d = ApprovalDetail{ApprovalRequest: a.req, Args: a.view.args}
	}
	k.approvals.mu.Unlock()
	if a == nil {
		return d, fmt.Errorf("approval %q is not pending: %w", id, ErrNotFound)
	}
	d.Files = []FileState{}
	for _, r := range a.view.writes {
		d.Files = append(d.Files, fileState(r))
	}
	return d, nil
}

// fileState reads r as it is now, through its root (never following a
// link out of it), at r.Real: a write or delete acts on the named path
// itself (syscalls.Workspace.Resolve), so a link there is shown as a link,
// not as what it leads to. A regular file is read, a directory counted
// (countDir); anything else is shown as there but unreadable. Opens do not
// wait (O_NONBLOCK), so a FIFO put at the path does not hold the view
// until a writer comes.
func fileState(r *syscalls.Resource) FileState {
	st := FileState{Root: r.RootPath, Path: r.Real}
	if r.Rel != r.Real {
		st.Spelled = r.Rel
	}
	if fi, err := r.Root.Lstat(r.Real); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		st.Exists = true
		if st.Link, err = r.Root.Readlink(r.Real); err != nil {
			st.Binary = true
		}
		return st
	}
	f, err := r.Root.OpenFile(r.Real, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			st.Exists, st.Binary = true, true // there, but unreadable: show nothing
		}
		return st
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		st.Exists, st.Binary = true, true
		return st
	case fi.IsDir():
		st.Exists, st.Dir = true, true
		st.Entries, st.Size, st.More = countDir(r.Root, r.Real, f)
		return st
	case !fi.Mode().IsRegular():
		st.Exists, st.Binary = true, true
		return st
	}
	st.Exists, st.Size = true, fi.Size()
	b, err := io.ReadAll(io.LimitReader(f, MaxShownFile+1))
	if err != nil {
		st.Binary = true
		return st
	}
	switch {
	case len(b) > MaxShownFile:
		st.Truncated = true
	case !utf8.Valid(b):
		st.Binary = true
	default:
		st.Content = string(b)
		st.Hash = digest.Sum(b)
	}
	return st
}

// countDir counts the entries under the directory dir of root (open as
// top), at any depth, and the bytes of the regular files among them,
// breadth first, stopping at MaxCountedEntries (more is then true). It
// holds one directory open at a time, follows no link, and opens
// subdirectories with O_DIRECTORY and O_NONBLOCK, so one swapped for a
// FIFO meanwhile fails instead of blocking. A directory it cannot read is
// counted as an entry with nothing in it.
func countDir(root *os.Root, dir string, top *os.File) (entries int, bytes int64, more bool) {
	queue := []string{dir}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		f := top
		if d != dir {
			var err error
			if f, err = root.OpenFile(d, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_DIRECTORY, 0); err != nil {
				continue
			}
		}
		for {
			list, err := f.ReadDir(256)
			for _, e := range list {
				if entries == MaxCountedEntries {
					more = true
					break
				}
				entries++
				switch {
				case e.IsDir():
					queue = append(queue, path.Join(d, e.Name()))
				case e.Type().IsRegular():
					if fi, err := e.Info(); err == nil {
						bytes += fi.Size()
					}
				}
			}
			if more || err != nil {
				break
			}
		}
		if f != top {
			f.Close()
		}
		if more {
			break
		}
	}
	return entries, bytes, more
}
