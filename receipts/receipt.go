// Package receipts holds capkernel's receipts: one per kernel call,
// allowed or denied, saying what was called, by whom, under which token and
// policy, with what outcome, and where in the ledger the call's record
// sits.
//
// Since format v2 (Logged, VerifyLogged) a receipt is proven by the log:
// the call's audit entry, its inclusion proof and the checkpoint, signed
// once per group commit, whose tree it is proven to be in. Anyone holding
// the kernel's JWKS can verify one offline.
//
// Format v1 receipts, which older ledgers hold one per call, are compact
// JWS (RFC 7515) signed with the kernel's Ed25519 key. Their protected
// header is exactly
//
//	{"alg":"EdDSA","kid":"<kid>","typ":"capkernel-receipt+jws"}
//
// where kid is the RFC 7638 JWK thumbprint (SHA-256, base64url) of the
// public key, and their payload is the RFC 8785 canonical JSON of a
// Receipt, so the same receipt always signs to the same bytes (Ed25519
// signatures are deterministic). Verify checks them.
package receipts

// Type is the typ header parameter of every receipt.
const Type = "capkernel-receipt+jws"

// Receipt is what a receipt attests: the payload of a v1 JWS receipt (the
// JSON field names are its wire format), or what Summarize reads from the
// audit entry of a v2 one.
type Receipt struct {
	ReceiptID         string  `json:"receipt_id"`
	OperationID       string  `json:"operation_id"`
	ToolID            string  `json:"tool_id"`
	AgentID           string  `json:"agent_id"`
	CapabilityTokenID string  `json:"capability_token_id"`
	ArgsHash          string  `json:"args_hash"`   // blake3:<hex> of the canonical args
	ResultHash        string  `json:"result_hash"` // blake3:<hex> of the canonical result
	TxOutcome         string  `json:"tx_outcome"`  // committed, rolled_back or no_op
	CommitDeltaID     string  `json:"commit_delta_id,omitempty"`
	PolicyHash        string  `json:"policy_hash"`
	AutonomyMode      string  `json:"autonomy_mode"`
	RiskScore         float64 `json:"risk_score"`
	ErrorClass        string  `json:"error_class,omitempty"`
	LedgerSeq         uint64  `json:"ledger_seq"`        // seq of the ledger entry attested (the call's audit record)
	LedgerEntryHash   string  `json:"ledger_entry_hash"` // entry_hash of that entry
	IssuedAt          string  `json:"issued_at"`         // RFC 3339 with nanoseconds, UTC
	// For a call that waited for an approval: its id, how it was closed
	// (allowed, denied, expired or abandoned; read from a v2 receipt's
	// audit record, absent from v1 receipts), who decided it (the approver
	// token's subject, whichever the decision; empty when nobody did) and
	// why.
	ApprovalID     string `json:"approval_id,omitempty"`
	ApprovalState  string `json:"approval_state,omitempty"`
	ApprovedBy     string `json:"approved_by,omitempty"`
	ApprovalReason string `json:"approval_reason,omitempty"`
}
