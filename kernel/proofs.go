package kernel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// SignedCheckpoint is the wire form of a stored checkpoint (HTTP API,
// kernelctl).
type SignedCheckpoint struct {
	Number uint64 `json:"number"` // position among the stored checkpoints, from 0
	Origin string `json:"origin"`
	Size   uint64 `json:"size"`
	Root   string `json:"root"` // blake3:<hex>
	// Note is the C2SP signed note; it is what a verifier checks, the
	// other fields are read from it for convenience.
	Note string `json:"note"`
	// VerifierKey is the note verifier key (name+hash+key) of the kernel.
	VerifierKey string `json:"verifier_key"`
}

// InclusionResponse is an inclusion proof with the root of its tree and,
// when the tree size was not chosen by the caller, the checkpoint that
// signs that root. A root without a signature proves nothing: a verifier
// checks it against a checkpoint with a consistency proof.
type InclusionResponse struct {
	ledger.Inclusion
	Root       string            `json:"root"`
	Checkpoint *SignedCheckpoint `json:"checkpoint,omitempty"`
}

// ConsistencyResponse is a consistency proof with the roots of its two
// trees (unsigned; see InclusionResponse).
type ConsistencyResponse struct {
	ledger.Consistency
	Root1 string `json:"root1"`
	Root2 string `json:"root2"`
}

func (i *Inspector) signed(c ledger.StoredCheckpoint) (SignedCheckpoint, error) {
	vk, err := ledger.CheckpointVerifierKey(i.origin, i.receiptKey)
	if err != nil {
		return SignedCheckpoint{}, err
	}
	return SignedCheckpoint{
		Number: c.Num, Origin: c.Origin, Size: c.Size, Root: digest.Format(c.Root),
		Note: string(c.Signed), VerifierKey: vk,
	}, nil
}

// Checkpoint returns the latest checkpoint, or with stable the latest one
// marked stable.
func (i *Inspector) Checkpoint(stable bool) (SignedCheckpoint, error) {
	var c ledger.StoredCheckpoint
	err := i.view(func(tx *bbolt.Tx) (err error) {
		if stable {
			c, err = latestStable(tx)
		} else {
			c, err = ledger.LatestCheckpoint(tx)
		}
		return err
	})
	if errors.Is(err, ledger.ErrNoCheckpoint) {
		return SignedCheckpoint{}, fmt.Errorf("checkpoint: %w", ErrNotFound)
	}
	if err != nil {
		return SignedCheckpoint{}, err
	}
	return i.signed(c)
}

// ProveInclusion returns the inclusion proof of entry seq in the tree of
// the first size entries. With size 0 the tree is that of the latest
// checkpoint, which comes with the proof. Out-of-range sizes and seqs are
// ErrRange errors.
func (i *Inspector) ProveInclusion(seq, size uint64) (*InclusionResponse, error) {
	out := &InclusionResponse{}
	err := i.view(func(tx *bbolt.Tx) error {
		if size == 0 {
			c, err := ledger.LatestCheckpoint(tx)
			if err != nil {
				return err
			}
			sc, err := i.signed(c)
			if err != nil {
				return err
			}
			out.Checkpoint, size = &sc, c.Size
		}
		h, err := ledger.HeadOf(tx)
		if err != nil {
			return err
		}
		if seq >= size || size > h.Size {
			return fmt.Errorf("%w: inclusion of entry %d in a tree of %d entries (the ledger has %d)", ErrRange, seq, size, h.Size)
		}
		if out.Inclusion, err = ledger.ProveInclusion(tx, seq, size); err != nil {
			return err
		}
		root, err := ledger.Root(tx, size)
		out.Root = digest.Format(root)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ProveConsistency returns the consistency proof from the tree of the first
// from entries to that of the first to entries.
func (i *Inspector) ProveConsistency(from, to uint64) (*ConsistencyResponse, error) {
	var out ConsistencyResponse
	err := i.view(func(tx *bbolt.Tx) error {
		h, err := ledger.HeadOf(tx)
		if err != nil {
			return err
		}
		if from > to || to > h.Size {
			return fmt.Errorf("%w: consistency from %d to %d entries (the ledger has %d)", ErrRange, from, to, h.Size)
		}
		if out.Consistency, err = ledger.ProveConsistency(tx, from, to); err != nil {
			return err
		}
		r1, err := ledger.Root(tx, from)
		if err != nil {
			return err
		}
		r2, err := ledger.Root(tx, to)
		out.Root1, out.Root2 = digest.Format(r1), digest.Format(r2)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ErrRange is returned (wrapped) for a proof asked of sizes or entries the
// ledger does not have.
var ErrRange = errors.New("out of range")

// Export writes the ledger as ledger.Export does: every entry record and
// every checkpoint, as JSON lines, in one read transaction; before each
// audit record, the payload line of what it commits to, when kept
// (export.go).
func (i *Inspector) Export(w io.Writer) error {
	return i.view(func(tx *bbolt.Tx) error { return exportWithPayloads(tx, w) })
}

// BundleFormat is the format tag of the receipt bundles of JWS receipts
// (format v1): VerifyBundle still reads them.
const BundleFormat = "capkernel-receipt-bundle/v1"

// Bundle is a receipt bundle of format v1: a JWS receipt with the audit
// record it attests (the stored ledger record), a signed checkpoint and
// the inclusion proof of that record in the checkpoint's tree.
type Bundle struct {
	Format     string           `json:"format"`
	Receipt    string           `json:"receipt"`    // compact JWS
	Entry      string           `json:"entry"`      // the attested ledger record: its canonical JSON, as a string (exact bytes)
	Checkpoint string           `json:"checkpoint"` // C2SP signed note
	Inclusion  ledger.Inclusion `json:"inclusion"`
}

// Bundle returns receipt id proven by the log against the latest
// checkpoint: its audit entry, the inclusion proof and the checkpoint
// (receipts.Logged). A JWS receipt of an older ledger gets the same for
// the audit entry it attests.
func (i *Inspector) Bundle(id string) (*receipts.Logged, error) {
	var out *receipts.Logged
	err := i.view(func(tx *bbolt.Tx) error {
		e, err := receiptEntry(tx, id)
		if err != nil {
			return err
		}
		seq := e.Seq
		if e.Kind != ledger.KindAudit {
			info, err := receiptInfo(e)
			if err != nil {
				return err
			}
			seq = info.Receipt.LedgerSeq
		}
		out, err = provenReceipt(tx, seq)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bundle of receipt %s: %w", id, err)
	}
	return out, nil
}

// provenReceipt proves the audit entry seq under the latest stored
// checkpoint.
func provenReceipt(tx *bbolt.Tx, seq uint64) (*receipts.Logged, error) {
	rec, err := ledger.Record(tx, seq)
	if err != nil {
		return nil, err
	}
	c, err := ledger.LatestCheckpoint(tx)
	if err != nil {
		return nil, err
	}
	in, err := ledger.ProveInclusion(tx, seq, c.Size)
	if err != nil {
		return nil, err
	}
	return &receipts.Logged{Format: receipts.Format, Entry: string(rec), Inclusion: in, Checkpoint: string(c.Signed)}, nil
}

// BundleCheck is what VerifyBundle established.
type BundleCheck struct {
	Format     string // receipts.Format or BundleFormat
	Receipt    *receipts.Receipt
	Checkpoint ledger.Checkpoint
}

// VerifyBundle checks a receipt offline against jwks, the kernel's JWKS
// document: a receipt proven by the log (receipts.Format, checked by
// receipts.VerifyLogged) or a bundle of format v1 (BundleFormat). For v1
// it checks the JWS receipt's signature; that the entry is a well-formed
// audit record hashing to the receipt's ledger_entry_hash at its
// ledger_seq and agreeing with every field the receipt attests; the
// checkpoint's signature by the same key; and the inclusion proof of the
// entry in the checkpoint's tree.
func VerifyBundle(raw []byte, jwks []byte) (*BundleCheck, error) {
	var tag struct {
		Format string `json:"format"`
	}
	if err := json.Unmarshal(raw, &tag); err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	if tag.Format == receipts.Format {
		p, err := receipts.VerifyLogged(raw, jwks)
		if err != nil {
			return nil, err
		}
		return &BundleCheck{Format: receipts.Format, Receipt: p.Receipt, Checkpoint: p.Checkpoint}, nil
	}
	var b Bundle
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if b.Format != BundleFormat {
		return nil, fmt.Errorf("bundle: format %q, want %q or %q", b.Format, receipts.Format, BundleFormat)
	}
	r, pub, err := receipts.VerifyJWKS(b.Receipt, jwks)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	e, err := ledger.ParseEntry([]byte(b.Entry))
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	c, err := DecodeCall(e)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if err := MatchReceipt(r, c); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	unverified, err := ledger.PeekCheckpoint([]byte(b.Checkpoint))
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	v, err := ledger.NewCheckpointVerifier(unverified.Origin, pub)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	cp, err := ledger.OpenCheckpoint([]byte(b.Checkpoint), v)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	in := b.Inclusion
	switch {
	case in.LeafIndex != e.Seq:
		return nil, fmt.Errorf("bundle: the proof is for entry %d, the receipt's is %d", in.LeafIndex, e.Seq)
	case in.LeafHash != e.Hash:
		return nil, fmt.Errorf("bundle: the proof's leaf is %s, the entry hash is %s", in.LeafHash, e.Hash)
	case in.TreeSize != cp.Size:
		return nil, fmt.Errorf("bundle: the proof is for a tree of %d entries, the checkpoint's has %d", in.TreeSize, cp.Size)
	}
	if err := in.Verify(cp.Root); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	return &BundleCheck{Format: BundleFormat, Receipt: r, Checkpoint: cp}, nil
}
