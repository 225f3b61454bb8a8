package kernel

import (
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/store"
)

// ErrNotFound is returned (wrapped) by the Inspector's lookups of an id
// that names nothing.
var ErrNotFound = errors.New("not found")

// ErrLocked is returned (wrapped) by OpenInspector when a running kernel
// holds the data dir.
var ErrLocked = errors.New("data dir is locked by a running kernel")

// bucketReceipts indexes receipts: receipt_id -> seq of its ledger entry
// (8 bytes big-endian).
var bucketReceipts = []byte("receipt_index")

// Inspector reads a data dir's history: ledger entries, receipts, stored
// operations and the idempotency table. It never writes. One comes from a
// running kernel (Kernel.Inspector) or from a stopped kernel's data dir
// opened read-only (OpenInspector).
type Inspector struct {
	view       func(func(*bbolt.Tx) error) error
	receiptKey ed25519.PublicKey
	origin     string // the kernel id: origin and key name of its checkpoints
	close      func() error
}

// Inspector returns an Inspector over k's live database.
func (k *Kernel) Inspector() *Inspector {
	return &Inspector{view: k.db.View, receiptKey: k.receiptPub, origin: k.settings.KernelID, close: func() error { return nil }}
}

// OpenInspector opens the data dir of a kernel that is not running, its
// bbolt file read-only. When a kernel serves the dir, it fails at once
// with an error wrapping ErrLocked. A file in the storage layout of an
// older build, which only a read-write open moves to the current one
// (Open), is refused, saying so.
func OpenInspector(dir string) (*Inspector, error) {
	s, err := loadSettings(dir)
	if err != nil {
		return nil, err
	}
	key, err := LoadKey(filepath.Join(dir, ReceiptKeyFile))
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, DBFile)
	if err := store.CheckLength(p); err != nil {
		return nil, err
	}
	db, err := bbolt.Open(p, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("%s: %w (use --server to ask it, or stop it)", dir, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		return ledger.CheckLayout(tx)
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return &Inspector{view: db.View, receiptKey: key.Public().(ed25519.PublicKey), origin: s.KernelID, close: db.Close}, nil
}

// Close releases the data dir of an Inspector from OpenInspector.
func (i *Inspector) Close() error { return i.close() }

// JWKS returns the JWKS document of the kernel's receipt key.
func (i *Inspector) JWKS() ([]byte, error) { return receipts.JWKS(i.receiptKey) }

// Head returns the ledger head.
func (i *Inspector) Head() (h ledger.Head, err error) {
	err = i.view(func(tx *bbolt.Tx) error {
		h, err = ledger.HeadOf(tx)
		return err
	})
	return h, err
}

// Verify checks the whole ledger with the kernel's own origin and receipt
// key: every record rehashed, the chain, the Merkle tree, every
// checkpoint's root and signature, every receipt's signature and its match
// with the audit record it attests. progress, if set, is called with each
// entry's seq once it has verified. A tampered ledger is a LedgerCheck
// that is not intact, naming the first bad entry, node or checkpoint.
func (i *Inspector) Verify(progress func(seq uint64)) (LedgerCheck, error) {
	check, err := CheckOf(i.verifyReport(progress))
	if err != nil || !check.Intact {
		return check, err
	}
	return check, i.verifyPayloads(&check)
}

func (i *Inspector) verifyReport(progress func(seq uint64)) (rep ledger.Report, err error) {
	opts, rc, err := verifyOptions(i.origin, i.receiptKey, progress)
	if err != nil {
		return rep, err
	}
	err = i.view(func(tx *bbolt.Tx) error {
		rep, err = ledger.VerifyWith(tx, opts)
		return err
	})
	return rep, rc.finish(err)
}

// Entries returns up to limit ledger entries from seq from on.
func (i *Inspector) Entries(from uint64, limit int) ([]ledger.Entry, error) {
	var out []ledger.Entry
	stop := errors.New("stop")
	err := i.view(func(tx *bbolt.Tx) error {
		return ledger.Scan(tx, from, func(e ledger.Entry) error {
			if len(out) >= limit {
				return stop
			}
			out = append(out, e)
			return nil
		})
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return out, err
}

// Scan calls fn for every ledger entry from seq from on, in order, inside
// one read transaction, and stops at fn's first error.
func (i *Inspector) Scan(from uint64, fn func(ledger.Entry) error) error {
	return i.view(func(tx *bbolt.Tx) error { return ledger.Scan(tx, from, fn) })
}

// Operation returns the stored result envelope of an operation id.
func (i *Inspector) Operation(id string) (json.RawMessage, error) {
	var out json.RawMessage
	err := i.view(func(tx *bbolt.Tx) error {
		r, err := storedResult(tx, id)
		if r == nil || err != nil {
			return err
		}
		if err := withLedgerRefs(tx, r); err != nil {
			return err
		}
		out, err = json.Marshal(r)
		return err
	})
	if err == nil && out == nil {
		err = fmt.Errorf("operation %q: %w", id, ErrNotFound)
	}
	return out, err
}

// ReceiptInfo is a receipt as the ledger holds it.
type ReceiptInfo struct {
	ReceiptID   string `json:"receipt_id"`
	OperationID string `json:"operation_id"`
	// Seq is the seq of the audit entry, which is the receipt (format v2);
	// for a JWS receipt (format v1, older ledgers) it is the seq of the
	// receipt's own entry.
	Seq uint64 `json:"seq"`
	// JWS is the signed receipt, for format v1 only.
	JWS string `json:"jws,omitempty"`
	// Receipt is what the receipt says: for v2, read from the audit entry
	// (receipts.Summarize); for v1, the JWS payload, not verified.
	Receipt *receipts.Receipt `json:"receipt"`
	// Withheld names what was left out of another agent's receipt (see
	// Access.Receipt).
	Withheld []string `json:"withheld,omitempty"`
}

// receiptInfo reads the JWS receipt entry e (format v1).
func receiptInfo(e ledger.Entry) (*ReceiptInfo, error) {
	var b receiptBody
	if err := json.Unmarshal(e.Body, &b); err != nil {
		return nil, fmt.Errorf("receipt entry %d: %w", e.Seq, err)
	}
	r, err := receipts.Decode(b.JWS)
	if err != nil {
		return nil, fmt.Errorf("receipt entry %d: %w", e.Seq, err)
	}
	return &ReceiptInfo{ReceiptID: b.ReceiptID, OperationID: b.OperationID, Seq: e.Seq, JWS: b.JWS, Receipt: r}, nil
}

// auditInfo reads the audit entry e as its receipt (format v2).
func auditInfo(e ledger.Entry) (*ReceiptInfo, error) {
	r, err := receipts.Summarize(e)
	if err != nil {
		return nil, err
	}
	return &ReceiptInfo{ReceiptID: r.ReceiptID, OperationID: r.OperationID, Seq: e.Seq, Receipt: r}, nil
}

// Receipt returns the receipt with id receipt_id: an audit entry's
// (receipts.ID), or a JWS receipt of an older ledger by its UUID.
func (i *Inspector) Receipt(id string) (*ReceiptInfo, error) {
	var info *ReceiptInfo
	err := i.view(func(tx *bbolt.Tx) error {
		e, err := receiptEntry(tx, id)
		if err != nil {
			return err
		}
		if e.Kind == ledger.KindAudit {
			info, err = auditInfo(e)
		} else {
			info, err = receiptInfo(e)
		}
		return err
	})
	return info, err
}

// receiptEntry returns the entry of receipt id: the audit entry it names,
// or a JWS receipt's own entry.
func receiptEntry(tx *bbolt.Tx, id string) (ledger.Entry, error) {
	notFound := fmt.Errorf("receipt %q: %w", id, ErrNotFound)
	if seq, prefix, ok := receipts.ParseID(id); ok {
		e, err := ledger.Get(tx, seq)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			return e, notFound
		case err != nil:
			return e, err
		case e.Kind != ledger.KindAudit || !strings.HasPrefix(e.Hash, prefix):
			return e, notFound
		}
		return e, nil
	}
	var v []byte
	if b := tx.Bucket(bucketReceipts); b != nil {
		v = b.Get([]byte(id))
	}
	if len(v) != 8 {
		return ledger.Entry{}, notFound
	}
	return ledger.Get(tx, binary.BigEndian.Uint64(v))
}

// ReceiptFilter selects receipts; zero fields match everything.
type ReceiptFilter struct {
	AgentID   string
	ToolID    string
	TxOutcome string // committed, rolled_back or no_op; or "error" / "ok" for the call's status
	Since     time.Time
	After     uint64 // only receipts whose entry seq is greater (for paging); 0 = from the start
	Limit     int    // at most this many (0 = no limit)
}

// Match reports whether r passes f.
func (f ReceiptFilter) Match(r *receipts.Receipt) bool {
	switch {
	case f.AgentID != "" && r.AgentID != f.AgentID,
		f.ToolID != "" && r.ToolID != f.ToolID:
		return false
	}
	switch f.TxOutcome {
	case "":
	case "error":
		if r.ErrorClass == "" {
			return false
		}
	case "ok":
		if r.ErrorClass != "" {
			return false
		}
	default:
		if r.TxOutcome != f.TxOutcome {
			return false
		}
	}
	if !f.Since.IsZero() {
		t, err := time.Parse(time.RFC3339Nano, r.IssuedAt)
		if err != nil || t.Before(f.Since) {
			return false
		}
	}
	return true
}

// Receipts lists the receipts f selects, in ledger order.
func (i *Inspector) Receipts(f ReceiptFilter) ([]ReceiptInfo, error) {
	out := []ReceiptInfo{}
	stop := errors.New("stop")
	from := uint64(0)
	if f.After > 0 {
		from = f.After + 1
	}
	// Every audit entry is its call's receipt; the JWS receipt entries of
	// older ledgers repeat what their audit entries say, so they are not
	// listed again.
	err := i.Scan(from, func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit {
			return nil
		}
		info, err := auditInfo(e)
		if err != nil {
			return err
		}
		if !f.Match(info.Receipt) {
			return nil
		}
		out = append(out, *info)
		if f.Limit > 0 && len(out) >= f.Limit {
			return stop
		}
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return out, err
}

// indexReceipts fills the receipt index from the ledger when it is new
// (data dirs made before the index existed).
func indexReceipts(tx *bbolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(bucketReceipts)
	if err != nil || b.Sequence() == 1 {
		return err
	}
	if err := ledger.Scan(tx, 0, func(e ledger.Entry) error {
		if e.Kind != ledger.KindReceipt {
			return nil
		}
		var rb receiptBody
		if err := json.Unmarshal(e.Body, &rb); err != nil {
			return fmt.Errorf("receipt entry %d: %w", e.Seq, err)
		}
		return b.Put([]byte(rb.ReceiptID), binary.BigEndian.AppendUint64(nil, e.Seq))
	}); err != nil {
		return err
	}
	// Sequence 1 marks the index as complete.
	return b.SetSequence(1)
}
