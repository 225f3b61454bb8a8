package kernel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/store"
)

// Checkpoints. The kernel signs a C2SP checkpoint of the ledger at the end
// of every group-commit transaction (store.Options.AfterBatch), so every
// acknowledged call is covered by a signed tree head as soon as it is
// answered. The signing key is the receipt key; the key name and the
// checkpoint origin are the kernel id. Every StableCheckpointInterval the
// latest checkpoint is also marked stable: outside witnesses poll the
// stable one, so that they all see the same tree heads rather than one per
// batch. Marks are kept, like the checkpoints they name.

// bucketStable lists the stable checkpoints: counter (8 bytes big-endian,
// from 0) -> number of the checkpoint marked (8 bytes big-endian) || its
// tree size (8 bytes big-endian), by which ledger.CheckpointAt finds it.
// Marks of builds before the size was kept hold the number alone.
var bucketStable = []byte("stable_checkpoints")

// afterBatch signs and stores a checkpoint of the ledger when the batch
// appended to it; the audit entries the batch appended are proven under
// it (ledger.Batch), which makes their receipts.
func (k *Kernel) afterBatch(tx *bbolt.Tx) error {
	defer k.onSequencer(time.Now())
	if k.upgrading || tx.Bucket(bucketStable) == nil {
		return nil // the ledger's buckets are created, or moved, by load
	}
	pre := k.presigned
	k.presigned = presigned{}
	if pre.tx != tx {
		pre.Presigned = ledger.Presigned{}
	}
	_, err := k.lw.CheckpointPresigned(tx, k.cpSigner, k.settings.KernelID, pre.Presigned)
	return err
}

// presigned is the checkpoint batchWork signed for a transaction.
type presigned struct {
	tx *bbolt.Tx
	ledger.Presigned
}

// batchWork takes the checkpoint's signature off the sequencer: once the
// batch's ops have appended their entries, it returns the signing of the
// checkpoint they make, which runs beside the ops' Work steps; afterBatch
// stores that signature, or signs again should the ledger have grown
// since (store.Options.BatchWork).
func (k *Kernel) batchWork(tx *bbolt.Tx) func() error {
	defer k.onSequencer(time.Now())
	k.presigned = presigned{}
	if k.upgrading || tx.Bucket(bucketStable) == nil {
		return nil
	}
	c, ok, err := k.lw.Pending(tx, k.settings.KernelID)
	if err != nil || !ok {
		return nil // afterBatch signs, or reports the error
	}
	return func() error {
		signed, err := ledger.SignCheckpoint(k.cpSigner, c)
		if err != nil {
			return nil // afterBatch signs again and reports it
		}
		k.presigned = presigned{tx: tx, Presigned: ledger.Presigned{Checkpoint: c, Signed: signed}}
		return nil
	}
}

// markStable marks the latest checkpoint stable unless it already is.
func (k *Kernel) markStable(ctx context.Context) error {
	return k.db.Update(ctx, func(tx *bbolt.Tx) error {
		cp, err := ledger.LatestCheckpoint(tx)
		if err != nil {
			return err
		}
		b := tx.Bucket(bucketStable)
		if _, v := b.Cursor().Last(); len(v) >= 8 && binary.BigEndian.Uint64(v) == cp.Num {
			return nil
		}
		n, err := b.NextSequence()
		if err != nil {
			return store.Abort(err)
		}
		mark := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), cp.Num), cp.Size)
		return abortIf(b.Put(binary.BigEndian.AppendUint64(nil, n-1), mark))
	})
}

// stableLoop marks the latest checkpoint stable every interval until done
// is closed.
func (k *Kernel) stableLoop(every time.Duration, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			// A failure here (the store closing) is retried at the next tick.
			_ = k.markStable(context.Background())
		}
	}
}

// latestStable returns the latest stable checkpoint.
func latestStable(tx *bbolt.Tx) (ledger.StoredCheckpoint, error) {
	b := tx.Bucket(bucketStable)
	if b == nil {
		return ledger.StoredCheckpoint{}, ledger.ErrNoCheckpoint
	}
	_, v := b.Cursor().Last()
	if v == nil {
		return ledger.StoredCheckpoint{}, ledger.ErrNoCheckpoint
	}
	if len(v) != 16 && len(v) != 8 {
		return ledger.StoredCheckpoint{}, fmt.Errorf("stable checkpoint mark is %d bytes, want 16 (or 8 from older builds)", len(v))
	}
	num := binary.BigEndian.Uint64(v)
	if len(v) == 16 {
		cp, err := ledger.CheckpointAt(tx, binary.BigEndian.Uint64(v[8:]), num)
		if errors.Is(err, ledger.ErrNoCheckpoint) {
			return cp, fmt.Errorf("stable checkpoint #%d is not stored", num)
		}
		return cp, err
	}
	// A mark from before sizes were kept: found by walking the ledger,
	// until the next mark (StableCheckpointInterval) replaces it.
	var out ledger.StoredCheckpoint
	found := false
	err := ledger.Checkpoints(tx, num, func(c ledger.StoredCheckpoint) error {
		out, found = c, true
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return out, err
	}
	if !found || out.Num != num {
		return out, fmt.Errorf("stable checkpoint #%d is not stored", num)
	}
	return out, nil
}

var errStop = errors.New("stop")
