package syscalls

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// quickSchemas are the built-in syscalls' input schemas and schemas that
// use every keyword of the subset, in and out of what quick models.
func quickSchemas(t testing.TB) map[string]*Entry {
	t.Helper()
	r := NewRegistry()
	if err := RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	out := map[string]*Entry{}
	for _, d := range r.List() {
		e, _ := r.Get(d.ID)
		out[d.ID] = e
	}
	extra := []string{
		`{"type":"object","properties":{"n":{"type":"integer","minimum":-3,"maximum":7},"x":{"type":"number","minimum":0}},"required":["n"]}`,
		`{"type":"object","properties":{"n":{"type":"number","minimum":1.5},"s":{"type":"string","minLength":2}},"additionalProperties":false}`,
		`{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer","maximum":2}},"b":{"type":"boolean"},"z":{"type":"null"}},"additionalProperties":false}`,
		`{"type":"object","properties":{"e":{"type":"string","enum":["a","b"]},"p":{"type":"string","pattern":"^a"},"c":{"const":1}}}`,
		`{"type":"object","properties":{"o":{"type":"object","properties":{"k":{"type":"string"}},"required":["k"],"additionalProperties":false},"any":{"description":"anything"}}}`,
		`{"type":"object","properties":{"n":{"type":"integer","exclusiveMinimum":0},"m":{"type":"integer","minimum":100000000000000000000}}}`,
		`{"type":"object","properties":{"u":{"type":"array","uniqueItems":true,"maxItems":2}}}`,
	}
	for i, s := range extra {
		sch, root, err := compileSchema(fmt.Sprint("extra", i), json.RawMessage(s))
		if err != nil {
			t.Fatalf("schema %s: %v", s, err)
		}
		out[fmt.Sprint("extra", i)] = &Entry{schema: sch, quick: compileQuick(root)}
	}
	return out
}

// quickValues are values to put in arguments: every JSON type, integers in
// the forms JSON allows, and numbers at and past the bounds quick compares.
var quickValues = []string{`"x"`, `""`, `"ab"`, `0`, `-0`, `1`, `-1`, `2`, `7`, `8`, `-3`, `-4`, `1.0`, `1.5`, `1e2`, `2E0`, `-0.0`,
	`123456789012345`, `1234567890123456`, `9007199254740993`, `100000000000000000000`, `true`, `false`, `null`,
	`[]`, `[1]`, `[1,2]`, `[3]`, `[1,1]`, `["a"]`, `{}`, `{"k":"v"}`, `{"k":1}`, `{"k":"v","j":1}`}

// quickInstances are argument objects over the schemas' property names
// (and one name none declares): each name alone with each value, the
// required names with each value in one, and non-objects.
func quickInstances(entries map[string]*Entry) []string {
	names := map[string]bool{"undeclared": true}
	for _, e := range entries {
		if e.quick != nil {
			for n := range e.quick.props {
				names[n] = true
			}
		}
	}
	for _, n := range []string{"n", "x", "s", "a", "b", "z", "e", "p", "c", "o", "any", "m", "u", "path", "content", "text"} {
		names[n] = true
	}
	out := []string{`{}`, `[]`, `"s"`, `1`, `null`}
	sorted := slices.Sorted(maps.Keys(names))
	for _, n := range sorted {
		for _, v := range quickValues {
			out = append(out, fmt.Sprintf(`{%q:%s}`, n, v))
			// With the names most schemas require, so that objects get
			// past "required".
			out = append(out, fmt.Sprintf(`{"path":"p","content":"c","text":"t","key":"k","value":1,"command":["true"],"url":"http://a","n":1,"o":{"k":"v"},%q:%s}`, n, v))
		}
	}
	return out
}

// TestQuickVouchesOnlyForValid: quick never accepts arguments the full
// validator refuses, for every schema and instance above; and it does
// vouch for the common valid arguments of the built-in syscalls, so the
// fast path is the one they take.
func TestQuickVouchesOnlyForValid(t *testing.T) {
	entries := quickSchemas(t)
	vouched := map[string]int{}
	for _, inst := range quickInstances(entries) {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(inst)))
		if err != nil {
			t.Fatalf("instance %s: %v", inst, err)
		}
		for id, e := range entries {
			if !e.quick.valid(v) {
				continue
			}
			vouched[id]++
			if err := check(e.schema, v); err != nil {
				t.Errorf("%s: quick vouched for %s, which the validator refuses: %v", id, inst, err)
			}
		}
	}
	for _, c := range []struct{ id, args string }{
		{"fs.read", `{"path":"a.txt"}`},
		{"fs.read", `{"path":"a.txt","offset":0,"max_bytes":10}`},
		{"echo", `{"text":"hello"}`},
		{"fs.write", `{"path":"a.txt","content":"hi"}`},
	} {
		v, _ := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(c.args)))
		if !entries[c.id].quick.valid(v) {
			t.Errorf("quick does not vouch for %s %s", c.id, c.args)
		}
	}
	for _, id := range []string{"extra0", "extra2", "extra4"} {
		if vouched[id] == 0 {
			t.Errorf("quick vouched for no instance of %s", id)
		}
	}
}

// FuzzQuick: for any JSON arguments, quick's vouching implies the full
// validator's acceptance, for every schema of quickSchemas.
func FuzzQuick(f *testing.F) {
	entries := quickSchemas(f)
	for _, inst := range quickInstances(entries) {
		f.Add(inst)
	}
	f.Fuzz(func(t *testing.T, inst string) {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(inst)))
		if err != nil {
			return
		}
		for id, e := range entries {
			if e.quick.valid(v) {
				if err := check(e.schema, v); err != nil {
					t.Fatalf("%s: quick vouched for %s, which the validator refuses: %v", id, inst, err)
				}
			}
		}
	})
}
