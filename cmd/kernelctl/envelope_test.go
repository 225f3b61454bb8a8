package main

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// receipts verify on result envelopes from a real server: honest ones (an
// ok call, an error, a replay, a provenance) verify; an envelope that is
// not the call its receipt attests (every field its record attests
// changed: tool, agent, operation, seq, outcome, mode, risk, result,
// result_hash, risk_basis, provenance, …), one without its audit_salt,
// one whose record's context holds notes it does not carry, the replay of
// an erased call (said to be that call, its result erased) and one
// another reader would read differently (duplicate or case-variant names)
// fail. replayed, which no record attests, is said not to be.
func TestReceiptsVerifyEnvelope(t *testing.T) {
	sv := initServed(t)
	s := sv.server
	ws := filepath.Join(sv.dir, "ws")
	os.MkdirAll(ws, 0o755)
	tok := mintCLI(t, s, sv.admin, "--agent", "a1", "--tools", "echo,fs.*", "--fs", ws+":rw")
	dir := t.TempDir()
	post := func(name string, env []byte) string {
		t.Helper()
		st, b := s.do(http.MethodPost, "/v1/syscalls", "", env)
		if st == 0 || !strings.Contains(string(b), `"receipt":{`) {
			t.Fatalf("%s: %d %s", name, st, b)
		}
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, b, 0o600)
		return f
	}
	okFile := post("ok", envelopeWith(tok, s, "echo", map[string]any{"text": "hello"}, "", nil))
	errFile := post("err", envelopeWith(tok, s, "fs.read", map[string]any{"path": filepath.Join(ws, "missing.txt")}, "", nil))
	write := envelopeWith(tok, s, "fs.write", map[string]any{"path": filepath.Join(ws, "a.txt"), "content": "x"}, "k1", nil)
	writeFile := post("write", write)
	replayFile := post("replay", write)
	provFile := post("prov", envelopeWith(tok, s, "echo", map[string]any{"text": "cited"}, "", map[string]any{"source": "user", "ids": []int{1, 2}}))
	for f, want := range map[string]string{errFile: `"status":"error"`, replayFile: `"replayed":true`} {
		if b, _ := os.ReadFile(f); !strings.Contains(string(b), want) {
			t.Fatalf("%s has no %s:\n%s", f, want, b)
		}
	}
	_, jwks := s.get("/.well-known/jwks.json", "")
	jwksFile := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwksFile, jwks, 0o600)
	argsFile := filepath.Join(dir, "args.json")
	os.WriteFile(argsFile, []byte(`{"text":"hello"}`), 0o600)

	okRaw, _ := os.ReadFile(okFile)
	var members map[string]json.RawMessage
	if err := json.Unmarshal(okRaw, &members); err != nil {
		t.Fatal(err)
	}
	// editFile writes the envelope in file with members set ("": removed).
	editFile := func(file, name string, set map[string]string) string {
		raw, _ := os.ReadFile(file)
		m := map[string]json.RawMessage{}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		for k, v := range set {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = json.RawMessage(v)
			}
		}
		b, _ := json.Marshal(m)
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, b, 0o600)
		return f
	}
	// edit writes the ok envelope with members set.
	edit := func(name string, set map[string]string) string { return editFile(okFile, name, set) }
	// prefix writes the ok envelope with text inserted as its first members.
	prefix := func(name, text string) string {
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, []byte("{"+text+","+strings.TrimPrefix(strings.TrimSpace(string(okRaw)), "{")), 0o600)
		return f
	}
	bare := filepath.Join(dir, "bare.json")
	os.WriteFile(bare, members["receipt"], 0o600)
	var rid string
	json.Unmarshal(members["receipt_id"], &rid)
	showOut, _, _ := run(t, "receipts", "show", rid, "--server", s.url, "--admin-token", sv.adminFile, "--json")
	show := filepath.Join(dir, "show.json")
	os.WriteFile(show, []byte(showOut), 0o600)
	forged := `{"text":"FORGED"}`
	// A call whose record's context holds notes the envelope does not
	// carry: an envelope naming another call's operation id is refused
	// under an id of its own, the id it named kept in a note.
	var okOp string
	json.Unmarshal(members["operation_id"], &okOp)
	var stolen map[string]any
	json.Unmarshal(envelopeWith(tok, s, "echo", map[string]any{"text": "again"}, "", nil), &stolen)
	stolen["operation_id"] = okOp
	stolenEnv, _ := json.Marshal(stolen)
	notesFile := post("notes", stolenEnv)
	// The replay of an erased call: the same call, its result erased.
	var writeOp string
	wb, _ := os.ReadFile(writeFile)
	var wm map[string]json.RawMessage
	json.Unmarshal(wb, &wm)
	json.Unmarshal(wm["operation_id"], &writeOp)
	if out, _, code := run(t, "ledger", "erase", "--operation", writeOp, "--reason", "dsr", "--server", s.url, "--admin-token", sv.adminFile); code != 0 {
		t.Fatalf("ledger erase: exit %d:\n%s", code, out)
	}
	erasedFile := post("erased-replay", write)
	if b, _ := os.ReadFile(erasedFile); strings.Contains(string(b), `"audit_salt"`) || !strings.Contains(string(b), `"replayed":true`) {
		t.Fatalf("the replay of an erased call kept its salt, or is no replay:\n%s", b)
	}

	for _, c := range []struct {
		name, file string
		args       bool
		code       int
		want       string
	}{
		{"honest ok", okFile, false, 0, "commitments:  ok"},
		{"honest ok with its args", okFile, true, 0, "commits to this result and these args"},
		{"honest error", errFile, false, 0, "envelope:     ok"},
		{"honest replay", replayFile, false, 0, "commitments:  ok"},
		{"bare receipt", bare, false, 0, "inclusion:    ok"},
		{"receipts show output", show, false, 1, "receipts bundle ID"},
		{"no audit_salt", edit("nosalt", map[string]string{"audit_salt": ""}), false, 1, "no audit_salt"},
		{"forged result, no audit_salt", edit("forged-nosalt", map[string]string{"audit_salt": "", "result": forged}), false, 1, "no audit_salt"},
		{"forged result", edit("forged", map[string]string{"result": forged}), false, 1, "does not commit to this result"},
		{"another tool", edit("tool", map[string]string{"tool_id": `"fs.write"`}), false, 1, `tool_id is "fs.write"`},
		{"another agent", edit("agent", map[string]string{"agent_id": `"bob"`}), false, 1, `agent_id is "bob"`},
		{"another operation", edit("op", map[string]string{"operation_id": `"01a21a88-0000-7000-8000-000000000000"`}), false, 1, "operation_id is"},
		{"another seq", edit("seq", map[string]string{"ledger_seq": "999"}), false, 1, `ledger_seq is "999"`},
		{"another receipt id", edit("rid", map[string]string{"receipt_id": `"r999-0000000000000000"`}), false, 1, "receipt_id is"},
		{"another outcome", edit("outcome", map[string]string{"tx_outcome": `"committed"`}), false, 1, `tx_outcome is "committed"`},
		{"an error claimed", edit("status", map[string]string{"status": `"error"`}), false, 1, `status is "error"`},
		{"an error with a forged result", editFile(errFile, "err-result", map[string]string{"result": forged}), false, 1, "both an error and a result"},
		{"another result_hash", edit("hash", map[string]string{"result_hash": `"blake3:1111111111111111111111111111111111111111111111111111111111111111"`}), false, 1, "result_hash is"},
		// Every field the record attests, changed (docs/formats.md,
		// verification step 3 and 4): directly, or through its
		// commitment opened with the envelope's audit_salt.
		{"another task_class", edit("task", map[string]string{"task_class": `"admin"`}), false, 1, `task_class is "admin"`},
		{"another autonomy_mode", edit("mode", map[string]string{"autonomy_mode": `"human_approval"`}), false, 1, `autonomy_mode is "human_approval"`},
		{"another risk_score", edit("risk", map[string]string{"risk_score": "0.001"}), false, 1, `risk_score is "0.001"`},
		{"another commit_delta_id", edit("delta", map[string]string{"commit_delta_id": `"blake3:1111111111111111111111111111111111111111111111111111111111111111"`}), false, 1, "commit_delta_id is"},
		{"another state_snapshot_id", edit("snap", map[string]string{"state_snapshot_id": `"1:blake3:00"`}), false, 1, `state_snapshot_id is "1:blake3:00"`},
		{"another error class", editFile(errFile, "err-class", map[string]string{"error": `{"class":"timeout","message":"x"}`}), false, 1, `error class is "timeout"`},
		{"another error message", editFile(errFile, "err-msg", map[string]string{"error": `{"class":"execution_error","message":"all fine"}`}), false, 1, "does not commit to this result"},
		{"another audit_salt", edit("salt", map[string]string{"audit_salt": `"` + strings.Repeat("ab", 32) + `"`}), false, 1, "does not commit to this result"},
		// The salt is 64 lowercase hex digits (docs/formats.md), one
		// spelling: the console refuses an upper-case one, and so does
		// kernelctl (review rev-verify F6).
		{"the audit_salt in upper case", edit("salt-upper", map[string]string{"audit_salt": strings.ToUpper(string(members["audit_salt"]))}), false, 1, "is not 64 lowercase hex digits"},
		{"a forged risk_basis", edit("basis", map[string]string{"risk_basis": `["approved by the CISO"]`}), false, 1, `not to its risk_basis ["approved by the CISO"]`},
		{"a risk_basis dropped", editFile(writeFile, "basis-dropped", map[string]string{"risk_basis": `[]`}), false, 1, "not to its risk_basis []"},
		{"a provenance added", edit("prov-added", map[string]string{"provenance": `{"approved_by":"CISO"}`}), false, 1, `provenance {"approved_by":"CISO"} is not the record's: the record has none`},
		{"a provenance changed", editFile(provFile, "prov-changed", map[string]string{"provenance": `{"source":"CISO"}`}), false, 1, `and provenance {"source":"CISO"}`},
		{"a provenance removed", editFile(provFile, "prov-removed", map[string]string{"provenance": ""}), false, 1, "and provenance none"},
		{"honest provenance", provFile, false, 0, "its risk_basis and provenance under the envelope's audit_salt"},
		{"honest write with its risk_basis", writeFile, false, 0, "its risk_basis and provenance under the envelope's audit_salt"},
		// Not attested, and said so: a replay carries its original's receipt.
		{"replayed set", edit("replayed", map[string]string{"replayed": "true"}), false, 0, "replayed is not attested"},
		// An honest envelope whose record's context holds notes carries
		// them: its context opens; without them it does not, saying why.
		{"context with notes", notesFile, false, 0, "its risk_basis and provenance under the envelope's audit_salt"},
		{"notes removed", editFile(notesFile, "notes-removed", map[string]string{"notes": ""}), false, 1, "lacks those of a net.fetch"},
		{"notes forged", editFile(notesFile, "notes-forged", map[string]string{"notes": `{"requested_operation_id":"x"}`}), false, 1, "with the notes it carries"},
		// The replay of an erased call is that call, its result erased.
		{"erased replay", erasedFile, false, 1, "the call audit record"},
		{"erased replay says erased", erasedFile, false, 1, "with its result erased"},
		{"duplicate result", prefix("dup", `"result":`+forged), false, 1, "duplicate member name"},
		{"case-variant result", prefix("case", `"Result":`+forged), false, 1, `unknown field "Result"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"receipts", "verify", c.file, "--jwks", jwksFile}
			if c.args {
				args = append(args, "--args", argsFile)
			}
			out, stderr, code := run(t, args...)
			if code != c.code || !strings.Contains(out+stderr, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, c.code, c.want, out, stderr)
			}
		})
	}

	// A receipt signed by another kernel's key fails, and the report
	// names it by the id its entry gives.
	otherPub, _, _ := ed25519.GenerateKey(nil)
	otherKey, err := receipts.JWKS(otherPub)
	if err != nil {
		t.Fatal(err)
	}
	otherJWKS := filepath.Join(dir, "other-jwks.json")
	os.WriteFile(otherJWKS, otherKey, 0o600)
	bundle := filepath.Join(dir, "bundle.json")
	os.WriteFile(bundle, []byte(mustRun(t, "receipts", "bundle", rid, "--server", s.url, "--admin-token", sv.adminFile)), 0o600)
	for _, f := range []string{bundle, bare, okFile} {
		out, stderr, code := run(t, "receipts", "verify", f, "--jwks", otherJWKS)
		if code != 1 || !strings.Contains(out, "receipt "+rid+" (claimed: not verified)\n") || !strings.Contains(out, "signature:    not ok") {
			t.Errorf("%s under another kernel's key: exit %d, want 1 naming %s:\n%s%s", filepath.Base(f), code, rid, out, stderr)
		}
	}
}

// An audit record from before commitments holds its risk_basis and
// provenance in its body: matchEnvelope compares them with the envelope's
// directly (a replay of such a call carries its record under a receipt
// proven by the log).
func TestMatchEnvelopePlainContext(t *testing.T) {
	const entryHash = "blake3:abababababababababababababababababababababababababababababababab"
	honest := func() *kernel.Result {
		return &kernel.Result{
			ToolID: "fs.write", AgentID: "a1", OperationID: "op1", Status: "ok", Result: json.RawMessage(`{"written":1}`),
			TxOutcome: "committed", AutonomyMode: "autopilot", RiskScore: 0.5, RiskBasis: []string{"writes a file"},
			Provenance: json.RawMessage(`{ "source" : "user" }`),
			LedgerSeq:  7, ReceiptID: receipts.ID(7, entryHash), StateSnapshotID: "7:" + entryHash,
		}
	}
	part := kernel.ResultPart(honest())
	sum := digest.Sum(part)
	body := `{"agent_id":"a1","autonomy_mode":"autopilot","operation_id":"op1","provenance":{"source":"user"},"result_hash":"` + sum + `",` +
		`"risk_basis":["writes a file"],"risk_score":0.5,"status":"ok","tool_id":"fs.write","tx_outcome":"committed"}`
	c, err := kernel.DecodeCall(ledger.Entry{Seq: 7, Kind: ledger.KindAudit, Hash: entryHash, Body: json.RawMessage(body)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(r *kernel.Result)
		want string
	}{
		{"honest", func(*kernel.Result) {}, "ok ("},
		{"risk_basis forged", func(r *kernel.Result) { r.RiskBasis = []string{"approved by the CISO"} }, `risk_basis is ["approved by the CISO"], the record's ["writes a file"]`},
		{"risk_basis dropped", func(r *kernel.Result) { r.RiskBasis = nil }, `risk_basis is [], the record's ["writes a file"]`},
		{"provenance changed", func(r *kernel.Result) { r.Provenance = json.RawMessage(`{"source":"CISO"}`) }, `provenance is {"source":"CISO"}, the record's {"source":"user"}`},
		{"provenance removed", func(r *kernel.Result) { r.Provenance = nil }, `provenance is none, the record's {"source":"user"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := honest()
			r.ResultHash = sum
			tc.edit(r)
			if got := matchEnvelope(r, c, part); !strings.Contains(got, tc.want) {
				t.Fatalf("got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// The stored envelope of an erased call (or of one at audit depth
// commitments_only) has lost its result, or its error's message, and its
// audit_salt: matchEnvelope says it is that call so, not another call.
func TestMatchEnvelopeResultGone(t *testing.T) {
	const entryHash = "blake3:abababababababababababababababababababababababababababababababab"
	body := `{"agent_id":"a1","autonomy_mode":"autopilot","error_class":"%s","operation_id":"op1","payload_depth":"full",` +
		`"result_commitment":"blake3:1212121212121212121212121212121212121212121212121212121212121212","risk_score":0.5,"status":"%s","tool_id":"fs.read","tx_outcome":"no_op"}`
	for _, tc := range []struct {
		name, status string
		err          *kernel.Error
		want         string
	}{
		{"result erased", "ok", nil, "the call audit record 7 attests, with its result erased"},
		{"error message erased", "error", &kernel.Error{Class: "execution_error", Message: kernel.ErasedMessage}, "with its error message erased"},
		{"error message not kept", "error", &kernel.Error{Class: "execution_error", Message: kernel.NotKeptMessage}, "with its error message not kept"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			class := ""
			if tc.err != nil {
				class = tc.err.Class
			}
			c, err := kernel.DecodeCall(ledger.Entry{Seq: 7, Kind: ledger.KindAudit, Hash: entryHash, Body: json.RawMessage(fmt.Sprintf(body, class, tc.status))})
			if err != nil {
				t.Fatal(err)
			}
			r := &kernel.Result{
				ToolID: "fs.read", AgentID: "a1", OperationID: "op1", Status: tc.status, Error: tc.err,
				TxOutcome: "no_op", AutonomyMode: "autopilot", RiskScore: 0.5, ResultHash: "blake3:" + strings.Repeat("34", 32),
				LedgerSeq: 7, ReceiptID: receipts.ID(7, entryHash), StateSnapshotID: "7:" + entryHash,
			}
			got := matchEnvelope(r, c, kernel.ResultPart(r))
			if !strings.HasPrefix(got, "refused: the envelope is the call") || !strings.Contains(got, tc.want) {
				t.Fatalf("got %s\nwant %s", got, tc.want)
			}
			// With its salt it is no erased envelope: the result_hash must
			// recompute.
			r.AuditSalt = strings.Repeat("00", 32)
			if got := matchEnvelope(r, c, kernel.ResultPart(r)); !strings.Contains(got, "is not the call") {
				t.Fatalf("with a salt: %s", got)
			}
		})
	}
}

// receipts verify opens commitments on the numbers an envelope (and
// --args) holds, not on their doubles: a result, provenance or args
// holding a number that rounds to the recorded one (9007199254740993 for
// 9007199254740992, 1.0000000000000001 for 1) is refused naming where,
// as the kernel refuses such args; the envelope as the kernel sent it, and
// numbers written otherwise but equal (1.0, 1e0), verify (review
// rev-verify F2).
func TestReceiptsVerifyExactNumbers(t *testing.T) {
	sv := initServed(t)
	s := sv.server
	tok := mintCLI(t, s, sv.admin, "--agent", "a1", "--tools", "kv.*,echo", "--kv", "*:rw")
	dir := t.TempDir()
	post := func(name string, env []byte) string {
		t.Helper()
		st, b := s.do(http.MethodPost, "/v1/syscalls", "", env)
		if st == 0 || !strings.Contains(string(b), `"receipt":{`) || !strings.Contains(string(b), `"status":"ok"`) {
			t.Fatalf("%s: %d %s", name, st, b)
		}
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, b, 0o600)
		return f
	}
	big := json.Number("9007199254740992")
	putFile := post("put", envelopeWith(tok, s, "kv.put", map[string]any{"key": "balance", "value": big}, "k1", nil))
	getFile := post("get", envelopeWith(tok, s, "kv.get", map[string]any{"key": "balance"}, "", nil))
	provFile := post("prov", envelopeWith(tok, s, "echo", map[string]any{"text": "x"}, "", map[string]any{"ids": []any{json.Number("1"), big}}))
	_, jwks := s.get("/.well-known/jwks.json", "")
	jwksFile := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwksFile, jwks, 0o600)
	// replace writes file with old replaced by new, which must occur.
	replace := func(file, name, old, new string) string {
		t.Helper()
		b, _ := os.ReadFile(file)
		if !strings.Contains(string(b), old) {
			t.Fatalf("%s holds no %s:\n%s", file, old, b)
		}
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, []byte(strings.Replace(string(b), old, new, 1)), 0o600)
		return f
	}
	args := func(name, text string) string {
		f := filepath.Join(dir, name+".args.json")
		os.WriteFile(f, []byte(text), 0o600)
		return f
	}
	for _, c := range []struct {
		name, file, args string
		code             int
		want             string
	}{
		{"honest result", getFile, "", 0, "commitments:  ok"},
		{"honest args", putFile, args("honest", `{"key":"balance","value":9007199254740992}`), 0, "commits to this result and these args"},
		{"args written otherwise, same number", putFile, args("other-form", `{"key":"balance","value":9.007199254740992e15}`), 0, "commits to this result and these args"},
		{"honest provenance", provFile, "", 0, "commitments:  ok"},
		{"result rounded up", replace(getFile, "result-993", "9007199254740992", "9007199254740993"), "", 1, "result: "},
		{"result with a fraction", replace(getFile, "result-fraction", "9007199254740992", "9007199254740992.9"), "", 1, "result: "},
		{"args rounded up", putFile, args("993", `{"key":"balance","value":9007199254740993}`), 1, "--args: "},
		{"args with a fraction", putFile, args("fraction", `{"key":"balance","value":9007199254740992.4}`), 1, "--args: "},
		{"provenance rounded", replace(provFile, "prov-rounded", "[1,", "[1.0000000000000001,"), "", 1, "provenance: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := []string{"receipts", "verify", c.file, "--jwks", jwksFile}
			if c.args != "" {
				a = append(a, "--args", c.args)
			}
			out, stderr, code := run(t, a...)
			if code != c.code || !strings.Contains(out+stderr, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, c.code, c.want, out, stderr)
			}
		})
	}
}
