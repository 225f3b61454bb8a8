package receipts

import (
	"encoding/json"
	"fmt"
)

const algEdDSA = "EdDSA"

// header is a receipt's JWS protected header.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	Typ string `json:"typ"`
}

// canonical returns the header's RFC 8785 form. Its values are plain ASCII
// without characters JSON escapes (a kid is base64url), so concatenation
// yields canonical JSON.
func (h header) canonical() []byte {
	return []byte(`{"alg":"` + h.Alg + `","kid":"` + h.Kid + `","typ":"` + h.Typ + `"}`)
}

// parseHeader decodes a base64url protected header and accepts only what a
// Signer writes: alg EdDSA, typ Type, a kid, no other parameters (no crit,
// jwk, jku, b64 …), canonical JSON.
func parseHeader(enc []byte) (header, error) {
	raw, err := b64.AppendDecode(nil, enc)
	if err != nil {
		return header{}, fmt.Errorf("header is not base64url: %v", err)
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return header{}, fmt.Errorf("header is not a JSON object: %v", err)
	}
	switch {
	case h.Alg != algEdDSA:
		return header{}, fmt.Errorf("alg %q is not allowed (only %s)", h.Alg, algEdDSA)
	case h.Typ != Type:
		return header{}, fmt.Errorf("typ %q, want %q", h.Typ, Type)
	case !isBase64URL(h.Kid):
		return header{}, fmt.Errorf("kid %q is not a JWK thumbprint", h.Kid)
	case string(raw) != string(h.canonical()):
		// Quoted: the header's strings may hold bidirectional or C1
		// characters, and the message reaches terminals.
		return header{}, fmt.Errorf("header %q has parameters other than alg, kid and typ, or is not canonical JSON", raw)
	}
	return h, nil
}

func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return len(s) > 0
}
