package httpapi

import (
	"encoding/json"
	"encoding/json/jsontext"
	"github.com/capkernel/capkernel/jcs"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// The result envelope of every call is encoded here, field by field, to
// exactly the bytes encoding/json makes of it (TestAppendResult compares
// the two on every field and FuzzAppendResult on arbitrary values): a call
// is answered on every request, and the generic encoder spent a tenth of
// the server's CPU on it, most of it escaping the receipt's entry string.
// What the plain paths below do not cover (a string with a character
// encoding/json escapes other than " \ and the common control
// characters, raw JSON that is not compact ASCII-safe, a float outside
// the plain decimal range) is handed to encoding/json for that one value,
// so the bytes stay its bytes; a value it refuses (a NaN, invalid raw
// JSON) makes appendResult report false, and the caller encodes the whole
// envelope with encoding/json to get its error.

// appendResult appends r's JSON encoding, as json.Marshal makes it, to b.
// ok is false when json.Marshal would fail on r.
func appendResult(b []byte, r *kernel.Result) (_ []byte, ok bool) {
	e := resultEncoder{b: b, ok: true}
	e.name(`{"tool_id":`)
	e.str(r.ToolID)
	e.name(`,"agent_id":`)
	e.str(r.AgentID)
	e.name(`,"operation_id":`)
	e.str(r.OperationID)
	e.name(`,"state_snapshot_id":`)
	e.str(r.StateSnapshotID)
	e.name(`,"status":`)
	e.str(r.Status)
	if len(r.Result) > 0 {
		e.name(`,"result":`)
		e.raw(r.Result)
	}
	if r.Error != nil {
		e.name(`,"error":{"class":`)
		e.str(r.Error.Class)
		e.name(`,"message":`)
		e.str(r.Error.Message)
		e.name(`}`)
	}
	e.name(`,"result_hash":`)
	e.str(r.ResultHash)
	if len(r.Provenance) > 0 {
		e.name(`,"provenance":`)
		e.raw(r.Provenance)
	}
	if r.TaskClass != "" {
		e.name(`,"task_class":`)
		e.str(r.TaskClass)
	}
	e.name(`,"autonomy_mode":`)
	e.str(r.AutonomyMode)
	e.name(`,"risk_score":`)
	e.float(r.RiskScore)
	e.name(`,"risk_basis":`)
	e.strs(r.RiskBasis)
	if len(r.Notes) > 0 {
		e.name(`,"notes":`)
		e.notes(r.Notes)
	}
	e.name(`,"tx_outcome":`)
	e.str(r.TxOutcome)
	if r.CommitDeltaID != "" {
		e.name(`,"commit_delta_id":`)
		e.str(r.CommitDeltaID)
	}
	if r.ReceiptID != "" {
		e.name(`,"receipt_id":`)
		e.str(r.ReceiptID)
	}
	if r.Receipt != nil {
		e.name(`,"receipt":`)
		e.logged(r.Receipt)
	}
	e.name(`,"ledger_seq":`)
	e.b = strconv.AppendUint(e.b, r.LedgerSeq, 10)
	e.name(`,"replayed":`)
	e.b = strconv.AppendBool(e.b, r.Replayed)
	if r.AuditSalt != "" {
		e.name(`,"audit_salt":`)
		e.str(r.AuditSalt)
	}
	e.name(`}`)
	return e.b, e.ok
}

// resultEncoder appends JSON to b; ok turns false, for good, when a value
// cannot be encoded.
type resultEncoder struct {
	b  []byte
	ok bool
}

// name appends s, JSON punctuation and member names written out above.
func (e *resultEncoder) name(s string) { e.b = append(e.b, s...) }

func (e *resultEncoder) logged(l *receipts.Logged) {
	e.name(`{"format":`)
	e.str(l.Format)
	e.name(`,"entry":`)
	e.str(l.Entry)
	e.name(`,"inclusion":`)
	e.inclusion(&l.Inclusion)
	e.name(`,"checkpoint":`)
	e.str(l.Checkpoint)
	e.name(`}`)
}

func (e *resultEncoder) inclusion(in *ledger.Inclusion) {
	e.name(`{"leaf_index":`)
	e.b = strconv.AppendUint(e.b, in.LeafIndex, 10)
	e.name(`,"tree_size":`)
	e.b = strconv.AppendUint(e.b, in.TreeSize, 10)
	e.name(`,"leaf_hash":`)
	e.str(in.LeafHash)
	e.name(`,"proof":`)
	e.strs(in.Proof)
	e.name(`}`)
}

// strs appends a []string: null when nil, as encoding/json does.
func (e *resultEncoder) strs(ss []string) {
	if ss == nil {
		e.name(`null`)
		return
	}
	e.b = append(e.b, '[')
	for i, s := range ss {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(s)
	}
	e.b = append(e.b, ']')
}

// str appends s as a JSON string. The plain path writes printable ASCII
// and DEL as they are but <, > and &, escapes " and \ and the control
// characters as encoding/json does (jcs.AppendEscapedByte), and copies any
// other valid UTF-8 character but U+2028 and U+2029; a string holding
// anything else is encoded by encoding/json.
func (e *resultEncoder) str(s string) {
	start := len(e.b)
	b := append(e.b, '"')
	for i := 0; i < len(s); {
		// A run of bytes copied as they are, in one append.
		j := i
		for j < len(s) && plain[s[j]] {
			j++
		}
		b = append(b, s[i:j]...)
		if i = j; i == len(s) {
			break
		}
		switch c := s[i]; {
		case c == '"' || c == '\\' || c < 0x20:
			b = jcs.AppendEscapedByte(b, c) // as encoding/json writes them
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRuneInString(s[i:])
			if (r == utf8.RuneError && n == 1) || r == '\u2028' || r == '\u2029' {
				e.b = e.marshal(b[:start], s)
				return
			}
			b = append(b, s[i:i+n]...)
			i += n
			continue
		default:
			e.b = e.marshal(b[:start], s)
			return
		}
		i++
	}
	e.b = append(b, '"')
}

// plain is the bytes str and raw copy as they are: printable ASCII and
// DEL but ", \, <, > and &.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// float appends f as encoding/json does: in plain decimal notation
// (strconv's shortest 'f' form) for 0 and magnitudes in [1e-6, 1e21).
func (e *resultEncoder) float(f float64) {
	if a := math.Abs(f); (f == 0 && !math.Signbit(f)) || (a >= 1e-6 && a < 1e21) {
		e.b = strconv.AppendFloat(e.b, f, 'f', -1, 64)
		return
	}
	e.b = e.marshal(e.b, f)
}

// raw appends raw JSON. It is copied as it is when it is valid JSON in
// valid UTF-8 (duplicate names allowed, as encoding/json allows them in
// raw JSON) that encoding/json copies unchanged, which keeps escapes as
// they are written: no white space outside strings, no <, > or &, no
// U+2028 or U+2029; anything else is encoded by encoding/json.
func (e *resultEncoder) raw(raw json.RawMessage) {
	if plainRaw(raw) && jsontext.Value(raw).IsValid(jsontext.AllowDuplicateNames(true)) {
		e.b = append(e.b, raw...)
		return
	}
	e.b = e.marshal(e.b, raw)
}

// plainRaw reports whether raw has none of the bytes raw does not copy.
// Whether raw is valid JSON is not its question.
func plainRaw(raw []byte) bool {
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if plain[c] && c != ' ' {
			continue
		}
		switch {
		case c == '"':
			inString = !inString
		case c == '\\':
			i++ // an escaped character never ends a string
		case c == ' ':
			if !inString {
				return false
			}
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(raw[i:])
			if (r == utf8.RuneError && n == 1) || r == '\u2028' || r == '\u2029' {
				return false
			}
			i += n - 1
		default:
			return false
		}
	}
	return true
}

// notes appends the notes object, its names in byte order as
// encoding/json sorts a map's keys; a name that is not plain ASCII hands
// the whole object to encoding/json, whose order is the reference.
func (e *resultEncoder) notes(m map[string]json.RawMessage) {
	names := make([]string, 0, len(m))
	for name := range m {
		for i := range len(name) {
			if name[i] < 0x20 || name[i] >= utf8.RuneSelf || name[i] == '"' || name[i] == '\\' || name[i] == '<' || name[i] == '>' || name[i] == '&' {
				e.b = e.marshal(e.b, m)
				return
			}
		}
		names = append(names, name)
	}
	slices.Sort(names)
	e.name(`{`)
	for i, name := range names {
		if i > 0 {
			e.name(`,`)
		}
		e.str(name)
		e.name(`:`)
		e.raw(m[name])
	}
	e.name(`}`)
}

// marshal appends encoding/json's encoding of v to b; after a failure b
// is returned as it was and the encoder is no longer ok.
func (e *resultEncoder) marshal(b []byte, v any) []byte {
	m, err := json.Marshal(v)
	if err != nil {
		e.ok = false
		return b
	}
	return append(b, m...)
}
