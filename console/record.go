package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// Record is the body of GET /console/api/receipts/{id}/record: a call's
// audit record as the session may read it (kernel.Access), so the page
// can open the record's commitments against its payload itself.
type Record struct {
	// Entry is the audit entry, with its payload (salt and the parts
	// still kept) when the session reads the record in full; an entry
	// written before commitments is cut to its public part for others
	// (Entry.Withheld).
	Entry kernel.EntryView `json:"entry"`
	// Full: the session reads this record in full. When it does and
	// Entry has no payload, either its depth is commitments_only (the
	// kernel stores no payload there, not even the salt), or the payload
	// was erased (Erasure), or, with no erasure record naming it, it is
	// missing: tampering.
	Full bool `json:"full"`
	// Erasure is the erasure record that removed the payload, when one
	// names this record (erasure records are public). It is not looked
	// for when the record's depth is commitments_only: such a record has
	// no payload to erase (kernel.ErrNothingToErase).
	Erasure *ledger.Entry `json:"erasure,omitempty"`
}

// record answers GET /console/api/receipts/{id}/record.
func (c *Console) record(w http.ResponseWriter, r *http.Request, s *session) {
	in := c.k.Inspector()
	info, err := in.Receipt(r.PathValue("id"))
	if err != nil {
		lookupError(w, err)
		return
	}
	seq := info.Seq
	if info.JWS != "" { // a v1 receipt entry: the record is the audit entry it attests
		seq = info.Receipt.LedgerSeq
	}
	views, err := in.EntryViews(seq, 1, s.access)
	if err == nil && (len(views) != 1 || views[0].Seq != seq || views[0].Kind != ledger.KindAudit) {
		err = fmt.Errorf("receipt %q: ledger entry %d is not its audit record", r.PathValue("id"), seq)
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := Record{Entry: views[0], Full: s.access.Full(info.Receipt.AgentID)}
	if out.Entry.Payload == nil && erasable(out.Entry.Body) {
		if out.Erasure, err = erasureOf(in, seq); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// erasable reports whether an erasure record may name the audit record
// of body: it holds commitments (it has a payload_depth) at a depth that
// stores a payload. At depth commitments_only nothing is stored, so
// nothing was erased, and the ledger is not scanned for an erasure on
// every view of such a record.
func erasable(body json.RawMessage) bool {
	var b struct {
		Depth string `json:"payload_depth"`
	}
	return json.Unmarshal(body, &b) == nil && b.Depth != "" && b.Depth != kernel.DepthCommitmentsOnly
}

// erasureOf returns the erasure record naming audit entry seq, or nil. An
// erasure is appended after the record it erases, so the scan starts
// there; it reads the rest of the ledger at worst, once per record shown
// without its payload.
func erasureOf(in *kernel.Inspector, seq uint64) (*ledger.Entry, error) {
	var found *ledger.Entry
	done := errors.New("found")
	err := in.Scan(seq+1, func(e ledger.Entry) error {
		if e.Kind != kernel.KindErasure {
			return nil
		}
		var b kernel.Erasure
		if err := json.Unmarshal(e.Body, &b); err != nil {
			return fmt.Errorf("erasure record %d: %w", e.Seq, err)
		}
		if slices.Contains(b.Seqs, seq) {
			found = &e
			return done
		}
		return nil
	})
	if errors.Is(err, done) {
		err = nil
	}
	return found, err
}
