package captoken

import (
	"crypto/ed25519"
	"strings"
	"testing"
)

// Token claims and headers are read by the strictjson rules at every
// level: a payload another JWT library would read differently (the last
// or the first of two "sub", a case-folded name, bytes that are not UTF-8)
// is refused, even when it is properly signed.
func TestVerifyStrictJSON(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	good := string(payloadJSON(t, testClaims()))
	// edit replaces old in the valid payload (exactly once).
	edit := func(old, new string) []byte {
		t.Helper()
		if strings.Count(good, old) != 1 {
			t.Fatalf("%q is not once in %s", old, good)
		}
		return []byte(strings.Replace(good, old, new, 1))
	}
	tests := []struct {
		name    string
		header  string
		payload []byte
		reason  string
	}{
		{"valid", "", []byte(good), ""},
		{"duplicate sub", "", edit(`"sub":"agent-1"`, `"sub":"agent-1","sub":"agent-1"`), `duplicate member name "sub"`},
		{"duplicate sub, escaped", "", edit(`"sub":"agent-1"`, `"sub":"agent-1","\u0073ub":"agent-1"`), `duplicate member name "sub"`},
		{"duplicate in cap", "", edit(`"autonomy":"soft_gate"`, `"autonomy":"soft_gate","autonomy":"autopilot"`), `duplicate member name "autonomy" in /cap`},
		{"duplicate in an fs root", "", edit(`"mode":"rw"`, `"mode":"r","mode":"rw"`), `duplicate member name "mode" in /cap/fs/0`},
		{"duplicate budget", "", edit(`{"calls":100}`, `{"calls":100,"calls":1000000}`), `duplicate member name "calls" in /cap/budgets`},
		{"duplicate in an ancestor", "", edit(`"autonomy":"soft_gate"`, `"autonomy":"soft_gate","ancestors":[{"jti":"a","jti":"b"}]`), `duplicate member name "jti" in /cap/ancestors/0`},
		{"unknown in an ancestor", "", edit(`"autonomy":"soft_gate"`, `"autonomy":"soft_gate","ancestors":[{"jti":"a","x":1}]`), `unknown field "x" in /cap/ancestors/0`},
		{"case-folded claim", "", edit(`"sub":"agent-1"`, `"SUB":"agent-1"`), `unknown field "SUB"`},
		{"invalid UTF-8 in sub", "", edit(`"sub":"agent-1"`, "\"sub\":\"agent-1\xff\""), `invalid UTF-8 in /sub`},
		{"invalid UTF-8 in a tool", "", edit(`"echo"`, "\"ech\xc3\""), `invalid UTF-8 in /cap/tools/0`},
		{"lone surrogate in a net pattern", "", edit(`"api.example.com:443"`, `"api.example.com\ud800:443"`), `surrogate`},
		{"invalid UTF-8 in a key", "", edit(`"budgets"`, "\"budg\xffets\""), `invalid UTF-8`},
		{"duplicate header alg", `{"alg":"none","alg":"EdDSA","kid":"` + kid + `","typ":"JWT"}`, []byte(good), `token header: duplicate member name "alg"`},
		{"invalid UTF-8 in the header", "{\"alg\":\"EdDSA\",\"kid\":\"" + kid + "\",\"typ\":\"JWT\xff\"}", []byte(good), `token header: invalid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == "" {
				h = header("EdDSA", kid)
			}
			tok := compact(h, tt.payload, ed25519Signer(key))
			v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}, Issuer: "issuer-1", Audience: "kernel-1"})
			_, err := v.Verify(tok, testBinding, t0)
			if tt.reason == "" {
				checkErr(t, err, "", "")
				return
			}
			checkErr(t, err, CodeInvalid, tt.reason)
		})
	}
}
