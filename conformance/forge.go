package conformance

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// Forged tokens: the suite makes them itself from a real token's claims,
// so no kernel code is needed to attack a kernel.

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// claimsOf decodes a compact JWT's claims without verifying it.
func claimsOf(tok string) map[string]any {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}

// signedByStranger re-signs tok's claims (edited by edit) with a fresh
// Ed25519 key the kernel never saw.
func signedByStranger(tok *Token, edit func(map[string]any)) *Token {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	pub := key.Public().(ed25519.PublicKey)
	h, _ := json.Marshal(map[string]string{"alg": "EdDSA", "kid": thumbprint(b64(pub)), "typ": "JWT"})
	c := claimsOf(tok.Token)
	if edit != nil {
		edit(c)
	}
	p, _ := json.Marshal(c)
	in := b64(h) + "." + b64(p)
	return &Token{Token: in + "." + b64(ed25519.Sign(key, []byte(in))), ID: tok.ID, AgentID: tok.AgentID}
}

// withClaims keeps tok's header and signature but swaps its claims.
func withClaims(tok *Token, edit func(map[string]any)) *Token {
	parts := strings.Split(tok.Token, ".")
	c := claimsOf(tok.Token)
	edit(c)
	p, _ := json.Marshal(c)
	return &Token{Token: parts[0] + "." + b64(p) + "." + parts[2], ID: tok.ID, AgentID: tok.AgentID}
}

// unsigned is tok's claims under {"alg":"none"} and no signature.
func unsigned(tok *Token) *Token {
	parts := strings.Split(tok.Token, ".")
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	return &Token{Token: b64(h) + "." + parts[1] + ".", ID: tok.ID, AgentID: tok.AgentID}
}
