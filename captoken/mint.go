package captoken

import (
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jwk"
	"github.com/lestrrat-go/jwx/v4/jws"
)

// headerType is the typ header parameter of every token.
const headerType = "JWT"

// KeyID returns the kid of an issuer public key: its RFC 7638 JWK
// thumbprint (SHA-256), base64url without padding. It returns "" if pub is
// not a 32-byte Ed25519 public key.
func KeyID(pub ed25519.PublicKey) string {
	if len(pub) != ed25519.PublicKeySize {
		return ""
	}
	k, err := jwk.Import[jwk.Key](pub)
	if err != nil {
		return ""
	}
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(tp)
}

// MaxFSRoots bounds the fs roots of a token Mint signs. A kernel opens
// every root of a token that makes a file call, two descriptors each, and
// keeps them open while its workspace is cached: the bound keeps one
// token's workspace a small share of what the kernel holds open.
const MaxFSRoots = 64

// Mint validates c and returns it as a token signed with key, with kid
// KeyID of key's public key. Times lose any fraction of a second. It fails
// if the token would be longer than MaxTokenSize, and, beyond Validate,
// if it grants more than MaxFSRoots fs roots or names one path in two of
// them (a path is granted once, in one mode). Verify holds tokens to
// Validate alone, so a token signed before these checks still verifies.
func Mint(key ed25519.PrivateKey, c Claims) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("captoken: mint: private key is %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	if err := c.Validate(); err != nil {
		return "", err
	}
	if err := checkFSRoots(c.Cap.FS); err != nil {
		return "", fmt.Errorf("captoken: mint: %w", err)
	}
	b, err := marshalClaims(c)
	if err != nil {
		return "", fmt.Errorf("captoken: mint: %w", err)
	}
	hdr := jws.NewHeaders()
	for name, v := range map[string]string{
		jws.KeyIDKey: KeyID(key.Public().(ed25519.PublicKey)),
		jws.TypeKey:  headerType,
	} {
		if err := hdr.Set(name, v); err != nil {
			return "", fmt.Errorf("captoken: mint: set header %s: %w", name, err)
		}
	}
	tok, err := jws.Sign(b, jws.WithKey(jwa.EdDSA(), key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", fmt.Errorf("captoken: mint: %w", err)
	}
	if len(tok) > MaxTokenSize {
		return "", fmt.Errorf("captoken: mint: token is %d bytes, over the %d-byte limit Verify accepts", len(tok), MaxTokenSize)
	}
	return string(tok), nil
}

// checkFSRoots refuses fs roots Mint does not sign: more than MaxFSRoots,
// or a path named twice, whatever the modes (which of two would count is
// a question no token needs to ask).
func checkFSRoots(roots []FSRoot) error {
	if len(roots) > MaxFSRoots {
		return fmt.Errorf("cap.fs holds %d roots; the limit is %d", len(roots), MaxFSRoots)
	}
	for i, r := range roots {
		for j := range i {
			if roots[j].Path == r.Path {
				return fmt.Errorf("cap.fs[%d] names %s, as cap.fs[%d] does: grant a path once, in one mode", i, r.Path, j)
			}
		}
	}
	return nil
}
