package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/capkernel/capkernel/syscalls"
)

// Declaration says what the arguments of the upstream tools whose names
// match Tools are (kernel.json mcp_servers.<name>.resources, docs/mcp.md):
// which hold a file path, a URL or host, a kv key. A matching tool with no
// Args is declared to touch nothing the kernel governs.
type Declaration struct {
	// Tools is a glob over upstream tool names (path.Match syntax: *, ?,
	// [a-z]); the first declaration that matches a tool is its.
	Tools string `json:"tools"`
	// SideEffect, when set, is the class of the matching tools (a
	// server's tools map still overrides it).
	SideEffect syscalls.SideEffect `json:"side_effect,omitempty"`
	// Args are the tool's resource arguments.
	Args []Arg `json:"args"`
}

// Arg declares that the values at Pointer in a call's arguments are
// resources of kind Kind.
type Arg struct {
	// Pointer is an RFC 6901 JSON pointer into the arguments object. A
	// segment "*" stands for every element of an array or every member
	// value of an object there ("/paths/*", "/files/*").
	Pointer string `json:"pointer"`
	// Kind is "fs" (a file path), "net" (a URL or host) or "kv" (a key of
	// the kernel's kv store).
	Kind string `json:"kind"`
	// Mode is "r" or "rw" (fs and kv; default "r").
	Mode string `json:"mode,omitempty"`
	// Op is how an fs path is touched: read, list or stat for mode r
	// (default read); write or delete for mode rw (default write).
	Op string `json:"op,omitempty"`
	// Form is how a net argument names its target: "url" (default; http
	// or https) or "host" (host or host:port, port 443 when absent).
	Form string `json:"form,omitempty"`
	// Optional lets a call leave the argument out; otherwise a missing
	// argument is invalid_args.
	Optional bool `json:"optional,omitempty"`
}

// PathMap maps a directory of the kernel's file system (a token root or a
// directory inside one) onto the same directory as the upstream server
// sees it (a container mount, say).
type PathMap struct {
	Root     string `json:"root"`
	Upstream string `json:"upstream"`
}

// check refuses a declaration that cannot be applied; where names it in
// the error.
func (d Declaration) check(where string) error {
	if d.Tools == "" {
		return fmt.Errorf("%s: tools (a glob over tool names) is required", where)
	}
	if _, err := path.Match(d.Tools, ""); err != nil {
		return fmt.Errorf("%s: tools %q: %v", where, d.Tools, err)
	}
	if d.SideEffect != "" && !d.SideEffect.Valid() {
		return fmt.Errorf("%s (tools %q): side_effect %q is not one of NONE, READ, WRITE, EXECUTE, NETWORK", where, d.Tools, d.SideEffect)
	}
	for i, a := range d.Args {
		if err := a.check(); err != nil {
			return fmt.Errorf("%s (tools %q), args[%d]: %w", where, d.Tools, i, err)
		}
	}
	return nil
}

func (a Arg) check() error {
	if _, err := splitPointer(a.Pointer); err != nil {
		return err
	}
	switch a.Kind {
	case syscalls.KindFS:
		if _, err := a.Access(); err != nil {
			return err
		}
	case syscalls.KindKV:
		if a.Mode != "" && a.Mode != "r" && a.Mode != "rw" {
			return fmt.Errorf("mode %q is not r or rw", a.Mode)
		}
	case "net":
		if a.Form != "" && a.Form != "url" && a.Form != "host" {
			return fmt.Errorf("form %q is not url or host", a.Form)
		}
	default:
		return fmt.Errorf("kind %q is not fs, net or kv", a.Kind)
	}
	if a.Kind != syscalls.KindFS && a.Op != "" {
		return fmt.Errorf("op is for kind fs only")
	}
	if a.Kind != "net" && a.Form != "" {
		return fmt.Errorf("form is for kind net only")
	}
	return nil
}

// Access is how an fs argument is touched.
func (a Arg) Access() (syscalls.Access, error) {
	switch a.Mode {
	case "", "r":
		switch a.Op {
		case "", "read":
			return syscalls.AccessRead, nil
		case "list", "stat":
			return syscalls.Access(a.Op), nil
		}
	case "rw":
		switch a.Op {
		case "", "write":
			return syscalls.AccessWrite, nil
		case "delete":
			return syscalls.AccessDelete, nil
		}
	default:
		return "", fmt.Errorf("mode %q is not r or rw", a.Mode)
	}
	return "", fmt.Errorf("op %q does not go with mode %q (r: read, list, stat; rw: write, delete)", a.Op, a.Mode)
}

// splitPointer parses an RFC 6901 pointer into its unescaped tokens.
func splitPointer(p string) ([]string, error) {
	if p == "" || p[0] != '/' {
		return nil, fmt.Errorf("pointer %q is not a JSON pointer to an argument (it starts with /)", p)
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if strings.Contains(strings.ReplaceAll(strings.ReplaceAll(t, "~0", ""), "~1", ""), "~") {
			return nil, fmt.Errorf("pointer %q: ~ must be followed by 0 or 1", p)
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	if toks[0] == "" || toks[0] == "*" {
		return nil, fmt.Errorf("pointer %q does not name an argument", p)
	}
	return toks, nil
}

// Tool is what the kernel knows of one upstream tool's arguments.
type Tool struct {
	// Server is the upstream server's name; Name the tool's upstream name.
	Server, Name string
	// Declared reports whether a declaration covers the tool; Args are
	// its resource arguments then.
	Declared bool
	Args     []Arg
	// Paths maps the kernel's directories onto the upstream's.
	Paths []PathMap
}

// Of returns what the kernel knows of the upstream tool behind e, or false
// when e is not an upstream tool.
func Of(e *syscalls.Entry) (*Tool, bool) {
	t, ok := e.New().(*tool)
	if !ok {
		return nil, false
	}
	return t.decl, true
}

// Ref is one resource value found in a call's arguments.
type Ref struct {
	Arg   *Arg
	Where string // the concrete pointer ("/paths/2")
	Value string
	// parent and key are the value's place in the decoded arguments
	// (an object and its member name, or an array and its index), for
	// Rewrite.
	parent, key any
}

// Refs finds every declared resource value in args and returns them with
// the decoded arguments (numbers kept as written), which Rewrite edits. A
// required pointer that names nothing, a value that is not a string, or
// a scalar where the pointer goes on is an *syscalls.ArgsError naming the
// pointer.
func (t *Tool) Refs(args json.RawMessage) ([]Ref, any, error) {
	if len(t.Args) == 0 {
		return nil, nil, nil
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, nil, &syscalls.ArgsError{Violations: []string{"args: " + err.Error()}}
	}
	var out []Ref
	for i := range t.Args {
		a := &t.Args[i]
		toks, _ := splitPointer(a.Pointer) // checked at Start
		found := 0
		var walk func(v any, toks []string, where string, parent, key any) error
		walk = func(v any, toks []string, where string, parent, key any) error {
			if len(toks) == 0 {
				if v == nil {
					return nil // null is an argument not given
				}
				s, ok := v.(string)
				if !ok {
					return fmt.Errorf("declared %s argument %s is %s, not a string", a.Kind, where, typeName(v))
				}
				found++
				out = append(out, Ref{Arg: a, Where: where, Value: s, parent: parent, key: key})
				return nil
			}
			tok := toks[0]
			switch x := v.(type) {
			case map[string]any:
				if tok == "*" {
					for _, k := range slices.Sorted(maps.Keys(x)) {
						if err := walk(x[k], toks[1:], where+"/"+escape(k), x, k); err != nil {
							return err
						}
					}
					return nil
				}
				for _, k := range slices.Sorted(maps.Keys(x)) {
					if k != tok && fold(k) == fold(tok) {
						// A decoder matching names loosely may take it for
						// tok (see fold): the kernel would check one member
						// and the upstream act on the other.
						return fmt.Errorf("member %q of %s differs from the declared %s argument %s only in case, '_' or '-': name it %q, once", k, where+"/", a.Kind, a.Pointer, tok)
					}
				}
				if m, ok := x[tok]; ok {
					return walk(m, toks[1:], where+"/"+escape(tok), x, tok)
				}
				return nil
			case []any:
				if tok == "*" {
					for j, m := range x {
						if err := walk(m, toks[1:], where+"/"+strconv.Itoa(j), x, j); err != nil {
							return err
						}
					}
					return nil
				}
				if j, err := strconv.Atoi(tok); err == nil && j >= 0 && j < len(x) {
					return walk(x[j], toks[1:], where+"/"+tok, x, j)
				}
				return nil
			case nil:
				return nil
			}
			return fmt.Errorf("declared %s argument %s: %s is %s, not an object or array", a.Kind, a.Pointer, where, typeName(v))
		}
		if err := walk(doc, toks, "", nil, nil); err != nil {
			return nil, nil, &syscalls.ArgsError{Violations: []string{err.Error()}}
		}
		if found == 0 && !a.Optional && !strings.Contains(a.Pointer, "*") {
			return nil, nil, &syscalls.ArgsError{Violations: []string{fmt.Sprintf("declared %s argument %s is missing", a.Kind, a.Pointer)}}
		}
	}
	return out, doc, nil
}

// fold returns s with '_' and '-' left out and each rune replaced by the
// least rune of its Unicode simple folding orbit: names equal under fold
// are ones a decoder matching names loosely takes for one another. Go's
// encoding/json matches them case-insensitively under that folding ("ſ"
// is "s", the last match winning); encoding/json/v2's case-insensitive
// matching also ignores '_' and '-'.
func fold(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return -1
		}
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, s)
}

// Rewrite sets the values of refs in doc (as Refs returned them) to
// repl[i] and encodes the result.
func Rewrite(doc any, refs []Ref, repl []string) (json.RawMessage, error) {
	for i, r := range refs {
		switch p := r.parent.(type) {
		case map[string]any:
			p[r.key.(string)] = repl[i]
		case []any:
			p[r.key.(int)] = repl[i]
		default:
			return nil, errors.New("rewrite: a reference without a place")
		}
	}
	return json.Marshal(doc)
}

func escape(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	case []any:
		return "an array"
	}
	return "an object"
}

// ToKernel maps an absolute path of the upstream's path space to the
// kernel's (the longest Paths entry whose upstream side holds it); other
// paths come back unchanged.
func (t *Tool) ToKernel(p string) string {
	if !filepath.IsAbs(p) {
		return p
	}
	c := filepath.Clean(p)
	best := -1
	for i, m := range t.Paths {
		if within(c, m.Upstream) && (best < 0 || len(m.Upstream) > len(t.Paths[best].Upstream)) {
			best = i
		}
	}
	if best < 0 {
		return p
	}
	rel, _ := filepath.Rel(t.Paths[best].Upstream, c)
	return filepath.Join(t.Paths[best].Root, rel)
}

// ToUpstream maps an absolute path of the kernel's file system to the
// upstream's path space; false when Paths is set and no entry holds it
// (the upstream cannot see that file). Without Paths the spaces are one.
func (t *Tool) ToUpstream(p string) (string, bool) {
	if len(t.Paths) == 0 {
		return p, true
	}
	best := -1
	for i, m := range t.Paths {
		if within(p, m.Root) && (best < 0 || len(m.Root) > len(t.Paths[best].Root)) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	rel, _ := filepath.Rel(t.Paths[best].Root, p)
	return filepath.Join(t.Paths[best].Upstream, rel), true
}

func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Target is a net argument's host and port; for a data: URL, which
// reaches no host, the zero HostPort.
func (a *Arg) Target(v string) (syscalls.HostPort, error) {
	if a.Form == "host" {
		host, port := v, 443
		if h, p, ok := strings.Cut(v, ":"); ok && !strings.Contains(p, ":") {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return syscalls.HostPort{}, &syscalls.ArgsError{Violations: []string{fmt.Sprintf("host %q: port %q is not a number from 1 to 65535", v, p)}}
			}
			host, port = h, n
		}
		if host == "" || strings.ContainsAny(host, "/@ ") {
			return syscalls.HostPort{}, &syscalls.ArgsError{Violations: []string{fmt.Sprintf("%q is not a host or host:port", v)}}
		}
		return syscalls.HostPort{Host: strings.ToLower(host), Port: port}, nil
	}
	u, err := url.Parse(v)
	if err == nil && u.Scheme == "data" {
		return syscalls.HostPort{}, nil // inline content: no host is reached
	}
	bad := func(why string) (syscalls.HostPort, error) {
		return syscalls.HostPort{}, &syscalls.ArgsError{Violations: []string{fmt.Sprintf("url %q: %s", v, why)}}
	}
	switch {
	case err != nil:
		return bad(err.Error())
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("the scheme is not http, https or data")
	case u.User != nil:
		return bad("a URL must not carry user information")
	case u.Hostname() == "":
		return bad("no host")
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("the port is not a number from 1 to 65535")
		}
		port = n
	}
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return syscalls.HostPort{Host: host, Port: port}, nil
}

// declarationFor returns the first declaration in ds matching tool.
func declarationFor(ds []Declaration, tool string) (*Declaration, bool) {
	for i := range ds {
		if ok, _ := path.Match(ds[i].Tools, tool); ok {
			return &ds[i], true
		}
	}
	return nil, false
}
