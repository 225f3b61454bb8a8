package txn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
)

// CanCommit checks in tx everything Commit needs that may have changed since
// prepare: the stored preconditions, the kv versions the effects were staged
// against, and the disk-write budget, now that the bytes written are known.
// It writes nothing.
func CanCommit(tx *bbolt.Tx, in *Intent, ps []Precondition, limits Usage, effects []Effect) error {
	if err := checkStored(tx, ps); err != nil {
		return err
	}
	for _, e := range effects {
		if e.Op != OpKVPut {
			continue
		}
		cur, err := kvGet(tx, e.Key)
		if err != nil {
			return err
		}
		if cur.Version+1 != e.Version {
			return refuse(ClassPrecondition, "kv %q changed while the call ran (version %d, staged %d)", e.Key, cur.Version, e.Version)
		}
	}
	return Check(tx, in.accounts(limits), spent(in, effects))
}

// Decision is a call's decided intent, with the bytes Commit stores for
// it encoded before the commit's transaction (Decide), so that the store's
// sequencer only writes them.
type Decision struct {
	Intent  *Intent
	Effects []Effect
	DeltaID string
	encoded []byte // Intent decided, with Effects and DeltaID, without commit_seq
}

// Decide encodes in as Commit will store it: decided, listing effects and
// the delta's id deltaID. Only the commit sequence number, which Commit
// assigns, is added in the transaction.
func Decide(in *Intent, effects []Effect, deltaID string) (*Decision, error) {
	dec := *in
	dec.State, dec.Effects, dec.DeltaID, dec.CommitSeq = Decided, effects, deltaID, 0
	v, err := json.Marshal(&dec)
	if err != nil {
		return nil, fmt.Errorf("txn: encode intent %s: %w", in.OperationID, err)
	}
	return &Decision{Intent: in, Effects: effects, DeltaID: deltaID, encoded: v}, nil
}

// withSeq returns d's encoded intent with commit_seq seq: the encoding
// omits a zero commit_seq, so the field is appended to the object.
func (d *Decision) withSeq(seq uint64) []byte {
	v := make([]byte, 0, len(d.encoded)+32)
	v = append(v, d.encoded[:len(d.encoded)-1]...)
	v = append(v, `,"commit_seq":`...)
	v = strconv.AppendUint(v, seq, 10)
	return append(v, '}')
}

// Commit records in tx that the call of d.Intent is decided: kv puts are
// applied, the delta is stored under d.DeltaID, the intent lists its
// effects for Apply (and for redo after a crash), the idempotency key takes
// result (the full result envelope; a reference to it when PutOperation
// stored the same bytes in tx first). The caller has run CanCommit and
// Spend (which charges the budgets) in the same tx; any error here comes
// after a write and is a store.Abort.
func Commit(tx *bbolt.Tx, d *Decision, delta, result []byte) error {
	return abortIf(commit(tx, d, delta, result))
}

func commit(tx *bbolt.Tx, d *Decision, delta, result []byte) error {
	in, effects := d.Intent, d.Effects
	for _, e := range effects {
		if e.Op == OpKVPut {
			if err := putKV(tx, e.Key, kvValue{Version: e.Version, Value: e.Value}); err != nil {
				return err
			}
		}
	}
	if err := tx.Bucket(bucketDelta).Put([]byte(d.DeltaID), clone(delta)); err != nil {
		return err
	}
	order := tx.Bucket(bucketOrder)
	seq, err := order.NextSequence()
	if err != nil {
		return err
	}
	if err := order.Put(binary.BigEndian.AppendUint64(nil, seq), []byte(d.DeltaID)); err != nil {
		return err
	}
	in.CommitSeq = seq
	in.State = Decided
	in.Effects = effects
	in.DeltaID = d.DeltaID
	if err := tx.Bucket(bucketIntent).Put([]byte(in.OperationID), d.withSeq(seq)); err != nil {
		return err
	}
	if k, ok := in.idemKey(); ok {
		call, err := idemCall(tx, k)
		if err != nil {
			return err
		}
		if err := putIdem(tx, k, done(tx, call, in.OperationID, result)); err != nil {
			return err
		}
	}
	return nil
}

// Spend charges in tx what a call that CanCommit admitted spends (its
// reservation settled against the bytes it wrote, and what it used
// running). Call it right after CanCommit, in the same step of a group
// commit: every call of the batch checks and charges in turn, so a later
// one sees what an earlier one spent (checked in one step and charged in
// another, each call of a batch was checked against the usage from before
// the batch, and concurrent writes overspent a budget). Commit charges
// nothing.
func Spend(tx *bbolt.Tx, in *Intent, effects []Effect) error {
	return abortIf(charge(tx, in.accounts(nil), spent(in, effects)))
}

// Rollback undoes a prepared intent in tx: the intent and its idempotency
// entry go (only committed outcomes are replayed, so the key may be retried),
// and the reservation is released except the call itself. What the
// execution consumed (in.Used: CPU time, network bytes) stays charged. The
// caller removes staging files (Stage.Discard).
func Rollback(tx *bbolt.Tx, in *Intent) error {
	return abortIf(rollback(tx, in))
}

func release(in *Intent) Usage {
	r := Usage{}
	for n, v := range in.Reserved {
		if n != BudgetCalls {
			r[n] = -v
		}
	}
	for n, v := range in.Used {
		r[n] += v
	}
	return r
}

// Settle ends in tx a prepared External call that does not commit but
// whose external effect happened, or may have: its outcome unknown (after
// a crash, or a failure mid-request), or its execution done and its commit
// refused. Nothing staged is applied, the intent goes, and the idempotency
// key keeps result — the result envelope, by reference when PutOperation
// stored it first — as its stored outcome, so a repeat is answered with it
// and never executes again. The caller removes staging files.
func Settle(tx *bbolt.Tx, in *Intent, result []byte) error {
	return abortIf(settle(tx, in, result))
}

func settle(tx *bbolt.Tx, in *Intent, result []byte) error {
	if k, ok := in.idemKey(); ok {
		call, err := idemCall(tx, k)
		if err != nil {
			return err
		}
		if err := putIdem(tx, k, done(tx, call, in.OperationID, result)); err != nil {
			return err
		}
	}
	if err := tx.Bucket(bucketIntent).Delete([]byte(in.OperationID)); err != nil {
		return err
	}
	return charge(tx, in.accounts(nil), release(in))
}

func rollback(tx *bbolt.Tx, in *Intent) error {
	if k, ok := in.idemKey(); ok {
		if err := tx.Bucket(bucketIdem).Delete(k.bytes()); err != nil {
			return err
		}
	}
	if err := tx.Bucket(bucketIntent).Delete([]byte(in.OperationID)); err != nil {
		return err
	}
	return charge(tx, in.accounts(nil), release(in))
}

// Finish removes the intent of an applied call.
func Finish(tx *bbolt.Tx, operationID string) error {
	return tx.Bucket(bucketIntent).Delete([]byte(operationID))
}

// spent is the budget the call uses beyond the call itself: the bytes its
// effects write and what its execution consumed (in.Used). Bytes written
// are a written file's content and a kv put's value (its JSON bytes, as
// stored); neither a file's path nor a kv key counts, and deletions and
// directories are free.
func spent(in *Intent, effects []Effect) Usage {
	var wrote int64
	for _, e := range effects {
		if e.Op == OpWrite || e.Op == OpKVPut {
			wrote += e.Size
		}
	}
	u := Usage{BudgetDiskWriteBytes: wrote}
	for n, v := range in.Used {
		u[n] += v
	}
	return u
}

func idemCall(tx *bbolt.Tx, k IdemKey) (Call, error) {
	v := tx.Bucket(bucketIdem).Get(k.bytes())
	if v == nil {
		return Call{}, fmt.Errorf("txn: idempotency key %q lost its in-flight record", k.Key)
	}
	var r idemRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return Call{}, fmt.Errorf("txn: idempotency record for key %q: %w", k.Key, err)
	}
	return r.Call, nil
}

func abortIf(err error) error {
	if err == nil {
		return nil
	}
	return store.Abort(err)
}
