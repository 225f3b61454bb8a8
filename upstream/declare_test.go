package upstream

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// TestRefs: pointers, "*" over arrays and objects (in member order),
// optional and missing arguments, wrong types; Rewrite changes only the
// declared values and keeps numbers as written.
func TestRefs(t *testing.T) {
	tests := []struct {
		name string
		args []Arg
		in   string
		want string // the refs as where=value, or the error
		out  string // the rewritten args, each value prefixed with "R:"
	}{
		{"one path", []Arg{{Pointer: "/path", Kind: "fs"}}, `{"path":"a","n":12345678901234567890}`,
			"[/path=a]", `{"n":12345678901234567890,"path":"R:a"}`},
		{"array", []Arg{{Pointer: "/paths/*", Kind: "fs"}}, `{"paths":["a","b"]}`, "[/paths/0=a /paths/1=b]", `{"paths":["R:a","R:b"]}`},
		{"object values, sorted", []Arg{{Pointer: "/files/*", Kind: "net"}}, `{"files":{"z":"u2","a~/b":"u1"}}`,
			"[/files/a~0~1b=u1 /files/z=u2]", `{"files":{"a~/b":"R:u1","z":"R:u2"}}`},
		{"nested index", []Arg{{Pointer: "/edits/1/to", Kind: "fs"}}, `{"edits":[{"to":"x"},{"to":"y"}]}`, "[/edits/1/to=y]", `{"edits":[{"to":"x"},{"to":"R:y"}]}`},
		{"escaped member", []Arg{{Pointer: "/a~1b", Kind: "kv"}}, `{"a/b":"k"}`, "[/a~1b=k]", `{"a/b":"R:k"}`},
		{"optional and missing", []Arg{{Pointer: "/p", Kind: "fs", Optional: true}}, `{}`, "[]", ""},
		{"wildcard over nothing", []Arg{{Pointer: "/paths/*", Kind: "fs"}}, `{}`, "[]", ""},
		{"required and missing", []Arg{{Pointer: "/p", Kind: "fs"}}, `{"q":"x"}`, "declared fs argument /p is missing", ""},
		{"null is missing", []Arg{{Pointer: "/p", Kind: "fs"}}, `{"p":null}`, "declared fs argument /p is missing", ""},
		{"a number", []Arg{{Pointer: "/p", Kind: "fs"}}, `{"p":3}`, "declared fs argument /p is a number, not a string", ""},
		{"an array element not a string", []Arg{{Pointer: "/p/*", Kind: "fs"}}, `{"p":["a",{}]}`, "declared fs argument /p/1 is an object, not a string", ""},
		{"a scalar in the way", []Arg{{Pointer: "/p/x", Kind: "net"}}, `{"p":"s"}`, "declared net argument /p/x: /p is a string, not an object or array", ""},
		// Names a decoder matching loosely (Go's encoding/json folds case,
		// encoding/json/v2's case:ignore also drops '_' and '-') takes for
		// the declared one, which the kernel would not check.
		{"a folded twin", []Arg{{Pointer: "/source", Kind: "fs"}}, `{"source":"ok.txt","ſource":"/etc/passwd"}`,
			`member "ſource" of / differs from the declared fs argument /source only in case, '_' or '-': name it "source", once`, ""},
		{"an ASCII twin", []Arg{{Pointer: "/source", Kind: "fs"}}, `{"SOURCE":"/etc/passwd","source":"ok.txt"}`,
			`member "SOURCE" of / differs from the declared fs argument /source only in case, '_' or '-': name it "source", once`, ""},
		{"a folded name alone", []Arg{{Pointer: "/source", Kind: "fs", Optional: true}}, `{"ſource":"/etc/passwd"}`,
			`member "ſource" of / differs from the declared fs argument /source only in case, '_' or '-': name it "source", once`, ""},
		{"a folded name under a wildcard", []Arg{{Pointer: "/edits/*/to", Kind: "fs"}}, `{"edits":[{"TO":"/etc/passwd"}]}`,
			`member "TO" of /edits/0/ differs from the declared fs argument /edits/*/to only in case, '_' or '-': name it "to", once`, ""},
		{"the Kelvin sign", []Arg{{Pointer: "/key", Kind: "kv"}}, `{"key":"a","\u212aey":"b"}`,
			"member \"\u212aey\" of / differs from the declared kv argument /key only in case, '_' or '-': name it \"key\", once", ""},
		{"an underscore dropped", []Arg{{Pointer: "/file_path", Kind: "fs", Optional: true}}, `{"filePath":"/etc/passwd"}`,
			`member "filePath" of / differs from the declared fs argument /file_path only in case, '_' or '-': name it "file_path", once`, ""},
		{"a dash added", []Arg{{Pointer: "/source", Kind: "fs"}}, `{"so-urce":"/etc/passwd","source":"a"}`,
			`member "so-urce" of / differs from the declared fs argument /source only in case, '_' or '-': name it "source", once`, ""},
		// Off the declared paths, names are the upstream's own business:
		// header maps, documents.
		{"twins off the declared path", []Arg{{Pointer: "/p", Kind: "fs"}}, `{"p":"a","headers":{"X-Trace":"1","x-trace":"2"},"doc":{"σ":1,"ς":2}}`,
			"[/p=a]", `{"doc":{"ς":2,"σ":1},"headers":{"X-Trace":"1","x-trace":"2"},"p":"R:a"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tl := &Tool{Declared: true, Args: tc.args}
			refs, doc, err := tl.Refs([]byte(tc.in))
			var got string
			if err != nil {
				var ae *syscalls.ArgsError
				if !errors.As(err, &ae) {
					t.Fatalf("error %v is not an ArgsError", err)
				}
				got = strings.Join(ae.Violations, "; ")
			} else {
				var parts []string
				for _, r := range refs {
					parts = append(parts, r.Where+"="+r.Value)
				}
				got = fmt.Sprint(parts)
			}
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			if tc.out == "" {
				return
			}
			repl := make([]string, len(refs))
			for i, r := range refs {
				repl[i] = "R:" + r.Value
			}
			b, err := Rewrite(doc, refs, repl)
			if err != nil || string(b) != tc.out {
				t.Fatalf("rewritten %s (%v), want %s", b, err, tc.out)
			}
		})
	}
}

// TestPaths: a path moves between the kernel's space and the upstream's
// by the longest matching entry; without entries the spaces are one.
func TestPaths(t *testing.T) {
	tl := &Tool{Paths: []PathMap{{Root: "/srv/ws", Upstream: "/data"}, {Root: "/srv/ws/deep", Upstream: "/deep"}}}
	for _, c := range []struct{ kernel, up string }{
		{"/srv/ws/a.txt", "/data/a.txt"}, {"/srv/ws", "/data"}, {"/srv/ws/deep/x", "/deep/x"},
	} {
		if got, ok := tl.ToUpstream(c.kernel); !ok || got != c.up {
			t.Errorf("ToUpstream(%s) = %s %v, want %s", c.kernel, got, ok, c.up)
		}
		if got := tl.ToKernel(c.up); got != c.kernel {
			t.Errorf("ToKernel(%s) = %s, want %s", c.up, got, c.kernel)
		}
	}
	if got, ok := tl.ToUpstream("/srv/wsx/a"); ok {
		t.Errorf("ToUpstream outside every entry: %s", got)
	}
	for _, p := range []string{"rel/a", "/elsewhere/a", "/database"} {
		if got := tl.ToKernel(p); got != p {
			t.Errorf("ToKernel(%s) = %s", p, got)
		}
	}
	if got, ok := (&Tool{}).ToUpstream("/x/y"); !ok || got != "/x/y" {
		t.Errorf("no paths: %s %v", got, ok)
	}
}
