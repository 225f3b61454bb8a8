package captoken

import "testing"

func TestAllowsTool(t *testing.T) {
	tests := []struct {
		tools []string
		id    string
		want  bool
	}{
		{[]string{"*"}, "echo", true},
		{[]string{"*"}, "mcp.github.create_issue", true},
		{[]string{"*"}, "", false},
		{[]string{"echo"}, "echo", true},
		{[]string{"echo"}, "echo2", false},
		{[]string{"echo"}, "ech", false},
		{[]string{"echo"}, "Echo", false},
		{[]string{"fs.*"}, "fs.read", true},
		{[]string{"fs.*"}, "fs.dir.list", true},
		{[]string{"fs.*"}, "fs", false},
		{[]string{"fs.*"}, "fs.", false},
		{[]string{"fs.*"}, "fsx.read", false},
		{[]string{"fs.*"}, "net.fetch", false},
		{[]string{"mcp.github.*"}, "mcp.github.create_issue", true},
		{[]string{"mcp.github.*"}, "mcp.gitlab.create_issue", false},
		{[]string{"mcp.github.*"}, "mcp.github", false},
		{[]string{"fs.read"}, "fs.read.secret", false},
		{[]string{"echo", "net.*"}, "net.fetch", true},
		{[]string{"echo", "net.*"}, "proc.exec", false},
		{nil, "echo", false},
		// Invalid patterns (Validate refuses them) still match literally
		// at most, never as globs.
		{[]string{"fs*"}, "fs.read", false},
		{[]string{"f?.read"}, "fs.read", false},
		{[]string{"*.read"}, "fs.read", false},
	}
	for _, tt := range tests {
		tok := &Token{Claims: Claims{Cap: Capability{Tools: tt.tools}}}
		if got := tok.AllowsTool(tt.id); got != tt.want {
			t.Errorf("tools %q AllowsTool(%q) = %v, want %v", tt.tools, tt.id, got, tt.want)
		}
	}
}

func TestToolPatternValid(t *testing.T) {
	for _, p := range []string{"*", "echo", "fs.*", "fs.read", "mcp.github.create_issue", "mcp.my-server.*", "a.b.c.*"} {
		if err := validToolPattern(p); err != nil {
			t.Errorf("validToolPattern(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", ".", ".*", "*.*", "fs.", ".fs", "fs..read", "fs*", "fs.re*", "*.read", "f?", "fs.[a-z]",
		`fs.\*`, "fs read", "fs.read\n", "fs.**", "fs.*.*", "écho"} {
		if err := validToolPattern(p); err == nil {
			t.Errorf("validToolPattern(%q) = nil, want an error", p)
		}
	}
}
