package conformance

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"
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
