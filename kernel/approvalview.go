package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
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

// ApprovalDetail is a pending approval request with the call's arguments
// and the current state of every file it would write, so an approver can
// see the change (a diff, for fs.write and fs.patch).
type ApprovalDetail struct {
	ApprovalRequest
	Args  json.RawMessage `json:"args"`
	Files []FileState     `json:"files"`
}

// FileState is a file as it is now.
type FileState struct {
	Root      string `json:"root"` // the token's root it lies in
	Path      string `json:"path"` // relative to Root
	Exists    bool   `json:"exists"`
	Hash      string `json:"hash,omitempty"`      // blake3 of Content, when shown
	Content   string `json:"content,omitempty"`   // when it is UTF-8 text of at most MaxShownFile bytes
	Binary    bool   `json:"binary,omitempty"`    // not UTF-8: no content shown
	Truncated bool   `json:"truncated,omitempty"` // over MaxShownFile: no content shown
	Size      int64  `json:"size"`
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
// link out of it). Only a regular file is read; anything else is shown as
// there but unreadable. The open does not wait (O_NONBLOCK), so a FIFO
// put at the path does not hold the view until a writer comes.
func fileState(r *syscalls.Resource) FileState {
	st := FileState{Root: r.RootPath, Path: r.Rel}
	f, err := r.Root.OpenFile(r.Real, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			st.Exists, st.Binary = true, true // there, but unreadable: show nothing
		}
		return st
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
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
