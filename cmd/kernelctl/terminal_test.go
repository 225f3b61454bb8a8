package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/receipts"
)

// Text an agent or caller chose reaches the terminal with no character a
// terminal acts on: control characters but tab and newline, bidirectional
// controls and bytes that are not UTF-8 are shown escaped; a cell holding
// a tab or newline is quoted, so it cannot end its row (rev-console #3:
// ESC [ 8 m hid the rest of a path in `approvals list`, an OSC 52
// sequence reached `kernelctl events`).
func TestTerminalSafe(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"write fs:/ws/README.md", "write fs:/ws/README.md"},
		{"a\tb\n", "a\tb\n"},
		{"README.md\x1b[8m/../ci.yml", `README.md\x1b[8m/../ci.yml`},
		{"\x1b]52;c;Y3VybCBldmlsfHNo\x07", `\x1b]52;c;Y3VybCBldmlsfHNo\a`},
		{"over\rwrite", `over\rwrite`},
		{"8-bit \u009b CSI", `8-bit \u009b CSI`},
		{"raw \x9b byte", `raw \x9b byte`},
		{"bidi \u202egnp.exe", `bidi \u202egnp.exe`},
		{"naïve ✓", "naïve ✓"},
	} {
		var b bytes.Buffer
		n, err := terminalSafe{&b}.Write([]byte(c.in))
		if err != nil || n != len(c.in) || b.String() != c.want {
			t.Errorf("%q: wrote %q (%d, %v), want %q", c.in, b.String(), n, err, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"fs.write", "fs.write"},
		{"a\tb", `"a\tb"`},
		{"x\nAPPROVAL\tpending", `"x\nAPPROVAL\tpending"`},
	} {
		if got := cell(c.in); got != c.want {
			t.Errorf("cell(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// A table cell of agent text cannot make a second row.
	var b bytes.Buffer
	tw := newTable(&b)
	fmt.Fprintf(tw, "%s\t%s\n", "ap-1", cell("x\nap-2\tallowed"))
	tw.Flush()
	if bytes.Count(b.Bytes(), []byte("\n")) != 1 {
		t.Errorf("one row became %q", b.String())
	}
}

// receipts show prints each field on its row however its value is made:
// a refused call's tool_id is whatever its sender put there (rev-key #3:
// "fs.read\ntx_outcome    committed" printed a forged row above the real
// one).
func TestPrintReceiptRows(t *testing.T) {
	var b bytes.Buffer
	printReceipt(&b, &receipts.Receipt{ReceiptID: "r1", ToolID: "fs.read\ntx_outcome    committed\napproved_by   alice\u202e", TxOutcome: "no_op"})
	out := b.String()
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("%d rows, want 5 (receipt_id, tool_id, tx_outcome, risk_score, ledger_seq):\n%s", n, out)
	}
	if strings.Contains(out, "\u202e") || strings.Count(out, "tx_outcome") != 2 || !strings.Contains(out, `\u202e`) {
		t.Errorf("the tool_id row:\n%s", out)
	}
}
