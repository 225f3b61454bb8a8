package captoken

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jws"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/strictjson"
)

// MaxTokenSize is the length in bytes of the longest token Verify accepts.
const MaxTokenSize = 16 << 10

// DefaultCacheSize is the number of verified tokens a Verifier remembers
// when VerifierConfig.CacheSize is 0.
const DefaultCacheSize = 4096

// Error codes, named after the call error classes they become.
const (
	CodeInvalid = "token_invalid" // the token is malformed, forged, expired, or not for this call
	CodeRevoked = "token_revoked" // the token, or its parent, is revoked
)

// Error is the error Verify returns.
type Error struct {
	Code   string // CodeInvalid or CodeRevoked
	Reason string // what is wrong, as one short sentence
}

func (e *Error) Error() string {
	return "captoken: " + e.Code + ": " + e.Reason
}

func invalid(format string, args ...any) *Error {
	return &Error{Code: CodeInvalid, Reason: fmt.Sprintf(format, args...)}
}

// Binding is what a call envelope claims about its token: the token must
// have been issued to AgentID (sub) and have id TokenID (jti).
type Binding struct {
	TokenID string // the envelope's capability_token_id
	AgentID string // the envelope's agent_id
}

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Keys are the trusted issuer public keys by kid, which should be
	// KeyID of the key. NewVerifier copies the map.
	Keys map[string]ed25519.PublicKey
	// Issuer, if not empty, is the iss every token must carry.
	Issuer string
	// Audience is the aud every token must carry: this kernel's id. If it
	// is empty, no token verifies.
	Audience string
	// Leeway is the clock skew allowed when checking exp and nbf.
	// Negative means 0.
	Leeway time.Duration
	// Revoked, if not nil, reports whether the token with id jti is
	// revoked. It is called on every Verify, with the token's jti and,
	// for an attenuated token, with its parent's jti; revoking earlier
	// ancestors must be reflected in what it reports for those.
	Revoked func(jti string) bool
	// CacheSize bounds how many verified tokens the Verifier remembers so
	// as to skip parsing and the signature check on a repeat. 0 means
	// DefaultCacheSize; negative turns the cache off.
	CacheSize int
}

// A Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	keys     map[string]ed25519.PublicKey
	issuer   string
	audience string
	leeway   time.Duration
	revoked  func(string) bool
	cache    *sigCache
}

// NewVerifier returns a Verifier for cfg.
func NewVerifier(cfg VerifierConfig) *Verifier {
	keys := maps.Clone(cfg.Keys)
	for kid, k := range keys {
		keys[kid] = slices.Clone(k)
	}
	size := cfg.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	return &Verifier{
		keys:     keys,
		issuer:   cfg.Issuer,
		audience: cfg.Audience,
		leeway:   max(0, cfg.Leeway),
		revoked:  cfg.Revoked,
		cache:    newSigCache(size),
	}
}

// Token is a verified token.
type Token struct {
	Raw    string // the compact token as presented
	Hash   string // digest.Sum of Raw
	Claims Claims
}

// Verify checks token for a call bound to b at time now, and returns it
// verified. It refuses, with an *Error of Code CodeInvalid, a token that
// is longer than MaxTokenSize, is not a compact JWS, has a header other
// than alg EdDSA, typ JWT and the kid of a trusted key, does not verify
// with that key, has claims that are malformed or fail Claims.Validate,
// or is not valid for the call: expired (now at or after exp + leeway),
// not yet valid (now before nbf - leeway), aud other than the configured
// audience, iss other than the configured issuer, jti other than
// b.TokenID, or sub other than b.AgentID. It refuses a token that Revoked
// reports revoked, or whose parent it reports revoked, with Code
// CodeRevoked.
//
// Every error Verify returns is an *Error. The checks that depend only on
// the token's bytes are cached by the digest of those bytes; the checks
// against the configured issuer and audience, b, now and the revocation
// list run on every call.
func (v *Verifier) Verify(token string, b Binding, now time.Time) (*Token, error) {
	c, hash, err := v.claims(token)
	if err != nil {
		return nil, err
	}
	if err := v.checkCall(c, b, now); err != nil {
		return nil, err
	}
	return &Token{Raw: token, Hash: hash, Claims: c.clone()}, nil
}

// maxTokenKey is the longest token the cache keys by itself.
const maxTokenKey = 4 << 10

// claims returns the verified claims of token and its digest, from the
// cache when token was verified before.
func (v *Verifier) claims(token string) (Claims, string, *Error) {
	if len(token) > MaxTokenSize {
		return Claims{}, "", invalid("token is %d bytes, over the %d-byte limit", len(token), MaxTokenSize)
	}
	// A token is its own cache key (no digest per call), but for a long
	// one, keyed by its digest, so the cache holds kilobytes per entry at
	// most, not MaxTokenSize.
	key, hash := token, ""
	if len(token) > maxTokenKey {
		hash = digest.Sum([]byte(token))
		key = hash
	}
	if e, ok := v.cache.get(key); ok {
		return e.claims, e.hash, nil
	}
	c, err := v.verifySignature(token)
	if err != nil {
		return Claims{}, "", err
	}
	if hash == "" {
		hash = digest.Sum([]byte(token))
	}
	v.cache.put(key, verified{c, hash})
	return c, hash, nil
}

// VerifyBearer checks token as Verify does for a call bound to the token's
// own jti and sub: for a token presented as a bearer credential (listing
// the syscalls it may call) rather than inside a call envelope.
func (v *Verifier) VerifyBearer(token string, now time.Time) (*Token, error) {
	c, _, err := v.claims(token)
	if err != nil {
		return nil, err
	}
	return v.Verify(token, Binding{TokenID: c.ID, AgentID: c.Subject}, now)
}

// verifySignature checks everything about token that depends only on its
// bytes and the trusted keys, and returns its claims.
func (v *Verifier) verifySignature(token string) (Claims, *Error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, invalid("token is not a compact JWS (three base64url parts separated by dots)")
	}
	// Each part must be canonical unpadded base64url (Strict: unused
	// trailing bits zero). Otherwise the last character of the signature
	// could be changed in bits that decoding drops, giving one token many
	// spellings, and so many hashes.
	var header []byte
	for i, p := range parts {
		b, err := base64.RawURLEncoding.Strict().DecodeString(p)
		if err != nil {
			return Claims{}, invalid("token is not a compact JWS: a part is not canonical base64url")
		}
		if i == 0 {
			header = b
		}
	}
	// The header is read by jwx; it must be a document every reader reads
	// the same way (no duplicate parameter, valid UTF-8).
	if err := strictjson.Check(header); err != nil {
		return Claims{}, invalid("token header: %v", err)
	}
	msg, err := jws.Parse([]byte(token), jws.WithCompact())
	if err != nil {
		return Claims{}, invalid("token header is not a JSON object of valid JOSE parameters")
	}
	hdr := msg.Signatures()[0].ProtectedHeaders()
	// The algorithm is pinned here, never taken from the token: a token
	// naming "none", or HS256 keyed with the public key, stops at this check.
	if alg, _ := hdr.Algorithm(); alg != jwa.EdDSA() {
		return Claims{}, invalid("token alg %q is not allowed; only EdDSA is", short(alg.String()))
	}
	for _, name := range hdr.Keys() {
		if name != jws.AlgorithmKey && name != jws.KeyIDKey && name != jws.TypeKey {
			return Claims{}, invalid("token header parameter %q is not allowed", short(name))
		}
	}
	if typ, _ := hdr.Type(); typ != headerType {
		return Claims{}, invalid("token typ %q is not %s", short(typ), headerType)
	}
	kid, _ := hdr.KeyID()
	if kid == "" {
		return Claims{}, invalid("token header has no kid")
	}
	pub, ok := v.keys[kid]
	if !ok {
		return Claims{}, invalid("token kid %q is not a trusted issuer key", short(kid))
	}
	if len(pub) != ed25519.PublicKeySize {
		return Claims{}, invalid("trusted key %q is not a %d-byte Ed25519 public key", short(kid), ed25519.PublicKeySize)
	}
	payload, err := jws.VerifyCompactFast(pub, []byte(token), jwa.EdDSA())
	if err != nil {
		return Claims{}, invalid("token signature does not verify with the key of kid %q", short(kid))
	}
	c, err := unmarshalClaims(payload)
	if err != nil {
		return Claims{}, invalid("token claims are malformed: %v", err)
	}
	if err := c.validate(); err != nil {
		return Claims{}, invalid("token claims are invalid: %v", err)
	}
	return c, nil
}

// checkCall checks what must hold for c at this call and moment.
func (v *Verifier) checkCall(c Claims, b Binding, now time.Time) *Error {
	switch {
	case c.Audience != v.audience:
		return invalid("token audience %q is not this kernel (%q)", short(c.Audience), v.audience)
	case v.issuer != "" && c.Issuer != v.issuer:
		return invalid("token issuer %q is not the trusted issuer %q", short(c.Issuer), v.issuer)
	case c.ID != b.TokenID:
		return invalid("token jti %q does not match capability_token_id %q", short(c.ID), short(b.TokenID))
	case c.Subject != b.AgentID:
		return invalid("token sub %q does not match agent_id %q", short(c.Subject), short(b.AgentID))
	}
	return v.Current(c, now)
}

// Current checks what verification checks of claims c that can change
// with time: c is not expired, not before its start, and neither the token
// nor its parent nor another ancestor is revoked. The kernel checks it
// again before a call that waited for an approval runs.
func (v *Verifier) Current(c Claims, now time.Time) *Error {
	switch {
	case !now.Before(c.Expiry.Add(v.leeway)):
		return invalid("token expired at %s", c.Expiry.Format(time.RFC3339))
	case now.Before(c.NotBefore.Add(-v.leeway)):
		return invalid("token is not valid before %s", c.NotBefore.Format(time.RFC3339))
	}
	if v.revoked == nil {
		return nil
	}
	if v.revoked(c.ID) {
		return &Error{Code: CodeRevoked, Reason: fmt.Sprintf("token %q is revoked", short(c.ID))}
	}
	if c.Cap.Parent != "" && v.revoked(c.Cap.Parent) {
		return &Error{Code: CodeRevoked, Reason: fmt.Sprintf("token %q's parent %q is revoked", short(c.ID), short(c.Cap.Parent))}
	}
	for _, a := range c.Cap.Ancestors {
		if v.revoked(a.ID) {
			return &Error{Code: CodeRevoked, Reason: fmt.Sprintf("token %q's ancestor %q is revoked", short(c.ID), short(a.ID))}
		}
	}
	return nil
}

// short bounds the length of token-supplied text quoted in a Reason.
func short(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
