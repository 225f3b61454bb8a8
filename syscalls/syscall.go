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
	"io"
	"io/fs"
	"strings"
	"time"
)

// SideEffect is a syscall's highest class of effect, by capability rather
// than typical use: what the syscall can do, whatever a given call does.
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
	InputSchema json.RawMessage // a JSON Schema object in the subset schema.go allows
	// OutputSchema, when set, is the JSON Schema of the result's
	// structured content (an upstream MCP tool's outputSchema, as it came).
	OutputSchema json.RawMessage
	// MCPResult marks a syscall whose result is an MCP CallToolResult
	// (content, structuredContent, _meta) to be handed to MCP clients as
	// it is, not wrapped (an upstream MCP server's tool).
	MCPResult  bool
	SideEffect SideEffect
	Resources  []ResourceArg
	Timeout    time.Duration // 0: the kernel's default
	// Reach, when set, tells the kernel what a call reaches beyond its
	// resource arguments (hosts, the token's whole fs grant, a network
	// posture) and, for syscalls whose class depends on the arguments, the
	// call's class. The kernel checks it against the token before the
	// policy step and passes what the token grants in Call.Grant.
	Reach func(args json.RawMessage) (Reach, error)
	// SelfTimed syscalls enforce their own time limit and honour
	// cancellation, returning only once everything they started is gone:
	// the kernel waits for them instead of abandoning them at the
	// deadline (Timeout is then only a backstop).
	SelfTimed bool
	// External marks a mutating syscall whose effect happens outside the
	// kernel (an upstream MCP server's tool): a crash or lost answer while
	// it runs leaves its outcome unknown, never rolled back and re-run,
	// as for class NETWORK.
	External bool
	// Gated syscalls start executing while the kernel makes the call's
	// intent durable, and call Call.Gate before any effect: the kernel
	// thus overlaps their set-up (proc.exec's sandbox) with the prepare
	// transaction's fsync. A gated syscall must do nothing outside its own
	// process before Gate returns nil, and must end, having done nothing,
	// when it returns an error.
	Gated bool
}

// Network postures of a call (Reach.Network).
const (
	NetOff       = "off"       // no network (a new network namespace)
	NetAllowlist = "allowlist" // the kernel's proxy, admitting the token's net patterns
	NetFull      = "full"      // the host's network: a token pattern "*" and the policy's net_full
)

// Reach is what one call reaches beyond its resource arguments.
type Reach struct {
	Class     SideEffect // this call's class; "" means Definition.SideEffect
	Hosts     []HostPort // hosts the call connects to; each must be allowed by the token
	Workspace bool       // the call acts on every fs root of the token (proc.exec)
	Dir       string     // a directory to resolve in the token's roots (list access); "" for none
	Network   string     // the network posture asked for; "" means NetOff
}

// HostPort is a host (name or IP literal) and port a call connects to.
type HostPort struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Grant is what the capability token grants a call whose Definition has a
// Reach: the kernel fills it after checking the Reach against the token.
type Grant struct {
	Roots     []RootSpec // the token's fs roots
	Workspace *Workspace // the same, opened (nil without roots)
	Dir       *Resource  // Reach.Dir resolved, or nil
	Network   string     // the posture granted (Reach.Network, checked)
	// AllowsHost reports whether the token's net patterns admit host:port;
	// NamesHost whether one names it explicitly (an IP literal or an exact
	// name: only then may a loopback, private, link-local or metadata
	// address be dialed).
	AllowsHost func(host string, port int) bool
	NamesHost  func(host string, port int) bool
	// Left is what is left of each limited budget (cpu_ms, net_bytes,
	// disk_write_bytes) when the call starts; a budget absent is unlimited.
	Left map[string]int64
}

// Failure is an error a syscall reports with a kernel error class of its
// own: timeout, cancelled, budget_exceeded, scope_denied, outcome_unknown.
type Failure struct {
	Class   string
	Message string
}

func (f *Failure) Error() string { return f.Class + ": " + f.Message }

// Failure classes.
const (
	FailTimeout   = "timeout"
	FailCancelled = "cancelled"
	FailBudget    = "budget_exceeded"
	FailScope     = "scope_denied"
	FailUnknown   = "outcome_unknown"
	// FailUpstreamUnavailable: the upstream MCP server of the syscall
	// could not be reached; nothing was sent.
	FailUpstreamUnavailable = "upstream_unavailable"
	// FailUpstreamError: the upstream MCP server answered the call with
	// an error (isError, or a JSON-RPC error).
	FailUpstreamError = "upstream_error"
)

func fail(class, format string, args ...any) *Failure {
	return &Failure{Class: class, Message: fmt.Sprintf(format, args...)}
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
	// Canonical, if not nil, is the RFC 8785 form of Result, written by
	// the syscall beside it (jcs.Object) so that the kernel need not parse
	// Result to hash it. It must be exactly jcs.Canonicalize(Result).
	Canonical json.RawMessage
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
	// Grant is set for syscalls with a Reach.
	Grant *Grant
	// Host is the kernel's side of the call (see Charge, Note and
	// Cleanup); nil for none.
	Host Host
	// Gate, set for Gated syscalls, blocks until the kernel has made the
	// call's intent durable and returns nil, or returns why the call does
	// not proceed (it was refused at prepare, or replays another).
	Gate func() error
}

// Host is what the kernel does for a running syscall beyond its
// arguments; a Call's methods of the same names go to it.
type Host interface {
	// Charge records budget units the execution consumed (cpu_ms,
	// net_bytes); the kernel charges them whether the call commits or
	// not.
	Charge(budget string, n int64)
	// Note adds a detail to the call's audit record under key (the
	// network connections of a call, for instance).
	Note(key string, v any)
	// Cleanup runs f in the background: work the syscall leaves once it
	// no longer needs a resource (removing scratch files), which then
	// overlaps the recording of the call. The kernel waits for it before
	// it answers the call.
	Cleanup(f func())
	// After runs f in the background once the call has been answered:
	// work for later calls (proc.exec: starting the sandbox's next spare
	// chain), which then competes with nothing of this call's (its
	// record's commit).
	After(f func())
}

// Charge records budget units the execution consumed (Host.Charge);
// without a Host nothing is charged.
func (c *Call) Charge(budget string, n int64) {
	if c.Host != nil {
		c.Host.Charge(budget, n)
	}
}

// Note adds a detail to the call's audit record (Host.Note); without a
// Host nothing is recorded.
func (c *Call) Note(key string, v any) {
	if c.Host != nil {
		c.Host.Note(key, v)
	}
}

// After runs f once the call has been answered (Host.After), or, without
// a Host, at once.
func (c *Call) After(f func()) {
	if c.Host == nil {
		f()
		return
	}
	c.Host.After(f)
}

// Cleanup runs f in the background (Host.Cleanup), or, without a Host,
// at once.
func (c *Call) Cleanup(f func()) {
	if c.Host == nil {
		f()
		return
	}
	c.Host.Cleanup(f)
}

// TreeStager is implemented by stagers that can also stage streamed file
// content and new directories (the kernel's does); proc.exec needs it to
// stage the delta of a sandboxed command.
type TreeStager interface {
	Stager
	// WriteFrom stages src's content for r with mode perm and returns its
	// digest; r's parent may be a directory an earlier Mkdir stages.
	WriteFrom(r *Resource, src io.Reader, perm fs.FileMode) (string, error)
	// Mkdir stages making directory r.
	Mkdir(r *Resource, perm fs.FileMode) error
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
