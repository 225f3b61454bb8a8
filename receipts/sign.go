package receipts

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/capkernel/capkernel/jcs"
)

// b64 is the base64url alphabet without padding that JWS uses (RFC 7515
// §2); Strict refuses encodings with non-zero trailing bits.
var b64 = base64.RawURLEncoding.Strict()

// Signer signs receipts with one Ed25519 key. It is safe for concurrent
// use.
type Signer struct {
	key    ed25519.PrivateKey
	kid    string
	header []byte // base64url of the protected header, the same for every receipt
	err    error  // why key cannot sign, if it cannot
}

// NewSigner returns a Signer for key. A malformed key (wrong length, or a
// public half that does not match its seed) does not fail here: KeyID
// returns "" and Sign returns the error.
func NewSigner(key ed25519.PrivateKey) *Signer {
	if len(key) != ed25519.PrivateKeySize {
		return &Signer{err: fmt.Errorf("receipts: Ed25519 private key is %d bytes, want %d", len(key), ed25519.PrivateKeySize)}
	}
	pub := ed25519.NewKeyFromSeed(key.Seed()).Public().(ed25519.PublicKey)
	if !bytes.Equal(pub, key[ed25519.SeedSize:]) {
		return &Signer{err: errors.New("receipts: Ed25519 private key's public half does not match its seed")}
	}
	kid, err := keyID(pub)
	if err != nil {
		return &Signer{err: err}
	}
	h := header{Alg: algEdDSA, Kid: kid, Typ: Type}
	return &Signer{
		key:    bytes.Clone(key),
		kid:    kid,
		header: b64.AppendEncode(nil, h.canonical()),
	}
}

// Public returns the signer's public key, nil if its key is malformed.
func (s *Signer) Public() ed25519.PublicKey {
	if s.err != nil {
		return nil
	}
	return bytes.Clone(s.key[ed25519.SeedSize:])
}

// KeyID returns the kid of the signer's public key: its RFC 7638 JWK
// thumbprint (SHA-256), base64url without padding.
func (s *Signer) KeyID() string { return s.kid }

// Sign returns r as a compact JWS: the header of the package comment, the
// RFC 8785 canonical JSON of r as payload and an Ed25519 signature. The
// result depends only on r and the key.
func (s *Signer) Sign(r *Receipt) (string, error) {
	if s.err != nil {
		return "", s.err
	}
	if r == nil {
		return "", errors.New("receipts: sign: nil receipt")
	}
	payload, err := jcs.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("receipts: sign receipt %q: %w", r.ReceiptID, err)
	}
	// Built here rather than with jws.Sign: the header is fixed, this runs
	// on every call, and jws.Sign adds time and allocations (compare
	// BenchmarkSign with BenchmarkSignJWX). TestJWXVerifiesSignature checks
	// that jwx verifies the result.
	n := len(s.header) + 1 + b64.EncodedLen(len(payload))
	jws := make([]byte, 0, n+1+b64.EncodedLen(ed25519.SignatureSize))
	jws = append(jws, s.header...)
	jws = append(jws, '.')
	jws = b64.AppendEncode(jws, payload)
	sig := ed25519.Sign(s.key, jws)
	jws = append(jws, '.')
	jws = b64.AppendEncode(jws, sig)
	return string(jws), nil
}
