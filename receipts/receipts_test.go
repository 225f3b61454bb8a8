package receipts

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jws"

	"github.com/capkernel/capkernel/jcs"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// testReceipt is the receipt of testdata/receipt.json.
func testReceipt() *Receipt {
	return &Receipt{
		ReceiptID:         "0194a0a4-7c00-7000-8000-000000000003",
		OperationID:       "0194a0a4-7c00-7000-8000-000000000002",
		ToolID:            "fs.write",
		AgentID:           "agent-1",
		CapabilityTokenID: "0194a0a4-7c00-7000-8000-000000000001",
		ArgsHash:          "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
		ResultHash:        "blake3:7b496e8d694e31dd0f2339f6fd56d25040d4481411454027bce4220d4d35c255",
		TxOutcome:         "committed",
		CommitDeltaID:     "0194a0a4-7c00-7000-8000-000000000004",
		PolicyHash:        "blake3:b6234a5af4fa48fede93de43fb31ae139bc721bf2cbb4ffb1bd9e1d4cd65781a",
		AutonomyMode:      "autopilot",
		RiskScore:         0.42,
		LedgerSeq:         2,
		LedgerEntryHash:   "blake3:9a5a0a23cd4dae5117348fdac4e37d4f55966f87293e918c663bd8b48ea78015",
		IssuedAt:          "2025-01-02T03:04:06.000000001Z",
	}
}

// testKey returns the Ed25519 key whose seed is in testdata/seed.hex.
func testKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	b, err := os.ReadFile("testdata/seed.hex")
	if err != nil {
		t.Fatal(err)
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		t.Fatalf("testdata/seed.hex: %d bytes, %v", len(seed), err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// otherKey returns a second fixed key.
func otherKey() ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
}

func jwksOf(t testing.TB, keys ...ed25519.PrivateKey) []byte {
	t.Helper()
	var pubs []ed25519.PublicKey
	for _, k := range keys {
		pubs = append(pubs, k.Public().(ed25519.PublicKey))
	}
	set, err := JWKS(pubs...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestSignVerifyRoundTrip(t *testing.T) {
	key := testKey(t)
	s := NewSigner(key)
	for _, r := range []*Receipt{
		testReceipt(),
		{ReceiptID: "r2", TxOutcome: "no_op", ErrorClass: "policy_denied", RiskScore: 1e-7, IssuedAt: "x"},
		{},
	} {
		signed, err := s.Sign(r)
		if err != nil {
			t.Fatal(err)
		}
		// Rotation: the JWKS also holds an older key.
		got, err := Verify(signed, jwksOf(t, otherKey(), key))
		if err != nil {
			t.Fatalf("Verify(%s) = %v", signed, err)
		}
		if *got != *r {
			t.Errorf("Verify = %+v, want %+v", got, r)
		}
	}
}

// TestJWXVerifiesSignature checks the hand-built serialization against jwx
// used as any third party would.
func TestJWXVerifiesSignature(t *testing.T) {
	key := testKey(t)
	r := testReceipt()
	signed, err := NewSigner(key).Sign(r)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := jws.Verify([]byte(signed), jws.WithKey(jwa.EdDSA(), key.Public()))
	if err != nil {
		t.Fatalf("jws.Verify: %v", err)
	}
	want, err := jcs.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(payload, want) {
		t.Errorf("payload %s, want %s", payload, want)
	}
	msg, err := jws.Parse([]byte(signed))
	if err != nil {
		t.Fatal(err)
	}
	h := msg.Signatures()[0].ProtectedHeaders()
	alg, _ := h.Algorithm()
	kid, _ := h.KeyID()
	typ, _ := h.Type()
	if alg.String() != "EdDSA" || kid != NewSigner(key).KeyID() || typ != Type {
		t.Errorf("header alg %s kid %s typ %s", alg, kid, typ)
	}
}

func TestKeyIDIsRFC7638Thumbprint(t *testing.T) {
	key := testKey(t)
	pub := key.Public().(ed25519.PublicKey)
	// RFC 7638 §3: SHA-256 over the required members in lexicographic order.
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + b64.EncodeToString(pub) + `"}`))
	if got, want := NewSigner(key).KeyID(), b64.EncodeToString(sum[:]); got != want {
		t.Errorf("KeyID = %s, want %s", got, want)
	}
	if !NewSigner(key).Public().Equal(pub) {
		t.Error("Public differs from the key's public half")
	}
}

func TestGoldenVector(t *testing.T) {
	key := testKey(t)
	signed, err := NewSigner(key).Sign(testReceipt())
	if err != nil {
		t.Fatal(err)
	}
	set := jwksOf(t, key)
	receipt, err := json.MarshalIndent(testReceipt(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	files := []struct {
		name string
		data []byte
	}{
		{"testdata/receipt.json", append(receipt, '\n')},
		{"testdata/receipt.jws", []byte(signed + "\n")},
		{"testdata/jwks.json", append(set, '\n')},
	}
	for _, f := range files {
		if *update {
			if err := os.WriteFile(f.name, f.data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(f.name)
		if err != nil {
			t.Fatalf("%v (run go test -update to create it)", err)
		}
		if !bytes.Equal(f.data, want) {
			t.Errorf("%s differs; got:\n%s", f.name, f.data)
		}
	}

	// The stored vector verifies on its own, against the stored JWKS.
	jwsFile, _ := os.ReadFile("testdata/receipt.jws")
	jwksFile, _ := os.ReadFile("testdata/jwks.json")
	got, err := Verify(strings.TrimSpace(string(jwsFile)), jwksFile)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *testReceipt() {
		t.Errorf("golden receipt verifies as %+v", got)
	}
}

// forge builds a compact JWS from a raw header and payload, signed with key
// (Ed25519) over the usual signing input.
func forge(header string, payload []byte, key ed25519.PrivateKey) string {
	in := b64.EncodeToString([]byte(header)) + "." + b64.EncodeToString(payload)
	return in + "." + b64.EncodeToString(ed25519.Sign(key, []byte(in)))
}

func TestVerifyRefuses(t *testing.T) {
	key, other := testKey(t), otherKey()
	s := NewSigner(key)
	kid := s.KeyID()
	set := jwksOf(t, key)
	good, err := s.Sign(testReceipt())
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	payload, _ := b64.DecodeString(parts[1])
	hdr := func(alg, typ string) string {
		return `{"alg":"` + alg + `","kid":"` + kid + `","typ":"` + typ + `"}`
	}
	withPayload := func(p []byte) string { return parts[0] + "." + b64.EncodeToString(p) + "." + parts[2] }
	hs256 := func() string {
		in := b64.EncodeToString([]byte(hdr("HS256", Type))) + "." + parts[1]
		mac := hmac.New(sha256.New, key.Public().(ed25519.PublicKey))
		mac.Write([]byte(in))
		return in + "." + b64.EncodeToString(mac.Sum(nil))
	}
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	otherPub := other.Public().(ed25519.PublicKey)
	relabeled := strings.Replace(string(jwksOf(t, other)), NewSigner(other).KeyID(), kid, 1)
	canonicalPlus := func(edit func(map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(payload, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, err := jcs.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	for _, tc := range []struct {
		name string
		jws  string
		jwks []byte
		want string
	}{
		{"tampered payload", withPayload(bytes.Replace(payload, []byte(`"risk_score":0.42`), []byte(`"risk_score":0.01`), 1)), set, "signature"},
		{"tampered signature", flip(good, len(good)-10), set, "signature"},
		{"signature of other key", forge(hdr("EdDSA", Type), payload, other), set, "signature"},
		{"alg none", b64.EncodeToString([]byte(hdr("none", Type))) + "." + parts[1] + ".", set, `alg "none"`},
		{"HS256 keyed with the public key", hs256(), set, `alg "HS256"`},
		{"alg Ed25519 (RFC 9864 name)", forge(hdr("Ed25519", Type), payload, key), set, `alg "Ed25519"`},
		{"unknown kid", mustSign(t, NewSigner(other)), set, "not in the JWKS"},
		{"other key's JWKS", good, jwksOf(t, other), "not in the JWKS"},
		{"other key labelled with our kid", good, []byte(relabeled), "thumbprint"},
		{"wrong typ", forge(hdr("EdDSA", "JWT"), payload, key), set, `typ "JWT"`},
		{"missing typ", forge(`{"alg":"EdDSA","kid":"`+kid+`"}`, payload, key), set, `typ ""`},
		{"missing kid", forge(`{"alg":"EdDSA","typ":"`+Type+`"}`, payload, key), set, `kid ""`},
		{"crit header", forge(`{"alg":"EdDSA","crit":["exp"],"exp":1,"kid":"`+kid+`","typ":"`+Type+`"}`, payload, key), set, "parameters other than"},
		{"embedded jwk header", forge(`{"alg":"EdDSA","jwk":{"crv":"Ed25519","kty":"OKP","x":"`+b64.EncodeToString(otherPub)+`"},"kid":"`+kid+`","typ":"`+Type+`"}`, payload, key), set, "parameters other than"},
		// The header is quoted in the error: raw bidirectional or C1
		// characters in its strings (valid JSON) reach no terminal
		// (review rev-verify, parseHeader).
		{"header with raw bidi and C1 characters", forge(`{"alg":"EdDSA","kid":"`+kid+`","typ":"`+Type+`","x":"`+"\u202e\u009b8m"+`"}`, payload, key), set, `\"x\":\"\u202e\u009b8m\"}"`},
		{"header with whitespace", forge(`{"alg":"EdDSA", "kid":"`+kid+`","typ":"`+Type+`"}`, payload, key), set, "not canonical"},
		{"unknown payload field", forge(hdr("EdDSA", Type), canonicalPlus(func(m map[string]any) { m["admin"] = true }), key), set, "unknown field"},
		{"missing payload field", forge(hdr("EdDSA", Type), canonicalPlus(func(m map[string]any) { delete(m, "ledger_seq") }), key), set, "not the canonical JSON"},
		{"non-canonical payload", forge(hdr("EdDSA", Type), append([]byte(" "), payload...), key), set, "not the canonical JSON"},
		{"duplicate payload field", forge(hdr("EdDSA", Type), bytes.Replace(payload, []byte(`{`), []byte(`{"tool_id":"proc.exec",`), 1), key), set, "payload"},
		{"payload not JSON", forge(hdr("EdDSA", Type), []byte("hello"), key), set, "payload"},
		{"padded base64", parts[0] + "=." + parts[1] + "." + parts[2], set, "base64url"},
		// One signed receipt, respelled: each part must be the one text of
		// its bytes (jwx alone accepts these).
		{"signature with unused bits set", parts[0] + "." + parts[1] + "." + respell(parts[2]), set, "JWS part 3 is not canonical base64url"},
		{"padded signature", parts[0] + "." + parts[1] + "." + parts[2] + "==", set, "JWS part 3 is not unpadded base64url"},
		{"newline in the signature", parts[0] + "." + parts[1] + "." + parts[2][:9] + "\n" + parts[2][9:], set, "JWS part 3 is not unpadded base64url"},
		{"newline in the header", parts[0][:5] + "\r\n" + parts[0][5:] + "." + parts[1] + "." + parts[2], set, "JWS part 1 is not unpadded base64url"},
		{"newline in the payload", parts[0] + "." + parts[1][:7] + "\n" + parts[1][7:] + "." + parts[2], set, "JWS part 2 is not unpadded base64url"},
		{"JSON serialization", `{"payload":"` + parts[1] + `","protected":"` + parts[0] + `","signature":"` + parts[2] + `"}`, set, "compact"},
		{"two parts", parts[0] + "." + parts[1], set, "compact"},
		{"four parts", good + ".x", set, "compact"},
		{"empty", "", set, "compact"},
		{"garbage", "not a jws at all", set, "compact"},
		{"dots only", "..", set, "header"},
		{"oversized", strings.Repeat("A", maxJWS) + "." + parts[1] + "." + parts[2], set, "exceeds"},
		{"JWKS not JSON", good, []byte("nope"), "JWKS"},
		{"JWKS with a duplicate kid", good, []byte(`{"keys":[` + jwkOf(t, key) + `,` + jwkOf(t, key) + `]}`), "JWKS"},
		// Keys for another alg or use are not signature keys: skipped.
		{"JWKS key for another alg", good, []byte(`{"keys":[` + strings.Replace(jwkOf(t, key), `"EdDSA"`, `"ES256"`, 1) + `]}`), "no Ed25519 signature key"},
		{"JWKS key for encryption", good, []byte(`{"keys":[` + strings.Replace(jwkOf(t, key), `"sig"`, `"enc"`, 1) + `]}`), "no Ed25519 signature key"},
		// The same key, its x respelled (jwx alone decodes these to it).
		{"JWKS key's x with unused bits set", good, []byte(`{"keys":[` + respellX(t, jwkOf(t, key), respell) + `]}`), "JWKS key 1: x is not canonical base64url"},
		{"JWKS key's x padded", good, []byte(`{"keys":[` + respellX(t, jwkOf(t, key), func(x string) string { return x + "=" }) + `]}`), "JWKS key 1: x is not unpadded base64url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Verify(tc.jws, tc.jwks)
			if err == nil {
				t.Fatalf("Verify accepted it: %+v", r)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verify = %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// respell returns the unpadded base64url text part with the lowest bit of
// its last digit flipped: for a part whose last digit carries unused bits
// (a 64-byte signature's carries four), the same bytes.
func respell(part string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, part[len(part)-1])
	return part[:len(part)-1] + string(alphabet[last^1])
}

// respellX returns the JWK k with its "x" member's text replaced by
// edit's.
func respellX(t *testing.T, k string, edit func(string) string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(k), &m); err != nil {
		t.Fatal(err)
	}
	x := m["x"].(string)
	return strings.Replace(k, `"x":"`+x+`"`, `"x":"`+edit(x)+`"`, 1)
}

// TestDecodeRefusesRespelledReceipt: Decode, which lists receipts without
// their signatures, refuses the texts Verify refuses for their spelling.
func TestDecodeRefusesRespelledReceipt(t *testing.T) {
	good := mustSign(t, NewSigner(testKey(t)))
	if _, err := Decode(good); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	respelledBytes, err := base64.RawURLEncoding.DecodeString(respell(parts[2])) // lenient: the same bytes
	if err != nil {
		t.Fatal(err)
	}
	if orig, _ := b64.DecodeString(parts[2]); !bytes.Equal(respelledBytes, orig) {
		t.Fatal("respell changed the signature's bytes")
	}
	for _, jws := range []string{
		parts[0] + "." + parts[1] + "." + respell(parts[2]),
		parts[0] + "." + parts[1][:7] + "\n" + parts[1][7:] + "." + parts[2],
		parts[0] + "." + parts[1] + "=." + parts[2],
	} {
		if r, err := Decode(jws); err == nil || !strings.Contains(err.Error(), "base64url") {
			t.Errorf("Decode(%q) = %+v, %v; want a refusal of its base64url", jws, r, err)
		}
	}
}

func mustSign(t *testing.T, s *Signer) string {
	t.Helper()
	out, err := s.Sign(testReceipt())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// jwkOf returns the single key of the JWKS for key.
func jwkOf(t *testing.T, key ed25519.PrivateKey) string {
	var set struct{ Keys []json.RawMessage }
	if err := json.Unmarshal(jwksOf(t, key), &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS: %v", err)
	}
	return string(set.Keys[0])
}

func TestSignerRefusesMalformedKey(t *testing.T) {
	good := testKey(t)
	mismatched := bytes.Clone(good)
	copy(mismatched[ed25519.SeedSize:], otherKey()[ed25519.SeedSize:])
	for name, key := range map[string]ed25519.PrivateKey{
		"nil":             nil,
		"seed only":       good.Seed(),
		"mismatched half": mismatched,
	} {
		s := NewSigner(key)
		if out, err := s.Sign(testReceipt()); err == nil {
			t.Errorf("%s: Sign = %s, want an error", name, out)
		}
		if s.KeyID() != "" || s.Public() != nil {
			t.Errorf("%s: KeyID = %q, Public = %x", name, s.KeyID(), s.Public())
		}
	}
	if _, err := NewSigner(good).Sign(nil); err == nil {
		t.Error("Sign(nil) succeeded")
	}
}

func TestJWKS(t *testing.T) {
	key := testKey(t)
	set, err := JWKS(key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Keys []map[string]string `json:"keys"`
	}
	if err := json.Unmarshal(set, &doc); err != nil || len(doc.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", set, err)
	}
	want := map[string]string{
		"kty": "OKP", "crv": "Ed25519", "x": b64.EncodeToString(key.Public().(ed25519.PublicKey)),
		"kid": NewSigner(key).KeyID(), "use": "sig", "alg": "EdDSA",
	}
	if len(doc.Keys[0]) != len(want) {
		t.Errorf("JWKS key %v, want %v", doc.Keys[0], want)
	}
	for k, v := range want {
		if doc.Keys[0][k] != v {
			t.Errorf("JWKS key %s = %q, want %q", k, doc.Keys[0][k], v)
		}
	}
	if _, err := JWKS(ed25519.PublicKey{1, 2, 3}); err == nil {
		t.Error("JWKS accepted a 3-byte key")
	}
}
