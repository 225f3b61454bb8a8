package receipts

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jws"

	"github.com/capkernel/capkernel/jcs"
)

// maxJWS bounds the receipts Verify reads; real ones are about 1 KiB.
const maxJWS = 64 << 10

// Verify checks that jws is a receipt signed by a key in the JWKS document
// jwks and returns the receipt. It accepts only what a Signer produces: a
// compact JWS whose protected header is exactly alg EdDSA, typ Type and the
// kid of an Ed25519 key in jwks (whose thumbprint it must be), with a valid
// Ed25519 signature by that key, over a payload that is the canonical JSON
// of a Receipt with no unknown, missing or duplicate fields. The algorithm
// is pinned to EdDSA and the key chosen by kid from jwks alone; so none,
// HS*, keys embedded in the header and other tricks are refused.
func Verify(jws string, jwks []byte) (*Receipt, error) {
	r, err := verify([]byte(jws), jwks)
	if err != nil {
		return nil, fmt.Errorf("receipts: verify: %w", err)
	}
	return r, nil
}

func verify(compact, jwks []byte) (*Receipt, error) {
	r, _, err := verifyJWKS(compact, jwks)
	return r, err
}

// VerifyJWKS is Verify that also returns the key of jwks that signed the
// receipt (it signs the kernel's ledger checkpoints too).
func VerifyJWKS(jws string, jwks []byte) (*Receipt, ed25519.PublicKey, error) {
	r, pub, err := verifyJWKS([]byte(jws), jwks)
	if err != nil {
		return nil, nil, fmt.Errorf("receipts: verify: %w", err)
	}
	return r, pub, nil
}

func verifyJWKS(compact, jwks []byte) (r *Receipt, pub ed25519.PublicKey, err error) {
	r, err = verifyWith(compact, func(kid string) (ed25519.PublicKey, error) {
		pub, err = verificationKey(jwks, kid)
		return pub, err
	})
	return r, pub, err
}

// VerifyKey is Verify with the kernel's public key given directly instead
// of in a JWKS document: the header's kid must be pub's thumbprint. It
// spares a verifier of many receipts (a whole ledger) parsing the JWKS for
// each.
func VerifyKey(jws string, pub ed25519.PublicKey) (*Receipt, error) {
	kid, err := keyID(pub)
	if err != nil {
		return nil, fmt.Errorf("receipts: verify: %w", err)
	}
	r, err := verifyWith([]byte(jws), func(k string) (ed25519.PublicKey, error) {
		if k != kid {
			return nil, fmt.Errorf("kid %q is not the thumbprint %q of the given key", k, kid)
		}
		return pub, nil
	})
	if err != nil {
		return nil, fmt.Errorf("receipts: verify: %w", err)
	}
	return r, nil
}

// verifyWith checks compact with the key that key returns for its kid.
func verifyWith(compact []byte, key func(kid string) (ed25519.PublicKey, error)) (*Receipt, error) {
	if len(compact) > maxJWS {
		return nil, fmt.Errorf("receipt of %d bytes exceeds %d", len(compact), maxJWS)
	}
	parts := bytes.Split(compact, []byte("."))
	if len(parts) != 3 {
		return nil, fmt.Errorf("not a compact JWS (%d parts, want 3)", len(parts))
	}
	if err := canonicalParts(parts); err != nil {
		return nil, err
	}
	h, err := parseHeader(parts[0])
	if err != nil {
		return nil, err
	}
	pub, err := key(h.Kid)
	if err != nil {
		return nil, err
	}
	payload, err := jwsVerify(compact, pub)
	if err != nil {
		return nil, err
	}
	return decodePayload(payload)
}

// jwsVerify checks the signature with jwx, the algorithm pinned to EdDSA and
// the key to pub.
func jwsVerify(compact []byte, pub any) ([]byte, error) {
	payload, err := jws.Verify(compact, jws.WithKey(jwa.EdDSA(), pub))
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	return payload, nil
}

// Decode returns the payload of the compact JWS receipt without checking
// its signature, for listing receipts out of a ledger the caller already
// trusts. Anything that must hold up to a third party uses Verify.
func Decode(jws string) (*Receipt, error) {
	if len(jws) > maxJWS {
		return nil, fmt.Errorf("receipts: decode: receipt of %d bytes exceeds %d", len(jws), maxJWS)
	}
	parts := bytes.Split([]byte(jws), []byte("."))
	if len(parts) != 3 {
		return nil, fmt.Errorf("receipts: decode: not a compact JWS (%d parts, want 3)", len(parts))
	}
	if err := canonicalParts(parts); err != nil {
		return nil, fmt.Errorf("receipts: decode: %w", err)
	}
	payload, err := b64.AppendDecode(nil, parts[1])
	if err != nil {
		return nil, fmt.Errorf("receipts: decode: payload: %v", err)
	}
	r, err := decodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("receipts: decode: %w", err)
	}
	return r, nil
}

// canonicalParts refuses a compact JWS whose parts are not each the one
// unpadded base64url text of their bytes: Go's decoder skips CR and LF,
// and jwx's accepts padding and unused trailing bits set, so one signed
// receipt would otherwise verify under many texts (the console's verifier
// refuses them too).
func canonicalParts(parts [][]byte) error {
	for i, p := range parts {
		if err := canonicalBase64URL(p); err != nil {
			return fmt.Errorf("JWS part %d %w", i+1, err)
		}
	}
	return nil
}

// canonicalBase64URL refuses text that is not the one unpadded base64url
// spelling of the bytes it decodes to; its error reads after a subject.
func canonicalBase64URL(text []byte) error {
	if !isBase64URL(string(text)) && len(text) > 0 {
		return errors.New("is not unpadded base64url")
	}
	if _, err := b64.AppendDecode(nil, text); err != nil {
		return fmt.Errorf("is not canonical base64url: %v", err)
	}
	return nil
}

// decodePayload decodes a receipt and requires payload to be its canonical
// JSON, which refuses missing, duplicate and differently spelled fields
// and non-canonical numbers as well as unknown fields.
func decodePayload(payload []byte) (*Receipt, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var r Receipt
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("payload: %v", err)
	}
	c, err := jcs.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("payload: %v", err)
	}
	if !bytes.Equal(c, payload) {
		return nil, errors.New("payload is not the canonical JSON of a receipt (missing, duplicate or misspelled fields, or not canonical)")
	}
	return &r, nil
}
