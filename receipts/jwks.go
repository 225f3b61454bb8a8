package receipts

import (
	"crypto"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jwk"
)

// JWKS returns a JWK Set (RFC 7517) publishing keys for receipt
// verification: each as an OKP/Ed25519 key with kid = its RFC 7638
// thumbprint, "use":"sig" and "alg":"EdDSA". Publish old keys beside the
// current one while receipts signed with them must still verify.
func JWKS(keys ...ed25519.PublicKey) ([]byte, error) {
	set := jwk.NewSet()
	for i, pub := range keys {
		k, err := publicJWK(pub)
		if err != nil {
			return nil, fmt.Errorf("receipts: JWKS key %d: %w", i, err)
		}
		if err := set.AddKey(k); err != nil {
			return nil, fmt.Errorf("receipts: JWKS key %d: %w", i, err)
		}
	}
	out, err := json.Marshal(set)
	if err != nil {
		return nil, fmt.Errorf("receipts: JWKS: %w", err)
	}
	return out, nil
}

func publicJWK(pub ed25519.PublicKey) (jwk.Key, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("Ed25519 public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	k, err := jwk.Import[jwk.Key](pub)
	if err != nil {
		return nil, err
	}
	kid, err := thumbprint(k)
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]any{
		jwk.KeyIDKey:     kid,
		jwk.KeyUsageKey:  jwk.ForSignature,
		jwk.AlgorithmKey: jwa.EdDSA(),
	} {
		if err := k.Set(name, v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	return k, nil
}

// keyID returns the kid of an Ed25519 public key.
func keyID(pub ed25519.PublicKey) (string, error) {
	k, err := publicJWK(pub)
	if err != nil {
		return "", fmt.Errorf("receipts: %w", err)
	}
	kid, _ := k.KeyID()
	return kid, nil
}

// thumbprint returns the RFC 7638 SHA-256 thumbprint of k, base64url.
func thumbprint(k jwk.Key) (string, error) {
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("JWK thumbprint: %w", err)
	}
	return b64.EncodeToString(tp), nil
}

// verificationKey returns the Ed25519 key that the JWKS document jwks
// publishes under kid, refusing keys that are not Ed25519 signature keys
// for EdDSA or whose thumbprint is not kid.
func verificationKey(jwks []byte, kid string) (ed25519.PublicKey, error) {
	set, err := parseJWKS(jwks)
	if err != nil {
		return nil, err
	}
	k, ok := set.LookupKeyID(kid)
	if !ok {
		return nil, fmt.Errorf("kid %q is not in the JWKS", kid)
	}
	return checkKey(k, kid)
}

// checkKey returns the Ed25519 public key of JWKS key k, published under
// kid, refusing a key that is not an Ed25519 signature key for EdDSA or
// whose thumbprint is not kid.
func checkKey(k jwk.Key, kid string) (ed25519.PublicKey, error) {
	if alg, ok := k.Algorithm(); ok && alg.String() != algEdDSA {
		return nil, fmt.Errorf("JWKS key %q is for alg %q, not %s", kid, alg, algEdDSA)
	}
	if use, ok := k.KeyUsage(); ok && use != string(jwk.ForSignature) {
		return nil, fmt.Errorf("JWKS key %q has use %q, not sig", kid, use)
	}
	pk, err := k.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("JWKS key %q: %w", kid, err)
	}
	pub, err := jwk.Export[ed25519.PublicKey](pk)
	if err != nil {
		return nil, fmt.Errorf("JWKS key %q is not an Ed25519 public key: %w", kid, err)
	}
	if tp, err := thumbprint(pk); err != nil || tp != kid {
		return nil, fmt.Errorf("JWKS key %q is not the key its kid names (thumbprint %s)", kid, tp)
	}
	return pub, nil
}

// PublicKey returns the key of a JWKS document that holds exactly one, as
// the kernel's does, checked as Verify checks the key it picks.
func PublicKey(jwks []byte) (ed25519.PublicKey, error) {
	set, err := parseJWKS(jwks)
	if err != nil {
		return nil, err
	}
	if set.Len() != 1 {
		return nil, fmt.Errorf("JWKS holds %d keys, want exactly one", set.Len())
	}
	k, _ := set.Key(0)
	kid, ok := k.KeyID()
	if !ok {
		return nil, errors.New("JWKS key has no kid")
	}
	return checkKey(k, kid)
}

// parseJWKS parses a JWKS document, refusing duplicate kids and a key
// whose "x" is not the one unpadded base64url text of its bytes (jwx
// decodes it leniently; the console's verifier refuses such a key too).
func parseJWKS(jwks []byte) (jwk.Set, error) {
	set, err := jwk.Parse(jwks, jwk.WithRejectDuplicateKID(true))
	if err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	var doc struct {
		Keys []struct {
			X *string `json:"x"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(jwks, &doc); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	for i, k := range doc.Keys {
		if k.X == nil {
			continue // not an OKP key: checkKey refuses it if it is the one used
		}
		if err := canonicalBase64URL([]byte(*k.X)); err != nil {
			return nil, fmt.Errorf("JWKS key %d: x %w", i+1, err)
		}
	}
	return set, nil
}
