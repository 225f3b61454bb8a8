package kernel

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/ledger"
)

// commitmentVector is one golden vector of testdata/commitments.json:
// a salt, a part's canonical bytes, the part's key and its commitment.
type commitmentVector struct {
	Part       string `json:"part"`
	Salt       string `json:"salt"`
	Canonical  string `json:"canonical"`
	Key        string `json:"key"` // hex of BLAKE3-derive_key("capkernel audit commitment v1 <part>", salt)
	Commitment string `json:"commitment"`
}

func commitmentVectors(t *testing.T) []commitmentVector {
	t.Helper()
	salts := []string{
		"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
		"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
	}
	parts := []struct{ name, canonical string }{
		{PartArgs, `{"content":"pin 4711","path":"pin.txt"}`},
		{PartArgs, `{"content":"pin 4712","path":"pin.txt"}`},
		{PartResult, `{"result":{"bytes":8,"path":"pin.txt"},"status":"ok"}`},
		{PartResult, `{"error":{"class":"execution_error","message":"fs.read plan.txt: no such file"},"status":"error"}`},
		{PartPolicyInput, `{"agent_id":"a1","args":{"path":"pin.txt"},"resources":[],"side_effect":"READ","tool_id":"fs.read"}`},
		{PartContext, `{"provenance":{"session_id":"s1"},"risk_basis":["read in scope"]}`},
	}
	var out []commitmentVector
	for _, s := range salts {
		for _, p := range parts {
			key, err := PartKey(s, p.name)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, commitmentVector{Part: p.name, Salt: s, Canonical: p.canonical, Key: hex.EncodeToString(key[:]), Commitment: Commit(key, []byte(p.canonical))})
		}
	}
	return out
}

// TestCommitmentVectors checks the audit commitments against
// testdata/commitments.json (go test -run TestCommitmentVectors -update
// rewrites it) and that CheckPayload opens a record by them.
func TestCommitmentVectors(t *testing.T) {
	got := commitmentVectors(t)
	const file = "testdata/commitments.json"
	want := golden(t, file, got)
	seen := map[string]bool{}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("vector %d: %+v, want %+v", i, got[i], want[i])
		}
		if seen[want[i].Commitment] {
			t.Errorf("vector %d: commitment %s repeats: salts or parts do not separate", i, want[i].Commitment)
		}
		seen[want[i].Commitment] = true
	}
	// A record holding the first salt's commitments opens with its parts
	// and not with another salt.
	v := want[:6]
	body, _ := json.Marshal(map[string]string{"args_commitment": v[0].Commitment, "result_commitment": v[2].Commitment,
		"policy_input_commitment": v[4].Commitment, "context_commitment": v[5].Commitment, "payload_depth": DepthFull})
	e := ledger.Entry{Kind: ledger.KindAudit, Body: body}
	p := Payload{Salt: v[0].Salt, Args: json.RawMessage(v[0].Canonical), Result: json.RawMessage(v[2].Canonical),
		PolicyInput: json.RawMessage(v[4].Canonical), Context: json.RawMessage(v[5].Canonical)}
	if err := CheckPayload(e, p); err != nil {
		t.Fatal(err)
	}
	p.Salt = want[6].Salt
	if err := CheckPayload(e, p); err == nil {
		t.Fatal("another salt opens the record")
	}
	// The salt in capitals is another spelling, refused.
	p.Salt = strings.ToUpper(v[0].Salt)
	if err := CheckPayload(e, p); err == nil {
		t.Fatal("the salt in upper case opens the record")
	}
}

// TestCheckPayloadExactNumbers: a part holding a number that reads as the
// double the committed part holds, but is another decimal, does not open
// the commitment (it did, rounded before hashing).
func TestCheckPayloadExactNumbers(t *testing.T) {
	salt := NewSalt()
	for _, tt := range []struct{ committed, given string }{
		{`{"n":9007199254740992}`, `{"n":9007199254740993}`},
		{`{"n":0.1}`, `{"n":0.10000000000000000001}`},
		{`{"n":1152921504606847000}`, `{"n":1152921504606846976}`},
	} {
		c, err := CommitPart(salt, PartArgs, []byte(tt.committed))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]string{"args_commitment": c, "payload_depth": DepthFull})
		e := ledger.Entry{Kind: ledger.KindAudit, Body: body}
		if err := CheckPayload(e, Payload{Salt: salt, Args: json.RawMessage(tt.committed)}); err != nil {
			t.Fatalf("%s: %v", tt.committed, err)
		}
		if err := CheckPayload(e, Payload{Salt: salt, Args: json.RawMessage(tt.given)}); err == nil {
			t.Errorf("%s opens the commitment to %s", tt.given, tt.committed)
		}
	}
}

// TestStoredPayloadRoundTrip: the stored form leaves out the policy
// input's copy of the args and gives back the exact canonical parts.
func TestStoredPayloadRoundTrip(t *testing.T) {
	args := `{"content":"x","path":"a.txt"}`
	for _, in := range []string{
		`{"agent_id":"a1","args":{"content":"x","path":"a.txt"},"tool_id":"fs.write"}`,
		`{"agent_id":"a1","tool_id":"fs.write"}`, // args over the policy's limit: not copied
		`{"agent_id":"a1","args":{"path":"b.txt"},"tool_id":"fs.write"}`,
	} {
		p := &Payload{Salt: NewSalt(), Args: json.RawMessage(args), PolicyInput: json.RawMessage(in)}
		b, err := marshalPayload(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(string(b), `"content":"x"`); got != 1 {
			t.Errorf("%s: the args' content is stored %d times: %s", in, got, b)
		}
		back, err := unmarshalPayload(b)
		if err != nil || string(back.PolicyInput) != in || string(back.Args) != args {
			t.Fatalf("%s: read back %s / %s, %v", in, back.PolicyInput, back.Args, err)
		}
	}
}

// A background call's result, kept in memory for its caller, is shown to
// the admin and auditors as it is stored: at depth commitments_only none
// of the call's parts (rev-gate #3: GET /v1/operations served them the
// file content, the provenance and the salt for an hour).
func TestBackgroundResultAtCommitmentsOnly(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Audit = &AuditConfig{Depth: map[string]string{"*": DepthCommitmentsOnly}}
	})
	h.write("memo.txt", "memo-the-merger-closes-friday")
	// By name, and by a handle refused before it resolves (rev-last2 #2:
	// its result names the handle, whose depth was taken for full).
	for _, tool := range []string{"fs.read", HandlePrefix + "aaaaaaaaaaaaaaaaaaaaaaaaaa"} {
		backgroundResultSeen(t, h, tool)
	}
}

func backgroundResultSeen(t *testing.T, h *harness, tool string) {
	t.Helper()
	env := h.env(tool, map[string]any{"path": "memo.txt"}, opID(newID()),
		func(e *Envelope) { e.Provenance = json.RawMessage(`{"prompt":"ssn-078-05-1120"}`) })
	raw, _ := json.Marshal(env)
	id, _, err := h.k.Start(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		acc   Access
		parts bool
	}{
		{"the calling agent", Access{Agent: h.agent}, true},
		{"the admin or an auditor", AccessAll, false},
	} {
		st, ok := h.k.OperationFor(id, c.acc)
		if !ok || st.Result == nil {
			t.Fatalf("%s: %v %+v", c.name, ok, st)
		}
		b, _ := json.Marshal(st.Result)
		parts := []string{"ssn-078", `"audit_salt"`}
		if tool == "fs.read" {
			parts = append(parts, "memo-the-merger")
		}
		for _, part := range parts {
			if strings.Contains(string(b), part) != c.parts {
				t.Errorf("%s, %s: %s in the result: %v, want %v: %s", tool, c.name, part, !c.parts, c.parts, b)
			}
		}
	}
	if _, ok := h.k.OperationFor(id, Access{Agent: "someone-else"}); ok {
		t.Error("another agent sees the operation")
	}
}
