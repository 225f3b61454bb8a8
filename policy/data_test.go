package policy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"
)

// TestDataFilesOverlap: a bundle's data files merge as OPA merges them:
// objects at the same data path merge member by member, and any other
// value that two files both reach (a value at the same path, or a value
// where the other file has an object, at any depth) refuses the bundle at
// load and in Test, naming both files and the path, whichever way the
// files' names sort. Each case is checked against OPA's own loader (`opa
// test`, `opa eval -d`) and bundle reader (`opa eval -b`, `opa build`):
// they refuse the same bundles and build the same data.
func TestDataFilesOverlap(t *testing.T) {
	cases := map[string]struct {
		files map[string]string
		// conflict: "data files A and B both define PATH", A before B in
		// path order; empty when the bundle loads.
		conflict string
		// merged: data.d of the loaded bundle, as JSON.
		merged string
	}{
		// The review's bundle: the nested file dropped the deny list.
		"array, nested dir sorting after data.json": {
			files:    map[string]string{"data.json": `{"zblocked": ["proc.exec"]}`, "zblocked/data.json": `{"note": "per-team overrides go here"}`},
			conflict: "data files data.json and zblocked/data.json both define data.zblocked",
		},
		"array, nested dir sorting before data.json": {
			files:    map[string]string{"data.json": `{"blocked": ["proc.exec"]}`, "blocked/data.json": `{"note": "per-team overrides go here"}`},
			conflict: "data files blocked/data.json and data.json both define data.blocked",
		},
		"array one level down, after": {
			files:    map[string]string{"a/data.json": `{"zz": [1]}`, "a/zz/data.json": `{"k": 1}`},
			conflict: "data files a/data.json and a/zz/data.json both define data.a.zz",
		},
		"array one level down, before": {
			files:    map[string]string{"a/data.json": `{"b": [1]}`, "a/b/data.json": `{"k": 1}`},
			conflict: "data files a/b/data.json and a/data.json both define data.a.b",
		},
		"string above a deeper file, after": {
			files:    map[string]string{"data.json": `{"zz": "s"}`, "zz/b/c/data.json": `{"k": 1}`},
			conflict: "data files data.json and zz/b/c/data.json both define data.zz",
		},
		"string above a deeper file, before": {
			files:    map[string]string{"data.json": `{"a": "s"}`, "a/b/c/data.json": `{"k": 1}`},
			conflict: "data files a/b/c/data.json and data.json both define data.a",
		},
		"an empty nested file still overlaps": {
			files:    map[string]string{"data.json": `{"z": 1}`, "z/data.json": `{}`},
			conflict: "data files data.json and z/data.json both define data.z",
		},
		"null": {
			files:    map[string]string{"data.json": `{"z": null}`, "z/data.json": `{}`},
			conflict: "data files data.json and z/data.json both define data.z",
		},
		"object member vs nested file's member, after": {
			files:    map[string]string{"data.json": `{"z": {"k": 1}}`, "z/data.json": `{"k": 2}`},
			conflict: "data files data.json and z/data.json both define data.z.k",
		},
		"object member vs nested file's member, before": {
			files:    map[string]string{"data.json": `{"a": {"k": 1}}`, "a/data.json": `{"k": 2}`},
			conflict: "data files a/data.json and data.json both define data.a.k",
		},
		"equal arrays still overlap": {
			files:    map[string]string{"data.json": `{"z": {"k": [1]}}`, "z/data.json": `{"k": [1]}`},
			conflict: "data files data.json and z/data.json both define data.z.k",
		},
		"deep in merged objects": {
			files:    map[string]string{"data.json": `{"z": {"b": {"x": 1}}}`, "z/data.json": `{"b": {"x": {"q": 1}}}`},
			conflict: "data files data.json and z/data.json both define data.z.b.x",
		},
		"two nested files": {
			files:    map[string]string{"a/data.json": `{"b": {"c": [1]}}`, "a/b/c/data.json": `{"d": 1}`},
			conflict: "data files a/b/c/data.json and a/data.json both define data.a.b.c",
		},
		"names the file that defines the value": {
			files:    map[string]string{"data.json": `{"a": {"b": {}}}`, "a/data.json": `{"b": {"c": 1}}`, "a/b/data.json": `{"c": 2}`},
			conflict: "data files a/b/data.json and a/data.json both define data.a.b.c",
		},
		"a key that is no identifier": {
			files:    map[string]string{"data.json": `{"x-y": [1]}`, "x-y/data.json": `{}`},
			conflict: `data files data.json and x-y/data.json both define data["x-y"]`,
		},
		"objects merge, after": {
			files:  map[string]string{"d/data.json": `{"z": {"k": 1}}`, "d/z/data.json": `{"j": [2]}`},
			merged: `{"z": {"k": 1, "j": [2]}}`,
		},
		"objects merge, before": {
			files:  map[string]string{"d/data.json": `{"a": {"k": 1}}`, "d/a/data.json": `{"j": [2]}`},
			merged: `{"a": {"k": 1, "j": [2]}}`,
		},
		"objects merge at depth": {
			files:  map[string]string{"d/data.json": `{"z": {"b": {"x": 1}}}`, "d/z/data.json": `{"b": {"y": [2]}}`},
			merged: `{"z": {"b": {"x": 1, "y": [2]}}}`,
		},
		"root file and a deeper file": {
			files:  map[string]string{"data.json": `{"d": {"a": {"b": {"k": 1}}}}`, "d/a/b/c/data.json": `{"m": 1}`, "d/a/data.json": `{"n": {}}`},
			merged: `{"a": {"b": {"k": 1, "c": {"m": 1}}, "n": {}}}`,
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "p.rego", "package capkernel\ndecision := {\"autonomy_mode\": \"autopilot\", \"risk_score\": 0, \"risk_basis\": [json.marshal(data.d)]}\n")
			write(t, dir, "p_test.rego", "package capkernel\ntest_loads if true\n")
			for p, content := range c.files {
				if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				write(t, dir, p, content)
			}
			opaData, opaErr := opaLoad(dir)
			e, err := Load(context.Background(), dir)
			_, testErr := Test(context.Background(), dir)
			if c.conflict != "" {
				if err == nil || !strings.Contains(err.Error(), c.conflict) {
					t.Errorf("Load: %v, want an error holding %q", err, c.conflict)
				}
				if testErr == nil || !strings.Contains(testErr.Error(), c.conflict) {
					t.Errorf("Test: %v, want an error holding %q", testErr, c.conflict)
				}
				if opaErr == nil {
					t.Errorf("OPA loads the bundle the kernel refuses")
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if testErr != nil {
				t.Errorf("Test: %v", testErr)
			}
			if opaErr != nil {
				t.Fatalf("OPA refuses the bundle the kernel loads: %v", opaErr)
			}
			d, err := e.Decide(context.Background(), &Input{ToolID: "t", SideEffect: "read", AgentID: "a"})
			if err != nil || len(d.RiskBasis) != 1 {
				t.Fatalf("Decide: %+v, %v", d, err)
			}
			got, want := unmarshal(t, d.RiskBasis[0]), unmarshal(t, c.merged)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("data.d is %s, want %s", d.RiskBasis[0], c.merged)
			}
			for reader, v := range opaData {
				if !reflect.DeepEqual(v, want) {
					t.Errorf("OPA's %s reads data.d as %v, want %s", reader, v, c.merged)
				}
			}
		})
	}
}

// opaLoad reads dir with OPA's loader and its bundle reader and returns
// the data.d each built, or the first error.
func opaLoad(dir string) (map[string]any, error) {
	l, err := loader.NewFileLoader().WithRegoVersion(ast.RegoV1).All([]string{dir})
	if err != nil {
		return nil, err
	}
	b, err := opabundle.NewCustomReader(opabundle.NewDirectoryLoader(dir)).WithRegoVersion(ast.RegoV1).Read()
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for reader, data := range map[string]map[string]any{"loader": l.Documents, "bundle reader": b.Data} {
		j, err := json.Marshal(data["d"])
		if err != nil {
			return nil, err
		}
		var v any
		if err := json.Unmarshal(j, &v); err != nil {
			return nil, err
		}
		out[reader] = v
	}
	return out, nil
}

func unmarshal(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}
