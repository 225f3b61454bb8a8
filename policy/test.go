package policy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestResult is the outcome of one Rego test of a bundle.
type TestResult struct {
	Package  string        `json:"package"`
	Name     string        `json:"name"`
	Pass     bool          `json:"pass"`
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"duration_ns"`
}

// Hash returns the policy hash of a bundle (the embedded default when dir
// is "") without compiling it.
func Hash(dir string) (string, error) {
	b, err := readBundle(dir)
	if err != nil {
		return "", err
	}
	return b.hash(), nil
}

// Test runs the Rego tests (rules named test_* in *_test.rego files) of a
// bundle, the embedded default when dir is "", with OPA's tester and the
// bundle's data, as `opa test` would.
func Test(ctx context.Context, dir string) ([]TestResult, error) {
	b, err := readBundle(dir)
	if err != nil {
		return nil, err
	}
	modules := map[string]*ast.Module{}
	for _, f := range b.files {
		if strings.HasSuffix(f.path, ".rego") {
			m, err := ast.ParseModuleWithOpts(f.path, string(f.content), ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				return nil, fmt.Errorf("policy %s: %s", b.name, oneLine(err))
			}
			modules[f.path] = m
		}
	}
	data, err := b.data()
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", b.name, err)
	}
	store := inmem.NewFromObject(data)
	txn, err := store.NewTransaction(ctx, storage.TransactionParams{})
	if err != nil {
		return nil, err
	}
	defer store.Abort(ctx, txn)
	ch, err := tester.NewRunner().SetStore(store).SetModules(modules).SetDefaultRegoVersion(ast.RegoV1).RunTests(ctx, txn)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %s", b.name, oneLine(err))
	}
	var out []TestResult
	for r := range ch {
		tr := TestResult{Package: r.Package, Name: r.Name, Pass: r.Pass(), Duration: r.Duration}
		if r.Error != nil {
			tr.Error = oneLine(r.Error)
		} else if r.Fail {
			tr.Error = "test rule is false or undefined"
		}
		out = append(out, tr)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("policy %s: no Rego tests (rules named test_* in *_test.rego files)", b.name)
	}
	return out, nil
}
