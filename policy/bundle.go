package policy

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/strictjson"
)

//go:embed rego/*.rego rego/*.json
var defaultBundle embed.FS

// file is one file of a bundle, by slash path relative to the bundle root.
type file struct {
	path    string
	content []byte
}

type bundle struct {
	name  string
	files []file // sorted by path
}

// readBundle reads the embedded default (dir "") or dir. Only .rego and
// .json files may be in a bundle; anything else, and symlinks, are refused
// so that what is hashed is what is evaluated.
func readBundle(dir string) (*bundle, error) {
	var fsys fs.FS
	b := &bundle{name: dir}
	if dir == "" {
		sub, err := fs.Sub(defaultBundle, "rego")
		if err != nil {
			return nil, err
		}
		fsys, b.name = sub, "default bundle"
	} else {
		fsys = os.DirFS(dir)
	}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("policy bundle %s: %s is a symlink; bundles hold regular files only", b.name, p)
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("policy bundle %s: %s is not a regular file", b.name, p)
		case !strings.HasSuffix(p, ".rego") && !strings.HasSuffix(p, ".json"):
			return fmt.Errorf("policy bundle %s: %s is neither .rego nor .json", b.name, p)
		}
		content, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		b.files = append(b.files, file{path: p, content: content})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(b.files) == 0 {
		return nil, fmt.Errorf("policy bundle %s: no .rego files", b.name)
	}
	sort.Slice(b.files, func(i, j int) bool { return b.files[i].path < b.files[j].path })
	return b, nil
}

// hash is the policy hash: digest.Sum over the listing
//
//	"capkernel-policy-v1\n" then, for each file in byte-wise order of its
//	slash path: path "\n" decimal length "\n" content
//
// which depends only on the files' paths and bytes, not on the machine.
func (b *bundle) hash() string {
	var l bytes.Buffer
	l.WriteString("capkernel-policy-v1\n")
	for _, f := range b.files {
		l.WriteString(f.path)
		l.WriteByte('\n')
		l.WriteString(strconv.Itoa(len(f.content)))
		l.WriteByte('\n')
		l.Write(f.content)
	}
	return digest.Sum(l.Bytes())
}

// mergeData puts a data file's object at the data path of its directory
// (as OPA bundles do: a/b/data.json is data.a.b). The file is read as
// strictly as every other JSON the kernel takes from outside (strictjson):
// one value and nothing after it (OPA refuses what follows, so the kernel
// and `opa test` would read different data from the same hashed bytes),
// no member named twice (which one counts would be the reader's choice).
func mergeData(data map[string]any, f file) error {
	if err := strictjson.Check(f.content); err != nil {
		return fmt.Errorf("data file %s: %w", f.path, err)
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(f.content))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("data file %s: %w", f.path, err)
	}
	v, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("data file %s: holds %s, not an object", f.path, describe(doc, true))
	}
	node := data
	if d := path.Dir(f.path); d != "." {
		for _, seg := range strings.Split(d, "/") {
			next, ok := node[seg].(map[string]any)
			if !ok {
				next = map[string]any{}
				node[seg] = next
			}
			node = next
		}
	}
	for k, val := range v {
		if _, dup := node[k]; dup {
			return fmt.Errorf("data file %s: key %q is defined twice", f.path, k)
		}
		node[k] = val
	}
	return nil
}
