package policy

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/capkernel/capkernel/digest"
)

// TestRegoTests runs the default bundle's Rego tests through OPA's tester,
// so go test fails when a rule does.
func TestRegoTests(t *testing.T) {
	results, err := tester.Run(context.Background(), "rego")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Fail || r.Error != nil {
			t.Errorf("%s: failed (%v)", r.Name, r.Error)
		}
	}
	if len(results) < 15 {
		t.Fatalf("only %d Rego tests ran", len(results))
	}
}

func TestDecideDefault(t *testing.T) {
	e, err := Load(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	fs := func(op, p string, dir bool) Resource {
		return Resource{Kind: "fs", Op: op, Path: p, RealPath: p, IsDir: dir}
	}
	cases := []struct {
		name  string
		class string
		res   []Resource
		mode  string
		risk  float64
		basis string
	}{
		{"read", "READ", []Resource{fs("read", "a.go", false)}, Autopilot, 0.1, "read in scope"},
		{"write", "WRITE", []Resource{fs("write", "a.go", false)}, Autopilot, 0.3, "write in scope"},
		{"sensitive write", "WRITE", []Resource{fs("write", ".git/config", false)}, SoftGate, 0.6, "write under sensitive path: .git/config"},
		{"dir delete", "WRITE", []Resource{fs("delete", "build", true)}, Escalated, 0.8, "delete of a directory: build"},
		{"secret", "READ", []Resource{fs("read", ".env", false)}, NoGo, 1, "secret path: .env"},
		{"unknown class", "TELEPORT", nil, NoGo, 1, `unknown side-effect class: "TELEPORT"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := e.Decide(context.Background(), &Input{ToolID: "t", SideEffect: c.class, Resources: c.res, AgentID: "a"})
			if err != nil {
				t.Fatal(err)
			}
			if d.AutonomyMode != c.mode || d.RiskScore != c.risk || !contains(d.RiskBasis, c.basis) {
				t.Fatalf("got %+v, want %s %v with basis %q", d, c.mode, c.risk, c.basis)
			}
		})
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestFailClosed: a bundle that decides badly, or cannot load, never lets
// a call through.
func TestFailClosed(t *testing.T) {
	decideErr := map[string]string{
		"unknown mode":           `decision := {"autonomy_mode": "yolo", "risk_score": 0, "risk_basis": []}`,
		"risk above 1":           `decision := {"autonomy_mode": "autopilot", "risk_score": 1.5, "risk_basis": []}`,
		"risk not a number":      `decision := {"autonomy_mode": "autopilot", "risk_score": "high", "risk_basis": []}`,
		"basis not strings":      `decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": [1]}`,
		"basis missing":          `decision := {"autonomy_mode": "autopilot", "risk_score": 0}`,
		"decision not an object": `decision := "autopilot"`,
	}
	for name, rule := range decideErr {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", "package capkernel\n"+rule+"\n")
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if d, err := e.Decide(context.Background(), &Input{SideEffect: "READ"}); err == nil {
				t.Fatalf("decided %+v, want an error", d)
			}
		})
	}
	loadErr := map[string]func(dir string){
		"syntax error": func(dir string) { write(t, dir, "p.rego", "package capkernel\ndecision := {\n") },
		"other file":   func(dir string) { write(t, dir, "p.rego", "package capkernel\n"); write(t, dir, "notes.txt", "x") },
		"symlink": func(dir string) {
			write(t, dir, "real.rego", "package capkernel\n")
			os.Symlink("real.rego", filepath.Join(dir, "p.rego"))
		},
		"empty":       func(string) {},
		"no decision": func(dir string) { write(t, dir, "p.rego", "package capkernel\nother := 1\n") },
		"bad data":    func(dir string) { write(t, dir, "p.rego", "package capkernel\n"); write(t, dir, "data.json", "{") },
		"missing":     func(dir string) { os.RemoveAll(dir) },
	}
	for name, mk := range loadErr {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mk(dir)
			if _, err := Load(context.Background(), dir); err == nil {
				t.Fatal("loaded")
			}
		})
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStricter(t *testing.T) {
	cases := []struct{ a, b, want string }{
		{"", "", Autopilot}, {Autopilot, SoftGate, SoftGate}, {Escalated, SoftGate, Escalated},
		{NoGo, Autopilot, NoGo}, {"", Escalated, Escalated}, {"bogus", Autopilot, NoGo}, {Autopilot, "bogus", NoGo},
	}
	for _, c := range cases {
		if got := Stricter(c.a, c.b); got != c.want {
			t.Errorf("Stricter(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

// TestHashVector pins the policy hash of testdata/bundle1 and checks it
// against the documented listing.
func TestHashVector(t *testing.T) {
	e, err := Load(context.Background(), "testdata/bundle1")
	if err != nil {
		t.Fatal(err)
	}
	var listing strings.Builder
	listing.WriteString("capkernel-policy-v1\n")
	for _, f := range []string{"a.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/bundle1", f))
		if err != nil {
			t.Fatal(err)
		}
		listing.WriteString(f + "\n" + itoa(len(b)) + "\n" + string(b))
	}
	// Also computed with b3sum over the listing built in the shell.
	const golden = "blake3:7d11cdaf00f20b90c873b327792ac863e5fff721c1b0d167f3204236c25f38ae"
	if e.Hash() != digest.Sum([]byte(listing.String())) {
		t.Fatalf("hash %s does not follow the documented listing", e.Hash())
	}
	if e.Hash() != golden {
		t.Fatalf("hash %s, golden %s", e.Hash(), golden)
	}
	if got := e.Files(); len(got) != 2 || got[0] != "a.rego" || got[1] != "data.json" {
		t.Fatalf("files %v", got)
	}
	// The same files written in another order hash alike; a changed byte does not.
	dir := t.TempDir()
	for _, f := range []string{"data.json", "a.rego"} {
		b, _ := os.ReadFile(filepath.Join("testdata/bundle1", f))
		write(t, dir, f, string(b))
	}
	if e2, err := Load(context.Background(), dir); err != nil || e2.Hash() != e.Hash() {
		t.Fatalf("copy hashes to %v (%v)", e2.Hash(), err)
	}
	write(t, dir, "data.json", `{"x": 2}`)
	if e3, err := Load(context.Background(), dir); err != nil || e3.Hash() == e.Hash() {
		t.Fatalf("changed bundle kept its hash (%v)", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestTestRunsBundleTests(t *testing.T) {
	res, err := Test(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) < 10 {
		t.Fatalf("ran %d Rego tests of the default bundle, want the whole suite", len(res))
	}
	for _, r := range res {
		if !r.Pass {
			t.Errorf("%s.%s failed: %s", r.Package, r.Name, r.Error)
		}
	}
	// A bundle whose test fails reports it.
	dir := t.TempDir()
	write(t, dir, "p.rego", "package capkernel\nallow := false\n")
	write(t, dir, "p_test.rego", "package capkernel\ntest_allow if { allow }\n")
	res, err = Test(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Pass {
		t.Fatalf("results = %+v, want one failing test", res)
	}
	h, err := Hash("")
	if err != nil {
		t.Fatal(err)
	}
	e, err := Load(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if h != e.Hash() {
		t.Fatalf("Hash() = %s, Load().Hash() = %s", h, e.Hash())
	}
}
