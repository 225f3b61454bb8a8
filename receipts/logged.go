package receipts

import (
	"crypto/ed25519"
	jsonv2 "encoding/json/v2"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/strictjson"
)

// Format is the format tag of a receipt proven by the log, the receipt of
// every call since the kernel stopped signing one JWS per call.
const Format = "capkernel-receipt/v2"

// Logged is a receipt proven by the log: the call's audit entry, its
// inclusion proof, and the signed checkpoint of the tree the proof leads
// to. The kernel signs one checkpoint per group commit instead of one
// receipt per call; the checkpoint's Ed25519 signature, over the Merkle
// root that the entry is proven to be under, is the receipt's signature.
// It shows more than a signed statement would: that the call is in the
// history the kernel signed. VerifyLogged checks it with the kernel's
// public key alone.
type Logged struct {
	Format     string           `json:"format"`     // Format
	Entry      string           `json:"entry"`      // the audit entry's stored record: its exact canonical JSON, as a string
	Inclusion  ledger.Inclusion `json:"inclusion"`  // of the entry in the checkpoint's tree
	Checkpoint string           `json:"checkpoint"` // C2SP signed note
}

// ID returns the receipt id of the audit entry seq whose entry hash is
// hash ("blake3:<hex>"): "r<seq>-<the first 16 hex digits of the hash>".
// It names the entry and checks it, so a lookup needs no index.
func ID(seq uint64, hash string) string {
	h := strings.TrimPrefix(hash, "blake3:")
	if len(h) > 16 {
		h = h[:16]
	}
	return "r" + strconv.FormatUint(seq, 10) + "-" + h
}

// ParseID reads a receipt id made by ID: the entry's seq and the hash
// prefix it must have. ok is false for anything else (such as the UUID
// ids of JWS receipts).
func ParseID(id string) (seq uint64, hashPrefix string, ok bool) {
	rest, found := strings.CutPrefix(id, "r")
	if !found {
		return 0, "", false
	}
	n, h, found := strings.Cut(rest, "-")
	if !found || len(h) != 16 || strings.Trim(h, "0123456789abcdef") != "" {
		return 0, "", false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || strconv.FormatUint(seq, 10) != n {
		return 0, "", false
	}
	return seq, "blake3:" + h, true
}

// Summarize returns what the audit entry e says about its call, in the
// fields of a JWS receipt: ReceiptID is ID(e.Seq, e.Hash), IssuedAt the
// entry's time, LedgerSeq and LedgerEntryHash the entry's. It checks
// neither the entry's hash nor its place in the ledger. The body's members
// are matched to Receipt's fields by exact name; one that names a field
// must be of its type (null reads as none), others are ignored.
func Summarize(e ledger.Entry) (*Receipt, error) {
	if e.Kind != ledger.KindAudit {
		return nil, fmt.Errorf("receipts: entry %d is a %q entry, not an audit record", e.Seq, e.Kind)
	}
	var r Receipt
	// encoding/json/v2: names match exactly ("TOOL_ID" is not tool_id), as
	// the console's verifier reads them.
	if err := jsonv2.Unmarshal(e.Body, &r); err != nil {
		return nil, fmt.Errorf("receipts: audit record %d: %w", e.Seq, err)
	}
	r.ReceiptID, r.LedgerSeq, r.LedgerEntryHash, r.IssuedAt = ID(e.Seq, e.Hash), e.Seq, e.Hash, e.Time
	return &r, nil
}

// Proven is what VerifyLogged established.
type Proven struct {
	Entry      ledger.Entry      // the audit entry, its hash recomputed
	Receipt    *Receipt          // Summarize(Entry)
	Checkpoint ledger.Checkpoint // signed by Key
	Key        ed25519.PublicKey // the JWKS key that signed the checkpoint
}

// VerifyLogged checks a receipt proven by the log (the JSON of a Logged)
// with nothing but jwks, the kernel's JWKS document:
//
//  1. it is exactly a Logged object (strictjson: no unknown or duplicate
//     members; every member present and not null) of format Format;
//  2. entry is exactly the canonical record of a well-formed ledger entry
//     whose entry_hash recomputes (ledger.ParseEntry), of kind audit, whose
//     body Summarize reads (its receipt fields of their types);
//  3. checkpoint is a C2SP signed note with a valid Ed25519 signature, under
//     the key name equal to its origin, by an Ed25519 signature key of
//     jwks (signatureKeys), of a size at most 2^53-1;
//  4. the inclusion proof is for the entry (leaf_index = seq, leaf_hash =
//     entry_hash) in the checkpoint's tree (tree_size = its size) and
//     leads to its root (RFC 9162 §2.1.3.2).
func VerifyLogged(raw, jwks []byte) (*Proven, error) {
	p, err := verifyLogged(raw, jwks)
	if err != nil {
		return nil, fmt.Errorf("receipts: verify: %w", err)
	}
	return p, nil
}

// wireLogged is a Logged as read: every member required, none null (a
// missing or null leaf_index or proof must not read as 0 or empty, which
// the console's verifier could not agree with).
type wireLogged struct {
	Format    *string `json:"format"`
	Entry     *string `json:"entry"`
	Inclusion *struct {
		LeafIndex *uint64   `json:"leaf_index"`
		TreeSize  *uint64   `json:"tree_size"`
		LeafHash  *string   `json:"leaf_hash"`
		Proof     *[]string `json:"proof"`
	} `json:"inclusion"`
	Checkpoint *string `json:"checkpoint"`
}

// decodeLogged reads a Logged from its JSON by strictjson, every member
// present and not null.
func decodeLogged(raw []byte) (Logged, error) {
	var w wireLogged
	if err := strictjson.Unmarshal(raw, &w); err != nil {
		return Logged{}, fmt.Errorf("receipt: %v", err)
	}
	in := w.Inclusion
	if w.Format == nil || w.Entry == nil || in == nil || w.Checkpoint == nil {
		return Logged{}, errors.New("receipt: format, entry, inclusion and checkpoint are required and not null")
	}
	if in.LeafIndex == nil || in.TreeSize == nil || in.LeafHash == nil || in.Proof == nil {
		return Logged{}, errors.New("receipt: inclusion's leaf_index, tree_size, leaf_hash and proof are required and not null")
	}
	return Logged{
		Format:     *w.Format,
		Entry:      *w.Entry,
		Inclusion:  ledger.Inclusion{LeafIndex: *in.LeafIndex, TreeSize: *in.TreeSize, LeafHash: *in.LeafHash, Proof: *in.Proof},
		Checkpoint: *w.Checkpoint,
	}, nil
}

// maxExact bounds the tree sizes a receipt may name: every integer up to
// 2^53-1 is exact in every JSON reader (RFC 8785 numbers are doubles),
// as ledger sequence numbers are.
const maxExact = 1<<53 - 1

func verifyLogged(raw, jwks []byte) (*Proven, error) {
	l, err := decodeLogged(raw)
	if err != nil {
		return nil, err
	}
	if l.Format != Format {
		return nil, fmt.Errorf("receipt format %q, want %q", l.Format, Format)
	}
	e, err := ledger.ParseEntry([]byte(l.Entry))
	if err != nil {
		return nil, err
	}
	r, err := Summarize(e)
	if err != nil {
		return nil, err
	}
	cp, pub, err := openCheckpoint([]byte(l.Checkpoint), jwks)
	if err != nil {
		return nil, err
	}
	if cp.Size > maxExact {
		return nil, fmt.Errorf("the checkpoint's size %d exceeds %d", cp.Size, uint64(maxExact))
	}
	in := l.Inclusion
	switch {
	case in.LeafIndex != e.Seq:
		return nil, fmt.Errorf("the proof is for entry %d, the receipt's entry is %d", in.LeafIndex, e.Seq)
	case in.LeafHash != e.Hash:
		return nil, fmt.Errorf("the proof's leaf is %q, the entry hash is %s", in.LeafHash, e.Hash)
	case in.TreeSize != cp.Size:
		return nil, fmt.Errorf("the proof is for a tree of %d entries, the checkpoint's has %d", in.TreeSize, cp.Size)
	}
	if err := in.Verify(cp.Root); err != nil {
		return nil, err
	}
	return &Proven{Entry: e, Receipt: r, Checkpoint: cp, Key: pub}, nil
}

// openCheckpoint checks the signed note against the Ed25519 signature keys
// of jwks (signatureKeys) under the key name equal to its origin.
func openCheckpoint(signed, jwks []byte) (ledger.Checkpoint, ed25519.PublicKey, error) {
	unverified, err := ledger.PeekCheckpoint(signed)
	if err != nil {
		return ledger.Checkpoint{}, nil, err
	}
	keys, err := signatureKeys(jwks)
	if err != nil {
		return ledger.Checkpoint{}, nil, err
	}
	var first error
	for _, k := range keys {
		pub := k.pub
		v, err := ledger.NewCheckpointVerifier(unverified.Origin, pub)
		if err != nil {
			return ledger.Checkpoint{}, nil, err
		}
		cp, err := ledger.OpenCheckpoint(signed, v)
		if err == nil {
			return cp, pub, nil
		}
		if first == nil {
			first = err
		}
	}
	return ledger.Checkpoint{}, nil, first
}
