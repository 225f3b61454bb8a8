package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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

// The --json of the list verbs prints one JSON array (empty, not null,
// when there is nothing), and ledger tail --json one object a line; each
// verb's help says so. Scripts depend on these shapes.
func TestJSONShapes(t *testing.T) {
	sv := initServed(t)
	data := sv.server.data
	tok := filepath.Join(t.TempDir(), "a.token")
	os.WriteFile(tok, []byte(mustRun(t, "token", "mint", "--data", data, "--agent", "a", "--tools", "echo,kv.*", "--kv", "*:rw")), 0o600)
	for range 2 {
		mustRun(t, "call", "kv.put", "--token", tok, "--arg", "key=k", "--arg", "value=1", "--idempotency-key", "i1", "--data", data)
	}
	array := func(args ...string) {
		t.Helper()
		out := mustRun(t, append(args, "--data", data, "--json")...)
		var v []json.RawMessage
		if !strings.HasPrefix(out, "[") || json.Unmarshal([]byte(out), &v) != nil {
			t.Errorf("kernelctl %s --json: not one JSON array:\n%s", strings.Join(args, " "), out)
		}
	}
	array("receipts", "list")
	array("receipts", "list", "--agent", "nobody")
	array("approvals", "list")
	array("replay", "show", "i1")
	lines := strings.Split(strings.TrimSpace(mustRun(t, "ledger", "tail", "--data", data, "--json")), "\n")
	for _, l := range lines {
		var v map[string]json.RawMessage
		if json.Unmarshal([]byte(l), &v) != nil {
			t.Errorf("ledger tail --json: a line is not a JSON object: %s", l)
		}
	}
	if len(lines) < 2 {
		t.Errorf("ledger tail --json printed %d line(s)", len(lines))
	}
	for verb, shape := range map[string]string{
		"receipts list":  `one JSON array of the receipts (GET /v1/receipts wraps the same array in {"receipts": [...]})`,
		"approvals list": `one JSON array of the approvals (GET /v1/approvals wraps the same array in {"approvals": [...]})`,
		"replay show":    "one JSON array, a history per agent that used KEY",
		"ledger tail":    "one JSON object a line, an entry each (JSON Lines",
	} {
		if help := mustRun(t, append(strings.Fields(verb), "--help")...); !strings.Contains(strings.Join(strings.Fields(help), " "), shape) {
			t.Errorf("kernelctl %s --help does not say %q", verb, shape)
		}
	}
}
