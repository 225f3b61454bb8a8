package main

import (
	"strings"
	"testing"
)

// kernelctl's text prints <, > and & as they are: a terminal or a file is
// no HTML page (a fetched page's markup was \u003c…\u003e). (--json prints
// the kernel's answer as it came, a JSON text of the same values.)
func TestOutputKeepsMarkup(t *testing.T) {
	sv := initServed(t)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "a1", "--tools", "echo")
	out := mustRun(t, "call", "echo", "--token", tok.file, "--arg-str", "text=<a&b>", "--server", sv.url)
	if !strings.Contains(out, `"text": "<a&b>"`) {
		t.Fatalf("call:\n%s", out)
	}
}
