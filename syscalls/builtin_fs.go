package syscalls

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

// MaxListEntries caps the entries fs.list returns.
const MaxListEntries = 10000

type fsRead struct{}

func (*fsRead) Definition() Definition {
	return Definition{
		ID:          "fs.read",
		Description: "Read a file in the workspace. Returns UTF-8 text in content (or content_base64 for binary data), the file's full size, and whether the returned bytes were truncated.",
		SideEffect:  Read,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessRead}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"File path, relative to the workspace root."},
			"offset":{"type":"integer","minimum":0,"description":"Byte offset to start reading at (default 0)."},
			"max_bytes":{"type":"integer","minimum":1,"description":"Most bytes to return (capped by the kernel)."}},
			"required":["path"],"additionalProperties":false}`),
	}
}

func (*fsRead) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path     string `json:"path"`
		Offset   int64  `json:"offset"`
		MaxBytes int64  `json:"max_bytes"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	r := c.Resources[0]
	// What is not a regular file is refused right after the open (which
	// does not wait for a FIFO's writer).
	fd, err := r.openRead()
	if err != nil {
		return Output{}, fmt.Errorf("fs.read %s: %w", a.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Output{}, fmt.Errorf("fs.read %s: %w", a.Path, &os.PathError{Op: "fstat", Path: r.Rel, Err: err})
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return Output{}, fmt.Errorf("fs.read %s: is a directory (use fs.list)", a.Path)
	case unix.S_IFREG:
	default:
		return Output{}, fmt.Errorf("fs.read %s: not a regular file", a.Path)
	}
	limit := c.MaxReadBytes
	if a.MaxBytes > 0 && (limit <= 0 || a.MaxBytes < limit) {
		limit = a.MaxBytes
	}
	// Read one byte past the limit to learn whether there is more, into a
	// buffer of the size the file had (it may have changed since).
	size := st.Size
	bp := readBufs.Get().(*[]byte)
	data, err := preadUpTo(*bp, fd, a.Offset, limit+1, max(size-a.Offset, 0))
	// readResult copies the bytes into the result: the buffer is free
	// after it, unless it grew large.
	defer func() {
		if cap(data) <= maxPooledRead {
			*bp = data[:0]
			readBufs.Put(bp)
		}
	}()
	if err != nil {
		return Output{}, fmt.Errorf("fs.read %s: %w", a.Path, &os.PathError{Op: "read", Path: r.Rel, Err: err})
	}
	truncated := int64(len(data)) > limit
	if truncated {
		data = data[:limit]
	}
	return readResult(data, a.Path, a.Offset, size, truncated)
}

// readBufs holds fs.read's read buffers of up to maxPooledRead bytes.
var readBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledRead = 64 << 10

// readResult is fs.read's result object for data read from path at
// offset (the file being size bytes), canonical and as encoding/json
// writes it.
func readResult(data []byte, path string, offset, size int64, truncated bool) (Output, error) {
	field, content := "content", ""
	if utf8.Valid(data) {
		// A view of data, which is not modified after: the text is copied
		// only into the result. string(data) would be a copy of its own.
		content = unsafe.String(unsafe.SliceData(data), len(data))
	} else {
		field, content = "content_base64", base64.StdEncoding.EncodeToString(data)
	}
	o := jcs.Object{B: make([]byte, 0, len(content)+len(path)+128)}
	o.Int("bytes_returned", int64(len(data)))
	o.Str(field, content)
	o.Int("offset", offset)
	o.Str("path", path)
	o.Int("size", size)
	o.Bool("truncated", truncated)
	canon := o.End()
	if jcs.Plain(content) && jcs.Plain(path) && size <= 1<<53 && offset <= 1<<53 {
		// json.Marshal of the object would write these very bytes.
		return Output{Result: canon, Canonical: canon}, nil
	}
	// The members in sorted order, as encoding/json writes a map's.
	res := map[string]any{"bytes_returned": len(data), field: content, "offset": offset,
		"path": path, "size": size, "truncated": truncated}
	out, err := output(res)
	out.Canonical = canon
	return out, err
}

type fsList struct{}

func (*fsList) Definition() Definition {
	return Definition{
		ID:          "fs.list",
		Description: "List a directory in the workspace: each entry's name, type (file, dir, symlink, other) and size, sorted by name.",
		SideEffect:  Read,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessList}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"Directory path, relative to the workspace root (\".\" for the root)."}},
			"required":["path"],"additionalProperties":false}`),
	}
}

func (*fsList) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	r := c.Resources[0]
	f, err := r.Root.Open(r.Rel)
	if err != nil {
		return Output{}, fmt.Errorf("fs.list %s: %w", a.Path, err)
	}
	defer f.Close()
	des, err := f.ReadDir(-1)
	if err != nil {
		return Output{}, fmt.Errorf("fs.list %s: %w", a.Path, err)
	}
	sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
	truncated := len(des) > MaxListEntries
	if truncated {
		des = des[:MaxListEntries]
	}
	type entry struct {
		Name string `json:"name"`
		Type string `json:"type"`
		Size int64  `json:"size"`
	}
	entries := make([]entry, 0, len(des))
	for _, d := range des {
		e := entry{Name: d.Name(), Type: typeOf(d.Type())}
		if info, err := d.Info(); err == nil && e.Type == "file" {
			e.Size = info.Size()
		}
		entries = append(entries, e)
	}
	return output(map[string]any{"path": a.Path, "entries": entries, "truncated": truncated})
}

func typeOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

type fsStat struct{}

func (*fsStat) Definition() Definition {
	return Definition{
		ID:          "fs.stat",
		Description: "Describe a path in the workspace: whether it exists, its type, size, mode, modification time and, for a regular file, the blake3 digest of its content (usable in an fs precondition).",
		SideEffect:  Read,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessStat}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"Path, relative to the workspace root."}},
			"required":["path"],"additionalProperties":false}`),
	}
}

func (*fsStat) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	r := c.Resources[0]
	fi, err := r.Root.Stat(r.Rel)
	if errors.Is(err, fs.ErrNotExist) {
		return output(map[string]any{"path": a.Path, "exists": false})
	}
	if err != nil {
		return Output{}, fmt.Errorf("fs.stat %s: %w", a.Path, err)
	}
	res := map[string]any{
		"path": a.Path, "exists": true, "type": typeOf(fi.Mode()), "size": fi.Size(),
		"mode": "0" + strconv.FormatUint(uint64(fi.Mode().Perm()), 8), "mtime": fi.ModTime().UTC().Format(time.RFC3339Nano),
	}
	if fi.Mode().IsRegular() {
		h, err := hashFile(r)
		if err != nil {
			return Output{}, fmt.Errorf("fs.stat %s: %w", a.Path, err)
		}
		res["hash"] = h
	}
	return output(res)
}

func hashFile(r *Resource) (string, error) {
	f, err := r.Root.Open(r.Rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := blake3.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	var sum [digest.Size]byte
	h.Sum(sum[:0])
	return digest.Format(sum), nil
}

type fsWrite struct{}

func (*fsWrite) Definition() Definition {
	return Definition{
		ID:          "fs.write",
		Description: "Create or replace a file in the workspace with the given text. The parent directory must exist. The write is atomic: the old content or the new, never a mix.",
		SideEffect:  Write,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessWrite}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"File path, relative to the workspace root."},
			"content":{"type":"string","description":"The file's new content."},
			"mode":{"type":"string","pattern":"^0?[0-7]{3}$","description":"Permission bits in octal, e.g. \"0644\" (default: keep an existing file's, 0644 for a new one)."}},
			"required":["path","content"],"additionalProperties":false}`),
	}
}

func (*fsWrite) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path    string `json:"path"`
		Content string `json:"content"`
		Mode    string `json:"mode"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	var perm fs.FileMode
	if a.Mode != "" {
		m, err := strconv.ParseUint(a.Mode, 8, 32)
		if err != nil {
			return Output{}, argsError("mode %q is not octal", a.Mode)
		}
		perm = fs.FileMode(m)
	}
	return stageWrite(c, a.Path, []byte(a.Content), perm)
}

func stageWrite(c *Call, name string, content []byte, perm fs.FileMode) (Output, error) {
	r := c.Resources[0]
	if r.IsDir {
		return Output{}, fmt.Errorf("%s is a directory", name)
	}
	if err := c.Stage.WriteFile(r, content, perm); err != nil {
		return Output{}, err
	}
	return output(map[string]any{"path": name, "size": len(content), "hash": digest.Sum(content)})
}

type fsPatch struct{}

func (*fsPatch) Definition() Definition {
	return Definition{
		ID:          "fs.patch",
		Description: "Replace the one occurrence of old with new in a workspace file. Fails (invalid args) when old occurs zero times or more than once: include enough context to make it unique.",
		SideEffect:  Write,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessWrite}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"File path, relative to the workspace root."},
			"old":{"type":"string","minLength":1,"description":"Exact text to replace; must occur exactly once."},
			"new":{"type":"string","description":"Replacement text."}},
			"required":["path","old","new"],"additionalProperties":false}`),
	}
}

func (*fsPatch) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path string `json:"path"`
		Old  string `json:"old"`
		New  string `json:"new"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	r := c.Resources[0]
	if !r.Exists {
		return Output{}, fmt.Errorf("fs.patch %s: no such file", a.Path)
	}
	data, err := r.readRegular()
	if err != nil {
		return Output{}, fmt.Errorf("fs.patch %s: %w", a.Path, err)
	}
	// Occurrences that overlap count too ("aa" occurs twice in "aaa"):
	// an old text that matches at two places is not unique.
	text := string(data)
	i := strings.Index(text, a.Old)
	switch {
	case i < 0:
		return Output{}, argsError("old string not found in %s", a.Path)
	case strings.Contains(text[i+1:], a.Old):
		return Output{}, argsError("old string occurs more than once in %s; it must be unique", a.Path)
	}
	return stageWrite(c, a.Path, []byte(text[:i]+a.New+text[i+len(a.Old):]), 0)
}

type fsDelete struct{}

func (*fsDelete) Definition() Definition {
	return Definition{
		ID:          "fs.delete",
		Description: "Delete a file, a symlink (not its target) or a directory tree in the workspace.",
		SideEffect:  Write,
		Resources:   []ResourceArg{{Arg: "path", Kind: KindFS, Access: AccessDelete}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string","description":"Path, relative to the workspace root."}},
			"required":["path"],"additionalProperties":false}`),
	}
}

func (*fsDelete) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	r := c.Resources[0]
	if !r.Exists {
		return Output{}, fmt.Errorf("fs.delete %s: no such file or directory", a.Path)
	}
	if err := c.Stage.Delete(r); err != nil {
		return Output{}, err
	}
	return output(map[string]any{"path": a.Path, "was_dir": r.IsDir})
}

// readRegular reads r's file, opened as fs.read opens it (openRead:
// without blocking, so that a fifo put there by anyone does not hold the
// call and its locks until a writer comes), and refuses anything but a
// regular file.
func (r *Resource) readRegular() ([]byte, error) {
	fd, err := r.openRead()
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), r.Rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	return io.ReadAll(f)
}
