// Package captoken mints and verifies capkernel's capability tokens: signed
// statements of which tools an agent may call, which files and hosts those
// calls may touch, how much they may spend, and how much autonomy they get.
//
// A token is a JWT (RFC 7519) in compact JWS form (RFC 7515), signed with an
// issuer's Ed25519 key. Its protected header is exactly
//
//	{"alg":"EdDSA","kid":"<kid>","typ":"JWT"}
//
// where kid is the RFC 7638 JWK thumbprint (SHA-256, base64url without
// padding) of the issuer's public key; see KeyID. Its payload holds the
// claims iss, sub (the agent id), aud (the kernel id, a single string), jti,
// iat, nbf and exp (NumericDate, whole seconds), and the private claim cap
// (a Capability). Mint writes the payload in that order, so the same claims
// and key always give the same token (Ed25519 signatures are deterministic).
//
// A Verifier accepts only what Mint writes: alg EdDSA (never "none", HS*, or
// any algorithm named by the token itself), a kid naming a trusted key, typ
// JWT, no other header parameters, every claim present, and no claim or cap
// field it does not know. Unknown fields are refused rather than ignored
// because a field that widens or narrows authority must never be silently
// dropped by an older verifier.
package captoken
