// Package receipts signs and verifies capkernel's receipts: one per kernel
// call, allowed or denied, saying what was called, by whom, under which
// token and policy, with what outcome, and where in the ledger the call's
// records sit.
//
// A receipt is a compact JWS (RFC 7515) signed with the kernel's Ed25519
// key. Its protected header is exactly
//
//	{"alg":"EdDSA","kid":"<kid>","typ":"capkernel-receipt+jws"}
//
// where kid is the RFC 7638 JWK thumbprint (SHA-256, base64url) of the
// public key, and its payload is the RFC 8785 canonical JSON of a Receipt,
// so the same receipt always signs to the same bytes (Ed25519 signatures
// are deterministic). Anyone holding the kernel's JWKS can verify a receipt
// offline with Verify or any JOSE library.
package receipts

// Type is the typ header parameter of every receipt.
const Type = "capkernel-receipt+jws"

// Receipt is the signed payload. The JSON field names are the wire format.
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
	// For a call that waited for an approval: its id, the approver (the
	// approver token's subject; empty when nobody decided) and reason.
	ApprovalID     string `json:"approval_id,omitempty"`
	ApprovedBy     string `json:"approved_by,omitempty"`
	ApprovalReason string `json:"approval_reason,omitempty"`
}
