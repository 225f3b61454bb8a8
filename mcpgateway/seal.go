package mcpgateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaSeal, in a tools/call's _meta, seals the marks the gateway's
// transports set there (MetaRequestID, MetaInvalid, MetaRawMessage): an
// HMAC-SHA256 of them under a key the gateway draws at start and never
// sends. The gateway's handler takes those marks only under a seal that
// verifies, so no client sets them, whatever path its message took to
// the handler; the transports drop all four keys from a client's _meta.
const MetaSeal = "capkernel/seal"

// marks are what the transports tell the handler of a tools/call, each as
// it stands in _meta: its JSON-RPC id (as JSON, idJSON), and for a call
// whose message broke the strictjson rules the fault and the message in
// base64. Zero marks: nothing known, as for a call no transport tagged.
type marks struct {
	requestID, invalid, raw string
}

// sealer seals and verifies marks under the gateway's key.
type sealer struct {
	macs sync.Pool // of *sealMAC
}

// sealMAC is an HMAC-SHA256 under the key, with its scratch space (kept
// with it, so that sealing allocates only its result).
type sealMAC struct {
	h   hash.Hash
	buf []byte
}

func newSealer() *sealer {
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand)
	return &sealer{macs: sync.Pool{New: func() any { return &sealMAC{h: hmac.New(sha256.New, key)} }}}
}

// seal is m's seal: base64url of the HMAC of m's fields, each preceded
// by its length, so no two marks share an input.
func (s *sealer) seal(m marks) string {
	mac := s.macs.Get().(*sealMAC)
	mac.h.Reset()
	for _, f := range [...]string{m.requestID, m.invalid, m.raw} {
		mac.buf = append(binary.AppendUvarint(mac.buf[:0], uint64(len(f))), f...)
		mac.h.Write(mac.buf)
	}
	mac.buf = mac.h.Sum(mac.buf[:0])
	out := base64.RawURLEncoding.EncodeToString(mac.buf)
	if cap(mac.buf) > 4<<10 {
		mac.buf = nil // grown by a refused call's message: not kept
	}
	s.macs.Put(mac)
	return out
}

// marksOf returns the marks in meta when meta's seal verifies them, else
// zero marks: any mark a client set is ignored.
func (s *sealer) marksOf(meta mcp.Meta) marks {
	got, _ := meta[MetaSeal].(string)
	if got == "" {
		return marks{}
	}
	var m marks
	if v, ok := meta[MetaRequestID]; ok {
		m.requestID = idJSON(v)
	}
	m.invalid, _ = meta[MetaInvalid].(string)
	m.raw, _ = meta[MetaRawMessage].(string)
	if !hmac.Equal([]byte(got), []byte(s.seal(m))) {
		return marks{}
	}
	return m
}

// idJSON is a JSON-RPC id's JSON as the derived idempotency key holds
// it: the same for the id the transports read (string or int64) and the
// value the SDK decodes from the _meta they wrote (string or float64): an
// integer is written as the float64 the SDK reads (2^60 is
// 1152921504606847000), as keys were before the marks were sealed.
func idJSON(id any) string {
	if n, ok := id.(int64); ok {
		id = float64(n)
	}
	b, err := json.Marshal(id)
	if err != nil {
		return ""
	}
	return string(b)
}
