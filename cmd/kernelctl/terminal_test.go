package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/jcs"
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

// receipts verify of a forged receipt prints what the receipt claims on
// one line, escaped and marked as a claim: a JWS payload's receipt_id, or
// the id a v2 receipt's unchecked entry makes, held fake "ok" lines and
// ESC [ 8 m, which hid the real verdict on a terminal (review rev-verify
// F4).
func TestReceiptsVerifyForgedIDSafe(t *testing.T) {
	fake := "r7-0123456789abcdef\nsignature:    ok (the checkpoint's)\nledger match: ok\n\x1b[8m"
	payload, err := jcs.Marshal(receipts.Receipt{ReceiptID: fake, TxOutcome: "no_op"})
	if err != nil {
		t.Fatal(err)
	}
	e := base64.RawURLEncoding
	jws := e.EncodeToString([]byte(`{"alg":"EdDSA","kid":"x","typ":"capkernel-receipt+jws"}`)) + "." + e.EncodeToString(payload) + "." + e.EncodeToString(make([]byte, 64))
	entry, err := json.Marshal(map[string]any{"seq": 7, "entry_hash": "blake3:\x1b[8m\nsignature: ok", "kind": "audit"})
	if err != nil {
		t.Fatal(err)
	}
	logged, err := json.Marshal(map[string]any{"format": receipts.Format, "entry": string(entry), "checkpoint": "x", "inclusion": map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := receipts.JWKS(pub)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jwksFile := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwksFile, jwks, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, content, wantID string
	}{
		{"a v1 JWS", jws, `receipt "r7-0123456789abcdef\nsignature:    ok (the checkpoint's)\nledger match: ok\n\x1b[8m" (claimed: not verified)`},
		{"a v2 receipt", string(logged), `receipt "r7-\x1b[8m\nsignature: " (claimed: not verified)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, "receipt")
			if err := os.WriteFile(file, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			out, stderr, code := run(t, "receipts", "verify", file, "--jwks", jwksFile)
			if code != 1 || !strings.Contains(stderr, "receipt verification FAILED") {
				t.Fatalf("exit %d, want 1:\n%s%s", code, out, stderr)
			}
			first, _, _ := strings.Cut(out, "\n")
			if strings.ContainsRune(out, 0x1b) || first != tc.wantID || strings.Count(out, "\nsignature:") != 1 || strings.Contains(out, "\nledger match: ok") {
				t.Fatalf("printed %q, want the first line %q and one signature line", out, tc.wantID)
			}
		})
	}
}
