package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/upstream"
)

func TestMCPDeclarations(t *testing.T) {
	out, errOut, code := run(t, "mcp", "declarations")
	var all map[string]upstream.Reference
	if code != 0 || json.Unmarshal([]byte(out), &all) != nil {
		t.Fatalf("exit %d, %s %s", code, out, errOut)
	}
	for _, n := range []string{"filesystem", "git", "fetch", "memory", "everything"} {
		if len(all[n].Resources) == 0 {
			t.Errorf("no declarations for %s", n)
		}
	}
	out, _, code = run(t, "mcp", "declarations", "filesystem")
	var fs []upstream.Declaration
	if code != 0 || json.Unmarshal([]byte(out), &fs) != nil || fs[0].Tools != "read_multiple_files" || fs[0].Args[0].Pointer != "/paths/*" {
		t.Fatalf("exit %d, %s", code, out)
	}
	// --json, as on every verb printing a result, prints the same JSON.
	if withJSON, errOut, code := run(t, "mcp", "declarations", "filesystem", "--json"); code != 0 || withJSON != out {
		t.Fatalf("declarations --json: exit %d, %s %s", code, withJSON, errOut)
	}
	if _, errOut, code = run(t, "mcp", "declarations", "nope"); code != 2 || !strings.Contains(errOut, "filesystem") {
		t.Fatalf("unknown name: exit %d, %s", code, errOut)
	}
}
