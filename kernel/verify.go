package kernel

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// Ledger verification with the kernel's public key: the ledger package
// checks entries, links, the Merkle tree and the checkpoint signatures;
// on top of that every receipt entry must carry a receipt signed by the
// key that matches, field by field, the audit record it names (which comes
// before it). Receipt signatures are checked on all cores while the
// entries stream by; the first failure by seq is reported.

// VerifyLedgerExport checks an export (ledger.Export's JSON lines) offline
// with only the kernel's origin (its id) and receipt public key: every
// record rehashed, the chain, the Merkle tree, every checkpoint's root and
// signature, and every receipt's signature and match with its audit
// record. progress, if set, is called with each entry's seq once it has
// verified. The export's payload lines are skipped (VerifyExport checks
// them).
func VerifyLedgerExport(r io.Reader, origin string, pub ed25519.PublicKey, progress func(seq uint64)) (ledger.Report, error) {
	pr := publicLines(r, &payloadLines{})
	defer pr.Close()
	return verifyLedgerExport(pr, origin, pub, progress)
}

// verifyLedgerExport is VerifyLedgerExport of an export without payload
// lines; hooks, if any, see every verified entry in seq order, and an
// error from one ends the verification at that entry.
func verifyLedgerExport(r io.Reader, origin string, pub ed25519.PublicKey, progress func(seq uint64), hooks ...func(ledger.Entry) error) (ledger.Report, error) {
	opts, rc, err := verifyOptions(origin, pub, progress, hooks...)
	if err != nil {
		return ledger.Report{}, err
	}
	rep, err := ledger.VerifyExport(r, opts)
	return rep, rc.finish(err)
}

func verifyOptions(origin string, pub ed25519.PublicKey, progress func(seq uint64), hooks ...func(ledger.Entry) error) (ledger.VerifyOptions, *receiptChecker, error) {
	v, err := ledger.NewCheckpointVerifier(origin, pub)
	if err != nil {
		return ledger.VerifyOptions{}, nil, fmt.Errorf("checkpoint verifier for origin %q: %w", origin, err)
	}
	rc := newReceiptChecker(pub)
	return ledger.VerifyOptions{
		Verifier: v,
		Origin:   origin,
		OnEntry: func(e ledger.Entry) error {
			err := rc.entry(e)
			for _, h := range hooks {
				if err == nil {
					err = h(e)
				}
			}
			if progress != nil {
				progress(e.Seq)
			}
			return err
		},
	}, rc, nil
}

// receiptChecker checks the receipt entries of a ledger as they stream by
// in seq order: the match with the audit record at once, the signature on
// a pool of workers.
type receiptChecker struct {
	pub ed25519.PublicKey
	// recent holds the latest audit entries (slot seq % len), copied, so
	// that a JWS receipt can be matched with the record it names. A v1
	// kernel appended a call's receipt in the same group commit as its
	// audit record (at most store.MaxBatch calls, each with at most a few
	// entries), well within the window. Since receipts are proven by the
	// log there are no receipt entries, and nothing is decoded here.
	recent [1 << 14]recentAudit
	jobs   chan sigJob
	wg     sync.WaitGroup

	mu    sync.Mutex
	first *ledger.VerifyError // the lowest-seq signature failure
}

// recentAudit is a slot of receiptChecker.recent.
type recentAudit struct {
	e        ledger.Entry
	valid    bool // e is an audit entry whose receipt has not come yet
	bodyData []byte
}

type sigJob struct {
	seq uint64
	jws string
}

func newReceiptChecker(pub ed25519.PublicKey) *receiptChecker {
	rc := &receiptChecker{pub: pub, jobs: make(chan sigJob, 256)}
	for range runtime.GOMAXPROCS(0) {
		rc.wg.Go(func() {
			for j := range rc.jobs {
				if _, err := receipts.VerifyKey(j.jws, rc.pub); err != nil {
					rc.fail(j.seq, err.Error())
				}
			}
		})
	}
	return rc
}

func (rc *receiptChecker) fail(seq uint64, reason string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.first == nil || seq < rc.first.Seq {
		rc.first = &ledger.VerifyError{Seq: seq, Reason: reason}
	}
}

// entry takes the next verified entry.
func (rc *receiptChecker) entry(e ledger.Entry) error {
	switch e.Kind {
	case ledger.KindAudit:
		// The body belongs to the verifier's buffers: keep a copy.
		slot := &rc.recent[e.Seq%uint64(len(rc.recent))]
		slot.bodyData = append(slot.bodyData[:0], e.Body...)
		slot.e, slot.valid = e, true
		slot.e.Body = slot.bodyData
	case ledger.KindReceipt:
		var b receiptBody
		if err := json.Unmarshal(e.Body, &b); err != nil {
			return fmt.Errorf("receipt entry: %w", err)
		}
		r, err := receipts.Decode(b.JWS)
		if err != nil {
			return fmt.Errorf("receipt entry: %w", err)
		}
		if r.ReceiptID != b.ReceiptID || r.OperationID != b.OperationID {
			return fmt.Errorf("entry names receipt %s of %s; the signed receipt is %s of %s", b.ReceiptID, b.OperationID, r.ReceiptID, r.OperationID)
		}
		slot := &rc.recent[r.LedgerSeq%uint64(len(rc.recent))]
		if !slot.valid || slot.e.Seq != r.LedgerSeq || r.LedgerSeq >= e.Seq {
			return fmt.Errorf("receipt %s names seq %d, which is not a recent earlier audit record without a receipt", r.ReceiptID, r.LedgerSeq)
		}
		c, err := DecodeCall(slot.e)
		if err != nil {
			return err
		}
		if err := MatchReceipt(r, c); err != nil {
			return err
		}
		slot.valid = false
		rc.jobs <- sigJob{seq: e.Seq, jws: b.JWS}
	}
	return nil
}

// finish waits for the signature checks and returns the earliest failure:
// err (from the ledger's verification) or a bad signature before it.
func (rc *receiptChecker) finish(err error) error {
	close(rc.jobs)
	rc.wg.Wait()
	if rc.first == nil {
		return err
	}
	var ve *ledger.VerifyError
	if err != nil && (!errors.As(err, &ve) || ve.Seq < rc.first.Seq) {
		return err
	}
	return rc.first
}

// LedgerCheck is the outcome of a ledger verification, as kernelctl prints
// it and GET /v1/admin/ledger/verify sends it.
//
// A ledger is intact only when its latest checkpoint signs every entry:
// the kernel stores a checkpoint of the whole ledger in every group commit
// that appends (afterBatch), so in an honest ledger or export the latest
// checkpoint's size is the number of entries. Entries after it (or any
// entry when there is no checkpoint) are signed by nothing: whoever holds
// the file could have appended or rewritten them, so they make the ledger
// not intact, with BadSeq the first of them.
type LedgerCheck struct {
	Intact      bool    `json:"intact"`
	Entries     uint64  `json:"entries"`               // entries verified: all of them when intact, else those before the finding
	Checkpoints uint64  `json:"checkpoints,omitempty"` // checkpoints verified, when intact
	Root        string  `json:"root,omitempty"`        // Merkle root of all entries, when intact
	BadSeq      *uint64 `json:"bad_seq,omitempty"`     // the first bad entry, when one is
	Reason      string  `json:"reason,omitempty"`      // what is wrong, when not intact
	// Latest is the latest checkpoint, once every checkpoint verified: when
	// intact, and when entries follow it that nothing signs.
	Latest *CheckpointSummary `json:"latest_checkpoint,omitempty"`
	// Payloads reports the audit payloads beside the chain (erase.go),
	// when intact.
	Payloads *PayloadReport `json:"payloads,omitempty"`
}

// CheckpointSummary is what a checkpoint signs: the tree size, its Merkle
// root (blake3:<hex>) and the origin (the kernel id).
type CheckpointSummary struct {
	Size   uint64 `json:"size"`
	Root   string `json:"root"`
	Origin string `json:"origin"`
}

// CheckOf reads a verification's outcome: a finding about the ledger (an
// entry, tree node, checkpoint or fork) makes a LedgerCheck that is not
// intact; any other error (reading failed) is returned. A ledger that
// verified is intact only if its latest checkpoint is of all its entries
// (see LedgerCheck).
func CheckOf(rep ledger.Report, err error) (LedgerCheck, error) {
	var (
		ve *ledger.VerifyError
		ne *ledger.NodeError
		ce *ledger.CheckpointError
		fe *ledger.ForkError
	)
	switch {
	case err == nil:
		return checkSigned(rep), nil
	case errors.As(err, &ve):
		return LedgerCheck{Entries: ve.Seq, BadSeq: &ve.Seq, Reason: err.Error()}, nil
	case errors.As(err, &ne), errors.As(err, &ce), errors.As(err, &fe):
		return LedgerCheck{Entries: rep.Entries, Reason: err.Error()}, nil
	}
	return LedgerCheck{}, err
}

// checkSigned is the LedgerCheck of a ledger that verified: intact when
// its latest checkpoint signs every entry, or when it has no entries.
func checkSigned(rep ledger.Report) LedgerCheck {
	var latest *CheckpointSummary
	signed := uint64(0)
	if rep.Checkpoints > 0 {
		latest = &CheckpointSummary{Size: rep.Latest.Size, Root: digest.Format(rep.Latest.Root), Origin: rep.Latest.Origin}
		signed = rep.Latest.Size
	}
	if signed >= rep.Entries { // a checkpoint beyond the entries fails verification
		return LedgerCheck{Intact: true, Entries: rep.Entries, Checkpoints: rep.Checkpoints, Root: digest.Format(rep.Root), Latest: latest}
	}
	bad, n := signed, rep.Entries
	what, verb, them := fmt.Sprintf("entries %d..%d", bad, n-1), "follow", "them"
	if n-bad == 1 {
		what, verb, them = fmt.Sprintf("entry %d", bad), "follows", "it"
	}
	reason := fmt.Sprintf("ledger: %s %s the latest checkpoint (size %d): no checkpoint signs %s", what, verb, signed, them)
	if latest == nil {
		reason = fmt.Sprintf("ledger: %s but no checkpoint: nothing signs %s", what, them)
	}
	return LedgerCheck{Entries: bad, BadSeq: &bad, Reason: reason, Latest: latest}
}
