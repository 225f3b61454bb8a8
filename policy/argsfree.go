package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"
)

// readsArgs reports whether a rule of modules may read the input's args:
// whether the input appears anywhere but as the head of a reference whose
// next term is a constant string other than "args" (input.tool_id,
// input.resources[_].path), or as the builtin object.get's object with
// such a key or a path of constant strings starting with one
// (object.get(input, "side_effect", "")). The test is syntactic and errs
// one way: the input whole (a value, an argument, an iteration), a key
// chosen at evaluation time (input[k]), an import of the input, a with
// modifier anywhere, and a rule or import named object (which would stand
// for the builtin) all count as reading args. A policy that does not read
// them decides inputs that differ only in args alike, so the kernel has
// its decisions remembered without them (Engine.DecideKeyed): agents'
// calls differ in their args far more often than in anything a policy
// reads.
func readsArgs(modules []*ast.Module) bool {
	reads := false
	// object.get is the builtin unless a rule or import is named object.
	builtinGet := !definesObject(modules)
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch v := x.(type) {
		case *ast.With:
			// Replacing a value or a function for a query: what it
			// makes read is not followed here.
			reads = true
			return true
		case *ast.Head:
			// The visitor does not walk a head's reference (p[k].q).
			for _, t := range v.Reference {
				vis.Walk(t)
			}
			return reads
		case ast.Call:
			if !builtinGet || !objectGetOfInput(v) {
				return reads
			}
			for _, t := range v[3:] {
				vis.Walk(t)
			}
			return true
		case ast.Ref:
			if !v[0].Equal(ast.InputRootDocument) {
				return reads // its terms, input among them, are walked
			}
			if len(v) < 2 {
				reads = true
				return true
			}
			if key, ok := v[1].Value.(ast.String); !ok || key == "args" {
				reads = true
				return true
			}
			// The head is no bare input; what selects further down
			// (input.resources[input.args.i]) is walked.
			for _, t := range v[2:] {
				vis.Walk(t)
			}
			return true
		case ast.Var:
			if v.Equal(ast.InputRootDocument.Value) {
				reads = true
			}
		}
		return reads
	})
	for _, m := range modules {
		vis.Walk(m)
		if reads {
			break
		}
	}
	return reads
}

// objectGet is the reference of the builtin object.get.
var objectGet = ast.RefTerm(ast.VarTerm("object"), ast.StringTerm("get"))

// objectGetOfInput reports whether call is object.get(input, key, …) with
// key a constant string other than "args", or a path whose first key is.
func objectGetOfInput(call ast.Call) bool {
	if len(call) < 3 || !call[0].Equal(objectGet) {
		return false
	}
	switch in := call[1].Value.(type) {
	case ast.Var:
		if !in.Equal(ast.InputRootDocument.Value) {
			return false
		}
	case ast.Ref:
		if len(in) != 1 || !in[0].Equal(ast.InputRootDocument) {
			return false
		}
	default:
		return false
	}
	key := call[2]
	if path, ok := key.Value.(*ast.Array); ok {
		if path.Len() == 0 {
			return false // the input whole
		}
		for i := range path.Len() {
			if _, ok := path.Elem(i).Value.(ast.String); !ok {
				return false // a key made at evaluation
			}
		}
		key = path.Elem(0)
	}
	k, ok := key.Value.(ast.String)
	return ok && k != "args"
}

// definesObject reports whether a rule of modules is named object or
// object.…, or an import is named object (its alias, or its path's last
// key): either would stand for the builtin object.get where it is seen.
func definesObject(modules []*ast.Module) bool {
	object := ast.VarTerm("object")
	for _, m := range modules {
		for _, imp := range m.Imports {
			if imp.Alias != "" {
				if imp.Alias.Equal(object.Value) {
					return true
				}
				continue
			}
			if ref, ok := imp.Path.Value.(ast.Ref); ok && len(ref) > 0 {
				if last := ref[len(ref)-1]; last.Equal(object) || last.Equal(ast.StringTerm("object")) {
					return true
				}
			}
		}
		for _, r := range m.Rules {
			for ; r != nil; r = r.Else {
				if ref := r.Head.Ref(); len(ref) > 0 && ref[0].Equal(object) {
					return true
				}
			}
		}
	}
	return false
}
