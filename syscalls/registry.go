package syscalls

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// idPattern: dot-separated labels of lowercase letters and digits, with
// single underscores between them ("fs.read", "mcp.git_hub.list_issues").
var idPattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*(\.[a-z][a-z0-9]*(_[a-z0-9]+)*)*$`)

// ValidID reports whether id has the form of a syscall id (idPattern, at
// most 255 bytes), registered or not.
func ValidID(id string) bool { return len(id) <= 255 && idPattern.MatchString(id) }

// MaxToolName is the longest tool name LLM providers accept; an id whose
// tool name (see ToolName) is longer is refused.
const MaxToolName = 64

// Entry is a registered syscall: its definition, its factory and its
// compiled input schema.
type Entry struct {
	Def    Definition
	New    Factory
	schema *jsonschema.Schema
	quick  *quick // the schema as far as the fast check models it; nil for none
}

// Validate checks args against the input schema; the error is an
// *ArgsError listing every violation.
func (e *Entry) Validate(args json.RawMessage) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return &ArgsError{Violations: []string{"args are not valid JSON: " + err.Error()}}
	}
	return e.ValidateDecoded(inst)
}

// ValidateDecoded is Validate for args decoded already by jcs.Decode (the
// values json.Decoder gives with UseNumber), which saves decoding them
// again.
func (e *Entry) ValidateDecoded(args any) error {
	if e.quick.valid(args) {
		return nil
	}
	return check(e.schema, args)
}

// Registry maps syscall ids to entries. It is safe for concurrent use; Get,
// on every call's path, only takes a read lock.
type Registry struct {
	mu      sync.RWMutex
	entries map[string]*Entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{entries: map[string]*Entry{}} }

// Register adds the syscall f makes. It calls f twice: to read the
// definition and to check that f makes a fresh instance each time (no
// state shared between calls). It refuses a duplicate or malformed id, a missing or unknown
// side-effect class, a schema outside the allowed subset or that does not
// compile, and a resource argument that is not a string property of the
// schema.
func (r *Registry) Register(f Factory) error {
	e, err := build(f)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.entries[e.Def.ID]; dup {
		return fmt.Errorf("register %s: already registered", e.Def.ID)
	}
	r.entries[e.Def.ID] = e
	return nil
}

// ReplacePrefix makes fs the whole set of syscalls whose id starts with
// prefix (which must end in "."), in one step under the write lock: a Get
// sees either every old entry of the prefix or every new one. A call that
// resolved its *Entry before keeps it and runs against the old definition.
// A factory refused by Register's checks, or whose id lacks the prefix, is
// left out; its error is returned with the others, and the rest still
// replace the old set.
func (r *Registry) ReplacePrefix(prefix string, fs []Factory) []error {
	if prefix == "" || prefix[len(prefix)-1] != '.' {
		return []error{fmt.Errorf("replace %q: the prefix must end in a dot", prefix)}
	}
	var errs []error
	next := map[string]*Entry{}
	for _, f := range fs {
		e, err := build(f)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !strings.HasPrefix(e.Def.ID, prefix):
			errs = append(errs, fmt.Errorf("replace %s: the id lacks the prefix %s", e.Def.ID, prefix))
		case next[e.Def.ID] != nil:
			errs = append(errs, fmt.Errorf("replace %s: listed twice", e.Def.ID))
		default:
			next[e.Def.ID] = e
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.entries {
		if strings.HasPrefix(id, prefix) {
			delete(r.entries, id)
		}
	}
	for id, e := range next {
		r.entries[id] = e
	}
	return errs
}

// build checks the syscall f makes and compiles its entry (see Register).
func build(f Factory) (*Entry, error) {
	if f == nil {
		return nil, fmt.Errorf("register: nil factory")
	}
	a, b := f(), f()
	if a == nil || b == nil {
		return nil, fmt.Errorf("register: factory returned nil")
	}
	def := a.Definition()
	if !idPattern.MatchString(def.ID) {
		return nil, fmt.Errorf("register %q: id must be dot-separated labels of lowercase letters and digits, with single underscores inside", def.ID)
	}
	if n := len(ToolName(def.ID, FormatOpenAI)); n > MaxToolName {
		return nil, fmt.Errorf("register %s: its LLM tool name %s is %d characters; providers accept at most %d", def.ID, ToolName(def.ID, FormatOpenAI), n, MaxToolName)
	}
	// Pointers to zero-size values may share an address and hold no state.
	if ra, rb := reflect.ValueOf(a), reflect.ValueOf(b); ra.Kind() == reflect.Pointer && ra.Type().Elem().Size() > 0 && ra.Pointer() == rb.Pointer() {
		return nil, fmt.Errorf("register %s: the factory returned the same instance twice; it must make a fresh one per call", def.ID)
	}
	if !def.SideEffect.Valid() {
		return nil, fmt.Errorf("register %s: side-effect class %q is not one of NONE, READ, WRITE, EXECUTE, NETWORK", def.ID, def.SideEffect)
	}
	schema, root, err := compileSchema(def.ID, def.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("register %s: %v", def.ID, err)
	}
	props, _ := root["properties"].(map[string]any)
	for _, ra := range def.Resources {
		p, _ := props[ra.Arg].(map[string]any)
		if p == nil || p["type"] != "string" {
			return nil, fmt.Errorf("register %s: resource argument %q is not a string property of the input schema", def.ID, ra.Arg)
		}
		if ra.Kind != KindFS && ra.Kind != KindKV {
			return nil, fmt.Errorf("register %s: resource argument %q has unknown kind %q", def.ID, ra.Arg, ra.Kind)
		}
		switch ra.Access {
		case AccessRead, AccessList, AccessStat, AccessWrite, AccessDelete:
		default:
			return nil, fmt.Errorf("register %s: resource argument %q has unknown access %q", def.ID, ra.Arg, ra.Access)
		}
		if ra.Access.Writes() && !def.SideEffect.Mutating() {
			return nil, fmt.Errorf("register %s: a %s syscall cannot %s resource %q", def.ID, def.SideEffect, ra.Access, ra.Arg)
		}
	}
	return &Entry{Def: def, New: f, schema: schema, quick: compileQuick(root)}, nil
}

// Unregister removes id and reports whether it was registered.
func (r *Registry) Unregister(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.entries[id]
	delete(r.entries, id)
	return ok
}

// Get returns the entry of id.
func (r *Registry) Get(id string) (*Entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.entries[id]
	return e, ok
}

// List returns every definition, sorted by id.
func (r *Registry) List() []Definition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Definition, 0, len(r.entries))
	for _, e := range r.entries {
		out = append(out, e.Def)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
