package receipts

import (
	"crypto"
	"crypto/ed25519"
	"encoding/json"
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
	"errors"
	"fmt"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jwk"

	"github.com/capkernel/capkernel/strictjson"
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
// publishes under kid (signatureKeys).
func verificationKey(jwks []byte, kid string) (ed25519.PublicKey, error) {
	keys, err := signatureKeys(jwks)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if k.kid == kid {
			return k.pub, nil
		}
	}
	return nil, fmt.Errorf("kid %q is not in the JWKS as an Ed25519 signature key", kid)
}

// PublicKey returns the Ed25519 key of a JWKS document that holds exactly
// one (signatureKeys), as the kernel's does.
func PublicKey(jwks []byte) (ed25519.PublicKey, error) {
	keys, err := signatureKeys(jwks)
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("JWKS holds %d Ed25519 signature keys, want exactly one", len(keys))
	}
	return keys[0].pub, nil
}

// SignatureKeys returns the Ed25519 signature keys of a JWKS document by
// kid, read by the rule of docs/formats.md ("The kernel's JWKS") that
// VerifyLogged applies (signatureKeys): an error for a document the rule
// refuses, else at least one key.
func SignatureKeys(jwks []byte) (map[string]ed25519.PublicKey, error) {
	keys, err := signatureKeys(jwks)
	if err != nil {
		return nil, fmt.Errorf("receipts: %w", err)
	}
	out := make(map[string]ed25519.PublicKey, len(keys))
	for _, k := range keys {
		out[k.kid] = k.pub
	}
	return out, nil
}

// jwksKey is an Ed25519 signature key of a JWKS document.
type jwksKey struct {
	kid string
	pub ed25519.PublicKey
}

// signatureKeys returns the Ed25519 signature keys of a JWKS document by
// the rule of docs/formats.md ("The kernel's JWKS"), which the console's
// verifier applies too:
//
//   - the document is strict JSON (strictjson.Check) holding an object
//     whose "keys" is an array of objects; other members are ignored;
//   - a key whose kty is not "OKP", whose crv is not "Ed25519", that has
//     a use other than "sig" or an alg other than "EdDSA" is not one:
//     it is skipped unread (an ES256 key beside the kernel's, say);
//   - every Ed25519 signature key must be well formed, or the document is
//     refused: x the unpadded base64url of 32 bytes, spelled canonically;
//     kid its RFC 7638 thumbprint; no "d" (a private key published);
//   - no two of them have the same kid, and there is at least one.
func signatureKeys(jwks []byte) ([]jwksKey, error) {
	if err := strictjson.Check(jwks); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	var doc struct {
		Keys *[]map[string]jsontext.Value `json:"keys"`
	}
	if err := jsonv2.Unmarshal(jwks, &doc); err != nil {
		return nil, fmt.Errorf("JWKS: %v", err)
	}
	if doc.Keys == nil {
		return nil, errors.New("JWKS: no keys array")
	}
	var out []jwksKey
	for i, m := range *doc.Keys {
		if m == nil {
			return nil, fmt.Errorf("JWKS key %d is not an object", i+1)
		}
		kty, _ := member(m, "kty")
		crv, _ := member(m, "crv")
		use, hasUse := member(m, "use")
		alg, hasAlg := member(m, "alg")
		// A member that is not a string reads as "": not the value wanted.
		if kty != "OKP" || crv != "Ed25519" || hasUse && use != "sig" || hasAlg && alg != algEdDSA {
			continue
		}
		k, err := ed25519Key(m)
		if err != nil {
			return nil, fmt.Errorf("JWKS key %d: %w", i+1, err)
		}
		for _, o := range out {
			if o.kid == k.kid {
				return nil, fmt.Errorf("JWKS keys %q: two Ed25519 keys have this kid", k.kid)
			}
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil, errors.New("the JWKS holds no Ed25519 signature key")
	}
	return out, nil
}

// member returns the value of member name of the JWK m if it is a string
// ("" if not), and whether m has the member.
func member(m map[string]jsontext.Value, name string) (string, bool) {
	v, ok := m[name]
	var s string
	if ok && v.Kind() == '"' {
		_ = jsonv2.Unmarshal(v, &s) // a valid string: strictjson.Check passed
	}
	return s, ok
}

// ed25519Key checks the JWK m of an Ed25519 signature key.
func ed25519Key(m map[string]jsontext.Value) (jwksKey, error) {
	if _, ok := m["d"]; ok {
		return jwksKey{}, errors.New("holds a private key (d)")
	}
	x, _ := member(m, "x")
	if x == "" {
		return jwksKey{}, errors.New("has no x string")
	}
	if err := canonicalBase64URL([]byte(x)); err != nil {
		return jwksKey{}, fmt.Errorf("x %w", err)
	}
	pub, _ := b64.AppendDecode(nil, []byte(x))
	if len(pub) != ed25519.PublicKeySize {
		return jwksKey{}, fmt.Errorf("x is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	kid, _ := member(m, "kid")
	want, err := keyID(pub)
	if err != nil {
		return jwksKey{}, err
	}
	if kid != want {
		return jwksKey{}, fmt.Errorf("kid %q is not the key's thumbprint %s", kid, want)
	}
	return jwksKey{kid: kid, pub: pub}, nil
}
