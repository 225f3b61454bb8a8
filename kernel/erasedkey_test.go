package kernel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// TestErasedKeyAnswersAlike: once a keyed call's audit payload is erased
// (by the admin or by retention), a repeat of its key with the erased args
// and one with any other args get the same answer — the erased outcome,
// replayed — so that no caller or auditor tells the erased args from the
// answers; no repeat runs a second effect; a repeat by another tool or
// token is still refused; and replay verify passes, also once the
// repeats' own payloads are erased.
func TestErasedKeyAnswersAlike(t *testing.T) {
	for _, tc := range []struct {
		name  string
		erase func(h *harness, clk *clock, op string)
	}{
		{"admin erasure", func(h *harness, _ *clock, op string) {
			if _, err := h.k.Erase(context.Background(), op, "subject asked"); err != nil {
				h.t.Fatal(err)
			}
		}},
		{"retention", func(h *harness, clk *clock, _ string) {
			h.k.Close()
			clk.add(2 * time.Hour)
			h.open(func(c *Config) {
				c.Now = clk.now
				c.Audit = &AuditConfig{Retention: []RetentionRule{{OlderThan: "1h", Tool: "fs.write"}}}
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The clock starts in the past, so that the harness's token
			// (which expires an hour from now) is valid before and after
			// retention's two hours.
			clk := &clock{t: time.Now().Add(-2 * time.Hour)}
			h := newHarness(t, func(c *Config) { c.Now = clk.now })
			w := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": "4711"}, key("k-pin"))
			mustOK(t, w)
			tc.erase(h, clk, w.OperationID)
			if _, p := h.entryOf(w); p != nil {
				t.Fatalf("the payload was not erased: %+v", p)
			}

			type answer struct {
				replayed bool
				status   string
				class    string
				op       string
			}
			answerOf := func(r *Result) answer {
				return answer{r.Replayed, r.Status, errClass(r), r.OperationID}
			}
			want := answer{true, StatusOK, "", w.OperationID}
			for _, pin := range []string{"4711", "4709", "4712", "0000"} {
				r := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": pin}, key("k-pin"))
				if got := answerOf(r); got != want {
					t.Errorf("repeat with content %s: %+v (%+v), want %+v", pin, got, r.Error, want)
				} else if r.Result != nil || r.AuditSalt != "" {
					t.Errorf("repeat with content %s answers erased parts: result %s salt %q", pin, r.Result, r.AuditSalt)
				}
			}
			if got := h.read("pin.txt"); got != "4711" {
				t.Fatalf("pin.txt = %q after the repeats: a repeat ran again", got)
			}

			// The key's other comparisons stay, whatever the args.
			tok2, jti2 := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
			for _, pin := range []string{"4711", "4712"} {
				other := h.invoke("fs.write", map[string]any{"path": "pin.txt", "content": pin}, key("k-pin"), func(e *Envelope) {
					e.CapabilityToken, e.CapabilityTokenID = tok2, jti2
				})
				if errClass(other) != ErrIdempotencyConflict || !strings.Contains(other.Error.Message, "capability token") {
					t.Errorf("repeat with content %s under another token: %+v", pin, other.Error)
				}
			}
			tool := h.invoke("fs.delete", map[string]any{"path": "pin.txt"}, key("k-pin"))
			if errClass(tool) != ErrIdempotencyConflict || !strings.Contains(tool.Error.Message, "fs.write") {
				t.Errorf("repeat by fs.delete: %+v", tool.Error)
			}
			if got := h.read("pin.txt"); got != "4711" {
				t.Fatalf("pin.txt = %q after the refused repeats", got)
			}

			hs, err := h.k.Inspector().ReplayShow("k-pin", h.agent)
			if err != nil || len(hs) != 1 || len(hs[0].Calls) < 5 {
				t.Fatalf("replay show: %+v, %v", hs, err)
			}
			for i, c := range hs[0].Calls[1:5] {
				if c.ReplayOf != w.OperationID || c.ErrorClass != "" {
					t.Errorf("repeat %d's record: %+v", i, c)
				}
			}
			verify := func(when string) {
				t.Helper()
				rep, err := h.k.Inspector().ReplayVerify()
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Problems) != 0 || rep.Committed != 1 || rep.Replays != 4 {
					t.Fatalf("replay verify %s: %+v", when, rep)
				}
				mustVerify(t, h.k.Inspector())
			}
			verify("after the repeats")
			// The replays' payloads hold the repeats' args: erasing the
			// operation again takes them.
			er, err := h.k.Erase(context.Background(), w.OperationID, "the repeats too")
			if err != nil || len(er.Seqs) != 4 {
				t.Fatalf("erasing the replays: %+v, %v", er, err)
			}
			verify("after the replays' erasure")
		})
	}
}
