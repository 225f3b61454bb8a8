package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
)

// TestRefusedArgsKeptAsDigest: a call refused before its token verified
// (no credential needed), and a verified agent's call refused before the
// policy step with args over RefusedArgsLimit, keep in their audit
// payload the digest form of their args, ["<args_hash>",<size>], not the
// args: refusals cost no budget, and 100 unauthenticated 1 MB requests
// grew kernel.db by 72 MB (rev14 F5). The commitment is over that form,
// so the stored payload opens it (ledger verify), the caller's args check
// against it (CheckPayload), and it erases like any payload. A verified
// refusal's small args, and a refusal after the policy step, keep the
// args. A big provenance of a call refused before the policy step, its
// token verified or not, is kept as its digest form too, in a note.
func TestRefusedArgsKeptAsDigest(t *testing.T) {
	h := newHarness(t)
	echoOnly, echoJTI := h.mint("echo-only", captoken.Capability{Tools: []string{"echo"}})
	asEchoOnly := func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "echo-only", echoOnly, echoJTI }
	big := map[string]any{"path": strings.Repeat("x", 64<<10)}
	small := map[string]any{"path": "notes.txt"}
	for _, tc := range []struct {
		name    string
		args    map[string]any
		mods    []func(*Envelope)
		class   string
		digests bool
	}{
		{"no token", big, []func(*Envelope){func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = "", "" }}, ErrTokenInvalid, true},
		{"garbage token", big, []func(*Envelope){func(e *Envelope) { e.CapabilityToken = "garbage" }}, ErrTokenInvalid, true},
		{"garbage token, small args", small, []func(*Envelope){func(e *Envelope) { e.CapabilityToken = "garbage" }}, ErrTokenInvalid, true},
		{"tool not granted", big, []func(*Envelope){asEchoOnly}, ErrPermissionDenied, true},
		{"tool not granted, small args", small, []func(*Envelope){asEchoOnly}, ErrPermissionDenied, false},
		{"out of scope", map[string]any{"path": "../" + strings.Repeat("y", 4090)}, nil, ErrScopeDenied, true}, // args over 4 KiB, a path within MaxPathBytes
		{"path over its bound", map[string]any{"path": strings.Repeat("y", 8<<10)}, nil, ErrInvalidArgs, true},
		{"policy_denied keeps its policy input", map[string]any{"text": strings.Repeat("z", 8<<10)},
			[]func(*Envelope){func(e *Envelope) { e.ToolID, e.AutonomyMode = "echo", "no_go" }}, ErrPolicyDenied, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := h.env("fs.read", tc.args, tc.mods...)
			canon, err := canonicalPart(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			r := h.k.Invoke(context.Background(), env)
			if errClass(r) != tc.class || r.ReceiptID == "" {
				t.Fatalf("class %q (%+v), receipt %q; want %s, recorded", errClass(r), r.Error, r.ReceiptID, tc.class)
			}
			var (
				e      ledger.Entry
				p      *Payload
				stored []byte
			)
			if err := h.k.View(func(tx *bbolt.Tx) (err error) {
				if e, err = ledger.Get(tx, r.LedgerSeq); err != nil {
					return err
				}
				if stored, err = ledger.Attachment(tx, r.LedgerSeq); err != nil {
					return err
				}
				p, err = getPayload(tx, r.LedgerSeq)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			form := fmt.Sprintf(`[%q,%d]`, digest.Sum(canon), len(canon))
			switch {
			case tc.digests && string(p.Args) != form:
				t.Fatalf("args part %.80s…, want the digest form %s", p.Args, form)
			case tc.digests && len(stored) > 2<<10:
				t.Fatalf("the payload of a refusal of %d bytes of args is stored in %d bytes", len(canon), len(stored))
			case !tc.digests && string(p.Args) != string(canon):
				t.Fatalf("args part %.80s…, want the args", p.Args)
			}
			// The caller's args check against the record, whichever form it
			// keeps, and so does the stored form; other args do not.
			for _, args := range [][]byte{canon, p.Args} {
				if err := CheckPayload(e, Payload{Salt: r.AuditSalt, Args: args}); err != nil {
					t.Fatalf("CheckPayload of %.40s…: %v", args, err)
				}
			}
			if CheckPayload(e, Payload{Salt: r.AuditSalt, Args: json.RawMessage(`{"path":"other"}`)}) == nil {
				t.Fatal("CheckPayload took other args")
			}
			if tc.digests {
				// A reader of the record in full reads the args' hash.
				if a := h.audits(r.LedgerSeq)[0]; a.ArgsHash != digest.Sum(canon) {
					t.Fatalf("the record read in full says args_hash %s, want %s", a.ArgsHash, digest.Sum(canon))
				}
			}
		})
	}
	// So does a big provenance of a call refused before the policy step,
	// its token verified or not (a verified agent's stored 0.86 MB per
	// refusal, rev16a #2): its digest form is a note, in the record's
	// context and the result. A small one, and one from the policy step
	// on, is kept.
	prov := []byte(`{"model":"` + strings.Repeat("p", 64<<10) + `"}`)
	smallProv := []byte(`{"model":"m"}`)
	var r *Result
	for _, tc := range []struct {
		name     string
		tool     string
		prov     []byte
		mod      func(*Envelope)
		class    string
		withheld bool
	}{
		{"garbage token", "echo", prov, func(e *Envelope) { e.CapabilityToken = "garbage" }, ErrTokenInvalid, true},
		{"tool not granted", "fs.read", prov, asEchoOnly, ErrPermissionDenied, true},
		{"policy mismatch", "echo", prov, func(e *Envelope) { e.PolicyHash = "sha256:other" }, ErrPolicyMismatch, true},
		{"tool not granted, small provenance", "fs.read", smallProv, asEchoOnly, ErrPermissionDenied, false},
		{"policy_denied", "echo", prov, func(e *Envelope) { e.AutonomyMode = "no_go" }, ErrPolicyDenied, false},
		{"ran", "echo", prov, func(*Envelope) {}, "", false},
	} {
		r = h.invoke(tc.tool, map[string]any{"text": "x"}, func(e *Envelope) { e.Provenance = tc.prov; tc.mod(e) })
		if errClass(r) != tc.class || r.ReceiptID == "" {
			t.Fatalf("%s: class %q (%+v), receipt %q; want %q, recorded", tc.name, errClass(r), r.Error, r.ReceiptID, tc.class)
		}
		a := h.audits(r.LedgerSeq)[0]
		if tc.withheld {
			want := fmt.Sprintf(`[%q,%d]`, digest.Sum(tc.prov), len(tc.prov))
			if r.Provenance != nil || string(r.Notes["provenance_withheld"]) != want {
				t.Fatalf("%s: a refusal of %d bytes of provenance: provenance %.40s…, notes %s; want the note %s", tc.name, len(tc.prov), r.Provenance, r.Notes, want)
			}
			if a.Provenance != nil || string(a.Notes["provenance_withheld"]) != want {
				t.Fatalf("%s: its record: provenance %.40s…, notes %s", tc.name, a.Provenance, a.Notes)
			}
		} else if len(r.Provenance) != len(tc.prov) || len(a.Provenance) != len(tc.prov) || r.Notes["provenance_withheld"] != nil {
			t.Fatalf("%s: provenance %d bytes in the result, %d in the record, notes %s; want its %d bytes kept", tc.name, len(r.Provenance), len(a.Provenance), r.Notes, len(tc.prov))
		}
	}
	verifyReceipt(t, h.k, r)
	mustVerify(t, h.k.Inspector())
	// The digest form erases like any payload, and the ledger still
	// verifies.
	r = h.invoke("fs.read", big, func(e *Envelope) { e.CapabilityToken = "garbage" })
	if _, err := h.k.Erase(context.Background(), r.OperationID, "test"); err != nil {
		t.Fatal(err)
	}
	if c := mustVerify(t, h.k.Inspector()); c.Payloads.Erased == 0 {
		t.Fatalf("payloads after the erasure: %+v", c.Payloads)
	}
}
