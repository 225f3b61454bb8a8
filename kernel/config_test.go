package kernel

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/syscalls"
)

// The execution bound of a syscall that sets none: the class's override,
// else CallTimeout, else 60 s, or 600 s for EXECUTE and NETWORK.
func TestTimeoutByClass(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		se   syscalls.SideEffect
		want time.Duration
	}{
		{"read default", Config{}, syscalls.Read, 60 * time.Second},
		{"write default", Config{}, syscalls.Write, 60 * time.Second},
		{"execute default", Config{}, syscalls.Execute, 600 * time.Second},
		{"network default", Config{}, syscalls.Network, 600 * time.Second},
		{"CallTimeout for every class", Config{CallTimeout: 5 * time.Second}, syscalls.Execute, 5 * time.Second},
		{"class override wins", Config{CallTimeout: 5 * time.Second, Timeouts: map[syscalls.SideEffect]time.Duration{syscalls.Execute: time.Hour}}, syscalls.Execute, time.Hour},
		{"override of another class", Config{Timeouts: map[syscalls.SideEffect]time.Duration{syscalls.Execute: time.Hour}}, syscalls.Read, 60 * time.Second},
	}
	for _, tc := range tests {
		if got := tc.cfg.timeout(tc.se); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// PolicyDir resolves kernel.json's policy_dir against the data dir and
// names the setting and the resolved path when it is no directory.
func TestPolicyDir(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if _, err := Init(data); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(data, "pol"), 0o755)
	os.WriteFile(filepath.Join(dir, "file.json"), []byte("{}"), 0o644)
	for _, tt := range []struct{ policyDir, want, err string }{
		{"", "", ""},
		{"pol", filepath.Join(data, "pol"), ""},
		{filepath.Join(data, "pol"), filepath.Join(data, "pol"), ""},
		{"nope", "", `policy_dir "nope" (` + filepath.Join(data, "nope") + `, resolved against the data dir): no such directory`},
		{"../file.json", "", `policy_dir "../file.json" (` + filepath.Join(dir, "file.json") + `, resolved against the data dir): not a directory`},
	} {
		cfg := filepath.Join(data, ConfigFile)
		var m map[string]any
		b, _ := os.ReadFile(cfg)
		json.Unmarshal(b, &m)
		m["policy_dir"] = tt.policyDir
		b, _ = json.Marshal(m)
		os.WriteFile(cfg, b, 0o600)
		got, err := PolicyDir(data)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("policy_dir %q: PolicyDir = %q, %v; want %q", tt.policyDir, got, err, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), cfg)):
			t.Errorf("policy_dir %q: PolicyDir = %q, %v; want an error naming %s with %q", tt.policyDir, got, err, cfg, tt.err)
		}
	}
}
