// Package syscalls is capkernel's syscall table: definitions with input
// schemas and side-effect classes, a registry of factories, confined file
// access through os.Root, and the built-in syscalls (echo, fs.*, kv.*).
//
// A syscall never decides whether it may run; the kernel does, before
// Execute, from the Definition: the side-effect class picks the
// transactional path and the policy, and the resource arguments name what
// the kernel resolves against the capability token's scopes. Mutating
// syscalls do not write anything themselves: they stage their effects
// through Call.Stage, and the kernel's transaction layer makes them visible
// at commit, atomically.
package syscalls

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// SideEffect is a syscall's highest class of effect, by capability rather
// than typical use (seed 002 §5.3).
type SideEffect string

// Side-effect classes.
const (
	None    SideEffect = "NONE"    // pure computation
	Read    SideEffect = "READ"    // reads without mutation
	Write   SideEffect = "WRITE"   // mutates the workspace or kernel state
	Execute SideEffect = "EXECUTE" // runs code
	Network SideEffect = "NETWORK" // mutates state elsewhere over the network
)

// Valid reports whether s is one of the five classes.
func (s SideEffect) Valid() bool {
	switch s {
	case None, Read, Write, Execute, Network:
		return true
	}
	return false
}

// Mutating reports whether calls of class s run as transactions and need
// an idempotency key.
func (s SideEffect) Mutating() bool { return s == Write || s == Execute || s == Network }

// Access is how a syscall touches a resource named by one of its arguments.
type Access string

// Accesses.
const (
	AccessRead   Access = "read"
	AccessList   Access = "list"
	AccessStat   Access = "stat"
	AccessWrite  Access = "write"
	AccessDelete Access = "delete"
)

// Writes reports whether a needs a writable root.
func (a Access) Writes() bool { return a == AccessWrite || a == AccessDelete }

// Resource kinds.
const (
	KindFS = "fs"
	KindKV = "kv"
)

// ResourceArg declares that the top-level string argument Arg names a
// resource of kind Kind ("fs" or "kv"), touched with Access.
type ResourceArg struct {
	Arg    string
	Kind   string
	Access Access
}

// Definition describes a syscall.
type Definition struct {
	ID          string          // e.g. "fs.read"; see Registry.Register for the form
	Description string          // for people and for LLMs
	InputSchema json.RawMessage // a JSON Schema object in the subset of seed 002 §5.4
	SideEffect  SideEffect
	Resources   []ResourceArg
	Timeout     time.Duration // 0: the kernel's default
}

// Syscall is one execution instance; a Factory makes a fresh one per call,
// so concurrent calls never share state.
type Syscall interface {
	Definition() Definition
	Execute(ctx context.Context, c *Call) (Output, error)
}

// Factory makes a Syscall.
type Factory func() Syscall

// Output is what a syscall returns: Result must be a JSON object.
type Output struct {
	Result json.RawMessage
}

// Call is what Execute gets: validated args and the resources the kernel
// resolved for them.
type Call struct {
	Args json.RawMessage
	// Resources holds one entry per Definition.Resources, in that order.
	// A kv resource has a nil Root and the key in Rel.
	Resources []*Resource
	// Stage records effects; it is non-nil for mutating syscalls.
	Stage Stager
	KV    KVReader
	// MaxReadBytes caps the bytes a read returns.
	MaxReadBytes int64
}

// Stager records side effects without making them visible; the kernel's
// transaction layer applies them atomically at commit or discards them.
type Stager interface {
	// WriteFile stages content for r; perm 0 keeps an existing file's mode.
	WriteFile(r *Resource, content []byte, perm fs.FileMode) error
	// Delete stages the removal of r.
	Delete(r *Resource) error
	// PutKV stages a put and returns the version the key will have.
	PutKV(key string, value json.RawMessage) (version uint64, err error)
}

// KVReader reads the kernel's versioned key-value store; version 0 means
// the key was never written.
type KVReader interface {
	GetKV(key string) (value json.RawMessage, version uint64, found bool, err error)
}

// ArgsError reports arguments that are invalid: every schema violation, or
// a syscall's own refusal (for example, an ambiguous patch). The kernel
// reports it as invalid_args.
type ArgsError struct {
	Violations []string
}

func (e *ArgsError) Error() string { return "invalid args: " + strings.Join(e.Violations, "; ") }

func argsError(format string, args ...any) *ArgsError {
	return &ArgsError{Violations: []string{fmt.Sprintf(format, args...)}}
}
