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

	"github.com/open-policy-agent/opa/v1/ast"

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

// data merges the bundle's data files (its .json files) into one
// document, each file's object at the data path of its directory (as in
// OPA: a/b/data.json is data.a.b), in the way OPA's loader (`opa test`,
// `opa eval -d`) and bundle reader (`opa build`, `opa eval -b`) merge
// them: where two files both reach a data path and both hold an object
// there, the objects merge member by member; where either holds anything
// else (two values at one path, or a value where the other has an object,
// at any depth, even equal values) the bundle is refused, naming both
// files and the path. Neither value can be the one that counts: when one
// did, which one depended on how the files' names sorted, and a nested
// data file silently replaced a root data.json's deny list (fail open).
// Whether the bundle loads, and the data it loads, depend on the set of
// files, not on the order of their names.
//
// Each file is read as strictly as every other JSON the kernel takes from
// outside (strictjson): one value and nothing after it (OPA refuses what
// follows, so the kernel and `opa test` would read different data from
// the same hashed bytes), no member named twice (which one counts would
// be the reader's choice).
func (b *bundle) data() (map[string]any, error) {
	data := map[string]any{}
	// Each file is checked against each file before it, whose tree merge
	// leaves as read (it copies objects into data): a file conflicts with
	// data just when it conflicts with one of the files merged into it,
	// and that file is the one to name.
	type tree struct {
		path string
		doc  map[string]any
	}
	var merged []tree
	for _, f := range b.files {
		if !strings.HasSuffix(f.path, ".json") {
			continue
		}
		doc, err := readData(f)
		if err != nil {
			return nil, err
		}
		for _, o := range merged {
			at, ok := conflict(o.doc, doc, nil)
			if !ok {
				continue
			}
			ov := lookup(o.doc, at)
			fv := lookup(doc, at)
			ref := ast.Ref{ast.DefaultRootDocument}
			for _, k := range at {
				ref = append(ref, ast.StringTerm(k))
			}
			return nil, fmt.Errorf("data files %s and %s both define %s (%s in %s, %s in %s); data files may overlap only in objects, whose members merge",
				o.path, f.path, ref, describe(ov, true), o.path, describe(fv, true), f.path)
		}
		merge(data, doc)
		merged = append(merged, tree{f.path, doc})
	}
	return data, nil
}

// readData reads data file f: its object, placed under the path of its
// directory.
func readData(f file) (map[string]any, error) {
	if err := strictjson.Check(f.content); err != nil {
		return nil, fmt.Errorf("data file %s: %w", f.path, err)
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(f.content))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("data file %s: %w", f.path, err)
	}
	v, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("data file %s: holds %s, not an object", f.path, describe(doc, true))
	}
	if d := path.Dir(f.path); d != "." {
		segs := strings.Split(d, "/")
		for i := len(segs) - 1; i >= 0; i-- {
			v = map[string]any{segs[i]: v}
		}
	}
	return v, nil
}

// conflict returns the path (below at) of the first member, in key order,
// that both a and b hold and that is not an object in both: what OPA
// calls conflicting values. Key order makes the path reported the same on
// every load.
func conflict(a, b map[string]any, at []string) ([]string, bool) {
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		av, ok := a[k]
		if !ok {
			continue
		}
		ao, aok := av.(map[string]any)
		bo, bok := b[k].(map[string]any)
		p := append(at[:len(at):len(at)], k)
		if !aok || !bok {
			return p, true
		}
		if c, ok := conflict(ao, bo, p); ok {
			return c, true
		}
	}
	return nil, false
}

// merge adds src's members to dst, which conflict has found not to
// conflict: objects held by both merge; the rest is copied into dst, its
// objects as new maps, so that merging into dst later never changes src.
func merge(dst, src map[string]any) {
	for k, v := range src {
		if d, ok := dst[k].(map[string]any); ok {
			merge(d, v.(map[string]any))
			continue
		}
		dst[k] = copyObjects(v)
	}
}

// copyObjects returns v with every object on its way from the root (not
// within arrays, which no merge enters) copied.
func copyObjects(v any) any {
	o, ok := v.(map[string]any)
	if !ok {
		return v
	}
	c := make(map[string]any, len(o))
	for k, m := range o {
		c[k] = copyObjects(m)
	}
	return c
}

// lookup returns the value at path p of doc, which conflict found there.
func lookup(doc map[string]any, p []string) any {
	var v any = doc
	for _, k := range p {
		v = v.(map[string]any)[k]
	}
	return v
}
