package kernel

import (
	"encoding/json"
	"errors"
	"slices"
	"sort"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
)

// Access is what one credential may read of the history. The admin and
// auditor tokens read every record in full; a capability token reads its
// own agent's records in full and every other record only as its public
// part (PublicFields); approver tokens, which act for no agent, read the
// public parts. Checkpoints and proofs are public to everyone.
type Access struct {
	// All is set for the admin credential and auditor tokens.
	All bool
	// Agent is the agent whose records are read in full ("" for none).
	Agent string
}

// AccessAll is the access of the admin credential and of auditor tokens.
var AccessAll = Access{All: true}

// AccessOf is the access of a verified bearer token.
func AccessOf(tok *captoken.Token) Access {
	switch tok.Claims.Cap.Role {
	case captoken.RoleAuditor:
		return AccessAll
	case "":
		return Access{Agent: tok.Claims.Subject}
	}
	return Access{}
}

// Full reports whether a record of agent is read in full.
func (a Access) Full(agent string) bool { return a.All || (agent != "" && agent == a.Agent) }

// EntryView is a ledger entry as one reader sees it. An audit record with
// commitments is public whole; its Payload (the parts kept beside the
// chain, and the salt that opens their commitments) comes with it only
// for a reader of the record in full. When Withheld is set the body is
// the public part of a record written before commitments: the listed
// members were left out, so its entry_hash does not recompute from it;
// the entry_hash is still the Merkle leaf, so an inclusion proof of the
// entry verifies.
type EntryView struct {
	ledger.Entry
	Withheld []string `json:"withheld,omitempty"`
	Payload  *Payload `json:"payload,omitempty"`
}

// PublicFields lists, per ledger kind, the body members every reader may
// see of a record that concerns another agent: the identity of the call
// and its outcome, never its arguments, results, messages or provenance.
// A kind not listed whose body names no agent_id is public whole.
var PublicFields = map[string][]string{
	ledger.KindAudit: {"operation_id", "agent_id", "policy_hash", "capability_token_id", "tool_id",
		"args_commitment", "result_commitment", "policy_input_commitment",
		"autonomy_mode", "requested_mode", "decided_mode", "risk_score", "status", "error_class",
		"tx_outcome", "commit_delta_id", "replay_of", "started_at", "approval_id", "approval_state", "approved_by", "approval_reason"},
	ledger.KindReceipt:    {"receipt_id", "operation_id"},
	KindApprovalRequested: approvalPublic,
	KindApprovalDecided:   approvalPublic,
}

// approvalPublic are the members of an approval entry's body
// (ApprovalRequest.ledgerBody): entries written before commitments held
// more, which is withheld.
var approvalPublic = []string{"approval_id", "operation_id", "tool_id", "agent_id", "capability_token_id", "policy_hash",
	"side_effect", "autonomy_mode", "required_role", "risk_score", "requested_at", "decide_by", "state",
	"session_id", "decided_by", "decided_with", "decided_at", "expires_at", "reason", "channel", "session_confirm"}

// publicDefault is the public part of a kind not in PublicFields whose
// body names an agent.
var publicDefault = []string{"operation_id", "agent_id", "tool_id"}

// Entry returns e as a sees it.
func (a Access) Entry(e ledger.Entry) EntryView {
	v, _ := a.entry(e)
	return v
}

// entry is Entry, and whether a reads e in full (its owner's view, or
// everything).
func (a Access) entry(e ledger.Entry) (v EntryView, full bool) {
	if a.All {
		return EntryView{Entry: e}, true
	}
	var body map[string]json.RawMessage
	if json.Unmarshal(e.Body, &body) != nil {
		// Not an object the kernel wrote: nothing of it is shown.
		return EntryView{Entry: withBody(e, json.RawMessage(`{}`)), Withheld: []string{"body"}}, false
	}
	owner, ok := a.owner(e, body)
	if ok && a.Full(owner) {
		return EntryView{Entry: e}, true
	}
	if _, sealed := body["payload_depth"]; sealed && e.Kind == ledger.KindAudit {
		// Its private parts are beside the chain: the body is public.
		return EntryView{Entry: e}, false
	}
	keep, listed := PublicFields[e.Kind]
	if !listed {
		if !ok {
			return EntryView{Entry: e}, false
		}
		keep = publicDefault
	}
	var withheld []string
	for name := range body {
		if !slices.Contains(keep, name) {
			withheld = append(withheld, name)
			delete(body, name)
		}
	}
	if len(withheld) == 0 {
		return EntryView{Entry: e}, false
	}
	sort.Strings(withheld)
	b, err := json.Marshal(body)
	if err != nil {
		return EntryView{Entry: withBody(e, json.RawMessage(`{}`)), Withheld: []string{"body"}}, false
	}
	return EntryView{Entry: withBody(e, b), Withheld: withheld}, false
}

// owner returns the agent a record concerns: its body's agent_id, or for
// a receipt entry the agent of the receipt. ok is false for records that
// concern no agent (grants, revocations, policy loads).
func (a Access) owner(e ledger.Entry, body map[string]json.RawMessage) (string, bool) {
	if e.Kind == ledger.KindReceipt {
		if r, err := receiptInfo(e); err == nil {
			return r.Receipt.AgentID, true
		}
		return "", true
	}
	raw, ok := body["agent_id"]
	if !ok {
		return "", false
	}
	var agent string
	json.Unmarshal(raw, &agent)
	return agent, true
}

func withBody(e ledger.Entry, b json.RawMessage) ledger.Entry {
	e.Body = b
	return e
}

// Receipt returns r as a sees it: for another agent's receipt the JWS and
// the hashes of the call's arguments and result are left out (they would
// let a reader confirm a guess of them), and Withheld says so.
func (a Access) Receipt(r ReceiptInfo) ReceiptInfo {
	if r.Receipt == nil || a.Full(r.Receipt.AgentID) {
		return r
	}
	pub := *r.Receipt
	pub.ArgsHash, pub.ResultHash = "", ""
	r.Receipt, r.JWS = &pub, ""
	r.Withheld = []string{"args_hash", "jws", "result_hash"}
	return r
}

// Event returns e as a sees it, and whether a may see it at all: a
// capability token sees only its own agent's events; approver tokens see
// every agent's, without messages (which may quote arguments) except on
// the approval requests they decide; the admin and auditors see all, but
// the message of a call audited at depth commitments_only, which only
// its agent sees (NotKeptMessage stands for it).
func (a Access) Event(e Event) (Event, bool) {
	switch {
	case a.Full(e.AgentID):
		if e.own && a.Agent != e.AgentID {
			e.Message = NotKeptMessage
		}
		return e, true
	case a.Agent != "":
		return e, false
	}
	if e.Approval == nil {
		e.Message = ""
	}
	return e, true
}

// MayHave reports whether a may have the whole ledger record rec (the
// exact JSON of an entry, as a receipt or bundle holds it): a record with
// commitments is public; one written before them only to a reader of it
// in full.
func (a Access) MayHave(rec string) bool {
	if a.All {
		return true
	}
	var e struct {
		Body struct {
			AgentID      string `json:"agent_id"`
			PayloadDepth string `json:"payload_depth"`
		} `json:"body"`
	}
	return json.Unmarshal([]byte(rec), &e) == nil && (e.Body.PayloadDepth != "" || a.Full(e.Body.AgentID))
}

// ScanViews calls fn for every ledger entry from seq from on, as a sees
// it, with the payload of each audit record a reads in full, inside one
// read transaction; it stops at fn's first error.
func (i *Inspector) ScanViews(from uint64, a Access, fn func(EntryView) error) error {
	return i.view(func(tx *bbolt.Tx) error {
		return ledger.Scan(tx, from, func(e ledger.Entry) error {
			v, err := a.view(tx, e)
			if err != nil {
				return err
			}
			return fn(v)
		})
	})
}

// EntryViews returns up to limit ledger entries from seq from on, as a
// sees them (see ScanViews).
func (i *Inspector) EntryViews(from uint64, limit int, a Access) ([]EntryView, error) {
	out := []EntryView{}
	stop := errors.New("stop")
	err := i.ScanViews(from, a, func(v EntryView) error {
		if len(out) >= limit {
			return stop
		}
		out = append(out, v)
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return out, err
}

// view is e as a sees it, with its payload when a reads it in full.
func (a Access) view(tx *bbolt.Tx, e ledger.Entry) (EntryView, error) {
	v, full := a.entry(e)
	if e.Kind != ledger.KindAudit || !full {
		return v, nil
	}
	p, err := openedPayloadOf(tx, e.Seq, e.Body)
	if err != nil {
		return v, err
	}
	v.Payload = p
	return v, nil
}

// ledgerBody is the body of r's ledger entries: the request without what
// the call carried (input summary, projected effects, args hash, risk
// basis), which the call's audit record commits to instead, so the chain
// holds nothing of the call that cannot be erased. The decision — who,
// through which channel, why — stays.
func (r ApprovalRequest) ledgerBody() map[string]any {
	m := map[string]any{
		"approval_id": r.ID, "operation_id": r.OperationID, "tool_id": r.ToolID, "agent_id": r.AgentID,
		"capability_token_id": r.CapabilityTokenID, "policy_hash": r.PolicyHash, "side_effect": r.SideEffect,
		"autonomy_mode": r.Mode, "required_role": r.RequiredRole, "risk_score": r.RiskScore,
		"requested_at": r.RequestedAt, "decide_by": r.DecideBy, "state": r.State,
	}
	for k, v := range map[string]string{"session_id": r.SessionID, "decided_by": r.DecidedBy, "decided_with": r.TokenID,
		"decided_at": r.DecidedAt, "expires_at": r.ExpiresAt, "reason": r.Reason, "channel": r.Channel} {
		if v != "" {
			m[k] = v
		}
	}
	if r.SessionConfirm {
		m["session_confirm"] = true
	}
	return m
}
