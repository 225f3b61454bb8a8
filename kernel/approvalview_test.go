package kernel

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
)

// An approval detail names each file by where the call acts, as the
// request's projected_effects do, not by the agent's spelling: through a
// link inside the workspace ("docs" -> ".github/workflows") an approver
// was shown a diff titled "docs/ci.yml" (rev10-approve F9). A link at the
// path itself is shown as that link, which the call replaces or removes,
// not as the file it leads to; a directory (a delete of a tree) as a
// directory with what it holds counted, up to MaxCountedEntries, where it
// was shown as a 0-byte binary file.
func TestApprovalDetailFiles(t *testing.T) {
	h := newHarness(t)
	h.write(".github/workflows/ci.yml", "on: push\n")
	h.write("real.txt", "the real file\n")
	relink(t, h.ws, "docs", filepath.Join(".github", "workflows"))
	relink(t, h.ws, "cfg", "real.txt")
	for i := range 30 {
		h.write(fmt.Sprintf("src/pkg%d/f%d.go", i%3, i), strings.Repeat("x", 1000))
	}
	for i := range MaxCountedEntries + 1 {
		h.write(fmt.Sprintf("huge/f%d", i), "y")
	}
	for _, c := range []struct {
		name string
		tool string
		args map[string]any
		want FileState
	}{
		{"a file", "fs.write", map[string]any{"path": "real.txt", "content": "new\n"},
			FileState{Path: "real.txt", Exists: true, Content: "the real file\n", Size: 14}},
		{"through a linked directory", "fs.write", map[string]any{"path": "docs/ci.yml", "content": "on: pull_request\n"},
			FileState{Path: ".github/workflows/ci.yml", Spelled: "docs/ci.yml", Exists: true, Content: "on: push\n", Size: 9}},
		{"spelled with ..", "fs.write", map[string]any{"path": "src/../real.txt", "content": "x"},
			FileState{Path: "real.txt", Exists: true, Content: "the real file\n", Size: 14}},
		{"a new file", "fs.write", map[string]any{"path": "docs/new.yml", "content": "x"},
			FileState{Path: ".github/workflows/new.yml", Spelled: "docs/new.yml"}},
		{"a link at the path", "fs.write", map[string]any{"path": "cfg", "content": "x"},
			FileState{Path: "cfg", Exists: true, Link: "real.txt"}},
		{"a directory deleted", "fs.delete", map[string]any{"path": "src"},
			FileState{Path: "src", Exists: true, Dir: true, Entries: 33, Size: 30000}},
		{"a directory over the count's bound", "fs.delete", map[string]any{"path": "huge"},
			FileState{Path: "huge", Exists: true, Dir: true, Entries: MaxCountedEntries, Size: MaxCountedEntries, More: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, res := h.gated(c.tool, c.args, key(newID()), func(e *Envelope) { e.AutonomyMode = "soft_gate" })
			d, err := h.k.ApprovalDetail(a.ID)
			if err != nil {
				t.Fatal(err)
			}
			c.want.Root = h.ws
			if c.want.Content != "" {
				c.want.Hash = digest.Sum([]byte(c.want.Content))
			}
			if len(d.Files) != 1 || d.Files[0] != c.want {
				t.Errorf("files %+v, want [%+v]", d.Files, c.want)
			}
			if _, err := h.k.Decide(a.ID, h.approver("alice", captoken.RoleEscalation), "deny", "test over"); err != nil {
				t.Fatal(err)
			}
			<-res
		})
	}
}
