package syscalls_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

// stub is a syscall with a settable definition. Its field makes it a
// non-zero-size type, so the registry can tell one instance from another.
type stub struct {
	def syscalls.Definition
}

func (s *stub) Definition() syscalls.Definition { return s.def }

func (s *stub) Execute(context.Context, *syscalls.Call) (syscalls.Output, error) {
	return syscalls.Output{Result: json.RawMessage(`{}`)}, nil
}

// zeroSize is a syscall of zero size: two instances may share an address.
type zeroSize struct{}

func (*zeroSize) Definition() syscalls.Definition {
	return syscalls.Definition{ID: "zero.size", SideEffect: syscalls.None, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (*zeroSize) Execute(context.Context, *syscalls.Call) (syscalls.Output, error) {
	return syscalls.Output{Result: json.RawMessage(`{}`)}, nil
}

// fresh returns a factory making a new stub with def on every call.
func fresh(def syscalls.Definition) syscalls.Factory {
	return func() syscalls.Syscall { return &stub{def: def} }
}

// def returns a valid READ definition with a string property "path" and
// the given schema, if any.
func def(id, schema string) syscalls.Definition {
	if schema == "" {
		schema = `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`
	}
	return syscalls.Definition{ID: id, Description: "test", SideEffect: syscalls.Read, InputSchema: json.RawMessage(schema)}
}

func TestRegisterRejects(t *testing.T) {
	withResource := func(schema string, se syscalls.SideEffect, ra syscalls.ResourceArg) syscalls.Definition {
		d := def("t.res", schema)
		d.SideEffect = se
		d.Resources = []syscalls.ResourceArg{ra}
		return d
	}
	withSideEffect := func(se syscalls.SideEffect) syscalls.Definition {
		d := def("t.se", "")
		d.SideEffect = se
		return d
	}
	pathFS := func(a syscalls.Access) syscalls.ResourceArg {
		return syscalls.ResourceArg{Arg: "path", Kind: syscalls.KindFS, Access: a}
	}
	singleton := &stub{def: def("t.singleton", "")}

	tests := []struct {
		name    string
		factory syscalls.Factory
		id      string   // the id that must not be registered afterwards
		want    []string // substrings of the error
	}{
		{"$ref", fresh(def("t.kw", `{"type":"object","$ref":"#/$defs/x"}`)), "t.kw", []string{`"$ref"`, "at / is"}},
		{"oneOf", fresh(def("t.kw", `{"type":"object","oneOf":[{"required":["a"]}]}`)), "t.kw", []string{`"oneOf"`}},
		{"anyOf", fresh(def("t.kw", `{"type":"object","anyOf":[{"required":["a"]}]}`)), "t.kw", []string{`"anyOf"`}},
		{"allOf", fresh(def("t.kw", `{"type":"object","allOf":[{"required":["a"]}]}`)), "t.kw", []string{`"allOf"`}},
		{"not", fresh(def("t.kw", `{"type":"object","not":{"required":["a"]}}`)), "t.kw", []string{`"not"`}},
		{"if", fresh(def("t.kw", `{"type":"object","if":{"required":["a"]}}`)), "t.kw", []string{`"if"`}},
		{"then", fresh(def("t.kw", `{"type":"object","then":{"required":["a"]}}`)), "t.kw", []string{`"then"`}},
		{"else", fresh(def("t.kw", `{"type":"object","else":{"required":["a"]}}`)), "t.kw", []string{`"else"`}},
		{"patternProperties", fresh(def("t.kw", `{"type":"object","patternProperties":{"^x":{"type":"string"}}}`)), "t.kw", []string{`"patternProperties"`}},
		{"$defs", fresh(def("t.kw", `{"type":"object","$defs":{"x":{"type":"string"}}}`)), "t.kw", []string{`"$defs"`}},
		{"unknown keyword", fresh(def("t.kw", `{"type":"object","frobnicate":true}`)), "t.kw", []string{`"frobnicate"`, "outside the allowed subset"}},
		{"forbidden keyword inside properties", fresh(def("t.kw", `{"type":"object","properties":{"a":{"anyOf":[{"type":"string"}]}}}`)), "t.kw", []string{`"anyOf"`, "/properties/a"}},
		{"forbidden keyword inside items", fresh(def("t.kw", `{"type":"object","properties":{"list":{"type":"array","items":{"$ref":"#"}}}}`)), "t.kw", []string{`"$ref"`, "/properties/list/items"}},
		{"forbidden keyword deep inside", fresh(def("t.kw", `{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"array","items":{"not":{}}}}}}}`)), "t.kw", []string{`"not"`, "/properties/a/properties/b/items"}},
		{"additionalProperties as a schema", fresh(def("t.kw", `{"type":"object","additionalProperties":{"type":"string"}}`)), "t.kw", []string{"additionalProperties", "boolean"}},
		{"nested additionalProperties as a schema", fresh(def("t.kw", `{"type":"object","properties":{"m":{"type":"object","additionalProperties":{}}}}`)), "t.kw", []string{"additionalProperties", "/properties/m", "boolean"}},
		{"root type string", fresh(def("t.root", `{"type":"string"}`)), "t.root", []string{`"type": "object"`}},
		{"root without type", fresh(def("t.root", `{"properties":{}}`)), "t.root", []string{`"type": "object"`}},
		{"root not a JSON object", fresh(def("t.root", `["type","object"]`)), "t.root", []string{"not an object"}},
		{"schema not JSON", fresh(def("t.root", `{"type":`)), "t.root", []string{"input schema"}},
		{"schema that does not compile", fresh(def("t.root", `{"type":"object","properties":{"a":{"type":"string","pattern":"("}}}`)), "t.root", []string{"input schema", "metaschema"}},
		{"missing side-effect class", fresh(withSideEffect("")), "t.se", []string{"side-effect class", `""`}},
		{"unknown side-effect class", fresh(withSideEffect("DELETE")), "t.se", []string{"side-effect class", `"DELETE"`}},
		{"lowercase side-effect class", fresh(withSideEffect("read")), "t.se", []string{"side-effect class", `"read"`}},
		{"empty id", fresh(def("", "")), "", []string{`register ""`, "id must be"}},
		{"uppercase id", fresh(def("FS.read", "")), "FS.read", []string{`"FS.read"`, "id must be"}},
		{"empty label", fresh(def("fs..read", "")), "fs..read", []string{`"fs..read"`, "id must be"}},
		{"trailing underscore", fresh(def("fs.read_", "")), "fs.read_", []string{`"fs.read_"`, "id must be"}},
		{"double underscore", fresh(def("a__b", "")), "a__b", []string{`"a__b"`, "id must be"}},
		{"leading digit", fresh(def("1x", "")), "1x", []string{`"1x"`, "id must be"}},
		{"leading dot", fresh(def(".fs", "")), ".fs", []string{`".fs"`, "id must be"}},
		{"label starting with underscore", fresh(def("fs._read", "")), "fs._read", []string{`"fs._read"`, "id must be"}},
		{"hyphen", fresh(def("fs.read-all", "")), "fs.read-all", []string{`"fs.read-all"`, "id must be"}},
		{"resource arg not a property", fresh(withResource("", syscalls.Read, syscalls.ResourceArg{Arg: "file", Kind: syscalls.KindFS, Access: syscalls.AccessRead})), "t.res", []string{`resource argument "file"`, "not a string property"}},
		{"resource arg an integer", fresh(withResource(`{"type":"object","properties":{"path":{"type":"integer"}}}`, syscalls.Read, pathFS(syscalls.AccessRead))), "t.res", []string{`resource argument "path"`, "not a string property"}},
		{"resource arg without type", fresh(withResource(`{"type":"object","properties":{"path":{}}}`, syscalls.Read, pathFS(syscalls.AccessRead))), "t.res", []string{`resource argument "path"`, "not a string property"}},
		{"resource arg nested, not top level", fresh(withResource(`{"type":"object","properties":{"o":{"type":"object","properties":{"path":{"type":"string"}}}}}`, syscalls.Read, pathFS(syscalls.AccessRead))), "t.res", []string{`resource argument "path"`, "not a string property"}},
		{"resource arg unknown kind", fresh(withResource("", syscalls.Read, syscalls.ResourceArg{Arg: "path", Kind: "net", Access: syscalls.AccessRead})), "t.res", []string{`unknown kind "net"`}},
		{"resource arg empty kind", fresh(withResource("", syscalls.Read, syscalls.ResourceArg{Arg: "path", Access: syscalls.AccessRead})), "t.res", []string{`unknown kind ""`}},
		{"resource arg unknown access", fresh(withResource("", syscalls.Read, pathFS("exec"))), "t.res", []string{`unknown access "exec"`}},
		{"READ syscall declaring a write resource", fresh(withResource("", syscalls.Read, pathFS(syscalls.AccessWrite))), "t.res", []string{"READ", "cannot write", `"path"`}},
		{"READ syscall declaring a delete resource", fresh(withResource("", syscalls.Read, pathFS(syscalls.AccessDelete))), "t.res", []string{"READ", "cannot delete", `"path"`}},
		{"NONE syscall declaring a write resource", fresh(withResource("", syscalls.None, pathFS(syscalls.AccessWrite))), "t.res", []string{"NONE", "cannot write"}},
		{"singleton factory", func() syscalls.Syscall { return singleton }, "t.singleton", []string{"same instance"}},
		{"nil factory", nil, "", []string{"nil factory"}},
		{"factory returning nil", func() syscalls.Syscall { return nil }, "", []string{"returned nil"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := syscalls.NewRegistry()
			err := r.Register(tt.factory)
			if err == nil {
				t.Fatal("Register succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, ok := r.Get(tt.id); ok {
				t.Errorf("Get(%q) found a rejected syscall", tt.id)
			}
			if n := len(r.List()); n != 0 {
				t.Errorf("List has %d definitions after a rejection, want 0", n)
			}
		})
	}
}

func TestRegisterAccepts(t *testing.T) {
	withResource := func(se syscalls.SideEffect, ra syscalls.ResourceArg) syscalls.Definition {
		d := def("t.res", "")
		d.SideEffect = se
		d.Resources = []syscalls.ResourceArg{ra}
		return d
	}
	tests := []struct {
		name    string
		factory syscalls.Factory
		id      string
	}{
		{"additionalProperties false", fresh(def("t.ap", `{"type":"object","additionalProperties":false}`)), "t.ap"},
		{"additionalProperties true", fresh(def("t.ap", `{"type":"object","additionalProperties":true}`)), "t.ap"},
		{"every allowed keyword", fresh(def("t.all", `{"type":"object","title":"t","description":"d","required":["s"],"additionalProperties":false,
			"properties":{
				"s":{"type":"string","minLength":1,"maxLength":9,"pattern":"^a","format":"x","default":"a","examples":["a"]},
				"n":{"type":"integer","minimum":0,"maximum":9,"exclusiveMinimum":-1,"exclusiveMaximum":10},
				"e":{"enum":["a","b"]},"c":{"const":3},
				"l":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3,"uniqueItems":true}}}`)), "t.all"},
		{"property named like a forbidden keyword", fresh(def("t.names", `{"type":"object","properties":{"$ref":{"type":"string"},"not":{"type":"string"}}}`)), "t.names"},
		{"id with underscores", fresh(def("mcp.git_hub.list_issues", "")), "mcp.git_hub.list_issues"},
		{"id with digits", fresh(def("v2.fs2.read_3", "")), "v2.fs2.read_3"},
		{"WRITE syscall declaring a write resource", fresh(withResource(syscalls.Write, syscalls.ResourceArg{Arg: "path", Kind: syscalls.KindFS, Access: syscalls.AccessWrite})), "t.res"},
		{"EXECUTE syscall declaring a delete resource", fresh(withResource(syscalls.Execute, syscalls.ResourceArg{Arg: "path", Kind: syscalls.KindFS, Access: syscalls.AccessDelete})), "t.res"},
		{"READ syscall declaring a kv read resource", fresh(withResource(syscalls.Read, syscalls.ResourceArg{Arg: "path", Kind: syscalls.KindKV, Access: syscalls.AccessRead})), "t.res"},
		{"zero-size type returned twice", func() syscalls.Syscall { return &zeroSize{} }, "zero.size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := syscalls.NewRegistry()
			if err := r.Register(tt.factory); err != nil {
				t.Fatalf("Register: %v", err)
			}
			e, ok := r.Get(tt.id)
			if !ok {
				t.Fatalf("Get(%q) not found", tt.id)
			}
			if e.Def.ID != tt.id || e.New == nil {
				t.Errorf("entry = {ID %q, New nil %v}, want ID %q and a factory", e.Def.ID, e.New == nil, tt.id)
			}
		})
	}
}

func TestRegisterDuplicate(t *testing.T) {
	r := syscalls.NewRegistry()
	first := def("t.dup", "")
	first.Description = "first"
	if err := r.Register(fresh(first)); err != nil {
		t.Fatal(err)
	}
	second := def("t.dup", "")
	second.Description = "second"
	err := r.Register(fresh(second))
	if err == nil || !strings.Contains(err.Error(), "already registered") || !strings.Contains(err.Error(), "t.dup") {
		t.Fatalf("second Register = %v, want an error naming t.dup as already registered", err)
	}
	e, _ := r.Get("t.dup")
	if e.Def.Description != "first" {
		t.Errorf("the duplicate replaced the first registration (description %q)", e.Def.Description)
	}
}

func TestRegistryGetListUnregister(t *testing.T) {
	r := syscalls.NewRegistry()
	if got := r.List(); len(got) != 0 {
		t.Fatalf("empty registry List = %v", got)
	}
	ids := []string{"z.last", "a.first", "m_x.middle", "a", "a.b.c"}
	for _, id := range ids {
		if err := r.Register(fresh(def(id, ""))); err != nil {
			t.Fatalf("Register(%s): %v", id, err)
		}
	}
	var got []string
	for _, d := range r.List() {
		got = append(got, d.ID)
	}
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		t.Errorf("List ids = %v, want %v", got, want)
	}

	tests := []struct {
		op     string // "get" or "unregister"
		id     string
		wantOK bool
	}{
		{"get", "a.first", true},
		{"get", "a.fir", false},
		{"get", "", false},
		{"unregister", "a.first", true},
		{"get", "a.first", false},
		{"unregister", "a.first", false},
		{"unregister", "never.registered", false},
		{"get", "z.last", true},
	}
	for i, tt := range tests {
		var ok bool
		switch tt.op {
		case "get":
			var e *syscalls.Entry
			e, ok = r.Get(tt.id)
			if ok && e.Def.ID != tt.id {
				t.Errorf("step %d: Get(%q) returned entry %q", i, tt.id, e.Def.ID)
			}
		case "unregister":
			ok = r.Unregister(tt.id)
		}
		if ok != tt.wantOK {
			t.Errorf("step %d: %s(%q) = %v, want %v", i, tt.op, tt.id, ok, tt.wantOK)
		}
	}
	if n := len(r.List()); n != len(ids)-1 {
		t.Errorf("List after one Unregister has %d entries, want %d", n, len(ids)-1)
	}
	// An unregistered id can be registered again.
	if err := r.Register(fresh(def("a.first", ""))); err != nil {
		t.Errorf("Register after Unregister: %v", err)
	}
}

func TestValidate(t *testing.T) {
	r := syscalls.NewRegistry()
	schema := `{"type":"object","properties":{"name":{"type":"string"},"count":{"type":"integer","minimum":1}},"required":["name"],"additionalProperties":false}`
	if err := r.Register(fresh(def("t.validate", schema))); err != nil {
		t.Fatal(err)
	}
	e, _ := r.Get("t.validate")
	tests := []struct {
		name string
		args string
		want []string // violations, sorted; nil for valid args
	}{
		{"valid", `{"name":"x","count":2}`, nil},
		{"valid without optional", `{"name":"x"}`, nil},
		{"three problems", `{"count":"many","extra":true}`, []string{
			"at /: additional properties 'extra' not allowed",
			"at /: missing property 'name'",
			"at /count: got string, want integer",
		}},
		{"below minimum", `{"name":"x","count":0}`, []string{"at /count: minimum: got 0, want 1"}},
		{"not an object", `[1]`, []string{"at /: got array, want object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.Validate(json.RawMessage(tt.args))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ae *syscalls.ArgsError
			if !errors.As(err, &ae) {
				t.Fatalf("Validate = %v (%T), want *ArgsError", err, err)
			}
			if !slices.Equal(ae.Violations, tt.want) {
				t.Errorf("violations:\n got %q\nwant %q", ae.Violations, tt.want)
			}
		})
	}
	t.Run("not JSON", func(t *testing.T) {
		var ae *syscalls.ArgsError
		if err := e.Validate(json.RawMessage(`{"name":`)); !errors.As(err, &ae) || len(ae.Violations) != 1 || !strings.Contains(ae.Violations[0], "not valid JSON") {
			t.Errorf("Validate(garbage) = %v, want one *ArgsError violation about invalid JSON", err)
		}
	})
}

// TestRegistryConcurrent runs Get and Validate on registered syscalls while
// other ids are registered and unregistered; run it with -race.
func TestRegistryConcurrent(t *testing.T) {
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	const readers, rounds = 8, 200
	good := json.RawMessage(`{"path":"a.txt","content":"hi","mode":"0644"}`)
	bad := json.RawMessage(`{"path":1}`)
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			for range rounds {
				e, ok := r.Get("fs.write")
				if !ok {
					t.Error("Get(fs.write) not found")
					return
				}
				if err := e.Validate(good); err != nil {
					t.Errorf("Validate(good) = %v", err)
					return
				}
				var ae *syscalls.ArgsError
				if err := e.Validate(bad); !errors.As(err, &ae) || len(ae.Violations) != 2 {
					t.Errorf("Validate(bad) = %v, want 2 violations", err)
					return
				}
				if n := len(r.List()); n < 9 {
					t.Errorf("List has %d entries, want at least the 9 builtins", n)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range rounds {
			id := fmt.Sprintf("tmp.x%d", i%5)
			if err := r.Register(fresh(def(id, ""))); err != nil {
				t.Errorf("Register(%s): %v", id, err)
				return
			}
			if _, ok := r.Get(id); !ok {
				t.Errorf("Get(%s) after Register: not found", id)
			}
			if !r.Unregister(id) {
				t.Errorf("Unregister(%s) = false", id)
				return
			}
		}
	})
	wg.Wait()
	var ids []string
	for _, d := range r.List() {
		ids = append(ids, d.ID)
	}
	if len(ids) != 9 {
		t.Errorf("after the run List = %v, want the 9 builtins", ids)
	}
}

func TestRegisterBuiltins(t *testing.T) {
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id string
		se syscalls.SideEffect
	}{
		{"echo", syscalls.None},
		{"fs.delete", syscalls.Write},
		{"fs.list", syscalls.Read},
		{"fs.patch", syscalls.Write},
		{"fs.read", syscalls.Read},
		{"fs.stat", syscalls.Read},
		{"fs.write", syscalls.Write},
		{"kv.get", syscalls.Read},
		{"kv.put", syscalls.Write},
	}
	got := r.List()
	if len(got) != len(want) {
		t.Fatalf("RegisterBuiltins registered %d syscalls, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].ID != w.id || got[i].SideEffect != w.se {
			t.Errorf("List[%d] = %s (%s), want %s (%s)", i, got[i].ID, got[i].SideEffect, w.id, w.se)
		}
		if got[i].Description == "" {
			t.Errorf("%s has no description", got[i].ID)
		}
	}
	// A second call refuses the duplicates rather than replacing them.
	if err := syscalls.RegisterBuiltins(r); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("second RegisterBuiltins = %v, want an already-registered error", err)
	}
}

func TestReplacePrefix(t *testing.T) {
	r := syscalls.NewRegistry()
	v1 := func(id string) syscalls.Definition { d := def(id, ""); d.Description = "v1"; return d }
	v2 := func(id string) syscalls.Definition { d := def(id, ""); d.Description = "v2"; return d }
	for _, d := range []syscalls.Definition{v1("mcp.s.a"), v1("mcp.s.b"), v1("mcp.other.a"), v1("fs.x")} {
		if err := r.Register(fresh(d)); err != nil {
			t.Fatal(err)
		}
	}
	inflight, _ := r.Get("mcp.s.a") // a call resolved its entry before the swap
	errs := r.ReplacePrefix("mcp.s.", []syscalls.Factory{
		fresh(v2("mcp.s.a")),
		fresh(v2("mcp.s.c")),
		fresh(v2("mcp.t.a")),                    // outside the prefix
		fresh(def("mcp.s.bad", `{"anyOf":[]}`)), // outside the schema subset
		fresh(v2("mcp.s.c")),                    // twice
	})
	if len(errs) != 3 {
		t.Fatalf("errors %v, want 3", errs)
	}
	for i, want := range []string{"lacks the prefix", "outside the allowed subset", "listed twice"} {
		if !strings.Contains(errs[i].Error(), want) {
			t.Errorf("error %d %q, want it to say %q", i, errs[i], want)
		}
	}
	var ids []string
	for _, d := range r.List() {
		ids = append(ids, d.ID+"="+d.Description)
	}
	if want := []string{"fs.x=v1", "mcp.other.a=v1", "mcp.s.a=v2", "mcp.s.c=v2"}; !slices.Equal(ids, want) {
		t.Fatalf("table %v, want %v", ids, want)
	}
	// The in-flight call keeps the entry it resolved, and its factory.
	if inflight.Def.Description != "v1" || inflight.New().Definition().Description != "v1" {
		t.Fatalf("in-flight entry %+v", inflight.Def)
	}
	if e, _ := r.Get("mcp.s.a"); e.Def.Description != "v2" || e == inflight {
		t.Fatalf("new lookup %+v", e.Def)
	}
	if errs := r.ReplacePrefix("mcp.s", nil); len(errs) != 1 {
		t.Fatalf("a prefix without its dot: %v", errs)
	}
	if errs := r.ReplacePrefix("mcp.s.", nil); len(errs) != 0 {
		t.Fatal(errs)
	}
	if _, ok := r.Get("mcp.s.a"); ok {
		t.Fatal("an empty replacement left mcp.s.a")
	}
	if _, ok := r.Get("mcp.other.a"); !ok {
		t.Fatal("mcp.other.a went missing")
	}
}

// TestReplacePrefixAtomic: a reader never sees a mix of two sets. Each
// set's entries all carry the same description; List under the read lock
// must find one description across the prefix, whichever set it is.
func TestReplacePrefixAtomic(t *testing.T) {
	r := syscalls.NewRegistry()
	set := func(v int) []syscalls.Factory {
		var fs []syscalls.Factory
		for _, n := range []string{"a", "b", "c", "d"} {
			d := def("mcp.s."+n, "")
			d.Description = fmt.Sprint(v)
			fs = append(fs, fresh(d))
		}
		return fs
	}
	r.ReplacePrefix("mcp.s.", set(0))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	mixed := make(chan string, 1)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				seen := map[string]bool{}
				for _, d := range r.List() {
					seen[d.Description] = true
				}
				if len(seen) != 1 {
					select {
					case mixed <- fmt.Sprint(seen):
					default:
					}
				}
			}
		}()
	}
	for v := 1; v <= 200; v++ {
		if errs := r.ReplacePrefix("mcp.s.", set(v)); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case m := <-mixed:
		t.Fatalf("a reader saw a mix of sets: %s", m)
	default:
	}
}
