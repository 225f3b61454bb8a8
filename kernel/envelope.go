package kernel

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/strictjson"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// Envelope is a call envelope (docs/http.md). The JSON field names are the
// wire format.
type Envelope struct {
	ToolID            string             `json:"tool_id"`
	AgentID           string             `json:"agent_id"`
	CapabilityToken   string             `json:"capability_token"`
	CapabilityTokenID string             `json:"capability_token_id"`
	StateSnapshotID   string             `json:"state_snapshot_id,omitempty"`
	PolicyHash        string             `json:"policy_hash"`
	Provenance        json.RawMessage    `json:"provenance,omitempty"`
	OperationID       string             `json:"operation_id,omitempty"`
	TaskClass         string             `json:"task_class,omitempty"`
	AutonomyMode      string             `json:"autonomy_mode,omitempty"`
	RiskScore         *float64           `json:"risk_score,omitempty"`
	RiskBasis         []string           `json:"risk_basis,omitempty"`
	IdempotencyKey    string             `json:"idempotency_key,omitempty"`
	PreconditionRefs  []txn.Precondition `json:"precondition_refs,omitempty"`
	// Args comes last, so that an envelope cut at a size limit (which
	// its args make large) still names its tool, agent and token for the
	// refusal's audit record (salvage).
	Args json.RawMessage `json:"args"`
}

// Result is a result envelope (docs/http.md).
type Result struct {
	ToolID          string          `json:"tool_id"`
	AgentID         string          `json:"agent_id"`
	OperationID     string          `json:"operation_id"`
	StateSnapshotID string          `json:"state_snapshot_id"`
	Status          string          `json:"status"`
	Result          json.RawMessage `json:"result,omitempty"`
	Error           *Error          `json:"error,omitempty"`
	ResultHash      string          `json:"result_hash"`
	Provenance      json.RawMessage `json:"provenance,omitempty"`
	TaskClass       string          `json:"task_class,omitempty"`
	AutonomyMode    string          `json:"autonomy_mode"`
	RiskScore       float64         `json:"risk_score"`
	RiskBasis       []string        `json:"risk_basis"`
	// Notes are the details the syscall added to the call's audit record
	// (proc.exec's net_connections, a handle's name, …): with risk_basis
	// and provenance, what the record's context commitment commits to,
	// so that the caller can open it (docs/formats.md).
	Notes         map[string]json.RawMessage `json:"notes,omitempty"`
	TxOutcome     string                     `json:"tx_outcome"`
	CommitDeltaID string                     `json:"commit_delta_id,omitempty"`
	ReceiptID     string                     `json:"receipt_id,omitempty"`
	Receipt       *receipts.Logged           `json:"receipt,omitempty"` // the call's audit entry proven by the log; absent from stored envelopes
	LedgerSeq     uint64                     `json:"ledger_seq"`
	Replayed      bool                       `json:"replayed"`
	// AuditSalt is the salt of the call's audit record (64 hex digits):
	// with it the caller checks that the record commits to exactly its
	// args, result, policy input and context (docs/formats.md).
	AuditSalt string `json:"audit_salt,omitempty"`

	closing bool // the answer to a call that came while the kernel closed
}

// KernelClosing reports whether r answers a call that came while the
// kernel was closing (Kernel.Close): the call did not run and is not
// recorded, and the same call may be made again once a kernel serves the
// data dir again (HTTP answers it 503).
func (r *Result) KernelClosing() bool { return r.closing }

// decodeStored decodes a stored result envelope into r. Envelopes stored
// by kernels that signed a JWS receipt per call carry it as a string; it
// is dropped (the receipt of the call is its audit entry, provenReceipt).
func decodeStored(b []byte, r *Result) error {
	aux := struct {
		*Result
		Receipt json.RawMessage `json:"receipt,omitempty"`
	}{Result: r}
	return json.Unmarshal(b, &aux)
}

// Error is the error of a result envelope.
type Error struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

// Statuses and transaction outcomes of a Result.
const (
	StatusOK    = "ok"
	StatusError = "error"

	Committed  = "committed"
	RolledBack = "rolled_back"
	NoOp       = "no_op"
)

// Error classes: a closed enum, one slug per cause.
const (
	ErrToolNotFound           = "tool_not_found"
	ErrInvalidArgs            = "invalid_args"
	ErrTokenInvalid           = "token_invalid"
	ErrTokenRevoked           = "token_revoked"
	ErrPermissionDenied       = "permission_denied"
	ErrScopeDenied            = syscalls.FailScope
	ErrPolicyMismatch         = "policy_mismatch"
	ErrPolicyDenied           = "policy_denied"
	ErrApprovalDenied         = "approval_denied"
	ErrApprovalTimeout        = "approval_timeout"
	ErrPreconditionFailed     = "precondition_failed"
	ErrBudgetExceeded         = syscalls.FailBudget
	ErrConcurrencyExceeded    = "concurrency_exceeded" // the session's queue of waiting calls is full
	ErrIdempotencyKeyRequired = "idempotency_key_required"
	ErrIdempotencyConflict    = "idempotency_conflict"
	ErrIdempotencyInFlight    = "idempotency_in_flight"
	ErrOutcomeUnknown         = syscalls.FailUnknown // syscalls report these classes themselves
	ErrTimeout                = syscalls.FailTimeout
	ErrCancelled              = syscalls.FailCancelled
	ErrExecution              = "execution_error"
	ErrUpstreamUnavailable    = syscalls.FailUpstreamUnavailable
	ErrUpstreamError          = syscalls.FailUpstreamError
	ErrInternal               = "internal"
)

// DecodeEnvelope parses a call envelope by the strictjson rules: one JSON
// object; no unknown fields, field names exactly as written above; no
// duplicate member names and no invalid UTF-8 or lone surrogate anywhere,
// args and provenance included at every depth. args must be a JSON object,
// provenance (if any) a JSON object, both valid I-JSON (they are hashed in
// canonical form).
func DecodeEnvelope(data []byte) (*Envelope, error) {
	env, _, err := decodeEnvelope(data)
	return env, err
}

// decodeEnvelope is DecodeEnvelope that also returns the canonical form of
// args, which the args hash reuses.
func decodeEnvelope(data []byte) (*Envelope, []byte, error) {
	var env Envelope
	if err := strictjson.Unmarshal(data, &env); err != nil {
		return nil, nil, fmt.Errorf("envelope: %v", err)
	}
	args, err := checkObject("args", env.Args, true)
	if err != nil {
		return nil, nil, err
	}
	if _, err := checkObject("provenance", env.Provenance, false); err != nil {
		return nil, nil, err
	}
	return &env, args, nil
}

// checkObject requires raw to be a JSON object in valid I-JSON and returns
// its canonical form (nil when it is absent).
func checkObject(field string, raw json.RawMessage, required bool) ([]byte, error) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if required {
			return nil, fmt.Errorf("envelope: %s is required (a JSON object)", field)
		}
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("envelope: %s must be a JSON object", field)
	}
	if jcs.CheckCanonical(raw) == nil {
		// Canonical already, as clients usually send it: a copy (the
		// envelope's bytes are the caller's) without re-encoding.
		return bytes.Clone(raw), nil
	}
	// Exact: a number whose canonical form is another decimal would be hashed and
	// audited as the double while its text reached the syscall.
	c, err := jcs.CanonicalizeExact(raw)
	if err != nil {
		return nil, fmt.Errorf("envelope: %s: %v", field, err)
	}
	return c, nil
}

// maxEncodedSize bounds the length of env's JSON encoding from above
// without encoding it: a string byte takes at most 6 bytes escaped
// (\u00XX), and so does a byte of raw JSON (encoding/json escapes <, > and
// &); names, quotes and punctuation take under 512 bytes. With
// precondition refs it is -1: unknown.
func maxEncodedSize(env *Envelope) int64 {
	if len(env.PreconditionRefs) > 0 {
		return -1
	}
	n := len(env.ToolID) + len(env.AgentID) + len(env.CapabilityToken) + len(env.CapabilityTokenID) + len(env.StateSnapshotID) +
		len(env.PolicyHash) + len(env.OperationID) + len(env.TaskClass) + len(env.AutonomyMode) + len(env.IdempotencyKey) +
		len(env.Args) + len(env.Provenance)
	for _, b := range env.RiskBasis {
		n += len(b) + 1
	}
	return 6*int64(n) + 512
}
