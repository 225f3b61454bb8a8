package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// What kernelctl prints as text is partly what agents and callers chose:
// paths, tool ids, sessions, reasons. A terminal acts on the control
// characters in such text (ESC [ 8 m hides what follows, OSC 52 sets the
// clipboard, a carriage return overwrites the line) and shows bidirectional
// controls by reordering text, and a lying kernel's error message may
// hold lines that look like kernelctl's own. So everything a verb prints
// goes through terminalSafe: main makes it the writer of the root
// command's standard output and error, and the error line too. It shows
// every such character as a visible escape; tab and newline, which lay
// the tables out, pass, and a value holding one is quoted by cell. JSON
// is written through jsonSafe, which escapes the same characters as JSON
// does (\u009b), so that it stays the same JSON. Only output that must
// be the bytes it copies (an export, the ledger's stored records, an
// agent's own output) is written to rawOut.

// terminalSafe is a writer that writes to w what it is given with every
// control character but tab and newline (C0, DEL, C1), every
// bidirectional control and every byte that is not UTF-8 shown as an
// escape (\x1b, \u202e).
type terminalSafe struct{ w io.Writer }

func (t terminalSafe) Write(p []byte) (int, error) {
	var b []byte // nil while p needs no escape
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		esc := ""
		switch {
		case r == utf8.RuneError && n == 1:
			esc = fmt.Sprintf(`\x%02x`, p[i])
		case unsafeRune(r):
			esc = strings.Trim(strconv.QuoteRuneToASCII(r), "'")
		}
		if esc != "" && b == nil {
			b = append(make([]byte, 0, len(p)+16), p[:i]...)
		}
		switch {
		case esc != "":
			b = append(b, esc...)
		case b != nil:
			b = append(b, p[i:i+n]...)
		}
		i += n
	}
	if b == nil {
		return t.w.Write(p)
	}
	if _, err := t.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// unsafeRune reports whether a terminal could act on r: a control
// character other than tab and newline, or a bidirectional control.
func unsafeRune(r rune) bool {
	switch {
	case r == '\t' || r == '\n':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// cell is s as one table cell: quoted (Go syntax) when it holds a tab,
// newline or carriage return, which would otherwise end the cell or the row.
func cell(s string) string {
	if strings.ContainsAny(s, "\t\n\r") {
		return strconv.Quote(s)
	}
	return s
}

// newTable returns a table writer to w, terminal safe.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(terminalSafe{w}, 2, 4, 2, ' ', 0)
}

// jsonSafe is a writer that writes to w the JSON text it is given with
// every rune terminalSafe escapes written as a JSON escape (\u001b,
// \u202e), and every byte that is not UTF-8 as \ufffd, which a JSON reader
// reads it as. An encoder escapes control characters in strings but for
// DEL, and passes C1 and bidirectional controls as they are; they occur
// only in strings, where the escape is the same character.
type jsonSafe struct{ w io.Writer }

func (j jsonSafe) Write(p []byte) (int, error) {
	var b []byte // nil while p needs no escape
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		unsafe := (r == utf8.RuneError && n == 1) || unsafeRune(r)
		if unsafe && b == nil {
			b = append(make([]byte, 0, len(p)+16), p[:i]...)
		}
		switch {
		case unsafe:
			b = fmt.Appendf(b, `\u%04x`, r)
		case b != nil:
			b = append(b, p[i:i+n]...)
		}
		i += n
	}
	if b == nil {
		return j.w.Write(p)
	}
	if _, err := j.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// rawOut is cmd's standard output without the terminalSafe main puts
// around it: for output that must be the bytes it copies.
func rawOut(cmd *cobra.Command) io.Writer { return withoutTerminalSafe(cmd.OutOrStdout()) }

// rawErr is cmd's standard error without terminalSafe, for an agent's
// own output.
func rawErr(cmd *cobra.Command) io.Writer { return withoutTerminalSafe(cmd.ErrOrStderr()) }

func withoutTerminalSafe(w io.Writer) io.Writer {
	if t, ok := w.(terminalSafe); ok {
		return t.w
	}
	return w
}
