package upstream

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Reference is a shipped set of declarations for a well-known upstream
// server (the official MCP reference servers), which a server's
// configuration names with "declare".
type Reference struct {
	About     string        `json:"about"`
	Resources []Declaration `json:"resources"`
}

//go:embed declarations.json
var referenceJSON []byte

// references are the shipped declarations, by name; checked at init, so a
// broken file fails every test of the package.
var references = func() map[string]Reference {
	var m map[string]Reference
	if err := json.Unmarshal(referenceJSON, &m); err != nil {
		panic("upstream/declarations.json: " + err.Error())
	}
	for n, r := range m {
		for i, d := range r.Resources {
			if err := d.check(fmt.Sprintf("shipped declarations %s, resources[%d]", n, i)); err != nil {
				panic(err)
			}
		}
	}
	return m
}()

// References returns the shipped declarations by name ("filesystem",
// "git", "fetch", "memory", "everything").
func References() map[string]Reference {
	out := make(map[string]Reference, len(references))
	for n, r := range references {
		out[n] = Reference{About: r.About, Resources: slices.Clone(r.Resources)}
	}
	return out
}

// ReferenceJSON is the shipped declarations as kernel.json fragments, for
// printing (kernelctl mcp declarations).
func ReferenceJSON() []byte { return referenceJSON }

func referenceNames() string {
	var ns []string
	for n := range references {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}
