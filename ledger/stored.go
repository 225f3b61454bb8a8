package ledger

import (
	"fmt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/jsonpack"
	"github.com/capkernel/capkernel/jcs"
)

// A record is stored in the "ledger" bucket packed (internal/jsonpack):
// the same JSON, member by member, in about half the bytes, with the
// entry and prev hashes, the seq and the time in binary. Everything that
// is hashed, exported or handed out (receipts) is the record's JSON, which
// loadRecord gives back byte for byte; a ledger written before packing
// holds the JSON itself, which loadRecord returns as is. docs/formats.md
// ("Storage encoding") specifies the packed form.

// packBody returns the tokens of the canonical body c for packRecord, or
// nil when c does not pack (its record is then stored as JSON). It runs
// before the transaction, with the canonicalization.
func packBody(c []byte) []byte {
	p, ok := jsonpack.AppendValue(make([]byte, 0, len(c)*2/3), c)
	if !ok {
		return nil
	}
	return p
}

// packRecord appends the stored form of e's record (appendRecord) given
// its body's tokens: the members in the record's order, the body's tokens
// packed beforehand, the hashes as 32 raw bytes each.
func packRecord(dst []byte, e *Entry, body []byte, sum, prev *[32]byte) []byte {
	dst = jsonpack.AppendObject(append(dst, jsonpack.Tag))
	dst = append(jsonpack.AppendName(dst, "body"), body...)
	dst = jsonpack.AppendDigest(jsonpack.AppendName(dst, "entry_hash"), sum)
	dst = jsonpack.AppendString(jsonpack.AppendName(dst, "kind"), e.Kind)
	dst = jsonpack.AppendDigest(jsonpack.AppendName(dst, "prev_hash"), prev)
	dst = jsonpack.AppendUint(jsonpack.AppendName(dst, "seq"), e.Seq)
	dst = jsonpack.AppendString(jsonpack.AppendName(dst, "time"), e.Time)
	return jsonpack.AppendEnd(dst)
}

// storedRecord returns the value to store for e: packed, appended to dst,
// when the body packed, else the record's JSON rec.
func storedRecord(dst []byte, e *Entry, body Body, sum, prev *[32]byte, rec []byte) []byte {
	if body.packed == nil {
		return rec
	}
	return packRecord(dst, e, body.packed, sum, prev)
}

// storedLen is the room storedRecord needs in dst: enough for the packed
// record (the body's tokens and at most 160 bytes around them), none when
// it stores rec.
func storedLen(body Body) int {
	if body.packed == nil {
		return 0
	}
	return len(body.packed) + 160
}

// loadRecord appends the record (its canonical JSON, as exported) of the
// stored value v to dst: every reader of the "ledger" bucket goes through
// it. A packed value that does not unpack is an error: the record was
// damaged or tampered with.
func loadRecord(dst, v []byte) ([]byte, error) {
	b, err := jsonpack.Unpack(dst, v)
	if err != nil {
		return dst, fmt.Errorf("undecodable record: %v", err)
	}
	return b, nil
}

// names are the dictionary names of a record's members.
var names = func() (n struct{ body, entryHash, kind, prevHash, seq, time jsonpack.Name }) {
	for _, m := range []struct {
		name string
		to   *jsonpack.Name
	}{{"body", &n.body}, {"entry_hash", &n.entryHash}, {"kind", &n.kind}, {"prev_hash", &n.prevHash}, {"seq", &n.seq}, {"time", &n.time}} {
		var ok bool
		if *m.to, ok = jsonpack.DictName(m.name); !ok {
			panic("ledger: " + m.name + " is not in jsonpack's dictionary")
		}
	}
	return n
}()

// unpackRecord appends the record of the packed stored value v to dst and
// parses it into r, as loadRecord and parseRecord do, taking the hashes,
// time and seq from the packed tokens instead of parsing their text again
// (the text it writes from them is well-formed by construction). It
// handles the layout packRecord writes; on anything else, and on any
// failure, it reports false and verification takes the general path,
// whose result is the reference. The body's canonical form is checked
// while it is unpacked (jsonpack.ObjectReader.CanonicalValue), and with
// jcs.CheckCanonical only where that cannot vouch for it. On true, rec is the record, at the end of
// out.
func unpackRecord(r *record, dst, v []byte) (out, rec []byte, ok bool) {
	rd, ok := jsonpack.NewObjectReader(dst, v)
	if !ok {
		return dst, nil, false
	}
	start := len(dst)
	at := func() int { return len(rd.Out()) - start }
	if !rd.Member(names.body) {
		return dst, nil, false
	}
	bodyAt := at()
	ok, canonical := rd.CanonicalValue()
	if !ok {
		return dst, nil, false
	}
	r.hashAt = at()
	if !rd.Member(names.entryHash) || !rd.Digest(&r.hash) {
		return dst, nil, false
	}
	r.hashEnd = at()
	kindAt := at()
	if !rd.Member(names.kind) || !rd.Value() {
		return dst, nil, false
	}
	prevAt := at()
	if !rd.Member(names.prevHash) || !rd.Digest(&r.prev) {
		return dst, nil, false
	}
	seqAt := at()
	if !rd.Member(names.seq) || !rd.Value() {
		return dst, nil, false
	}
	timeAt := at()
	if !rd.Member(names.time) || !rd.Time(9) || !rd.End() {
		return dst, nil, false
	}
	out = rd.Out()
	rec = out[start:]
	r.body = rec[len(recHead):r.hashAt]
	r.hashHex = rec[r.hashEnd-1-len(digest.Prefix)-hexDigestLen : r.hashEnd-1]
	r.prevHex = rec[seqAt-1-len(digest.Prefix)-hexDigestLen : seqAt-1]
	r.time = rec[len(rec)-len(recEnd)-timeLen : len(rec)-len(recEnd)]
	// The kind and seq came from tokens of any type: check their text.
	kind := rec[kindAt+len(`,"kind":`) : prevAt]
	if len(kind) < 2 || kind[0] != '"' || kind[len(kind)-1] != '"' {
		return dst, nil, false
	}
	r.kind = kind[1 : len(kind)-1]
	if checkKind(alias(r.kind)) != nil {
		return dst, nil, false
	}
	digits := rec[seqAt+len(`,"seq":`) : timeAt]
	if len(digits) == 0 || len(digits) > 16 || len(digits) > 1 && digits[0] == '0' {
		return dst, nil, false
	}
	r.seq = 0
	for _, d := range digits {
		if d < '0' || d > '9' {
			return dst, nil, false
		}
		r.seq = r.seq*10 + uint64(d-'0')
	}
	// The body's canonical form: vouched for by the decoder where it can,
	// else checked here as parseRecord does.
	if r.seq > maxSeq || bodyAt != len(recHead) || r.body[0] != '{' || !canonical && jcs.CheckCanonical(r.body) != nil {
		return dst, nil, false
	}
	return out, rec, true
}
