package conformance

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// suiteVerify is how the suite rules on a receipt proven by the log and
// the JWKS it is checked against.
func suiteVerify(raw, jwks []byte) error {
	_, err := verifyLogged(raw, jwks)
	return err
}

// The suite rules on receipts and JWKS documents as the contract does:
// every accept/refuse vector of receipts/testdata/verify_vectors.json
// (which receipts.VerifyLogged and the console pass) gets the contract's
// verdict, so a kernel whose receipts or JWKS a verifier refuses cannot
// pass the suite (review rev-verify F3: 22 vectors were accepted:
// duplicate and case-variant members, missing or null members, body
// fields of other types, a tree of 2^53 entries, JWKS keys not for
// signing or given twice).
func TestSuiteVerifierFollowsVectors(t *testing.T) {
	b, err := os.ReadFile("../receipts/testdata/verify_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		JWKS  map[string]string `json:"jwks"`
		Cases []struct {
			Name          string `json:"name"`
			Receipt       string `json:"receipt"`
			ReceiptBase64 string `json:"receipt_base64"`
			JWKS          string `json:"jwks"`
			OK            bool   `json:"ok"`
			Rule          string `json:"rule"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 90 {
		t.Fatalf("%d vectors, want the whole file", len(doc.Cases))
	}
	for _, c := range doc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			raw := []byte(c.Receipt)
			if c.ReceiptBase64 != "" {
				if raw, err = base64.StdEncoding.DecodeString(c.ReceiptBase64); err != nil {
					t.Fatal(err)
				}
			}
			jwks, ok := doc.JWKS[c.JWKS]
			if !ok {
				t.Fatalf("no JWKS %q", c.JWKS)
			}
			if err := suiteVerify(raw, []byte(jwks)); (err == nil) != c.OK {
				t.Errorf("rule %s: the contract says ok=%v, the suite %v", c.Rule, c.OK, err)
			}
		})
	}
}

// The suite opens commitments by the verifiers' rules (kernel.CheckPayload,
// receipts verify, the console): a salt in lowercase hex only, and a part
// holding a number whose decimal is not its canonical form fails, since
// it would open the commitment to another decimal (review rev2-fronts F7:
// an upper-case salt and 9007199254740993 opened the suite's commitments,
// which every verifier refuses).
func TestSuiteOpensCommitmentsAsVerifiers(t *testing.T) {
	lower := strings.Repeat("ab", 32)
	committed, err := kernel.CommitPart(lower, "result", []byte(`{"n":9007199254740992}`))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"result_commitment":"` + committed + `"}`)
	for _, c := range []struct {
		name, salt, part string
		ok               bool
	}{
		{"the committed part", lower, `{"n":9007199254740992}`, true},
		{"the same part spaced", lower, `{ "n" : 9007199254740992 }`, true},
		{"an upper-case salt", strings.ToUpper(lower), `{"n":9007199254740992}`, false},
		{"a mixed-case salt", "A" + lower[1:], `{"n":9007199254740992}`, false},
		{"a number rounding to the committed one", lower, `{"n":9007199254740993}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			payload := []byte(`{"salt":"` + c.salt + `","result":` + c.part + `}`)
			msg := openBody(Entry{Seq: 3, Kind: "audit", Body: body, Payload: payload})
			if (msg == "") != c.ok {
				t.Errorf("OpenBody: failure %q, want ok=%v", msg, c.ok)
			}
			// A result envelope with the same salt and result, checked as
			// VerifyReceipt checks it.
			r := &Result{Status: "ok", AuditSalt: c.salt, Result: json.RawMessage(c.part)}
			want, err := kernel.CommitPart(lower, "result", []byte(`{"result":{"n":9007199254740992},"status":"ok"}`))
			if err != nil {
				t.Fatal(err)
			}
			canon, err := resultCanonical(r)
			got := ""
			if err == nil {
				got, err = commitment(r.AuditSalt, "result", canon)
			}
			if (err == nil && got == want) != c.ok {
				t.Errorf("result envelope: commitment %q, %v; want ok=%v", got, err, c.ok)
			}
		})
	}
}

// openBody runs T.OpenBody on e and returns the failure it ends the case
// with, "" for none.
func openBody(e Entry) (msg string) {
	t := &T{}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stop); !ok {
				panic(r)
			}
			msg = t.msg
		}
	}()
	t.OpenBody(e)
	return ""
}
