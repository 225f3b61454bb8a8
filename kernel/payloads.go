package kernel

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/b3"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
)

// An audit record's chained body holds commitments to what the call
// carried — its arguments, its result, the policy input and its context
// (provenance, notes, the approver's reason) — and the payloads live
// beside the chain, each its audit entry's attachment (ledger.Attach),
// where they can be erased without touching a hashed byte.
// docs/formats.md specifies the encoding; this file is its one
// implementation.

// Payload parts, in the order they are committed to.
const (
	PartArgs        = "args"
	PartResult      = "result"
	PartPolicyInput = "policy_input"
	PartContext     = "context"
)

// Parts lists every payload part.
var Parts = []string{PartArgs, PartResult, PartPolicyInput, PartContext}

// Audit depths (kernel.json audit.depth): what of a call's payload the
// kernel keeps beside its commitments.
const (
	DepthFull            = "full"             // every part and the salt
	DepthCommitmentsOnly = "commitments_only" // nothing: neither the parts nor the salt is stored
)

// RefusedArgsLimit is the most canonical bytes of args that the record
// of a call refused before the policy step, its token verified, keeps
// whole: larger args are kept in their digest form (argsDigestPart), as
// are the args of every call refused before its token verified.
const RefusedArgsLimit = 4 << 10

// SaltSize is the length in bytes of an audit record's salt.
const SaltSize = 32

// commitmentContext prefixes the BLAKE3 key-derivation context of a
// part's commitment key: "capkernel audit commitment v1 args", ….
const commitmentContext = "capkernel audit commitment v1 "

// Payload is what an audit record commits to, as kept beside the chain:
// the record's salt (64 lowercase hex digits) and each part kept, as
// canonical JSON. A part absent from a Payload was never there, was not
// kept (depth commitments_only) or was erased; the record's commitments
// and the ledger's erasure records say which.
type Payload struct {
	Salt        string          `json:"salt"`
	Args        json.RawMessage `json:"args,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	PolicyInput json.RawMessage `json:"policy_input,omitempty"`
	Context     json.RawMessage `json:"context,omitempty"`
}

// part returns the canonical bytes of part name, or nil.
func (p *Payload) part(name string) json.RawMessage {
	switch name {
	case PartArgs:
		return p.Args
	case PartResult:
		return p.Result
	case PartPolicyInput:
		return p.PolicyInput
	case PartContext:
		return p.Context
	}
	return nil
}

// Commitments are the commitments an audit record's body holds, one per
// part the call had ("" for a part it had not: no args in an undecodable
// envelope, no policy input before the policy step, no context).
type Commitments struct {
	Args        string `json:"args_commitment,omitempty"`
	Result      string `json:"result_commitment,omitempty"`
	PolicyInput string `json:"policy_input_commitment,omitempty"`
	Context     string `json:"context_commitment,omitempty"`
}

// of returns the commitment to part name.
func (c *Commitments) of(name string) string {
	switch name {
	case PartArgs:
		return c.Args
	case PartResult:
		return c.Result
	case PartPolicyInput:
		return c.PolicyInput
	case PartContext:
		return c.Context
	}
	return ""
}

// NewSalt returns a fresh random salt, hex encoded.
func NewSalt() string {
	var s [SaltSize]byte
	if _, err := rand.Read(s[:]); err != nil {
		// crypto/rand does not fail on Linux; a kernel without
		// randomness must not write guessable commitments.
		panic("capkernel: reading a random salt: " + err.Error())
	}
	return hex.EncodeToString(s[:])
}

// PartKey returns the key of part name's commitment under salt (hex):
// BLAKE3-derive_key("capkernel audit commitment v1 " + name, salt). A
// holder may hand out one part's key to let another party check that part
// alone: it opens no other part.
func PartKey(salt, name string) ([32]byte, error) {
	raw, err := decodeSalt(salt)
	if err != nil {
		return [32]byte{}, err
	}
	return partKey(&raw, name), nil
}

// decodeSalt decodes a hex salt of SaltSize bytes.
func decodeSalt(salt string) (raw [SaltSize]byte, err error) {
	if len(salt) != 2*SaltSize {
		return raw, fmt.Errorf("salt %q is not %d bytes of lowercase hex", salt, SaltSize)
	}
	// Lowercase only, as the kernel writes it (hex.Decode takes either
	// case): one salt has one spelling.
	if _, err := hex.Decode(raw[:], []byte(salt)); err != nil || strings.ToLower(salt) != salt {
		return raw, fmt.Errorf("salt %q is not %d bytes of lowercase hex", salt, SaltSize)
	}
	return raw, nil
}

// partContexts holds the derive_key context key of each part: deriving
// a part's key then hashes only the salt.
var partContexts = func() map[string]b3.Key {
	m := make(map[string]b3.Key, len(Parts))
	for _, name := range Parts {
		m[name] = b3.ContextKey(commitmentContext + name)
	}
	return m
}()

// partKey is PartKey for a decoded salt.
func partKey(raw *[SaltSize]byte, name string) [32]byte {
	ctx, ok := partContexts[name]
	if !ok {
		ctx = b3.ContextKey(commitmentContext + name)
	}
	return b3.DeriveKey(&ctx, raw[:])
}

// Commit returns the commitment to the canonical JSON bytes part under
// key: "blake3:" and the keyed BLAKE3-256 of part.
func Commit(key [32]byte, part []byte) string { return digest.Format(commit(key, part)) }

// commit is the keyed BLAKE3-256 of part under key.
func commit(key [32]byte, part []byte) [digest.Size]byte {
	if b3.Small(len(part)) {
		k := b3.KeyOf(&key)
		return b3.Keyed(&k, part)
	}
	h, err := blake3.NewKeyed(key[:])
	if err != nil {
		panic(err) // the key is 32 bytes
	}
	h.Write(part)
	var sum [digest.Size]byte
	h.Sum(sum[:0])
	return sum
}

// CommitPart returns the commitment to part name with bytes b under salt.
func CommitPart(salt, name string, b []byte) (string, error) {
	key, err := PartKey(salt, name)
	if err != nil {
		return "", err
	}
	return Commit(key, b), nil
}

// sealed is an audit record split for the ledger: its commitments and the
// payload to keep (nil for none), both computed before the transaction.
type sealed struct {
	commitments Commitments
	payload     []byte // the kept Payload as stored (packPayload); nil for none
}

// seal computes a's commitments under salt from the call's parts (each
// canonical JSON or nil) and encodes the payload depth keeps. noArgs, if
// not nil, is the policy input part without its "args" member, which is
// exactly the args part; known says whether the caller decided that (else
// marshalPayload decides it the slow way).
func seal(salt, depth string, parts map[string][]byte, noArgs []byte, known bool) (*sealed, error) {
	s := &sealed{}
	p := Payload{Salt: salt}
	raw, err := decodeSalt(salt)
	if err != nil {
		return nil, err
	}
	// The commitments' strings share one allocation, formatted on the
	// stack (for the four Parts).
	const width = len(digest.Prefix) + 2*digest.Size
	var buf [4 * width]byte
	all := buf[:0]
	for _, name := range Parts {
		if b := parts[name]; b != nil {
			sum := commit(partKey(&raw, name), b)
			all = hex.AppendEncode(append(all, digest.Prefix...), sum[:])
		}
	}
	strs := string(all)
	for _, name := range Parts {
		b := parts[name]
		if b == nil {
			continue
		}
		c := strs[:width]
		strs = strs[width:]
		switch name {
		case PartArgs:
			s.commitments.Args, p.Args = c, b
		case PartResult:
			s.commitments.Result, p.Result = c, b
		case PartPolicyInput:
			s.commitments.PolicyInput, p.PolicyInput = c, b
		case PartContext:
			s.commitments.Context, p.Context = c, b
		}
	}
	if depth == DepthCommitmentsOnly {
		// No payload: kept, the salt alone would let every reader of it
		// test guesses of a short part (a PIN, which of a known set of
		// files) against the record's public commitments. The agent
		// holds it in its envelope.
		return s, nil
	}
	if !known && p.Args != nil && p.PolicyInput != nil {
		b, err := marshalPayload(&p)
		if err != nil {
			return nil, err
		}
		s.payload = packPayload(b)
		return s, nil
	}
	n := len(p.Salt) + len(p.Args) + len(p.Result) + len(p.PolicyInput) + len(p.Context) + 128
	// The payload is packed into memory of its own: its JSON is scratch.
	bp := packBufs.Get().(*[]byte)
	js := appendPayload(slices.Grow((*bp)[:0], n), &p, noArgs)
	s.payload = packPayload(js)
	putBuf(bp, js)
	return s, nil
}

// storedPayload is a Payload as its entry's attachment holds it. The
// policy input copies the call's args; when its "args" member is exactly the args
// part it is stored without it and SharesArgs is set, which halves the
// payload of a write.
type storedPayload struct {
	Payload
	SharesArgs bool `json:"policy_input_shares_args,omitempty"`
}

// marshalPayload is the stored form of p: the canonical JSON of its
// storedPayload.
func marshalPayload(p *Payload) ([]byte, error) {
	sp := storedPayload{Payload: *p}
	if p.Args != nil && p.PolicyInput != nil {
		var in map[string]json.RawMessage
		if err := json.Unmarshal(p.PolicyInput, &in); err != nil {
			return nil, fmt.Errorf("policy input: %w", err)
		}
		if bytes.Equal(in["args"], p.Args) {
			delete(in, "args")
			b, err := json.Marshal(in)
			if err != nil {
				return nil, err
			}
			sp.PolicyInput, sp.SharesArgs = b, true
		}
	}
	b, err := json.Marshal(&sp)
	if err != nil {
		return nil, err
	}
	return jcs.Canonicalize(b)
}

// unmarshalPayload reads a stored payload back into its parts.
func unmarshalPayload(v []byte) (*Payload, error) {
	v, err := unpackPayload(v)
	if err != nil {
		return nil, err
	}
	var sp storedPayload
	if err := json.Unmarshal(v, &sp); err != nil {
		return nil, err
	}
	if sp.SharesArgs {
		var in map[string]json.RawMessage
		if err := json.Unmarshal(sp.PolicyInput, &in); err != nil {
			return nil, fmt.Errorf("policy input: %w", err)
		}
		in["args"] = sp.Args
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		if sp.PolicyInput, err = jcs.Canonicalize(b); err != nil {
			return nil, err
		}
	}
	return &sp.Payload, nil
}

// argsDigestPart is the digest form of the canonical args canon, which
// the args part of a refused call's record holds in their place
// (call.argsPart): the canonical JSON array ["blake3:<hex>",<size>] of
// their plain args_hash and their length in bytes. Args are an object, so
// the form is never a call's args.
func argsDigestPart(canon []byte) []byte {
	b := make([]byte, 0, len(digest.Prefix)+2*digest.Size+24)
	b = append(append(append(b, `["`...), digest.Sum(canon)...), `",`...)
	return append(strconv.AppendInt(b, int64(len(canon)), 10), ']')
}

// argsDigestOf reads an args part in its digest form: the args' digest,
// and whether it is that form (else it is the args).
func argsDigestOf(part []byte) (sum string, ok bool) {
	if len(part) == 0 || part[0] != '[' {
		return "", false
	}
	var v [2]json.RawMessage
	if json.Unmarshal(part, &v) != nil || json.Unmarshal(v[0], &sum) != nil {
		return "", false
	}
	return sum, true
}

// canonicalPart returns the canonical JSON of v, or nil for nil or an
// empty value.
func canonicalPart(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil || bytes.Equal(b, []byte("null")) {
		return nil, err
	}
	return jcs.Canonicalize(b)
}

// putPayload keeps the payload of the audit entry seq.
func putPayload(tx *bbolt.Tx, seq uint64, payload []byte) error {
	if payload == nil {
		return nil
	}
	// payload is the entry's own, never modified after: bbolt may keep it
	// until the commit without a copy.
	return ledger.Attach(tx, seq, payload)
}

// openedPayload is getPayload for readers that serve the payload (auditor
// views, exports, replays): each stored part must open its commitment
// among c, the audit record's, at depth, or it is an error. A damaged
// stored form can decode to other valid text; only the commitments tell,
// and a reader serves no part they do not vouch for.
func openedPayload(tx *bbolt.Tx, seq uint64, c Commitments, depth string) (*Payload, error) {
	if depth == DepthCommitmentsOnly {
		// Nothing is kept at that depth. Builds before fc670a8 stored the
		// salt alone there, which would let a reader test guesses of a
		// short part against the commitments: it is never served (an
		// erasure of the operation removes it).
		return nil, nil
	}
	p, err := getPayload(tx, seq)
	if err != nil || p == nil {
		return p, err
	}
	states := OpenPayload(c, depth, p, nil)
	for _, name := range Parts {
		if states[name] == PartMismatch {
			return nil, fmt.Errorf("payload of entry %d: part %s does not open its commitment (damaged or tampered with)", seq, name)
		}
	}
	return p, nil
}

// openedPayloadOf is openedPayload with the commitments of the audit
// record body.
func openedPayloadOf(tx *bbolt.Tx, seq uint64, body []byte) (*Payload, error) {
	c, depth, err := commitmentsOf(body)
	if err != nil {
		return nil, fmt.Errorf("audit record %d: %w", seq, err)
	}
	return openedPayload(tx, seq, c, depth)
}

// getPayload returns the stored payload of the audit entry seq, or nil
// when none is stored (never kept, or erased).
func getPayload(tx *bbolt.Tx, seq uint64) (*Payload, error) {
	v, err := ledger.Attachment(tx, seq)
	if err != nil || v == nil {
		return nil, err
	}
	p, err := unmarshalPayload(v)
	if err != nil {
		return nil, fmt.Errorf("payload of entry %d: %w", seq, err)
	}
	return p, nil
}

// PartState is what a verifier found for one part of one record.
type PartState string

// Part states.
const (
	PartMatches  PartState = "matches"  // kept, and it opens the commitment
	PartErased   PartState = "erased"   // an erasure record names it
	PartNotKept  PartState = "not_kept" // the record's depth keeps no parts
	PartAbsent   PartState = "absent"   // the call had no such part (no commitment)
	PartMismatch PartState = "mismatch" // kept, but it does not open the commitment: tampered
	PartMissing  PartState = "missing"  // committed and due, but neither kept nor erased: tampered
)

// OpenPayload checks payload p against the commitments c of a record kept
// at depth, erased naming the parts an erasure record removed. It returns
// each part's state; a Mismatch or Missing state means tampering.
func OpenPayload(c Commitments, depth string, p *Payload, erased map[string]bool) map[string]PartState {
	out := make(map[string]PartState, len(Parts))
	for _, name := range Parts {
		want := c.of(name)
		var got []byte
		if p != nil {
			got = p.part(name)
		}
		switch {
		case want == "" && got == nil:
			out[name] = PartAbsent
		case want == "":
			out[name] = PartMismatch // a part the record never committed to
		case got != nil:
			have, err := CommitPart(p.Salt, name, got)
			if err != nil || have != want {
				out[name] = PartMismatch
			} else {
				out[name] = PartMatches
			}
		case erased[name]:
			out[name] = PartErased
		case depth == DepthCommitmentsOnly:
			out[name] = PartNotKept
		default:
			out[name] = PartMissing
		}
	}
	return out
}

// commitmentsOf reads the commitments and depth of an audit entry's body.
func commitmentsOf(body []byte) (Commitments, string, error) {
	var b struct {
		Commitments
		Depth string `json:"payload_depth"`
	}
	err := json.Unmarshal(body, &b)
	return b.Commitments, b.Depth, err
}

// CheckPayload checks that the audit entry e commits to exactly the parts
// of p: what a payload's holder (the calling agent, with the salt from
// its result envelope, or an auditor) runs against a record or a receipt.
// Parts p leaves out are not checked; a part that does not open its
// commitment, or holds a number that is not the decimal of its canonical
// form (jcs.CanonicalizeExact), is an error naming it, and so is a salt
// not in lowercase hex. Args open a record that keeps their digest form
// (a refused call's, argsDigestPart) as well as that form itself does.
func CheckPayload(e ledger.Entry, p Payload) error {
	if e.Kind != ledger.KindAudit {
		return fmt.Errorf("entry %d is a %s entry, not an audit record", e.Seq, e.Kind)
	}
	c, _, err := commitmentsOf(e.Body)
	if err != nil {
		return fmt.Errorf("audit record %d: %w", e.Seq, err)
	}
	n := 0
	for _, name := range Parts {
		b := p.part(name)
		if b == nil {
			continue
		}
		n++
		// Exact: a number that reads as the double of another decimal
		// would open the commitment to that double (the kernel takes
		// none such in: envelope.go checkObject).
		canon, err := jcs.CanonicalizeExact(b)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		got, err := CommitPart(p.Salt, name, canon)
		if err != nil {
			return err
		}
		if want := c.of(name); got != want && name == PartArgs && canon[0] == '{' {
			got, _ = CommitPart(p.Salt, name, argsDigestPart(canon))
		}
		if want := c.of(name); got != want {
			return fmt.Errorf("audit record %d does not commit to this %s: commitment %q, the payload gives %s", e.Seq, name, want, got)
		}
	}
	if n == 0 {
		return fmt.Errorf("the payload holds no part to check against audit record %d", e.Seq)
	}
	return nil
}

// auditContext is the context part of an audit payload.
type auditContext struct {
	Provenance json.RawMessage            `json:"provenance,omitempty"`
	Notes      map[string]json.RawMessage `json:"notes,omitempty"`
	RiskBasis  []string                   `json:"risk_basis"`
}

// seal sets a's commitments under salt to args (canonical JSON, nil for
// none), the canonical result res, a's policy input and its context, and
// returns the payload depth keeps.
func (a *auditRecord) seal(salt, depth string, args, res []byte) (*sealed, error) {
	parts := map[string][]byte{PartArgs: args, PartResult: res}
	var (
		err    error
		noArgs []byte
		known  = true
	)
	if e := a.policyEnc; e != nil && e.in == a.PolicyInput && e.err == nil {
		parts[PartPolicyInput], noArgs, known = e.full, e.noArgs, e.known
	} else if a.PolicyInput != nil {
		if parts[PartPolicyInput], noArgs, known, err = policyPart(a.PolicyInput, args); err != nil {
			return nil, err
		}
	}
	ctx := auditContext{Provenance: a.Provenance, Notes: a.Notes, RiskBasis: a.RiskBasis}
	if ctx.RiskBasis == nil {
		ctx.RiskBasis = []string{}
	}
	if parts[PartContext], err = contextPart(&ctx); err != nil {
		return nil, err
	}
	s, err := seal(salt, depth, parts, noArgs, known)
	if err != nil {
		return nil, err
	}
	a.Commitments, a.PayloadDepth = s.commitments, depth
	return s, nil
}

// publicBody is a's ledger body: a without its private fields, which its
// commitments stand for. The error message is part of the result (the
// result commitment covers it); the plain args_hash and result_hash would
// confirm a guess of a short argument or result, so they stay out. The
// approver's identity and reason are the approval's, not the call's
// data, and stay public with the decision.
func (a *auditRecord) publicBody() *auditRecord {
	p := *a
	p.ArgsHash, p.ResultHash, p.Provenance, p.ErrorMessage, p.PolicyInput, p.Notes = "", "", nil, "", nil, nil
	p.RecoverySalt, p.RecoveryArgs, p.RiskBasis = "", nil, nil
	return &p
}

// argsID is what identifies the call's arguments in c's record: the args
// commitment (equal for a replay and its original, which share a salt), or
// the plain args_hash of a record from before commitments.
func (c *CallRecord) argsID() string {
	if c.PayloadDepth != "" {
		return c.Commitments.Args
	}
	return c.ArgsHash
}

// resultID is resultID's counterpart for the result.
func (c *CallRecord) resultID() string {
	if c.PayloadDepth != "" {
		return c.Commitments.Result
	}
	return c.ResultHash
}

// plainHashes returns the plain args_hash and result_hash of c's call: from
// its record before commitments, else from its payload ("" for a part
// erased or not kept, which then cannot be compared).
func (c *CallRecord) plainHashes(tx *bbolt.Tx) (args, result string, err error) {
	if c.PayloadDepth == "" {
		return c.ArgsHash, c.ResultHash, nil
	}
	p, err := openedPayload(tx, c.Seq, c.Commitments, c.PayloadDepth)
	if err != nil || p == nil {
		return "", "", err
	}
	if sum, ok := argsDigestOf(p.Args); ok {
		args = sum
	} else if p.Args != nil {
		args = digest.Sum(p.Args)
	}
	if p.Result != nil {
		result = digest.Sum(p.Result)
	}
	return args, result, nil
}

// openRecord decodes the audit entry e with its payload p (nil for none)
// into the whole record: the private fields back from the parts kept.
func openRecord(e ledger.Entry, p *Payload) (*auditRecord, error) {
	var a auditRecord
	if err := json.Unmarshal(e.Body, &a); err != nil {
		return nil, fmt.Errorf("audit record %d: %w", e.Seq, err)
	}
	if p == nil {
		return &a, nil
	}
	if sum, ok := argsDigestOf(p.Args); ok {
		a.ArgsHash = sum
	} else if p.Args != nil {
		a.ArgsHash = digest.Sum(p.Args)
	}
	if p.Result != nil {
		a.ResultHash = digest.Sum(p.Result)
		var res struct {
			Error *Error `json:"error"`
		}
		if err := json.Unmarshal(p.Result, &res); err != nil {
			return nil, fmt.Errorf("audit record %d: result: %w", e.Seq, err)
		}
		if res.Error != nil {
			a.ErrorMessage = res.Error.Message
		}
	}
	if p.PolicyInput != nil {
		if err := json.Unmarshal(p.PolicyInput, &a.PolicyInput); err != nil {
			return nil, fmt.Errorf("audit record %d: policy input: %w", e.Seq, err)
		}
	}
	if p.Context != nil {
		var c auditContext
		if err := json.Unmarshal(p.Context, &c); err != nil {
			return nil, fmt.Errorf("audit record %d: context: %w", e.Seq, err)
		}
		a.Provenance, a.Notes, a.RiskBasis = c.Provenance, c.Notes, c.RiskBasis
	}
	return &a, nil
}

// auditSalt returns the call's salt, choosing it now if none is yet: the
// call's audit record commits under it, and crash recovery audits the
// call under it too.
func (c *call) auditSalt() string {
	if c.salt == "" {
		c.salt = NewSalt()
	}
	return c.salt
}

// ResultPart returns the result part of r's audit record: the canonical
// {"status","result"} or {"status","error"} object its result commitment
// commits to and its result_hash hashes.
func ResultPart(r *Result) json.RawMessage { return resultCanonical(r, nil) }
