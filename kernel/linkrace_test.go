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

// An fs.read through a symbolic link, with a precondition on the file's
// content, holds the lock a write of the link itself takes: a concurrent
// fs.write replacing the link (a write acts on the link, not on what it
// points to) waits, so the read returns the content its precondition
// checked, or is refused, never the replacement under a precondition that
// held (review rev-ops #3: 9 of 40 reads did).
func TestPreconditionReadThroughLinkHoldsTheLink(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "original")
	pre := func(e *Envelope) {
		e.PreconditionRefs = []txn.Precondition{{Ref: "fs:link", Hash: digest.Sum([]byte("original"))}}
	}
	link := filepath.Join(h.ws, "link")
	for i := range 400 {
		os.Remove(link)
		if err := os.Symlink("a.txt", link); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var read *Result
		wg.Add(2)
		go func() {
			defer wg.Done()
			// The write's apply comes after its commit: reads start
			// spread over that time.
			time.Sleep(time.Duration(i%40) * 50 * time.Microsecond)
			read = h.invoke("fs.read", map[string]any{"path": "link"}, pre)
		}()
		go func() {
			defer wg.Done()
			if r := h.invoke("fs.write", map[string]any{"path": "link", "content": "replaced"}, key(fmt.Sprint("w", i))); r.Status != StatusOK {
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
			t.Fatalf("read %d: %q under a precondition on %q", i, out.Content, "original")
		}
	}
}
