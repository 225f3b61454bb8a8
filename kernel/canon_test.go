package kernel

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/policy"
)

// canonOdd are field values that exercise the direct encoder's escaping
// and its replacement of invalid UTF-8, as json.Marshal does it.
var canonOdd = []string{
	"", "x", `q"b\s`, "\x00\x1f\n\t", "<&>", "\u2028", "é𝄞", "\xff", "a\xc3", "\xed\xa0\x80", "\ufffd",
}

// randomRecord is an audit record with every field drawn from canonOdd or
// left empty, and random notes, provenance, risk basis and policy input.
func randomRecord(r *rand.Rand) (*auditRecord, []byte) {
	s := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		return canonOdd[r.IntN(len(canonOdd))] + canonOdd[r.IntN(len(canonOdd))]
	}
	a := &auditRecord{
		OperationID: s(), AgentID: s(), PolicyHash: s(), StateSnapshotID: s(), CapabilityTokenID: s(),
		TokenHash: s(), ToolID: s(), ArgsHash: s(), EnvelopeHash: s(), ResultHash: s(), TaskClass: s(),
		AutonomyMode: s(), RequestedMode: s(), DecidedMode: s(), Status: s(), ErrorClass: s(),
		ErrorMessage: s(), TxOutcome: s(), CommitDeltaID: s(), IdempotencyKey: s(), ReplayOf: s(),
		StartedAt: s(), ApprovalID: s(), ApprovalState: s(), ApprovedBy: s(), ApprovalReason: s(),
		PayloadDepth: s(), RecoverySalt: s(),
		Commitments: Commitments{Args: s(), Result: s(), PolicyInput: s(), Context: s()},
		RiskScore:   []float64{0, 1, 0.25, 0.1 + 0.2, 1e-7, 1e21, r.Float64()}[r.IntN(7)],
	}
	raws := []string{`{"b":1,"a":[1e2,"\u00e9"]}`, `"x"`, `null`, `{"z":{"y":0.5}}`, `[ 1 , 2 ]`}
	if r.IntN(2) == 0 {
		a.Provenance = json.RawMessage(raws[r.IntN(len(raws))])
	}
	if n := r.IntN(4); n > 0 {
		a.Notes = map[string]json.RawMessage{}
		names := []string{"net_connections", "a", "Z", "é", "<x>", "b_c"}
		for range n {
			a.Notes[names[r.IntN(len(names))]] = json.RawMessage(raws[r.IntN(len(raws))])
		}
	}
	for range r.IntN(3) {
		a.RiskBasis = append(a.RiskBasis, s())
	}
	var args []byte
	if r.IntN(4) > 0 {
		args = []byte(`{"content":"x\u0000","path":"a.txt"}`)
		args, _ = jcs.Canonicalize(args)
	}
	if r.IntN(4) > 0 {
		score := 0.5
		in := &policy.Input{ToolID: s(), SideEffect: s(), AgentID: s(), TaskClass: s(), Ceiling: s(), RequestedMode: s(),
			ResourcesUndeclared: r.IntN(2) == 0, ArgsOmitted: r.IntN(2) == 0, ArgsSize: r.IntN(2) * (16<<10 + r.IntN(1<<20))}
		for range r.IntN(3) {
			var others []string
			for range r.IntN(3) {
				others = append(others, s())
			}
			in.Resources = append(in.Resources, policy.Resource{Kind: s(), Op: s(), Path: s(), RealPath: s(), Root: s(), OtherPaths: others,
				IsDir: r.IntN(2) == 0, Exists: r.IntN(2) == 0, Key: s(), Host: s(), Port: r.IntN(3) * 443})
		}
		if r.IntN(3) == 0 {
			in.Resources = []policy.Resource{}
		}
		if r.IntN(2) == 0 {
			in.CallerRiskScore = &score
		}
		if r.IntN(2) == 0 {
			in.CallerRiskBasis = []string{s(), s()}
		}
		if r.IntN(2) == 0 {
			in.Network = &policy.Network{Posture: s()}
			if r.IntN(2) == 0 {
				in.Network.Patterns = []string{s()}
			}
		}
		if r.IntN(2) == 0 {
			in.Provenance = json.RawMessage(raws[r.IntN(len(raws))])
		}
		switch r.IntN(4) {
		case 0: // args left out of the policy input (too large)
		case 1:
			in.Args = args
		case 2: // the envelope's args, not in canonical form
			if args != nil {
				in.Args = json.RawMessage(`{ "path":"a.txt", "content":"x\u0000"}`)
			}
		case 3: // args other than the call's
			in.Args = json.RawMessage(`{"path":"b"}`)
		}
		a.PolicyInput = in
	}
	return a, args
}

// TestDirectEncodingMatchesMarshal checks that the kernel's direct encoders
// give the bytes of json.Marshal followed by RFC 8785 canonicalization: the
// audit body, the context and policy input parts, and the stored payload.
func TestDirectEncodingMatchesMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	recs := []*auditRecord{{}, {RiskBasis: []string{}, Notes: map[string]json.RawMessage{}}}
	argsOf := [][]byte{nil, nil}
	for range 3000 {
		a, args := randomRecord(r)
		recs = append(recs, a)
		argsOf = append(argsOf, args)
	}
	for i, a := range recs {
		checkDirect(t, a, argsOf[i])
	}
}

func FuzzDirectEncoding(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		a, args := randomRecord(rand.New(rand.NewPCG(s1, s2)))
		checkDirect(t, a, args)
	})
}

func checkDirect(t *testing.T, a *auditRecord, args []byte) {
	t.Helper()
	want, err := jcs.Marshal(a.publicBody())
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendAuditBody(nil, a)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("audit body of %+v:\n got %s (%v)\nwant %s", a, got, err, want)
	}
	ctx := auditContext{Provenance: a.Provenance, Notes: a.Notes, RiskBasis: a.RiskBasis}
	if ctx.RiskBasis == nil {
		ctx.RiskBasis = []string{}
	}
	wantCtx, werr := canonicalPart(ctx)
	gotCtx, gerr := contextPart(&ctx)
	if !bytes.Equal(gotCtx, wantCtx) || (werr == nil) != (gerr == nil) {
		t.Fatalf("context part:\n got %s (%v)\nwant %s (%v)", gotCtx, gerr, wantCtx, werr)
	}
	if werr != nil {
		return
	}
	// The payload as marshalPayload makes it from the parts encoded by
	// encoding/json, against seal's.
	parts := map[string][]byte{PartArgs: args, PartResult: []byte(`{"result":"r","status":"ok"}`), PartContext: wantCtx}
	if a.PolicyInput != nil {
		if parts[PartPolicyInput], err = canonicalPart(a.PolicyInput); err != nil {
			t.Fatal(err)
		}
	}
	for _, depth := range []string{DepthFull, DepthCommitmentsOnly} {
		salt := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
		ref := Payload{Salt: salt, Args: parts[PartArgs], Result: parts[PartResult], PolicyInput: parts[PartPolicyInput], Context: parts[PartContext]}
		wantPayload, err := marshalPayload(&ref)
		if err != nil {
			t.Fatal(err)
		}
		b := *a
		s, err := b.seal(salt, depth, args, parts[PartResult])
		if err != nil {
			t.Fatal(err)
		}
		if depth == DepthCommitmentsOnly {
			// Nothing is kept, the salt neither (seal).
			if s.payload != nil {
				t.Fatalf("payload at depth %s: %q, want none", depth, s.payload)
			}
		} else if got, err := unpackPayload(s.payload); err != nil || !bytes.Equal(got, wantPayload) {
			t.Fatalf("payload at depth %s:\n got %s (%v)\nwant %s", depth, got, err, wantPayload)
		}
		for _, name := range Parts {
			want := ""
			if parts[name] != nil {
				want, _ = CommitPart(salt, name, parts[name])
			}
			if got := b.Commitments.of(name); got != want {
				t.Fatalf("%s commitment %q, want %q", name, got, want)
			}
		}
	}
}
