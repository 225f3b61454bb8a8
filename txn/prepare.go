package txn

import (
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/internal/jsonpack"
)

// Prepare is the first step of a mutating call (or of any call carrying an
// idempotency key).
type Prepare struct {
	Intent        Intent // State is set by Run
	Call          Call   // what the idempotency key is bound to
	Limits        Usage  // the token's budgets
	Preconditions []Precondition

	encoded []byte // the prepared intent (Encode)
}

// Encode encodes the intent as Run stores it. Call it before the
// transaction, so that Run, on the store's sequencer, only writes the
// bytes; Run refuses a Prepare that was not encoded. p.Intent must not
// change between Encode and Run.
func (p *Prepare) Encode() error {
	in := p.Intent
	in.State = Prepared
	v, err := json.Marshal(&in)
	if err != nil {
		return fmt.Errorf("txn: encode intent %s: %w", in.OperationID, err)
	}
	p.encoded = v
	return nil
}

// Run checks and records p in tx. It returns the stored result envelope of
// a finished twin call (a replay, with nothing written), an *Error refusal
// (nothing written), or nil once the intent is durable in tx. A write that
// fails after another succeeded aborts tx (store.Abort): no idempotency
// record or charge is ever committed without its intent.
func (p *Prepare) Run(tx *bbolt.Tx) (replay json.RawMessage, err error) {
	if p.encoded == nil {
		return nil, fmt.Errorf("txn: prepare %s: Encode was not called before the transaction", p.Intent.OperationID)
	}
	in := &p.Intent
	if k, ok := in.idemKey(); ok {
		replay, err := Lookup(tx, k, p.Call)
		if replay != nil || err != nil {
			return replay, err
		}
	}
	if OperationUsed(tx, in.OperationID) {
		e := refuse(ClassInvalidArgs, "operation_id %s is already used", in.OperationID)
		e.cause = ErrOperationUsed
		return nil, e
	}
	if err := checkStored(tx, p.Preconditions); err != nil {
		return nil, err
	}
	accounts := in.accounts(p.Limits)
	used, err := usages(tx, accounts)
	if err != nil {
		return nil, err
	}
	if err := checkUsed(accounts, used, in.Reserved); err != nil {
		return nil, err
	}
	// Writes from here on: a failure after one leaves tx half written,
	// so it aborts the transaction rather than refusing the call.
	if k, ok := in.idemKey(); ok {
		if err := putIdem(tx, k, idemRecord{Call: p.Call, OperationID: in.OperationID}); err != nil {
			return nil, abortIf(err)
		}
	}
	if err := chargeUsed(tx, accounts, used, in.Reserved); err != nil {
		return nil, abortIf(err)
	}
	in.State = Prepared
	return nil, abortIf(tx.Bucket(bucketIntent).Put([]byte(in.OperationID), p.encoded))
}

// CheckStored checks the kv and ledger preconditions of ps in tx; fs ones
// are the caller's (see CheckFile). It writes nothing.
func CheckStored(tx *bbolt.Tx, ps []Precondition) error { return checkStored(tx, ps) }

// OperationUsed reports whether operation id is taken by a recorded or
// running call.
func OperationUsed(tx *bbolt.Tx, id string) bool {
	return tx.Bucket(bucketOps).Get([]byte(id)) != nil || tx.Bucket(bucketIntent).Get([]byte(id)) != nil
}

// Operation is a result envelope in the form the operations table stores
// it: packed (internal/jsonpack), which takes about 40% of the JSON's
// bytes. Envelopes stored before packing existed are JSON; getOperation
// reads both.
type Operation struct{ stored []byte }

// PackOperation returns the stored form of the result envelope result
// (JSON), for PutOperation. Callers run it before their transaction: it
// is most of the cost of storing an envelope.
func PackOperation(result []byte) Operation {
	return Operation{jsonpack.Pack(make([]byte, 0, len(result)/2), result)}
}

// PutOperation stores the result envelope of operation id.
func PutOperation(tx *bbolt.Tx, id string, op Operation) error {
	b := tx.Bucket(bucketOps)
	// The kernel's operation ids are UUIDv7, ordered by time: packing
	// full pages halves the bucket, as appends leave nothing to fill.
	b.FillPercent = 1
	return b.Put([]byte(id), op.stored)
}

// HasOperation reports whether a result envelope is stored for operation
// id, without copying it.
func HasOperation(tx *bbolt.Tx, id string) bool {
	return tx.Bucket(bucketOps).Get([]byte(id)) != nil
}

// GetOperation returns the stored result envelope of operation id (its
// JSON, sharing no memory with bbolt), or nil when there is none, or an
// error when the stored value does not unpack (damaged). Every reader of
// the operations table goes through it.
func GetOperation(tx *bbolt.Tx, id string) (json.RawMessage, error) {
	v := tx.Bucket(bucketOps).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	b, err := jsonpack.Unpack(make([]byte, 0, 3*len(v)), v)
	if err != nil {
		return nil, fmt.Errorf("txn: operation %q: stored result envelope: %w", id, err)
	}
	return b, nil
}
