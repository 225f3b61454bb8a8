package kernel

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

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
	o.b = appendStrings(o.b, ctx.RiskBasis)
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

// policyPart returns the canonical policy input in and, when its "args"
// member is exactly args (canonical), the policy input without it, both
// written directly (the args are not canonicalized again). known says
// whether that was decided; when not, the payload's encoder decides.
// Input the direct encoder does not write (provenance jcs refuses, a
// number that is not finite) takes canonicalPart's path.
func policyPart(in *policy.Input, args []byte) (full, noArgs []byte, known bool, err error) {
	switch {
	case len(in.Args) == 0:
		if full, err = appendPolicyInput(nil, in, nil); err == nil {
			return full, nil, true, nil
		}
	case args != nil && bytes.Equal(in.Args, args):
		if noArgs, err = appendPolicyInput(nil, in, nil); err == nil {
			if full, err = appendPolicyInput(make([]byte, 0, len(noArgs)+len(args)+8), in, args); err == nil {
				return full, noArgs, true, nil
			}
		}
	}
	full, err = canonicalPart(in)
	return full, nil, false, err
}

// appendPolicyInput appends the canonical JSON of in with args (canonical,
// nil for none) as its "args" member.
func appendPolicyInput(b []byte, in *policy.Input, args []byte) ([]byte, error) {
	o := object{b: b}
	o.str("agent_id", in.AgentID)
	if args != nil {
		o.raw("args", args)
	}
	o.opt("autonomy_ceiling", in.Ceiling)
	if len(in.CallerRiskBasis) > 0 {
		o.key("caller_risk_basis")
		o.b = appendStrings(o.b, in.CallerRiskBasis)
	}
	if in.CallerRiskScore != nil {
		f := *in.CallerRiskScore
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, errSlowPath
		}
		o.key("caller_risk_score")
		o.b = jcs.AppendNumber(o.b, f)
	}
	if n := in.Network; n != nil {
		o.key("network")
		no := object{b: o.b}
		no.key("patterns")
		no.b = appendStrings(no.b, n.Patterns)
		no.str("posture", n.Posture)
		o.b = no.end()
	}
	if len(in.Provenance) > 0 {
		v, err := jcs.Canonicalize(in.Provenance)
		if err != nil {
			return nil, err
		}
		o.raw("provenance", v)
	}
	o.opt("requested_mode", in.RequestedMode)
	o.key("resources")
	if in.Resources == nil {
		o.b = append(o.b, "null"...)
	} else {
		o.b = append(o.b, '[')
		for i := range in.Resources {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			var err error
			if o.b, err = appendResource(o.b, &in.Resources[i]); err != nil {
				return nil, err
			}
		}
		o.b = append(o.b, ']')
	}
	if in.ResourcesUndeclared {
		o.raw("resources_undeclared", []byte("true"))
	}
	o.str("side_effect", in.SideEffect)
	o.opt("task_class", in.TaskClass)
	o.str("tool_id", in.ToolID)
	return o.end(), nil
}

func appendResource(b []byte, r *policy.Resource) ([]byte, error) {
	o := object{b: b}
	if r.Exists {
		o.raw("exists", []byte("true"))
	}
	o.opt("host", r.Host)
	if r.IsDir {
		o.raw("is_dir", []byte("true"))
	}
	o.opt("key", r.Key)
	o.str("kind", r.Kind)
	o.str("op", r.Op)
	o.opt("path", r.Path)
	if r.Port != 0 {
		if r.Port > 1<<53 || r.Port < -(1<<53) {
			return nil, errSlowPath // beyond exact doubles: RFC 8785 rounds it
		}
		o.key("port")
		o.b = strconv.AppendInt(o.b, int64(r.Port), 10)
	}
	o.opt("real_path", r.RealPath)
	o.opt("root", r.Root)
	return o.end(), nil
}

// appendStrings appends ss as a JSON array, null for nil.
func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = jcs.AppendGoString(b, s)
	}
	return append(b, ']')
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
