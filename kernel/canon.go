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

// appendAuditBody appends a's ledger body, json.Marshal(a.publicBody())
// in canonical form.
func appendAuditBody(b []byte, a *auditRecord) ([]byte, error) {
	if math.IsNaN(a.RiskScore) || math.IsInf(a.RiskScore, 0) {
		return nil, fmt.Errorf("audit record %s: risk score %v is not a finite number", a.OperationID, a.RiskScore)
	}
	o := jcs.Object{B: b}
	o.Str("agent_id", a.AgentID)
	o.Opt("approval_id", a.ApprovalID)
	o.Opt("approval_reason", a.ApprovalReason)
	o.Opt("approval_state", a.ApprovalState)
	o.Opt("approved_by", a.ApprovedBy)
	o.Opt("args_commitment", a.Commitments.Args)
	o.Str("autonomy_mode", a.AutonomyMode)
	o.Str("capability_token_id", a.CapabilityTokenID)
	o.Opt("claimed_agent_id", a.ClaimedAgentID)
	o.Opt("claimed_capability_token_id", a.ClaimedTokenID)
	o.Opt("commit_delta_id", a.CommitDeltaID)
	o.Opt("context_commitment", a.Commitments.Context)
	o.Opt("decided_mode", a.DecidedMode)
	o.Opt("envelope_hash", a.EnvelopeHash)
	o.Opt("error_class", a.ErrorClass)
	o.Opt("idempotency_key", a.IdempotencyKey)
	o.Str("operation_id", a.OperationID)
	o.Opt("payload_depth", a.PayloadDepth)
	o.Str("policy_hash", a.PolicyHash)
	o.Opt("policy_input_commitment", a.Commitments.PolicyInput)
	o.Opt("replay_of", a.ReplayOf)
	o.Opt("requested_mode", a.RequestedMode)
	o.Opt("result_commitment", a.Commitments.Result)
	o.Key("risk_score")
	o.B = jcs.AppendNumber(o.B, a.RiskScore)
	o.Str("started_at", a.StartedAt)
	o.Str("state_snapshot_id", a.StateSnapshotID)
	o.Str("status", a.Status)
	o.Str("task_class", a.TaskClass)
	o.Opt("token_hash", a.TokenHash)
	o.Str("tool_id", a.ToolID)
	o.Str("tx_outcome", a.TxOutcome)
	return o.End(), nil
}

// contextPart is the canonical JSON of ctx, canonicalPart(ctx) written
// directly. Provenance and notes are outside input: each is canonicalized
// strictly. Notes with a name that is not plain ASCII, and input
// jcs.Canonicalize refuses, take canonicalPart's path, so its bytes and
// errors stay the reference.
func contextPart(ctx *auditContext) ([]byte, error) {
	n := 64 + len(ctx.Provenance)
	for _, v := range ctx.Notes {
		n += len(v) + 32
	}
	for _, r := range ctx.RiskBasis {
		n += len(r) + 3
	}
	b, err := appendContext(make([]byte, 0, n), ctx)
	if err != nil {
		return canonicalPart(ctx)
	}
	return b, nil
}

var errSlowPath = errors.New("not written directly")

func appendContext(b []byte, ctx *auditContext) ([]byte, error) {
	o := jcs.Object{B: b}
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
		o.Key("notes")
		n := jcs.Object{B: o.B}
		for _, name := range names {
			v, err := jcs.Canonical(ctx.Notes[name])
			if err != nil {
				return nil, err
			}
			n.Raw(name, v)
		}
		o.B = n.End()
	}
	if len(ctx.Provenance) > 0 {
		v, err := jcs.Canonical(ctx.Provenance)
		if err != nil {
			return nil, err
		}
		o.Raw("provenance", v)
	}
	o.Key("risk_basis")
	o.B = appendStrings(o.B, ctx.RiskBasis)
	return o.End(), nil
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

// policyEncoding is what policyPart returned for in.
type policyEncoding struct {
	in           *policy.Input
	full, noArgs []byte
	known        bool
	err          error
}

// encodePolicyInput is policyPart(in, args), kept for the call: the policy
// decides on full and the audit record commits to it.
func encodePolicyInput(in *policy.Input, args []byte) *policyEncoding {
	e := &policyEncoding{in: in}
	e.full, e.noArgs, e.known, e.err = policyPart(in, args)
	return e
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
		if full, err = appendPolicyInput(make([]byte, 0, policyInputSize(in)), in, nil); err == nil {
			return full, nil, true, nil
		}
	case args != nil && bytes.Equal(in.Args, args):
		if noArgs, err = appendPolicyInput(make([]byte, 0, policyInputSize(in)), in, nil); err == nil {
			if full, err = appendPolicyInput(make([]byte, 0, len(noArgs)+len(args)+8), in, args); err == nil {
				return full, noArgs, true, nil
			}
		}
	}
	full, err = canonicalPart(in)
	return full, nil, false, err
}

// policyInputSize estimates the length of in's canonical JSON without
// its args, so that it is written into one buffer.
func policyInputSize(in *policy.Input) int {
	n := 256 + len(in.AgentID) + len(in.TaskClass) + len(in.ToolID) + len(in.Provenance)
	for _, r := range in.Resources {
		n += 96 + len(r.Path) + len(r.RealPath) + len(r.Root) + len(r.Key) + len(r.Host)
	}
	for _, r := range in.CallerRiskBasis {
		n += len(r) + 3
	}
	if in.Network != nil {
		n += 64
		for _, p := range in.Network.Patterns {
			n += len(p) + 3
		}
	}
	return n
}

// appendPolicyInput appends the canonical JSON of in with args (canonical,
// nil for none) as its "args" member.
func appendPolicyInput(b []byte, in *policy.Input, args []byte) ([]byte, error) {
	o := jcs.Object{B: b}
	o.Str("agent_id", in.AgentID)
	if args != nil {
		o.Raw("args", args)
	}
	if in.ArgsOmitted {
		o.Bool("args_omitted", true)
	}
	if in.ArgsSize != 0 {
		o.Int("args_size", int64(in.ArgsSize))
	}
	o.Opt("autonomy_ceiling", in.Ceiling)
	if len(in.CallerRiskBasis) > 0 {
		o.Key("caller_risk_basis")
		o.B = appendStrings(o.B, in.CallerRiskBasis)
	}
	if in.CallerRiskScore != nil {
		f := *in.CallerRiskScore
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, errSlowPath
		}
		o.Key("caller_risk_score")
		o.B = jcs.AppendNumber(o.B, f)
	}
	if n := in.Network; n != nil {
		o.Key("network")
		no := jcs.Object{B: o.B}
		no.Key("patterns")
		no.B = appendStrings(no.B, n.Patterns)
		no.Str("posture", n.Posture)
		o.B = no.End()
	}
	if len(in.Provenance) > 0 {
		v, err := jcs.Canonical(in.Provenance)
		if err != nil {
			return nil, err
		}
		o.Raw("provenance", v)
	}
	o.Opt("requested_mode", in.RequestedMode)
	o.Key("resources")
	if in.Resources == nil {
		o.B = append(o.B, "null"...)
	} else {
		o.B = append(o.B, '[')
		for i := range in.Resources {
			if i > 0 {
				o.B = append(o.B, ',')
			}
			var err error
			if o.B, err = appendResource(o.B, &in.Resources[i]); err != nil {
				return nil, err
			}
		}
		o.B = append(o.B, ']')
	}
	if in.ResourcesUndeclared {
		o.Bool("resources_undeclared", true)
	}
	o.Str("side_effect", in.SideEffect)
	o.Opt("task_class", in.TaskClass)
	o.Str("tool_id", in.ToolID)
	return o.End(), nil
}

func appendResource(b []byte, r *policy.Resource) ([]byte, error) {
	o := jcs.Object{B: b}
	if r.Exists {
		o.Bool("exists", true)
	}
	o.Opt("host", r.Host)
	if r.IsDir {
		o.Bool("is_dir", true)
	}
	o.Opt("key", r.Key)
	o.Str("kind", r.Kind)
	o.Str("op", r.Op)
	if len(r.OtherPaths) > 0 {
		o.Key("other_paths")
		o.B = appendStrings(o.B, r.OtherPaths)
	}
	o.Opt("path", r.Path)
	if r.Port != 0 {
		if r.Port > 1<<53 || r.Port < -(1<<53) {
			return nil, errSlowPath // beyond exact doubles: RFC 8785 rounds it
		}
		o.Key("port")
		o.B = strconv.AppendInt(o.B, int64(r.Port), 10)
	}
	o.Opt("real_path", r.RealPath)
	o.Opt("root", r.Root)
	return o.End(), nil
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
	o := jcs.Object{B: b}
	if p.Args != nil {
		o.Raw("args", p.Args)
	}
	if p.Context != nil {
		o.Raw("context", p.Context)
	}
	if p.PolicyInput != nil {
		if noArgs != nil {
			o.Raw("policy_input", noArgs)
			o.Bool("policy_input_shares_args", true)
		} else {
			o.Raw("policy_input", p.PolicyInput)
		}
	}
	if p.Result != nil {
		o.Raw("result", p.Result)
	}
	o.Str("salt", p.Salt)
	return o.End()
}
