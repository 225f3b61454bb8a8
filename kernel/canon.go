package kernel

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/policy"
)

// The kernel writes its own records in RFC 8785 form directly, once: the
// members of each object in sorted order, strings by jcs.AppendGoString,
// numbers by jcs.AppendNumber, parts that are canonical already copied as
// they are. The bytes are those json.Marshal followed by jcs.Canonicalize
// gives (canon_test.go compares them), without building and re-parsing an
// intermediate text. Outside input (args, provenance, notes) is still
// canonicalized strictly by jcs.Canonicalize.

// object appends the members of one JSON object; the caller adds them in
// sorted order of their names, which must need no escaping.
type object struct {
	b []byte
	n int
}

func (o *object) key(name string) {
	if o.n == 0 {
		o.b = append(o.b, '{')
	} else {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = append(o.b, '"')
	o.b = append(o.b, name...)
	o.b = append(o.b, '"', ':')
}

// str adds a string member.
func (o *object) str(name, v string) {
	o.key(name)
	o.b = jcs.AppendGoString(o.b, v)
}

// opt adds a string member unless v is empty (omitempty).
func (o *object) opt(name, v string) {
	if v != "" {
		o.str(name, v)
	}
}

// raw adds a member whose value is canonical JSON already.
func (o *object) raw(name string, v []byte) {
	o.key(name)
	o.b = append(o.b, v...)
}

func (o *object) end() []byte {
	if o.n == 0 {
		o.b = append(o.b, '{')
	}
	return append(o.b, '}')
}

// appendAuditBody appends a's ledger body, json.Marshal(a.publicBody())
// in canonical form.
func appendAuditBody(b []byte, a *auditRecord) ([]byte, error) {
	if math.IsNaN(a.RiskScore) || math.IsInf(a.RiskScore, 0) {
		return nil, fmt.Errorf("audit record %s: risk score %v is not a finite number", a.OperationID, a.RiskScore)
	}
	o := object{b: b}
	o.str("agent_id", a.AgentID)
	o.opt("approval_id", a.ApprovalID)
	o.opt("approval_reason", a.ApprovalReason)
	o.opt("approval_state", a.ApprovalState)
	o.opt("approved_by", a.ApprovedBy)
	o.opt("args_commitment", a.Commitments.Args)
	o.str("autonomy_mode", a.AutonomyMode)
	o.str("capability_token_id", a.CapabilityTokenID)
	o.opt("commit_delta_id", a.CommitDeltaID)
	o.opt("context_commitment", a.Commitments.Context)
	o.opt("decided_mode", a.DecidedMode)
	o.opt("envelope_hash", a.EnvelopeHash)
	o.opt("error_class", a.ErrorClass)
	o.opt("idempotency_key", a.IdempotencyKey)
	o.str("operation_id", a.OperationID)
	o.opt("payload_depth", a.PayloadDepth)
	o.str("policy_hash", a.PolicyHash)
	o.opt("policy_input_commitment", a.Commitments.PolicyInput)
	o.opt("replay_of", a.ReplayOf)
	o.opt("requested_mode", a.RequestedMode)
	o.opt("result_commitment", a.Commitments.Result)
	o.key("risk_score")
	o.b = jcs.AppendNumber(o.b, a.RiskScore)
	o.str("started_at", a.StartedAt)
	o.str("state_snapshot_id", a.StateSnapshotID)
	o.str("status", a.Status)
	o.str("task_class", a.TaskClass)
	o.opt("token_hash", a.TokenHash)
	o.str("tool_id", a.ToolID)
	o.str("tx_outcome", a.TxOutcome)
	return o.end(), nil
}

// contextPart is the canonical JSON of ctx, canonicalPart(ctx) written
// directly. Provenance and notes are outside input: each is canonicalized
// strictly. Notes with a name that is not plain ASCII, and input
// jcs.Canonicalize refuses, take canonicalPart's path, so its bytes and
// errors stay the reference.
func contextPart(ctx *auditContext) ([]byte, error) {
	b, err := appendContext(nil, ctx)
	if err != nil {
		return canonicalPart(ctx)
	}
	return b, nil
}

var errSlowPath = errors.New("not written directly")

func appendContext(b []byte, ctx *auditContext) ([]byte, error) {
	o := object{b: b}
	if len(ctx.Notes) > 0 {
		names := make([]string, 0, len(ctx.Notes))
		for name := range ctx.Notes {
			if !plainName(name) {
				return nil, errSlowPath
			}
			names = append(names, name)
		}
		// Plain ASCII names sort by bytes as by UTF-16 code units.
		slices.Sort(names)
		o.key("notes")
		n := object{b: o.b}
		for _, name := range names {
			v, err := jcs.Canonicalize(ctx.Notes[name])
			if err != nil {
				return nil, err
			}
			n.raw(name, v)
		}
		o.b = n.end()
	}
	if len(ctx.Provenance) > 0 {
		v, err := jcs.Canonicalize(ctx.Provenance)
		if err != nil {
			return nil, err
		}
		o.raw("provenance", v)
	}
	o.key("risk_basis")
	o.b = append(o.b, '[')
	for i, s := range ctx.RiskBasis {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = jcs.AppendGoString(o.b, s)
	}
	o.b = append(o.b, ']')
	return o.end(), nil
}

// plainName reports whether name is printable ASCII needing no escape in
// JSON nor in encoding/json's HTML-safe output.
func plainName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// withArgs returns the canonical policy input that noArgs (a canonical
// policy input without "args") is with the canonical args member added.
// "agent_id", always present, is the one member that sorts before "args".
func withArgs(noArgs, args []byte) ([]byte, bool) {
	const head = `{"agent_id":"`
	if !bytes.HasPrefix(noArgs, []byte(head)) {
		return nil, false
	}
	i := len(head)
	for ; i < len(noArgs) && noArgs[i] != '"'; i++ {
		if noArgs[i] == '\\' {
			i++
		}
	}
	if i >= len(noArgs) {
		return nil, false
	}
	i++ // the closing quote
	out := make([]byte, 0, len(noArgs)+len(args)+8)
	out = append(out, noArgs[:i]...)
	out = append(out, `,"args":`...)
	out = append(out, args...)
	return append(out, noArgs[i:]...), true
}

// policyPart returns the canonical policy input in and, when its "args"
// member is exactly args (canonical), the policy input without it, from
// which it is made (the args are not canonicalized again). known says
// whether that was decided; when not, the payload's encoder decides.
func policyPart(in *policy.Input, args []byte) (full, noArgs []byte, known bool, err error) {
	if len(in.Args) == 0 || args == nil {
		full, err = canonicalPart(in)
		return full, nil, true, err
	}
	same := bytes.Equal(in.Args, args)
	if !same {
		c, err := jcs.Canonicalize(in.Args)
		same = err == nil && bytes.Equal(c, args)
	}
	if same {
		cp := *in
		cp.Args = nil
		if noArgs, err = canonicalPart(&cp); err == nil {
			if full, ok := withArgs(noArgs, args); ok {
				return full, noArgs, true, nil
			}
		}
	}
	full, err = canonicalPart(in)
	return full, nil, false, err
}

// appendPayload appends the stored form of p (marshalPayload's bytes),
// every part of p canonical already. noArgs, if not nil, is p's policy
// input without its "args" member, which is exactly p.Args.
func appendPayload(b []byte, p *Payload, noArgs []byte) []byte {
	o := object{b: b}
	if p.Args != nil {
		o.raw("args", p.Args)
	}
	if p.Context != nil {
		o.raw("context", p.Context)
	}
	if p.PolicyInput != nil {
		if noArgs != nil {
			o.raw("policy_input", noArgs)
			o.raw("policy_input_shares_args", []byte("true"))
		} else {
			o.raw("policy_input", p.PolicyInput)
		}
	}
	if p.Result != nil {
		o.raw("result", p.Result)
	}
	o.str("salt", p.Salt)
	return o.end()
}
