package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/jcs"
)

// An honest export verifies whatever the length of its lines: a payload
// line larger than 64 MiB (an echo of 34 MiB, its args and result) once
// failed with "token too long" while the database verified.
func TestVerifyExportLongPayloadLine(t *testing.T) {
	if testing.Short() {
		t.Skip("a 71 MB payload line")
	}
	h := newHarness(t, func(c *Config) { c.MaxEnvelopeBytes = 40 << 20 })
	mustOK(t, h.invoke("echo", map[string]any{"text": strings.Repeat("x", 34<<20)}))
	var exp bytes.Buffer
	if err := h.k.Inspector().Export(&exp); err != nil {
		t.Fatal(err)
	}
	longest := 0
	for line := range bytes.Lines(exp.Bytes()) {
		longest = max(longest, len(line))
	}
	if longest <= 64<<20 {
		t.Fatalf("the longest export line is %d bytes, want over 64 MiB", longest)
	}
	c, err := VerifyExport(bytes.NewReader(exp.Bytes()), h.k.ID(), h.k.ReceiptKey(), nil)
	if err != nil || !c.Intact || c.Payloads == nil || c.Payloads.Absent != 0 || c.Payloads.Opened < 2 {
		t.Fatalf("an honest export with a %d-byte line: %+v %v", longest, c, err)
	}
}

// Payload lines are read strictly, in canonical form, each right before
// the record of its seq and one per record; otherwise the export is not
// intact, the reason naming the line. A forged payload that a lax reader
// took (a case-variant member beside the real one, or a second line for
// the record) once passed as opening its commitments.
func TestVerifyExportPayloadLines(t *testing.T) {
	h := newHarness(t)
	h.burst(4)
	w := h.invoke("fs.write", map[string]any{"path": "notes.txt", "content": "pin 4711"}, key("k"))
	mustOK(t, w)
	mustOK(t, h.invoke("echo", map[string]any{"text": "after"}))
	lines := exportLines(t, h.k.Inspector())
	seq, entries := w.LedgerSeq, h.headSize()
	at := slices.IndexFunc(lines, func(l []byte) bool {
		return bytes.HasPrefix(l, []byte(`{"payload":`)) && bytes.HasSuffix(l, fmt.Appendf(nil, `,"seq":%d}`+"\n", seq))
	})
	if at < 1 || !isCheckpointLine(lines[at-1]) || !bytes.Contains(lines[at+1], []byte(fmt.Sprintf(`"seq":%d,`, seq))) {
		t.Fatalf("the export holds no payload line for record %d between a checkpoint line and its record", seq)
	}
	if c, err := VerifyExport(bytes.NewReader(bytes.Join(lines, nil)), h.k.ID(), h.k.ReceiptKey(), nil); err != nil || !c.Intact {
		t.Fatalf("the honest export: %+v %v", c, err)
	}
	real := lines[at]
	// recode returns the payload line with edit applied to its members and
	// its payload's, in canonical form.
	recode := func(edit func(line, payload map[string]any)) []byte {
		var l map[string]any
		if err := json.Unmarshal(real, &l); err != nil {
			t.Fatal(err)
		}
		edit(l, l["payload"].(map[string]any))
		b, err := jcs.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		return append(b, '\n')
	}
	forged := recode(func(_, p map[string]any) { p["args"] = map[string]any{"path": "notes.txt", "content": "forged"} })
	// with returns the export with its lines from..to-1 replaced by repl.
	with := func(from, to int, repl ...[]byte) []byte {
		return bytes.Join(slices.Concat(lines[:from], repl, lines[to:]), nil)
	}
	record := lines[at+1]
	n := len(lines)
	s := &seq
	tests := []struct {
		name   string
		export []byte
		line   int     // the line named, from 1
		bad    *uint64 // the bad_seq
		reason string
	}{
		{"a case-variant member beside the real one", with(at, at+1, recode(func(_, p map[string]any) {
			p["ARGS"], p["args"] = p["args"], map[string]any{"path": "notes.txt", "content": "forged"}
		})), at + 1, nil, `does not decode strictly: unknown field "ARGS" in /payload`},
		{"a duplicate member", with(at, at+1, bytes.Replace(real, []byte(`{"payload":{`), []byte(`{"payload":{"args":{"content":"forged","path":"notes.txt"},`), 1)),
			at + 1, nil, `does not decode strictly: duplicate member name "args" in /payload`},
		{"an unknown member", with(at, at+1, recode(func(l, _ map[string]any) { l["signed"] = true })), at + 1, nil, `unknown field "signed"`},
		{"no payload", with(at, at+1, []byte(fmt.Sprintf(`{"payload":null,"seq":%d}`+"\n", seq))), at + 1, s, "holds no payload"},
		{"not canonical", with(at, at+1, bytes.Replace(real, []byte(`,"seq":`), []byte(`, "seq":`), 1)), at + 1, s, "is not in canonical JSON form (RFC 8785)"},
		// The forged line is opened first, and fails: the record's line is
		// named.
		{"a forged line before the record, the real one after", with(at, at+2, forged, record, real), at + 2, s,
			fmt.Sprintf("ledger: entry %d: audit record %d: payload part args is mismatch", seq, seq)},
		{"the line before and after its record", with(at, at+2, real, record, real), at + 3, s,
			fmt.Sprintf("a second payload line for entry %d (the first is line %d)", seq, at+1)},
		{"the same line twice", with(at, at+1, real, real), at + 2, s, fmt.Sprintf("a second payload line for entry %d (the first is line %d)", seq, at+1)},
		{"after its record", with(at, at+2, record, real), at + 2, s, fmt.Sprintf("the payload line for entry %d stands before record %d, not right before record %d", seq, seq+1, seq)},
		{"before the checkpoint line that precedes its record", with(at-1, at+1, real, lines[at-1]), at, s,
			fmt.Sprintf("the payload line for entry %d is followed by a checkpoint line (line %d), not by record %d", seq, at+1, seq)},
		{"for the next record, at the end", with(n, n, recode(func(l, _ map[string]any) { l["seq"] = entries })), n + 1, &entries,
			fmt.Sprintf("the payload line for entry %d is the export's last line, not followed by record %d", entries, entries)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := VerifyExport(bytes.NewReader(tc.export), h.k.ID(), h.k.ReceiptKey(), nil)
			want := fmt.Sprintf("export line %d: ", tc.line)
			if err != nil || c.Intact || !strings.HasPrefix(c.Reason, want) || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("got %+v %v, want not intact with %q…%q", c, err, want, tc.reason)
			}
			if (c.BadSeq == nil) != (tc.bad == nil) || (c.BadSeq != nil && *c.BadSeq != *tc.bad) {
				t.Fatalf("bad_seq %v, want %v", c.BadSeq, tc.bad)
			}
		})
	}
}

// TestVerifyExportCountsNotKept: an export's verification and the
// database's report the same payloads of the same ledger: the parts of a
// record at depth commitments_only, which has no payload line, count as
// not kept in both (the export's said 0).
func TestVerifyExportCountsNotKept(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Audit = &AuditConfig{Depth: map[string]string{"fs.write": DepthCommitmentsOnly}} })
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "x"}, key("w")))
	mustOK(t, h.invoke("echo", map[string]any{"text": "y"}))
	db := mustVerify(t, h.k.Inspector())
	var exp bytes.Buffer
	if err := h.k.Inspector().Export(&exp); err != nil {
		t.Fatal(err)
	}
	c, err := VerifyExport(bytes.NewReader(exp.Bytes()), h.k.ID(), h.k.ReceiptKey(), nil)
	if err != nil || !c.Intact || c.Payloads == nil || db.Payloads == nil || db.Payloads.NotKept == 0 || *c.Payloads != *db.Payloads {
		t.Fatalf("the export's payloads %+v (%v), the database's %+v", c.Payloads, err, db.Payloads)
	}
}

// TestVerifyExportErasedPayloadBack: an export whose payload line for a
// record an erasure record names was put back is not intact, the reason
// naming that record.
func TestVerifyExportErasedPayloadBack(t *testing.T) {
	h := newHarness(t)
	w := h.invoke("fs.write", map[string]any{"path": "notes.txt", "content": "pin 4711"}, key("k"))
	mustOK(t, w)
	before := exportLines(t, h.k.Inspector())
	at := slices.IndexFunc(before, func(l []byte) bool {
		return bytes.HasPrefix(l, []byte(`{"payload":`)) && bytes.HasSuffix(l, fmt.Appendf(nil, `,"seq":%d}`+"\n", w.LedgerSeq))
	})
	if at < 0 {
		t.Fatal("no payload line for the write")
	}
	if _, err := h.k.Erase(context.Background(), w.OperationID, "subject asked"); err != nil {
		t.Fatal(err)
	}
	after := exportLines(t, h.k.Inspector())
	rec := slices.IndexFunc(after, func(l []byte) bool {
		return !bytes.HasPrefix(l, []byte(`{"payload":`)) && bytes.Contains(l, fmt.Appendf(nil, `"seq":%d,`, w.LedgerSeq))
	})
	if rec < 0 {
		t.Fatal("no record line for the write")
	}
	forged := slices.Concat(after[:rec], [][]byte{before[at]}, after[rec:])
	c, err := VerifyExport(bytes.NewReader(bytes.Join(forged, nil)), h.k.ID(), h.k.ReceiptKey(), nil)
	if err != nil || c.Intact || c.BadSeq == nil || *c.BadSeq != w.LedgerSeq || !strings.Contains(c.Reason, "erasure record says was erased") {
		t.Fatalf("an erased payload put back: %+v %v", c, err)
	}
}
