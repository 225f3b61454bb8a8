package captoken

import (
	"fmt"
	"strings"
)

// AllowsTool reports whether c grants calling the tool id. A pattern "*"
// matches every id; a pattern "p.*" matches every id that starts with "p."
// (so "fs.*" matches "fs.read" and "fs.dir.list" but not "fs" or
// "fsx.read"); any other pattern matches only the id equal to it. Matching
// is case-sensitive. The empty id matches nothing.
func (c Capability) AllowsTool(id string) bool {
	if id == "" {
		return false
	}
	for _, p := range c.Tools {
		if p == "*" || p == id {
			return true
		}
		// The prefix keeps its dot, so "fs.*" cannot match "fsx.read".
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasSuffix(prefix, ".") &&
			len(id) > len(prefix) && strings.HasPrefix(id, prefix) {
			return true
		}
	}
	return false
}

// AllowsTool reports whether the token grants calling the tool id; see
// Capability.AllowsTool.
func (t *Token) AllowsTool(id string) bool {
	return t.Claims.Cap.AllowsTool(id)
}

// validToolPattern accepts "*", a tool id, or a tool id followed by ".*",
// where a tool id is one or more non-empty dot-separated labels of
// printable ASCII other than space and the glob characters * ? [ ] \.
// Refusing other glob syntax keeps every pattern's meaning fixed should
// matching ever grow richer.
func validToolPattern(p string) error {
	if p == "*" {
		return nil
	}
	for label := range strings.SplitSeq(strings.TrimSuffix(p, ".*"), ".") {
		if label == "" {
			return fmt.Errorf("tool pattern %q has an empty label", p)
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`*?[]\`, c) >= 0 {
				return fmt.Errorf("tool pattern %q has character %q; only a whole \"*\" or a trailing \".*\" is a wildcard", p, c)
			}
		}
	}
	return nil
}
