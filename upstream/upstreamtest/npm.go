package upstreamtest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// ReferenceServer is the command line that runs the official MCP
// reference server pkg ("server-filesystem", "server-everything") from
// upstream/testdata/npm, which make upstream-deps installs, with args.
// Without it the test is skipped, unless the Makefile runs it
// (CAPKERNEL_NPM_TESTS set), where that is a failure: make test must not
// pass by skipping the real servers.
func ReferenceServer(t testing.TB, pkg string, args ...string) []string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	js := filepath.Join(filepath.Dir(self), "..", "testdata", "npm", "node_modules", "@modelcontextprotocol", pkg, "dist", "index.js")
	if _, err := os.Stat(js); err != nil {
		if os.Getenv("CAPKERNEL_NPM_TESTS") != "" {
			t.Fatalf("%s is not installed (make upstream-deps): %v", pkg, err)
		}
		t.Skipf("%s is not installed; run make upstream-deps", pkg)
	}
	return append([]string{"node", js}, args...)
}
