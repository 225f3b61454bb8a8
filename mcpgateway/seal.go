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
	macs sync.Pool // of hash.Hash: HMAC-SHA256 under the key
}

func newSealer() *sealer {
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand)
	return &sealer{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// seal is m's seal: base64url of the HMAC of m's fields, each preceded
// by its length, so no two marks share an input.
func (s *sealer) seal(m marks) string {
	h := s.macs.Get().(hash.Hash)
	h.Reset()
	var buf [binary.MaxVarintLen64]byte
	for _, f := range [...]string{m.requestID, m.invalid, m.raw} {
		h.Write(binary.AppendUvarint(buf[:0], uint64(len(f))))
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	out := base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0]))
	s.macs.Put(h)
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
