package syscalls

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// allowedKeywords is the JSON Schema subset every LLM provider's tool
// format accepts, plus simple validation keywords. Anything else —
// $ref, oneOf, anyOf, allOf, not, if/then/else, patternProperties,
// additionalProperties as a schema, unknown keywords — is refused at
// registration (fail closed).
var allowedKeywords = map[string]bool{
	"type": true, "enum": true, "const": true, "required": true, "properties": true, "items": true,
	"description": true, "title": true, "default": true, "format": true, "examples": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	"minLength": true, "maxLength": true, "minItems": true, "maxItems": true, "pattern": true,
	"additionalProperties": true, "uniqueItems": true,
}

// checkSubset walks a schema and returns an error naming the first
// construct outside the subset, by JSON pointer.
func checkSubset(v any, at string) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("schema at %s is not an object", orRoot(at))
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !allowedKeywords[k] {
			return fmt.Errorf("schema keyword %q at %s is outside the allowed subset", k, orRoot(at))
		}
	}
	if ap, ok := obj["additionalProperties"]; ok {
		if _, isBool := ap.(bool); !isBool {
			return fmt.Errorf("additionalProperties at %s must be a boolean", orRoot(at))
		}
	}
	if props, ok := obj["properties"]; ok {
		m, ok := props.(map[string]any)
		if !ok {
			return fmt.Errorf("properties at %s is not an object", orRoot(at))
		}
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if err := checkSubset(m[n], at+"/properties/"+n); err != nil {
				return err
			}
		}
	}
	if items, ok := obj["items"]; ok {
		if err := checkSubset(items, at+"/items"); err != nil {
			return err
		}
	}
	return nil
}

func orRoot(at string) string {
	if at == "" {
		return "/"
	}
	return at
}

// CheckSchema returns what Register would refuse of raw as an input
// schema: outside the subset, not "type": "object", or not compiling. It
// is for schemas the kernel passes on to clients without validating
// anything against them (an upstream tool's output schema), which must
// meet the same bar.
func CheckSchema(raw json.RawMessage) error {
	_, _, err := compileSchema("check", raw)
	return err
}

// compileSchema checks raw against the subset and compiles it. Schemas are
// compiled from memory only: nothing is ever loaded from a file or URL.
func compileSchema(id string, raw json.RawMessage) (*jsonschema.Schema, map[string]any, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("input schema: %v", err)
	}
	if err := checkSubset(doc, ""); err != nil {
		return nil, nil, err
	}
	root := doc.(map[string]any)
	if root["type"] != "object" {
		return nil, nil, fmt.Errorf(`input schema must have "type": "object"`)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	url := "mem:///syscalls/" + id + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, nil, fmt.Errorf("input schema: %v", err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, nil, fmt.Errorf("input schema: %v", err)
	}
	return s, root, nil
}

// check validates args decoded already, as jsonschema.UnmarshalJSON (or
// jcs.Decode) decodes them, against s, and returns an *ArgsError listing
// every violation as "at <pointer>: <message>", sorted.
func check(s *jsonschema.Schema, inst any) error {
	err := s.Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return &ArgsError{Violations: []string{err.Error()}}
	}
	var out []string
	var walk func(u *jsonschema.OutputUnit)
	walk = func(u *jsonschema.OutputUnit) {
		if u.Error != nil && len(u.Errors) == 0 {
			out = append(out, fmt.Sprintf("at %s: %s", orRoot(u.InstanceLocation), u.Error.String()))
		}
		for i := range u.Errors {
			walk(&u.Errors[i])
		}
	}
	walk(ve.BasicOutput())
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		out = []string{strings.TrimSpace(ve.Error())}
	}
	return &ArgsError{Violations: out}
}
