package kernel

import (
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream"
)

// TestDeclaredRefsBounded: an upstream tool's call names at most
// MaxDeclaredRefs declared resources; a wildcard pointer (as the shipped
// read_multiple_files's "/paths/*") naming more is refused invalid_args
// before any is resolved (paths outside the roots would be scope_denied),
// where 200,000 paths were each resolved and made a policy resource
// (rev16a #3). A call naming the bound's number goes on to the upstream.
func TestDeclaredRefsBounded(t *testing.T) {
	_, url := httpServer(t)
	h := newHarness(t, execPolicy(t), withServers(map[string]upstream.Server{
		"web": {URL: url, Resources: []upstream.Declaration{{Tools: "fail", SideEffect: syscalls.Read, Args: []upstream.Arg{{Pointer: "/p/*", Kind: "fs"}}}}},
	}))
	h.write("a", "x")
	waitFor(t, "tool", func() bool { _, ok := h.k.registry.Get("mcp.web.fail"); return ok })
	paths := func(n int, p string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = p
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		paths []string
		class string // "" for any class but these
	}{
		{"one over the bound, outside the roots", paths(MaxDeclaredRefs+1, "../out"), ErrInvalidArgs},
		{"200,000", paths(200000, "a"), ErrInvalidArgs},
		{"the bound's number, outside the roots", paths(MaxDeclaredRefs, "../out"), ErrScopeDenied},
		{"the bound's number", paths(MaxDeclaredRefs, "a"), ""},
	} {
		r := h.invoke("mcp.web.fail", map[string]any{"p": tc.paths})
		switch {
		case tc.class == "" && (errClass(r) == ErrInvalidArgs || errClass(r) == ErrScopeDenied):
			t.Errorf("%s: %d paths refused %s: %+v", tc.name, len(tc.paths), errClass(r), r.Error)
		case tc.class == ErrInvalidArgs && (errClass(r) != tc.class || !strings.Contains(r.Error.Message, "the limit is 512")):
			t.Errorf("%s: %d paths: class %q, %+v; want invalid_args, the limit", tc.name, len(tc.paths), errClass(r), r.Error)
		case tc.class != "" && errClass(r) != tc.class:
			t.Errorf("%s: %d paths: class %q, %+v; want %s", tc.name, len(tc.paths), errClass(r), r.Error, tc.class)
		}
	}
}
