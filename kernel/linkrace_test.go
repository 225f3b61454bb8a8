package kernel

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/txn"
)

// An fs.read through symbolic links, with a precondition, holds the locks
// a write of each link of the last name's chain takes: a concurrent
// fs.write replacing one of them (a write acts on a link, not on what it
// points to) waits, so the read returns what its precondition checked, or
// is refused — never the replacement under a precondition that held.
// Before, a read locked only the file reached (9 of 40 reads of a single
// link returned the replacement: review rev-ops #3), then also the link
// it named, not a link that one led to, nor a dangling link under a
// linked directory by its resolved name (1 in 400: rev-last #3, #4), nor
// the missing name a dangling link leads to (rev-final).
func TestPreconditionReadThroughLinkHoldsTheLink(t *testing.T) {
	original := txn.Precondition{Ref: "fs:link", Hash: digest.Sum([]byte("original"))}
	for _, c := range []struct {
		name    string
		setup   func(t *testing.T, ws string)
		read    string
		pre     txn.Precondition
		replace string // the name the write replaces or makes
	}{
		{"a link to the file", func(t *testing.T, ws string) { relink(t, ws, "link", "a.txt") }, "link", original, "link"},
		{"a link to a link to the file", func(t *testing.T, ws string) {
			relink(t, ws, "mid", "a.txt")
			relink(t, ws, "link", "mid")
		}, "link", original, "mid"},
		{"a dangling link under a linked directory", func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "real"), 0o755)
			relink(t, ws, "d", "real")
			relink(t, ws, "real/l", "missing")
		}, "d/l", txn.Precondition{Ref: "fs:d/l", Absent: true}, "d/l"},
		{"a dangling link, its target made", func(t *testing.T, ws string) {
			os.Remove(filepath.Join(ws, "missing"))
			relink(t, ws, "l", "missing")
		}, "l", txn.Precondition{Ref: "fs:l", Absent: true}, "missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.write("a.txt", "original")
			pre := func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{c.pre} }
			for i := range 400 {
				c.setup(t, h.ws)
				var wg sync.WaitGroup
				var read *Result
				wg.Add(2)
				go func() {
					defer wg.Done()
					// The write's apply comes after its commit: reads
					// start spread over that time.
					time.Sleep(time.Duration(i%40) * 50 * time.Microsecond)
					read = h.invoke("fs.read", map[string]any{"path": c.read}, pre)
				}()
				go func() {
					defer wg.Done()
					if r := h.invoke("fs.write", map[string]any{"path": c.replace, "content": "replaced"}, key(fmt.Sprint("w", i))); r.Status != StatusOK {
						t.Errorf("write %d: %+v", i, r.Error)
					}
				}()
				wg.Wait()
				if read.Status != StatusOK {
					continue // refused: the precondition no longer held
				}
				var out struct {
					Content string `json:"content"`
				}
				if err := json.Unmarshal(read.Result, &out); err != nil {
					t.Fatal(err)
				}
				if out.Content != "original" {
					t.Fatalf("read %d: %q under the precondition %+v", i, out.Content, c.pre)
				}
			}
		})
	}
}

// relink makes the entry rel of ws a symlink to target, whatever it was.
func relink(t *testing.T, ws, rel, target string) {
	t.Helper()
	p := filepath.Join(ws, rel)
	os.RemoveAll(p)
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
