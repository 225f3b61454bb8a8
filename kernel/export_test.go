package kernel

import (
	"bytes"
	"strings"
	"testing"
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
