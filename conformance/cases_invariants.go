package conformance

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Group names.
const (
	gNoBypass   = "TOOL-01 §6 no bypass"
	gAudit      = "TOOL-01 §6 auditability"
	gPolicy     = "TOOL-01 §6 policy mediation"
	gDelegation = "TOOL-01 §6 delegation mediation"
	gTxn        = "TOOL-01 §6 transactional safety"
	gReplay     = "TOOL-01 §6 replay safety"
)

const (
	cNoBypass   = "seed 003 TOOL-01 §6 No bypass"
	cAudit      = "seed 003 TOOL-01 §6 Auditability"
	cPolicy     = "seed 003 TOOL-01 §6 Policy mediation"
	cDelegation = "seed 003 TOOL-01 §6 Delegation mediation"
	cTxn        = "seed 003 TOOL-01 §6 Transactional safety; §2.1"
	cReplay     = "seed 003 TOOL-01 §6 Replay safety; §2.1 replay rules"
)

func mk(id, group, clause, title string, fn func(*T)) Case {
	return Case{ID: id, Group: group, Clause: clause, Title: title, run: fn}
}

// writeRefused makes a write with tok (edited by edit) that must be refused
// with one of classes, and checks the file was not created.
func writeRefused(t *T, tok *Token, edit func(map[string]any), classes ...string) *Resp {
	dir := t.Dir()
	path := dir + "/refused.txt"
	r := heldCall(t, tok, "fs.write", map[string]any{"path": path, "content": "must not exist"}, func(m map[string]any) {
		m["idempotency_key"] = t.Key("w")
		if edit != nil {
			edit(m)
		}
	})
	t.ExpectRefused(r, classes...)
	if _, ok := t.ReadFile(path); ok {
		t.Failf("the refused write created %s", path)
	}
	return r
}

func noBypassCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gNoBypass, cNoBypass, title, fn) }
	return []Case{
		c("TOOL01-INV-NOBYPASS-001", "a call without a capability token is refused (token_invalid, 401) and has no effect", func(t *T) {
			tok := t.Full("a")
			writeRefused(t, tok, func(m map[string]any) { delete(m, "capability_token"); delete(m, "capability_token_id") }, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-002", "a token with the right claims signed by a key the kernel does not trust is refused", func(t *T) {
			tok := signedByStranger(t.Full("a"), nil)
			writeRefused(t, tok, nil, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-003", "a token whose claims were altered after signing (wider tools) is refused", func(t *T) {
			narrow := t.Mint("narrow", TokenRequest{Tools: []string{"echo"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}})
			tok := withClaims(narrow, func(c map[string]any) {
				if cp, ok := c["cap"].(map[string]any); ok {
					cp["tools"] = []string{"*"}
				}
			})
			writeRefused(t, tok, nil, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-004", `an unsigned token ("alg":"none") is refused`, func(t *T) {
			writeRefused(t, unsigned(t.Full("a")), nil, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-005", "the admin credential is not a capability token: inside the envelope it is refused", func(t *T) {
			tok := t.Full("a")
			writeRefused(t, tok, func(m map[string]any) { m["capability_token"] = t.Admin() }, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-006", "the admin credential as a bearer header does not authorize a call (401 token_invalid)", func(t *T) {
			tok := t.Full("a")
			r := t.Post(t.env.envelope(tok, "echo", map[string]any{"text": "x"}, nil), "Authorization", "Bearer "+t.Admin())
			t.ExpectRefused(r, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-007", "capability_token_id must be the token's jti", func(t *T) {
			tok := t.Full("a")
			writeRefused(t, tok, func(m map[string]any) { m["capability_token_id"] = "not-" + tok.ID }, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-008", "agent_id must be the token's subject: one agent cannot use another's token", func(t *T) {
			tok := t.Full("a")
			writeRefused(t, tok, func(m map[string]any) { m["agent_id"] = t.env.agent("someone-else") }, "token_invalid")
		}),
		c("TOOL01-INV-NOBYPASS-009", "a revoked token is refused (token_revoked, 401) and its write has no effect", func(t *T) {
			tok := t.Mint("revoked", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}})
			t.ExpectOK(t.Call(tok, "echo", map[string]any{"text": "before"}, nil))
			if status, _ := t.Do("POST", "/v1/tokens/"+tok.ID+"/revoke", t.Admin(), []byte(`{"reason":"conformance"}`)); status != 200 {
				t.Failf("POST /v1/tokens/{jti}/revoke: %d", status)
			}
			writeRefused(t, tok, nil, "token_revoked")
		}),
		c("TOOL01-INV-NOBYPASS-010", "GET /v1/syscalls needs a capability token: none, garbage or the admin credential is 401", func(t *T) {
			for _, cred := range []string{"", "garbage.token.here", t.Admin()} {
				if status, _ := t.Get("/v1/syscalls", cred); status != 401 {
					t.Failf("GET /v1/syscalls with credential %q: %d, want 401", t.env.redact(cred), status)
				}
			}
		}),
		c("TOOL01-INV-NOBYPASS-011", "a token that grants the tool but was minted for no workspace cannot touch files (scope_denied)", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/secret.txt", "s3cret")
			tok := t.Mint("nofs", TokenRequest{Tools: []string{"fs.*"}})
			r := t.Call(tok, "fs.read", map[string]any{"path": t.Abs(dir + "/secret.txt")}, nil)
			t.ExpectRefused(r, "scope_denied")
			if strings.Contains(string(r.Body), "s3cret") {
				t.Failf("the refused read returned the file's content")
			}
		}),
		c("TOOL01-INV-NOBYPASS-012", "kv keys outside a token's kv scopes are refused (scope_denied): another agent's key is neither read nor written", func(t *T) {
			t.NeedTool("kv.put", "the case writes a key with kv.put and reads it with kv.get")
			owner, other := t.Key("owner")+"/", t.Key("other")+"/"
			a := t.Mint("kv-owner", TokenRequest{Tools: []string{"kv.*"}, KV: []KVScope{{Keys: owner + "*", Mode: "rw"}}})
			b := t.Mint("kv-other", TokenRequest{Tools: []string{"kv.*"}, KV: []KVScope{{Keys: other + "*", Mode: "rw"}}})
			t.ExpectOK(t.Call(a, "kv.put", map[string]any{"key": owner + "k", "value": "s3cret"}, func(m map[string]any) { m["idempotency_key"] = t.Key("a") }))
			r := t.Call(b, "kv.get", map[string]any{"key": owner + "k"}, nil)
			t.ExpectRefused(r, "scope_denied")
			if strings.Contains(string(r.Body), "s3cret") {
				t.Failf("the refused read returned the value")
			}
			t.ExpectRefused(t.Call(b, "kv.put", map[string]any{"key": owner + "k", "value": 0}, func(m map[string]any) { m["idempotency_key"] = t.Key("b") }), "scope_denied")
			t.ExpectOK(t.Call(a, "kv.get", map[string]any{"key": owner + "k"}, nil))
		}),
	}
}

func auditCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gAudit, cAudit, title, fn) }
	return []Case{
		c("TOOL01-INV-AUDIT-001", "an allowed call leaves an audit record: its verified receipt names an audit entry of the same operation", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "audited"}, nil)
			t.ExpectOK(r)
			_, body := t.Audit(r)
			if str(body["status"]) != "" && str(body["status"]) != "ok" {
				t.Failf("audit record status %q for an ok call", str(body["status"]))
			}
		}),
		c("TOOL01-INV-AUDIT-002", "a call refused for permission leaves an audit record naming the refusal", func(t *T) {
			tok := t.Mint("echo-only", TokenRequest{Tools: []string{"echo"}})
			r := t.Call(tok, "fs.read", map[string]any{"path": "x"}, nil)
			t.ExpectClass(r, "permission_denied")
			_, body := t.Audit(r)
			if cl := str(body["error_class"]); cl != "" && cl != "permission_denied" {
				t.Failf("audit record error_class %q", cl)
			}
		}),
		c("TOOL01-INV-AUDIT-003", "a body that is not JSON at all still gets a result envelope with a receipt and an audit record", func(t *T) {
			r := t.Post([]byte("\x00\xff this is not an envelope"))
			t.ExpectClass(r, "invalid_args")
			_, body := t.Audit(r)
			if got := str(body["result_hash"]); got != r.R.ResultHash {
				t.Failf("audit record result_hash %s ≠ result's %s", got, r.R.ResultHash)
			}
		}),
		c("TOOL01-INV-AUDIT-004", "a body over the envelope limit is refused (413 invalid_args) and still audited", func(t *T) {
			body := `{"tool_id":"echo","args":{"text":"` + strings.Repeat("x", 2<<20) + `"}}`
			r := t.Post([]byte(body))
			if r.Status != 413 || r.Class() != "invalid_args" {
				t.Failf("got %d %q, want 413 invalid_args", r.Status, r.Class())
			}
			t.CheckEnvelope(r)
			t.Audit(r)
		}),
		c("TOOL01-INV-AUDIT-005", "one call leaves exactly one audit record (its receipt) and at most one receipt entry (older kernels)", func(t *T) {
			from := t.Head()
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "once"}, nil)
			t.ExpectOK(r)
			audits, rcpts := t.AuditRecords(from, r.R.OperationID)
			if len(audits) != 1 {
				t.Failf("%d audit records of operation %s, want 1", len(audits), r.R.OperationID)
			}
			if len(rcpts) > 1 {
				t.Failf("%d receipt entries of operation %s, want at most 1", len(rcpts), r.R.OperationID)
			}
		}),
		c("TOOL01-INV-AUDIT-006", "the audit record agrees with the result envelope (tool, agent, operation, result hash, mode, risk, outcome, delta, error class)", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/f.txt", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectOK(r)
			_, body := t.Audit(r)
			got := []string{str(body["tool_id"]), str(body["agent_id"]), str(body["operation_id"]), str(body["result_hash"]), str(body["autonomy_mode"]), str(body["tx_outcome"]), str(body["commit_delta_id"])}
			want := []string{r.R.ToolID, r.R.AgentID, r.R.OperationID, r.R.ResultHash, r.R.AutonomyMode, r.R.TxOutcome, r.R.CommitDeltaID}
			if !slices.Equal(got, want) {
				t.Failf("audit record %v, result %v", got, want)
			}
			var risk *float64
			json.Unmarshal(body["risk_score"], &risk)
			if risk == nil || *risk != *r.R.RiskScore {
				t.Failf("audit record risk_score differs from the result's %v", *r.R.RiskScore)
			}
		}),
		c("TOOL01-INV-AUDIT-007", "the result's state_snapshot_id names a ledger entry at or after the call's audit record, with that entry's hash", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "snap"}, nil)
			t.ExpectOK(r)
			audit, _ := t.Audit(r)
			seq, hash, ok := seqOf(r.R.StateSnapshotID)
			if !ok {
				t.Failf("state_snapshot_id %q is not <seq>:<hash>", r.R.StateSnapshotID)
			}
			if seq < audit.Seq {
				t.Failf("state_snapshot_id seq %d is before the audit record %d", seq, audit.Seq)
			}
			if e := t.Entry(seq); e.Hash != hash {
				t.Failf("state_snapshot_id hash %s, entry %d has %s", hash, seq, e.Hash)
			}
		}),
		c("TOOL01-INV-AUDIT-008", "the entries a call appended chain to their predecessors and their hashes recompute", func(t *T) {
			from := t.Head()
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "chain"}, nil)
			t.ExpectOK(r)
			start := from
			if start > 0 {
				start--
			}
			es := t.Entries(start, 1000)
			for i, e := range es {
				if err := checkEntryHash(e); err != nil {
					t.Failf("entry %d: %v", e.Seq, err)
				}
				if i > 0 && e.PrevHash != es[i-1].Hash {
					t.Failf("entry %d prev_hash %s ≠ entry %d's hash %s", e.Seq, e.PrevHash, es[i-1].Seq, es[i-1].Hash)
				}
			}
			if len(es) < 2 {
				t.Failf("the ledger did not grow with the call (%d entries from %d)", len(es), start)
			}
		}),
		c("TOOL01-INV-AUDIT-009", "a call refused for its token (forged) is audited with the tool it named and the agent it claimed, as a claim (claimed_agent_id), attributed to no agent", func(t *T) {
			tok := signedByStranger(t.Full("a"), nil)
			r := t.Call(tok, "echo", map[string]any{"text": "x"}, nil)
			t.ExpectClass(r, "token_invalid")
			_, body := t.Audit(r)
			if str(body["claimed_agent_id"]) != tok.AgentID || str(body["agent_id"]) != "" || str(body["tool_id"]) != "echo" {
				t.Failf("audit record names agent %q, claimed agent %q, tool %q", str(body["agent_id"]), str(body["claimed_agent_id"]), str(body["tool_id"]))
			}
		}),
		c("TOOL01-INV-AUDIT-010", "result_hash recomputes from the result (blake3 of RFC 8785) and the record's args_hash from the args sent", func(t *T) {
			args := map[string]any{"text": "hash me é \u2028", "z": nil}
			delete(args, "z")
			r := t.Call(t.Full("a"), "echo", args, nil)
			t.ExpectOK(r)
			if h, err := resultHash(r.R); err != nil || h != r.R.ResultHash {
				t.Failf("result_hash %s, recomputed %s (%v)", r.R.ResultHash, h, err)
			}
			_, body := t.Audit(r)
			if got := str(body["args_hash"]); got != argsHash(args) {
				t.Failf("audit args_hash %s, recomputed %s", got, argsHash(args))
			}
		}),
	}
}

func policyCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gPolicy, cPolicy, title, fn) }
	return []Case{
		c("TOOL01-INV-POLICY-001", "a policy_hash other than the active policy's fails closed (policy_mismatch, 409), no effect", func(t *T) {
			writeRefused(t, t.Full("a"), func(m map[string]any) { m["policy_hash"] = "blake3:" + strings.Repeat("0", 64) }, "policy_mismatch")
		}),
		c("TOOL01-INV-POLICY-002", "a call without policy_hash fails closed (policy_mismatch), no effect", func(t *T) {
			writeRefused(t, t.Full("a"), func(m map[string]any) { delete(m, "policy_hash") }, "policy_mismatch")
		}),
		c("TOOL01-INV-POLICY-003", "the token grants fs.* on the root, yet policy refuses reading a secret (.env): policy_denied, no content", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/.env", "API_KEY=conformance-secret")
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/.env"}, nil)
			t.ExpectRefused(r, "policy_denied")
			if strings.Contains(string(r.Body), "conformance-secret") {
				t.Failf("the refused read returned the secret")
			}
		}),
		c("TOOL01-INV-POLICY-004", "policy refuses writing a secret path (id_rsa): policy_denied, the file is not created", func(t *T) {
			dir := t.Dir()
			r := t.Call(t.Full("a"), "fs.write", map[string]any{"path": dir + "/id_rsa", "content": "x"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") })
			t.ExpectRefused(r, "policy_denied")
			if _, ok := t.ReadFile(dir + "/id_rsa"); ok {
				t.Failf("the refused write created id_rsa")
			}
		}),
		c("TOOL01-INV-POLICY-005", "an allowed call's audit record names the active policy (GET /v1/policy) and the decision's risk basis", func(t *T) {
			r := t.Call(t.Full("a"), "echo", map[string]any{"text": "p"}, nil)
			t.ExpectOK(r)
			_, body := t.Audit(r)
			if got := str(body["policy_hash"]); got != t.PolicyHash() {
				t.Failf("audit policy_hash %q, active %q", got, t.PolicyHash())
			}
			var basis []string
			if err := json.Unmarshal(body["risk_basis"], &basis); err != nil || !slices.Equal(basis, r.R.RiskBasis) {
				t.Failf("audit risk_basis %s, result's %v", body["risk_basis"], r.R.RiskBasis)
			}
		}),
		c("TOOL01-INV-POLICY-006", "a caller's own low risk estimate does not lower the kernel's risk score", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			plain := t.Call(tok, "fs.write", map[string]any{"path": dir + "/a.txt", "content": "a"}, func(m map[string]any) { m["idempotency_key"] = t.Key("a") })
			t.ExpectOK(plain)
			low := t.Call(tok, "fs.write", map[string]any{"path": dir + "/b.txt", "content": "b"}, func(m map[string]any) {
				m["idempotency_key"] = t.Key("b")
				m["risk_score"] = 0
				m["risk_basis"] = []string{"caller says this is harmless"}
			})
			t.ExpectOK(low)
			if *low.R.RiskScore < *plain.R.RiskScore {
				t.Failf("risk_score %v with the caller's 0, %v without", *low.R.RiskScore, *plain.R.RiskScore)
			}
			if slices.Equal(low.R.RiskBasis, []string{"caller says this is harmless"}) {
				t.Failf("the result's risk_basis is the caller's")
			}
		}),
		c("TOOL01-INV-POLICY-007", "a call the policy decided no_go never executes, even when the caller asks for autopilot", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/.aws/credentials", "aws-secret")
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/.aws/credentials"}, func(m map[string]any) { m["autonomy_mode"] = "autopilot" })
			t.ExpectRefused(r, "policy_denied")
			if r.R.AutonomyMode != "no_go" {
				t.Failf("autonomy_mode %q, want no_go", r.R.AutonomyMode)
			}
		}),
		c("TOOL01-INV-POLICY-008", "every executed call reports a mode other than no_go, with a risk score and basis from the policy", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/r.txt", "r")
			tok := t.Full("a")
			for _, r := range []*Resp{
				t.Call(tok, "echo", map[string]any{"text": "x"}, nil),
				t.Call(tok, "fs.read", map[string]any{"path": dir + "/r.txt"}, nil),
				t.Call(tok, "fs.write", map[string]any{"path": dir + "/w.txt", "content": "w"}, func(m map[string]any) { m["idempotency_key"] = t.Key("w") }),
			} {
				t.ExpectOK(r)
				if r.R.AutonomyMode == "no_go" || r.R.RiskBasis == nil {
					t.Failf("%s executed with mode %q basis %v", r.R.ToolID, r.R.AutonomyMode, r.R.RiskBasis)
				}
			}
		}),
	}
}

func delegationCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gDelegation, cDelegation, title, fn) }
	gated := []string{"approval_denied", "approval_timeout", "policy_denied"}
	return []Case{
		c("TOOL01-INV-DELEGATION-001", "a token whose autonomy ceiling is soft_gate cannot run a write unattended: refused before execution", func(t *T) {
			tok := t.Mint("ceiling", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, Autonomy: "soft_gate"})
			r := writeRefused(t, tok, nil, gated...)
			if r.R.AutonomyMode == "autopilot" {
				t.Failf("autonomy_mode autopilot under a soft_gate ceiling")
			}
		}),
		c("TOOL01-INV-DELEGATION-002", "a caller asking for no_go gets policy_denied and no effect", func(t *T) {
			writeRefused(t, t.Full("a"), func(m map[string]any) { m["autonomy_mode"] = "no_go" }, "policy_denied")
		}),
		c("TOOL01-INV-DELEGATION-003", "a caller asking for escalated is held for an approval: refused here, mode escalated, no effect", func(t *T) {
			r := writeRefused(t, t.Full("a"), func(m map[string]any) { m["autonomy_mode"] = "escalated" }, gated...)
			if r.R.AutonomyMode != "escalated" && r.R.AutonomyMode != "no_go" {
				t.Failf("autonomy_mode %q, want escalated (the stricter of decided and requested)", r.R.AutonomyMode)
			}
		}),
		c("TOOL01-INV-DELEGATION-004", "requesting autopilot does not loosen a soft_gate decision (default policy: writing Makefile)", func(t *T) {
			t.NeedWorkspace()
			r := heldCall(t, t.Full("a"), "fs.write", map[string]any{"path": "Makefile", "content": "all:\n"}, func(m map[string]any) {
				m["idempotency_key"] = t.Key("w")
				m["autonomy_mode"] = "autopilot"
			})
			t.ExpectRefused(r, gated...)
			if r.R.AutonomyMode == "autopilot" {
				t.Failf("autonomy_mode autopilot for a gated write")
			}
			if _, ok := t.ReadFile("Makefile"); ok {
				t.Failf("the gated write created Makefile")
			}
		}),
		c("TOOL01-INV-DELEGATION-005", "an escalated decision (default policy: deleting a directory) is refused without an approval; the directory stays", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/tree/leaf.txt", "leaf")
			r := heldCall(t, t.Full("a"), "fs.delete", map[string]any{"path": dir + "/tree"}, func(m map[string]any) { m["idempotency_key"] = t.Key("d") })
			t.ExpectRefused(r, gated...)
			if r.R.AutonomyMode != "escalated" && r.R.AutonomyMode != "no_go" {
				t.Failf("autonomy_mode %q, want escalated", r.R.AutonomyMode)
			}
			if _, ok := t.ReadFile(dir + "/tree/leaf.txt"); !ok {
				t.Failf("the refused delete removed the directory")
			}
		}),
		c("TOOL01-INV-DELEGATION-006", "a token whose ceiling is no_go can run nothing, not even echo", func(t *T) {
			tok := t.Mint("nogo", TokenRequest{Tools: []string{"*"}, Autonomy: "no_go"})
			r := t.Call(tok, "echo", map[string]any{"text": "x"}, nil)
			t.ExpectRefused(r, "policy_denied")
			if len(r.R.Result) > 0 && string(r.R.Result) != "null" {
				t.Failf("a refused call returned a result %s", r.R.Result)
			}
		}),
		c("TOOL01-INV-DELEGATION-007", "an unknown autonomy_mode is refused as invalid_args", func(t *T) {
			writeRefused(t, t.Full("a"), func(m map[string]any) { m["autonomy_mode"] = "yolo" }, "invalid_args")
		}),
		c("TOOL01-INV-DELEGATION-008", "a caller risk_score outside [0,1] is refused as invalid_args", func(t *T) {
			for _, v := range []float64{1.5, -0.1} {
				r := t.Call(t.Full("a"), "echo", map[string]any{"text": "x"}, func(m map[string]any) { m["risk_score"] = v })
				t.ExpectRefused(r, "invalid_args")
			}
		}),
		c("TOOL01-INV-DELEGATION-009", "a read under a soft_gate ceiling is held too: refused, and the result carries no file content", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/private.txt", "held-back-content")
			tok := t.Mint("ceiling-r", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "r"}}, Autonomy: "soft_gate"})
			r := heldCall(t, tok, "fs.read", map[string]any{"path": dir + "/private.txt"}, nil)
			t.ExpectRefused(r, gated...)
			if strings.Contains(string(r.Body), "held-back-content") {
				t.Failf("the gated read returned the content")
			}
		}),
	}
}

func txnCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gTxn, cTxn, title, fn) }
	write := func(t *T, tok *Token, path, content, key string, edit func(map[string]any)) *Resp {
		return t.Call(tok, "fs.write", map[string]any{"path": path, "content": content}, func(m map[string]any) {
			m["idempotency_key"] = t.Key(key)
			if edit != nil {
				edit(m)
			}
		})
	}
	return []Case{
		c("TOOL01-INV-TXN-001", "a write commits: tx_outcome committed, a commit_delta_id, the file holds the content and reads back", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			r := write(t, tok, dir+"/c.txt", "committed content", "w", nil)
			t.ExpectOK(r)
			if r.R.TxOutcome != "committed" {
				t.Failf("tx_outcome %q", r.R.TxOutcome)
			}
			if got, _ := t.ReadFile(dir + "/c.txt"); got != "committed content" {
				t.Failf("file holds %q", got)
			}
			rd := t.Call(tok, "fs.read", map[string]any{"path": dir + "/c.txt"}, nil)
			t.ExpectOK(rd)
			if !strings.Contains(string(rd.R.Result), "committed content") {
				t.Failf("fs.read returned %s", rd.R.Result)
			}
		}),
		c("TOOL01-INV-TXN-002", "an fs precondition whose hash no longer holds fails (precondition_failed, 409); the file is unchanged", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/p.txt", "original")
			r := write(t, t.Full("a"), dir+"/p.txt", "new", "w", func(m map[string]any) {
				m["precondition_refs"] = []any{map[string]any{"ref": "fs:" + dir + "/p.txt", "hash": "blake3:" + strings.Repeat("ab", 32)}}
			})
			t.ExpectRefused(r, "precondition_failed")
			if got, _ := t.ReadFile(dir + "/p.txt"); got != "original" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-TXN-003", "an absent precondition on an existing file fails; the file is unchanged", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/p.txt", "original")
			r := write(t, t.Full("a"), dir+"/p.txt", "new", "w", func(m map[string]any) {
				m["precondition_refs"] = []any{map[string]any{"ref": "fs:" + dir + "/p.txt", "absent": true}}
			})
			t.ExpectRefused(r, "precondition_failed")
			if got, _ := t.ReadFile(dir + "/p.txt"); got != "original" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-TXN-004", "an fs precondition with the file's current hash holds: the write commits", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/p.txt", "original")
			r := write(t, t.Full("a"), dir+"/p.txt", "new", "w", func(m map[string]any) {
				m["precondition_refs"] = []any{map[string]any{"ref": "fs:" + dir + "/p.txt", "hash": blake3Of("original")}}
			})
			t.ExpectOK(r)
			if got, _ := t.ReadFile(dir + "/p.txt"); got != "new" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-TXN-005", "kv compare-and-set: a stale version precondition fails and the value stays", func(t *T) {
			t.NeedTool("kv.put", "the key-value compare-and-set case uses kv.put and kv.get")
			tok := t.Full("a")
			key := t.Key("kv")
			first := t.Call(tok, "kv.put", map[string]any{"key": key, "value": "v1"}, func(m map[string]any) { m["idempotency_key"] = t.Key("1") })
			t.ExpectOK(first)
			stale := t.Call(tok, "kv.put", map[string]any{"key": key, "value": "v2"}, func(m map[string]any) {
				m["idempotency_key"] = t.Key("2")
				m["precondition_refs"] = []any{map[string]any{"ref": "kv:" + key, "version": 0}}
			})
			t.ExpectRefused(stale, "precondition_failed")
			get := t.Call(tok, "kv.get", map[string]any{"key": key}, nil)
			t.ExpectOK(get)
			if !strings.Contains(string(get.R.Result), `"v1"`) {
				t.Failf("kv.get after the failed put: %s", get.R.Result)
			}
		}),
		c("TOOL01-INV-TXN-006", "a ledger:head precondition naming an old head fails; the file is not created", func(t *T) {
			dir := t.Dir()
			r := write(t, t.Full("a"), dir+"/h.txt", "x", "w", func(m map[string]any) {
				m["precondition_refs"] = []any{map[string]any{"ref": "ledger:head", "seq": 0}}
			})
			t.ExpectRefused(r, "precondition_failed")
			if _, ok := t.ReadFile(dir + "/h.txt"); ok {
				t.Failf("the refused write created the file")
			}
		}),
		c("TOOL01-INV-TXN-007", "a write over the disk-write budget rolls back (budget_exceeded, 429): the file keeps its old content", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/b.txt", "old")
			tok := t.Mint("budget", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}, Budgets: map[string]int64{"disk_write_bytes": 8}})
			r := write(t, tok, dir+"/b.txt", strings.Repeat("x", 64), "w", nil)
			t.ExpectRefused(r, "budget_exceeded")
			if got, _ := t.ReadFile(dir + "/b.txt"); got != "old" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-TXN-008", "a write that fails while executing (no parent directory) leaves nothing behind", func(t *T) {
			dir := t.Dir()
			r := write(t, t.Full("a"), dir+"/missing/f.txt", "x", "w", nil)
			if r.R.Status != "error" {
				t.Failf("a write under a missing directory succeeded")
			}
			t.CheckEnvelope(r)
			if r.R.TxOutcome == "committed" {
				t.Failf("committed")
			}
			assertOnly(t, dir)
		}),
		c("TOOL01-INV-TXN-009", "concurrent writes to one file: every answer is committed and the file is exactly one of the contents, whole", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			contents := map[string]bool{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			var bad []string
			for i := range 8 {
				content := strings.Repeat(fmt.Sprintf("writer-%d|", i), 400)
				contents[content] = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, res, err := t.env.rawCall(t.ctx, t.env.envelope(tok, "fs.write", map[string]any{"path": dir + "/same.txt", "content": content}, func(m map[string]any) { m["idempotency_key"] = t.Key(fmt.Sprint(i)) }))
					mu.Lock()
					defer mu.Unlock()
					if err != nil || res.TxOutcome != "committed" {
						bad = append(bad, fmt.Sprintf("writer %d: %v %s", i, err, res.errClass()))
					}
				}()
			}
			wg.Wait()
			if len(bad) > 0 {
				t.Failf("%s", strings.Join(bad, "; "))
			}
			got, _ := t.ReadFile(dir + "/same.txt")
			if !contents[got] {
				t.Failf("the file holds a mix of writes (%d bytes)", len(got))
			}
			assertOnly(t, dir, "same.txt")
		}),
		c("TOOL01-INV-TXN-010", "a read is no_op: no commit_delta_id", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/r.txt", "r")
			r := t.Call(t.Full("a"), "fs.read", map[string]any{"path": dir + "/r.txt"}, nil)
			t.ExpectOK(r)
			if r.R.TxOutcome != "no_op" || r.R.CommitDeltaID != "" {
				t.Failf("read: tx_outcome %q commit_delta_id %q", r.R.TxOutcome, r.R.CommitDeltaID)
			}
		}),
		c("TOOL01-INV-TXN-011", "a delete commits and the file is gone; deleting it again fails without committing", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/d.txt", "d")
			tok := t.Full("a")
			r := t.Call(tok, "fs.delete", map[string]any{"path": dir + "/d.txt"}, func(m map[string]any) { m["idempotency_key"] = t.Key("1") })
			t.ExpectOK(r)
			if r.R.TxOutcome != "committed" {
				t.Failf("delete: tx_outcome %q", r.R.TxOutcome)
			}
			if _, ok := t.ReadFile(dir + "/d.txt"); ok {
				t.Failf("the file is still there")
			}
			again := t.Call(tok, "fs.delete", map[string]any{"path": dir + "/d.txt"}, func(m map[string]any) { m["idempotency_key"] = t.Key("2") })
			if again.R.Status != "error" || again.R.TxOutcome == "committed" {
				t.Failf("deleting a missing file: %s %s", again.R.Status, again.R.TxOutcome)
			}
			t.CheckEnvelope(again)
		}),
		c("TOOL01-INV-TXN-012", "a refused write (precondition) leaves the directory exactly as it was: no staging files", func(t *T) {
			dir := t.Dir()
			t.WriteFile(dir+"/keep.txt", "keep")
			r := write(t, t.Full("a"), dir+"/new.txt", strings.Repeat("n", 1000), "w", func(m map[string]any) {
				m["precondition_refs"] = []any{map[string]any{"ref": "fs:" + dir + "/keep.txt", "absent": true}}
			})
			t.ExpectRefused(r, "precondition_failed")
			assertOnly(t, dir, "keep.txt")
		}),
	}
}

func replayCases() []Case {
	c := func(id, title string, fn func(*T)) Case { return mk(id, gReplay, cReplay, title, fn) }
	return []Case{
		c("TOOL01-INV-REPLAY-001", "a mutating call without idempotency_key is refused (idempotency_key_required, 400), no effect", func(t *T) {
			writeRefused(t, t.Full("a"), func(m map[string]any) { delete(m, "idempotency_key") }, "idempotency_key_required")
		}),
		c("TOOL01-INV-REPLAY-002", "a repeat (same tool, key, args, token) returns the original outcome with replayed:true and no second effect", func(t *T) {
			t.NeedTool("kv.put", "the effect is counted by the key's version")
			tok := t.Full("a")
			args := map[string]any{"key": t.Key("kv"), "value": 1}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			first := t.Call(tok, "kv.put", args, edit)
			t.ExpectOK(first)
			second := t.Call(tok, "kv.put", args, edit)
			t.ExpectOK(second)
			if second.R.Replayed == nil || !*second.R.Replayed {
				t.Failf("the repeat is not marked replayed")
			}
			if first.R.Replayed != nil && *first.R.Replayed {
				t.Failf("the first call is marked replayed")
			}
			if second.R.OperationID != first.R.OperationID || second.R.ResultHash != first.R.ResultHash || second.R.CommitDeltaID != first.R.CommitDeltaID {
				t.Failf("the repeat's operation/result/delta differ from the original's")
			}
			get := t.Call(tok, "kv.get", map[string]any{"key": args["key"]}, nil)
			t.ExpectOK(get)
			var g struct {
				Version int `json:"version"`
			}
			json.Unmarshal(get.R.Result, &g)
			if g.Version != 1 {
				t.Failf("the key's version is %d after one put and its repeat, want 1", g.Version)
			}
		}),
		c("TOOL01-INV-REPLAY-003", "a repeat after the file changed on disk is replayed, not re-executed: the file keeps the later content", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			args := map[string]any{"path": dir + "/r.txt", "content": "from the call"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			t.ExpectOK(t.Call(tok, "fs.write", args, edit))
			t.WriteFile(dir+"/r.txt", "changed since")
			again := t.Call(tok, "fs.write", args, edit)
			t.ExpectOK(again)
			if again.R.Replayed == nil || !*again.R.Replayed {
				t.Failf("the repeat is not marked replayed")
			}
			if got, _ := t.ReadFile(dir + "/r.txt"); got != "changed since" {
				t.Failf("the repeat wrote again: the file holds %q", got)
			}
		}),
		c("TOOL01-INV-REPLAY-004", "the same key with other args is refused (idempotency_conflict, 422) and has no effect", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			t.ExpectOK(t.Call(tok, "fs.write", map[string]any{"path": dir + "/c.txt", "content": "one"}, func(m map[string]any) { m["idempotency_key"] = t.Key("k") }))
			r := t.Call(tok, "fs.write", map[string]any{"path": dir + "/c.txt", "content": "two"}, func(m map[string]any) { m["idempotency_key"] = t.Key("k") })
			t.ExpectRefused(r, "idempotency_conflict")
			t.Audit(r) // a stale replay attempt remains auditable
			if got, _ := t.ReadFile(dir + "/c.txt"); got != "one" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-REPLAY-005", "the same key on another tool is refused (idempotency_conflict)", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			t.ExpectOK(t.Call(tok, "fs.write", map[string]any{"path": dir + "/c.txt", "content": "one"}, func(m map[string]any) { m["idempotency_key"] = t.Key("k") }))
			r := t.Call(tok, "fs.delete", map[string]any{"path": dir + "/c.txt"}, func(m map[string]any) { m["idempotency_key"] = t.Key("k") })
			t.ExpectRefused(r, "idempotency_conflict")
			if _, ok := t.ReadFile(dir + "/c.txt"); !ok {
				t.Failf("the refused delete removed the file")
			}
		}),
		c("TOOL01-INV-REPLAY-006", "eight concurrent identical calls: one effect; every answer is the original, a replay of it, or idempotency_in_flight (409)", func(t *T) {
			t.NeedTool("kv.put", "the effect is counted by the key's version")
			tok := t.Full("a")
			args := map[string]any{"key": t.Key("kv"), "value": "once"}
			body := t.env.envelope(tok, "kv.put", args, func(m map[string]any) { m["idempotency_key"] = t.Key("k") })
			var mu sync.Mutex
			var wg sync.WaitGroup
			ops := map[string]int{}
			var bad []string
			inFlight := 0
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					status, res, err := t.env.rawCall(t.ctx, body)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						bad = append(bad, err.Error())
					case status == 200 && res.TxOutcome == "committed":
						ops[res.OperationID]++
					case status == 409 && res.errClass() == "idempotency_in_flight":
						inFlight++
					default:
						bad = append(bad, fmt.Sprintf("%d %s", status, res.errClass()))
					}
				}()
			}
			wg.Wait()
			if len(bad) > 0 || len(ops) != 1 {
				t.Failf("answers: %d committed operations %v, unexpected %v", len(ops), ops, bad)
			}
			t.Logf("%d answered idempotency_in_flight", inFlight)
			get := t.Call(tok, "kv.get", map[string]any{"key": args["key"]}, nil)
			var g struct {
				Version int `json:"version"`
			}
			json.Unmarshal(get.R.Result, &g)
			if g.Version != 1 {
				t.Failf("version %d after eight identical puts, want 1", g.Version)
			}
		}),
		c("TOOL01-INV-REPLAY-007", "a replay is itself audited: a new audit record of the same tool, agent and args, with the original's result_hash", func(t *T) {
			tok := t.Full("a")
			args := map[string]any{"text": "replayed"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			first := t.Call(tok, "echo", args, edit)
			t.ExpectOK(first)
			firstAudit, _ := t.Audit(first)
			from := t.Head()
			again := t.Call(tok, "echo", args, edit)
			t.ExpectOK(again)
			found := false
			for _, e := range t.Entries(from, 1000) {
				if e.Kind != "audit" || e.Seq == firstAudit.Seq {
					continue
				}
				b := t.OpenBody(e)
				if str(b["agent_id"]) == tok.AgentID && str(b["tool_id"]) == "echo" && str(b["args_hash"]) == argsHash(args) && str(b["result_hash"]) == first.R.ResultHash {
					found = true
				}
			}
			if !found {
				t.Failf("no audit record of the replay after seq %d", from)
			}
		}),
		c("TOOL01-INV-REPLAY-008", "a repeat under another token of the same agent fails closed (idempotency_conflict), no second effect", func(t *T) {
			dir := t.Dir()
			req := TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}}
			one := t.Mint("same-agent", req)
			two := t.Mint("same-agent", req)
			args := map[string]any{"path": dir + "/t.txt", "content": "first"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			t.ExpectOK(t.Call(one, "fs.write", args, edit))
			t.WriteFile(dir+"/t.txt", "changed")
			r := t.Call(two, "fs.write", args, edit)
			t.ExpectRefused(r, "idempotency_conflict")
			t.Audit(r)
			if got, _ := t.ReadFile(dir + "/t.txt"); got != "changed" {
				t.Failf("file holds %q", got)
			}
		}),
		c("TOOL01-INV-REPLAY-009", "a repeat with a revoked token is refused (token_revoked), not served the stored outcome", func(t *T) {
			dir := t.Dir()
			tok := t.Mint("revoke-replay", TokenRequest{Tools: []string{"*"}, FS: []FSRoot{{Path: t.env.ws, Mode: "rw"}}})
			args := map[string]any{"path": dir + "/x.txt", "content": "x"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			t.ExpectOK(t.Call(tok, "fs.write", args, edit))
			if status, _ := t.Do("POST", "/v1/tokens/"+tok.ID+"/revoke", t.Admin(), []byte(`{"reason":"conformance"}`)); status != 200 {
				t.Failf("revoke: %d", status)
			}
			r := t.Call(tok, "fs.write", args, edit)
			t.ExpectRefused(r, "token_revoked")
			t.Audit(r)
		}),
		c("TOOL01-INV-REPLAY-010", "an operation_id already used cannot be used again for another call; no effect", func(t *T) {
			dir := t.Dir()
			tok := t.Full("a")
			first := t.Call(tok, "echo", map[string]any{"text": "1"}, nil)
			t.ExpectOK(first)
			r := t.Call(tok, "fs.write", map[string]any{"path": dir + "/o.txt", "content": "x"}, func(m map[string]any) {
				m["idempotency_key"] = t.Key("k")
				m["operation_id"] = first.R.OperationID
			})
			t.ExpectRefused(r, "invalid_args", "idempotency_conflict")
			if _, ok := t.ReadFile(dir + "/o.txt"); ok {
				t.Failf("the refused call wrote")
			}
			// The refusal is audited, and its receipt agrees with its
			// envelope (its record's context may hold the id it named,
			// a note the envelope does not carry).
			t.Audit(r)
		}),
		c("TOOL01-INV-REPLAY-011", "another agent using the same key and args is not served the first agent's outcome", func(t *T) {
			t.NeedTool("kv.put", "each agent's put must get its own version")
			args := map[string]any{"key": t.Key("kv"), "value": "v"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			a := t.Call(t.Full("a"), "kv.put", args, edit)
			t.ExpectOK(a)
			b := t.Call(t.Full("b"), "kv.put", args, edit)
			if b.R.Status == "ok" && (b.R.OperationID == a.R.OperationID || (b.R.Replayed != nil && *b.R.Replayed)) {
				t.Failf("agent b got agent a's outcome (operation %s)", b.R.OperationID)
			}
			if b.R.AgentID != t.Full("b").AgentID {
				t.Failf("agent b's result names agent %q", b.R.AgentID)
			}
		}),
		c("TOOL01-INV-REPLAY-012", "the endpoint's replay proof (GET /v1/admin/replay/verify) finds no key committed twice after a call and its replay", func(t *T) {
			tok := t.Full("a")
			dir := t.Dir()
			args := map[string]any{"path": dir + "/p.txt", "content": "p"}
			edit := func(m map[string]any) { m["idempotency_key"] = t.Key("k") }
			t.ExpectOK(t.Call(tok, "fs.write", args, edit))
			t.ExpectOK(t.Call(tok, "fs.write", args, edit))
			var rep struct {
				Committed int               `json:"committed"`
				Replays   int               `json:"replays"`
				Problems  []json.RawMessage `json:"problems"`
			}
			t.GetJSON("/v1/admin/replay/verify", t.Admin(), &rep)
			if len(rep.Problems) > 0 || rep.Committed < 1 || rep.Replays < 1 {
				t.Failf("replay verification: %d committed, %d replays, problems %s", rep.Committed, rep.Replays, rep.Problems)
			}
			var hist []json.RawMessage
			t.GetJSON("/v1/admin/replay?key="+t.Key("k")+"&agent="+tok.AgentID, t.Admin(), &hist)
			if len(hist) == 0 {
				t.Failf("GET /v1/admin/replay lists nothing for the key")
			}
		}),
	}
}

// assertOnly fails unless dir (workspace-relative) holds exactly names.
func assertOnly(t *T, dir string, names ...string) {
	got := listDir(t, dir)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Failf("%s holds %v, want exactly %v (leftovers of a rolled-back call?)", dir, got, names)
	}
}
