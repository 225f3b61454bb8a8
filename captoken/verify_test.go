package captoken

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/digest"
)

var b64 = base64.RawURLEncoding

// t0 is the moment the test tokens become valid.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// testClaims returns valid claims for agent-1's token tok-1 on kernel-1,
// valid for an hour from t0.
func testClaims() Claims {
	return Claims{
		Issuer:    "issuer-1",
		Subject:   "agent-1",
		Audience:  "kernel-1",
		ID:        "tok-1",
		IssuedAt:  t0,
		NotBefore: t0,
		Expiry:    t0.Add(time.Hour),
		Cap: Capability{
			Tools:    []string{"echo", "fs.*"},
			FS:       []FSRoot{{Path: "/srv/work", Mode: "rw"}},
			Net:      []string{"api.example.com:443"},
			Budgets:  map[string]int64{BudgetCalls: 100},
			Autonomy: "soft_gate",
		},
	}
}

var testBinding = Binding{TokenID: "tok-1", AgentID: "agent-1"}

func newKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func mint(t testing.TB, key ed25519.PrivateKey, c Claims) string {
	t.Helper()
	tok, err := Mint(key, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// compact assembles a compact JWS from a header and payload as given,
// signed by sign over the signing input (nil sign: empty signature). It
// builds what an attacker can build, bypassing Mint's checks.
func compact(header string, payload []byte, sign func(input []byte) []byte) string {
	input := b64.EncodeToString([]byte(header)) + "." + b64.EncodeToString(payload)
	var sig []byte
	if sign != nil {
		sig = sign([]byte(input))
	}
	return input + "." + b64.EncodeToString(sig)
}

func ed25519Signer(key ed25519.PrivateKey) func([]byte) []byte {
	return func(in []byte) []byte { return ed25519.Sign(key, in) }
}

func header(alg, kid string) string {
	return `{"alg":"` + alg + `","kid":"` + kid + `","typ":"JWT"}`
}

func payloadJSON(t testing.TB, c Claims) []byte {
	t.Helper()
	b, err := marshalClaims(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// editPayload returns the payload of c as JSON with edit applied to its
// decoded object.
func editPayload(t testing.TB, c Claims, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(payloadJSON(t, c), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// part returns the i-th dot-separated part of a compact token.
func part(tok string, i int) string {
	return strings.Split(tok, ".")[i]
}

func TestVerify(t *testing.T) {
	key, other := newKey(t), newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	good := mint(t, key, testClaims())
	signedPayload := func(p []byte) string { return compact(header("EdDSA", kid), p, ed25519Signer(key)) }
	withCap := func(edit func(cp map[string]any)) string {
		return signedPayload(editPayload(t, testClaims(), func(m map[string]any) { edit(m["cap"].(map[string]any)) }))
	}
	withClaims := func(edit func(c *Claims)) string {
		c := testClaims()
		edit(&c)
		return signedPayload(payloadJSON(t, c))
	}

	tests := []struct {
		name    string
		token   string
		binding Binding               // testBinding if zero
		now     time.Time             // t0 if zero
		config  func(*VerifierConfig) // applied to the default config
		code    string                // "" for success
		reason  string                // substring of the Reason
	}{
		{name: "valid", token: good},
		{name: "valid one second before exp", token: good, now: t0.Add(time.Hour - time.Second)},
		{name: "any issuer when none configured", token: good, config: func(c *VerifierConfig) { c.Issuer = "" }},

		{name: "alg none", token: compact(header("none", kid), payloadJSON(t, testClaims()), nil),
			code: CodeInvalid, reason: `alg "none" is not allowed`},
		{name: "alg none with a signature", token: compact(header("none", kid), payloadJSON(t, testClaims()), ed25519Signer(key)),
			code: CodeInvalid, reason: `alg "none" is not allowed`},
		{name: "HS256 keyed with the public key", token: compact(header("HS256", kid), payloadJSON(t, testClaims()), func(in []byte) []byte {
			m := hmac.New(sha256.New, key.Public().(ed25519.PublicKey))
			m.Write(in)
			return m.Sum(nil)
		}), code: CodeInvalid, reason: `alg "HS256" is not allowed`},
		{name: "RS256 header over an Ed25519 signature", token: compact(header("RS256", kid), payloadJSON(t, testClaims()), ed25519Signer(key)),
			code: CodeInvalid, reason: `alg "RS256" is not allowed`},

		{name: "unknown kid", token: mint(t, other, testClaims()),
			code: CodeInvalid, reason: "is not a trusted issuer key"},
		{name: "no kid", token: compact(`{"alg":"EdDSA","typ":"JWT"}`, payloadJSON(t, testClaims()), ed25519Signer(key)),
			code: CodeInvalid, reason: "has no kid"},
		{name: "trusted kid, signed by another key", token: compact(header("EdDSA", kid), payloadJSON(t, testClaims()), ed25519Signer(other)),
			code: CodeInvalid, reason: "signature does not verify"},
		{name: "tampered payload", token: part(good, 0) + "." +
			b64.EncodeToString(editPayload(t, testClaims(), func(m map[string]any) { m["cap"].(map[string]any)["tools"] = []string{"*"} })) +
			"." + part(good, 2),
			code: CodeInvalid, reason: "signature does not verify"},
		{name: "tampered header", token: b64.EncodeToString([]byte(`{"typ":"JWT","kid":"`+kid+`","alg":"EdDSA"}`)) + "." + part(good, 1) + "." + part(good, 2),
			code: CodeInvalid, reason: "signature does not verify"},
		{name: "tampered signature", token: func() string {
			sig, _ := b64.DecodeString(part(good, 2))
			sig[10] ^= 0x01
			return part(good, 0) + "." + part(good, 1) + "." + b64.EncodeToString(sig)
		}(), code: CodeInvalid, reason: "signature does not verify"},
		{name: "signature with nonzero unused bits", token: func() string {
			// The last of 86 characters carries 2 of the signature's 512
			// bits; setting its 4 unused bits must not give a second
			// spelling of the same token.
			last := strings.IndexByte(alphabet, good[len(good)-1])
			return good[:len(good)-1] + string(alphabet[last|1])
		}(), code: CodeInvalid, reason: "not canonical base64url"},
		{name: "padded signature", token: good + "==", code: CodeInvalid, reason: "not canonical base64url"},
		{name: "truncated signature", token: func() string {
			sig, _ := b64.DecodeString(part(good, 2))
			return part(good, 0) + "." + part(good, 1) + "." + b64.EncodeToString(sig[:63])
		}(),
			code: CodeInvalid, reason: "signature does not verify"},
		{name: "extra header parameter", token: compact(`{"alg":"EdDSA","jku":"https://evil.example/jwks","kid":"`+kid+`","typ":"JWT"}`, payloadJSON(t, testClaims()), ed25519Signer(key)),
			code: CodeInvalid, reason: `header parameter "jku" is not allowed`},
		{name: "typ of a receipt", token: compact(`{"alg":"EdDSA","kid":"`+kid+`","typ":"capkernel-receipt+jws"}`, payloadJSON(t, testClaims()), ed25519Signer(key)),
			code: CodeInvalid, reason: `typ "capkernel-receipt+jws" is not JWT`},

		{name: "expired", token: good, now: t0.Add(time.Hour),
			code: CodeInvalid, reason: "expired at 2030-01-02T04:04:05Z"},
		{name: "not yet valid", token: good, now: t0.Add(-time.Second),
			code: CodeInvalid, reason: "not valid before 2030-01-02T03:04:05Z"},
		{name: "wrong audience", token: good, config: func(c *VerifierConfig) { c.Audience = "kernel-2" },
			code: CodeInvalid, reason: `audience "kernel-1" is not this kernel ("kernel-2")`},
		{name: "no audience configured", token: good, config: func(c *VerifierConfig) { c.Audience = "" },
			code: CodeInvalid, reason: "is not this kernel"},
		{name: "wrong issuer", token: good, config: func(c *VerifierConfig) { c.Issuer = "issuer-2" },
			code: CodeInvalid, reason: `issuer "issuer-1" is not the trusted issuer "issuer-2"`},
		{name: "jti mismatch", token: good, binding: Binding{TokenID: "tok-2", AgentID: "agent-1"},
			code: CodeInvalid, reason: `jti "tok-1" does not match capability_token_id "tok-2"`},
		{name: "sub mismatch", token: good, binding: Binding{TokenID: "tok-1", AgentID: "agent-2"},
			code: CodeInvalid, reason: `sub "agent-1" does not match agent_id "agent-2"`},
		{name: "revoked", token: good, config: revoking("tok-1"),
			code: CodeRevoked, reason: `token "tok-1" is revoked`},
		{name: "other token revoked", token: good, config: revoking("tok-9")},
		{name: "parent revoked", token: mint(t, key, func() Claims { c := testClaims(); c.Cap.Parent = "tok-0"; return c }()),
			config: revoking("tok-0"), code: CodeRevoked, reason: `parent "tok-0" is revoked`},

		{name: "empty", token: "", code: CodeInvalid, reason: "not a compact JWS"},
		{name: "two parts", token: "a.b", code: CodeInvalid, reason: "not a compact JWS"},
		{name: "four parts", token: good + ".x", code: CodeInvalid, reason: "not a compact JWS"},
		{name: "JSON serialization", token: `{"payload":"e30","signatures":[]}`, code: CodeInvalid, reason: "not a compact JWS"},
		{name: "not base64", token: "!!!.@@@.###", code: CodeInvalid, reason: "not a compact JWS"},
		{name: "base64 but not JSON", token: "YWJj.YWJj.YWJj", code: CodeInvalid, reason: "token header: malformed JSON"},
		{name: "header of unknown alg", token: compact(header("XX999", "k"), payloadJSON(t, testClaims()), ed25519Signer(key)), code: CodeInvalid, reason: "header is not a JSON object"},
		{name: "oversize", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { m["sub"] = strings.Repeat("a", MaxTokenSize) })),
			code: CodeInvalid, reason: "over the 16384-byte limit"},

		{name: "unknown cap field", token: withCap(func(cp map[string]any) { cp["admin"] = true }),
			code: CodeInvalid, reason: `claims are malformed: unknown field "admin" in /cap`},
		{name: "unknown fs field", token: withCap(func(cp map[string]any) { cp["fs"] = []any{map[string]any{"path": "/", "mode": "r", "follow": true}} }),
			code: CodeInvalid, reason: `unknown field "follow"`},
		{name: "unknown top-level claim", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { m["scope"] = "admin" })),
			code: CodeInvalid, reason: `unknown field "scope"`},
		{name: "cap tools not a list", token: withCap(func(cp map[string]any) { cp["tools"] = "*" }),
			code: CodeInvalid, reason: "claims are malformed"},
		{name: "aud as a list", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { m["aud"] = []string{"kernel-1"} })),
			code: CodeInvalid, reason: "claims are malformed"},
		{name: "no exp", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { delete(m, "exp") })),
			code: CodeInvalid, reason: "no exp claim"},
		{name: "fractional exp", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { m["exp"] = 1.5e9 + 0.5 })),
			code: CodeInvalid, reason: "claims are malformed"},
		{name: "no cap", token: signedPayload(editPayload(t, testClaims(), func(m map[string]any) { delete(m, "cap") })),
			code: CodeInvalid, reason: "no cap claim"},
		{name: "data after the claims", token: signedPayload(append(payloadJSON(t, testClaims()), " {}"...)),
			code: CodeInvalid, reason: "claims are malformed: malformed JSON: invalid character '{' after top-level value"},
		{name: "unknown budget", token: withCap(func(cp map[string]any) { cp["budgets"] = map[string]int{"gpu_ms": 1} }),
			code: CodeInvalid, reason: `claims are invalid: cap.budgets has unknown key "gpu_ms"`},
		{name: "negative budget", token: withCap(func(cp map[string]any) { cp["budgets"] = map[string]int{"calls": -1} }),
			code: CodeInvalid, reason: "is negative"},
		{name: "relative fs root", token: withClaims(func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "srv", Mode: "r"}} }),
			code: CodeInvalid, reason: "is not an absolute, clean path"},
		{name: "unknown autonomy", token: withClaims(func(c *Claims) { c.Cap.Autonomy = "yolo" }),
			code: CodeInvalid, reason: `cap.autonomy "yolo"`},
		{name: "empty sub", token: withClaims(func(c *Claims) { c.Subject = "" }), binding: Binding{TokenID: "tok-1"},
			code: CodeInvalid, reason: "sub is empty"},
		{name: "exp not after nbf", token: withClaims(func(c *Claims) { c.Expiry = c.NotBefore }),
			code: CodeInvalid, reason: "is not after nbf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := VerifierConfig{
				Keys:     map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)},
				Issuer:   "issuer-1",
				Audience: "kernel-1",
			}
			if tt.config != nil {
				tt.config(&cfg)
			}
			b, now := tt.binding, tt.now
			if b == (Binding{}) {
				b = testBinding
			}
			if now.IsZero() {
				now = t0
			}
			tok, err := NewVerifier(cfg).Verify(tt.token, b, now)
			checkErr(t, err, tt.code, tt.reason)
			if tt.code == "" && (tok == nil || tok.Raw != tt.token) {
				t.Fatalf("Verify returned %+v for a valid token", tok)
			}
			if tt.code != "" && tok != nil {
				t.Fatalf("Verify returned a token with an error")
			}
		})
	}
}

func revoking(jtis ...string) func(*VerifierConfig) {
	return func(c *VerifierConfig) {
		c.Revoked = func(jti string) bool {
			for _, j := range jtis {
				if j == jti {
					return true
				}
			}
			return false
		}
	}
}

// checkErr fails t unless err is nil (code "") or an *Error with code
// whose Reason contains reason.
func checkErr(t *testing.T, err error, code, reason string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("Verify: %v, want success", err)
		}
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Verify error = %v (%T), want *Error %s", err, err, code)
	}
	if e.Code != code || !strings.Contains(e.Reason, reason) {
		t.Fatalf("Verify error = %s: %s\nwant %s with reason containing %q", e.Code, e.Reason, code, reason)
	}
}

func TestVerifyLeeway(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	tok := mint(t, key, testClaims())
	exp, nbf := t0.Add(time.Hour), t0
	tests := []struct {
		leeway time.Duration
		now    time.Time
		reason string // "" for success
	}{
		{30 * time.Second, exp.Add(29 * time.Second), ""},
		{30 * time.Second, exp.Add(30 * time.Second), "expired"},
		{30 * time.Second, nbf.Add(-30 * time.Second), ""},
		{30 * time.Second, nbf.Add(-31 * time.Second), "not valid before"},
		{0, exp.Add(-time.Nanosecond), ""},
		{0, exp, "expired"},
		{0, nbf, ""},
		{0, nbf.Add(-time.Nanosecond), "not valid before"},
		{-time.Minute, exp.Add(-time.Second), ""}, // negative leeway counts as 0
		{-time.Minute, nbf, ""},
	}
	for _, tt := range tests {
		v := NewVerifier(VerifierConfig{
			Keys:     map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)},
			Audience: "kernel-1",
			Leeway:   tt.leeway,
		})
		_, err := v.Verify(tok, testBinding, tt.now)
		t.Run(tt.leeway.String()+"@"+tt.now.Format(time.RFC3339Nano), func(t *testing.T) {
			code := ""
			if tt.reason != "" {
				code = CodeInvalid
			}
			checkErr(t, err, code, tt.reason)
		})
	}
}

// TestVerifyCacheHit checks that a cached token is still checked against
// the call, the clock and the revocation list every time.
func TestVerifyCacheHit(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	tok := mint(t, key, testClaims())
	var mu sync.Mutex
	revoked := map[string]bool{}
	v := NewVerifier(VerifierConfig{
		Keys:     map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)},
		Audience: "kernel-1",
		Revoked: func(jti string) bool {
			mu.Lock()
			defer mu.Unlock()
			return revoked[jti]
		},
	})

	if _, err := v.Verify(tok, testBinding, t0); err != nil {
		t.Fatal(err)
	}
	if n := v.cache.len(); n != 1 {
		t.Fatalf("cache holds %d entries after one verification, want 1", n)
	}
	_, err := v.Verify(tok, testBinding, t0.Add(2*time.Hour))
	checkErr(t, err, CodeInvalid, "expired")
	_, err = v.Verify(tok, testBinding, t0.Add(-time.Minute))
	checkErr(t, err, CodeInvalid, "not valid before")
	_, err = v.Verify(tok, Binding{TokenID: "tok-1", AgentID: "agent-2"}, t0)
	checkErr(t, err, CodeInvalid, "does not match agent_id")
	_, err = v.Verify(tok, Binding{TokenID: "tok-2", AgentID: "agent-1"}, t0)
	checkErr(t, err, CodeInvalid, "does not match capability_token_id")

	mu.Lock()
	revoked["tok-1"] = true
	mu.Unlock()
	_, err = v.Verify(tok, testBinding, t0)
	checkErr(t, err, CodeRevoked, "is revoked")
	if n := v.cache.len(); n != 1 {
		t.Fatalf("cache holds %d entries, want 1: the refusals must have been cache hits", n)
	}
}

// TestVerifyCacheKeepsBadTokensBad checks that having verified a token does
// not make a tampered copy of it verify.
func TestVerifyCacheKeepsBadTokensBad(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	good := mint(t, key, testClaims())
	v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}, Audience: "kernel-1"})
	if _, err := v.Verify(good, testBinding, t0); err != nil {
		t.Fatal(err)
	}
	sig, _ := b64.DecodeString(part(good, 2))
	sig[0] ^= 0x80
	for name, bad := range map[string]string{
		"signature": part(good, 0) + "." + part(good, 1) + "." + b64.EncodeToString(sig),
		"payload": part(good, 0) + "." +
			b64.EncodeToString(editPayload(t, testClaims(), func(m map[string]any) { m["cap"].(map[string]any)["tools"] = []string{"*"} })) +
			"." + part(good, 2),
	} {
		_, err := v.Verify(bad, testBinding, t0)
		t.Run(name, func(t *testing.T) { checkErr(t, err, CodeInvalid, "signature does not verify") })
	}
}

// TestVerifyResultIsACopy checks that changing a returned token does not
// change what later verifications of the same token return.
func TestVerifyResultIsACopy(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	tok := mint(t, key, testClaims())
	v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}, Audience: "kernel-1"})
	for range 2 {
		got, err := v.Verify(tok, testBinding, t0)
		if err != nil {
			t.Fatal(err)
		}
		if got.AllowsTool("net.fetch") || got.Claims.Cap.Budgets[BudgetCalls] != 100 {
			t.Fatalf("verified claims %+v differ from the minted ones", got.Claims.Cap)
		}
		got.Claims.Cap.Tools[0] = "*"
		got.Claims.Cap.Budgets[BudgetCalls] = 1 << 40
	}
}

func TestVerifyConcurrent(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	const cacheSize = 32
	v := NewVerifier(VerifierConfig{
		Keys:      map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)},
		Audience:  "kernel-1",
		CacheSize: cacheSize,
	})
	// More tokens than the cache holds, so that entries are evicted.
	tokens := make([]string, 3*cacheSize)
	for i := range tokens {
		c := testClaims()
		c.ID = fmt.Sprintf("tok-%d", i)
		tokens[i] = mint(t, key, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for r := range 4 * len(tokens) {
				i := (r*7 + w) % len(tokens)
				if _, err := v.Verify(tokens[i], Binding{TokenID: fmt.Sprintf("tok-%d", i), AgentID: "agent-1"}, t0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := v.cache.len(); n > cacheSize {
		t.Fatalf("cache holds %d entries, over its bound of %d", n, cacheSize)
	}
}

func TestVerifyNoCache(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}, Audience: "kernel-1", CacheSize: -1})
	if v.cache != nil {
		t.Fatal("CacheSize -1 left a cache")
	}
	for range 2 {
		if _, err := v.Verify(mint(t, key, testClaims()), testBinding, t0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVerifyCopiesKeys checks that the Verifier keeps its own copy of the
// trusted keys.
func TestVerifyCopiesKeys(t *testing.T) {
	key, other := newKey(t), newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	keys := map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}
	v := NewVerifier(VerifierConfig{Keys: keys, Audience: "kernel-1", CacheSize: -1})
	keys[kid] = other.Public().(ed25519.PublicKey)
	keys[KeyID(other.Public().(ed25519.PublicKey))] = other.Public().(ed25519.PublicKey)
	if _, err := v.Verify(mint(t, key, testClaims()), testBinding, t0); err != nil {
		t.Fatal(err)
	}
	_, err := v.Verify(mint(t, other, testClaims()), testBinding, t0)
	checkErr(t, err, CodeInvalid, "not a trusted issuer key")
}

func TestVerifyMalformedTrustedKey(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: ed25519.PublicKey("short")}, Audience: "kernel-1"})
	_, err := v.Verify(mint(t, key, testClaims()), testBinding, t0)
	checkErr(t, err, CodeInvalid, "is not a 32-byte Ed25519 public key")
}

func TestVerifyBearer(t *testing.T) {
	key := newKey(t)
	v := NewVerifier(VerifierConfig{
		Keys:     map[string]ed25519.PublicKey{KeyID(key.Public().(ed25519.PublicKey)): key.Public().(ed25519.PublicKey)},
		Issuer:   "issuer-1",
		Audience: "kernel-1",
		Revoked:  func(jti string) bool { return jti == "tok-revoked" },
	})
	revoked := testClaims()
	revoked.ID = "tok-revoked"
	otherKernel := testClaims()
	otherKernel.Audience = "kernel-2"
	for _, tc := range []struct {
		name  string
		token string
		now   time.Time
		code  string // "" for success
	}{
		{"valid", mint(t, key, testClaims()), t0.Add(time.Minute), ""},
		{"expired", mint(t, key, testClaims()), t0.Add(2 * time.Hour), CodeInvalid},
		{"other audience", mint(t, key, otherKernel), t0, CodeInvalid},
		{"forged", mint(t, newKey(t), testClaims()), t0, CodeInvalid},
		{"revoked", mint(t, key, revoked), t0, CodeRevoked},
		{"garbage", "not.a.token", t0, CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := v.VerifyBearer(tc.token, tc.now)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("VerifyBearer: %v", err)
				}
				if tok.Claims.Subject != "agent-1" || tok.Claims.ID != "tok-1" {
					t.Fatalf("claims = %+v", tok.Claims)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Fatalf("VerifyBearer error = %v, want code %s", err, tc.code)
			}
		})
	}
}

// TestVerifyCacheKeys: a token of usual size is cached under itself, a
// long one under its digest (the cache holds no token of up to
// MaxTokenSize per entry); either way a second verification is a hit and
// the token's hash is its digest.
func TestVerifyCacheKeys(t *testing.T) {
	key := newKey(t)
	kid := KeyID(key.Public().(ed25519.PublicKey))
	long := testClaims()
	for i := range 200 {
		long.Cap.Net = append(long.Cap.Net, fmt.Sprintf("host-%03d.example.com", i))
	}
	for _, c := range []struct {
		name   string
		claims Claims
		long   bool
	}{{"usual", testClaims(), false}, {"long", long, true}} {
		t.Run(c.name, func(t *testing.T) {
			tok := mint(t, key, c.claims)
			if (len(tok) > maxTokenKey) != c.long {
				t.Fatalf("token of %d bytes", len(tok))
			}
			v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{kid: key.Public().(ed25519.PublicKey)}, Audience: "kernel-1"})
			for range 2 {
				got, err := v.Verify(tok, testBinding, t0)
				if err != nil {
					t.Fatal(err)
				}
				if got.Hash != digest.Sum([]byte(tok)) {
					t.Fatalf("hash %s, want the token's digest", got.Hash)
				}
			}
			if n := v.cache.len(); n != 1 {
				t.Fatalf("cache holds %d entries, want 1", n)
			}
			_, byToken := v.cache.get(tok)
			_, byDigest := v.cache.get(digest.Sum([]byte(tok)))
			if byToken == c.long || byDigest != c.long {
				t.Fatalf("cached under the token %v, under its digest %v", byToken, byDigest)
			}
		})
	}
}
