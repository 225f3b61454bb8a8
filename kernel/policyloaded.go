package kernel

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
)

// bucketPolicyLoaded holds, under keyLastPolicy, the seq (8 bytes big
// endian) of the ledger's last policy_loaded record, put in the
// transaction that appends it: a verb on a stopped kernel learns the
// policy the kernel last ran under in one read, where reading the ledger
// back from its head took time in proportion to the calls since that
// start (LastPolicy).
var (
	bucketPolicyLoaded = []byte("policy_loaded")
	keyLastPolicy      = []byte("last")
)

// recordPolicyLoaded notes e, the policy_loaded record just appended in
// tx, as the last.
func recordPolicyLoaded(tx *bbolt.Tx, e ledger.Entry) error {
	b, err := tx.CreateBucketIfNotExists(bucketPolicyLoaded)
	if err != nil {
		return err
	}
	return b.Put(keyLastPolicy, binary.BigEndian.AppendUint64(nil, e.Seq))
}

// LastPolicy returns the policy hash and seq of the ledger's last
// policy_loaded record (what the kernel last ran under), found false
// when the ledger has none. A file no kernel of this build has opened
// since it was written has no note of it: the ledger is then read back
// from its head. A build from before the note appends its record without
// moving the note, which then names the record of this build's last
// start until this build starts the kernel again.
func (i *Inspector) LastPolicy() (hash string, seq uint64, found bool, err error) {
	err = i.view(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(bucketPolicyLoaded); b != nil {
			if v := b.Get(keyLastPolicy); len(v) == 8 {
				e, err := ledger.Get(tx, binary.BigEndian.Uint64(v))
				if err != nil {
					return err
				}
				hash, seq, found, err = policyOf(e)
				if err == nil && !found {
					err = fmt.Errorf("ledger seq %d, noted as the last policy_loaded record, is a %s record", e.Seq, e.Kind)
				}
				return err
			}
		}
		return nil
	})
	if err != nil || found {
		return hash, seq, found, err
	}
	h, err := i.Head()
	if err != nil {
		return "", 0, false, err
	}
	const page = 512
	for end := h.Size; end > 0; {
		from := end - min(end, page)
		es, err := i.Entries(from, int(end-from))
		if err != nil {
			return "", 0, false, err
		}
		for j := len(es) - 1; j >= 0; j-- {
			if hash, seq, found, err = policyOf(es[j]); found || err != nil {
				return hash, seq, found, err
			}
		}
		end = from
	}
	return "", 0, false, nil
}

// policyOf returns the policy hash of e when it is a policy_loaded record.
func policyOf(e ledger.Entry) (hash string, seq uint64, found bool, err error) {
	if e.Kind != ledger.KindPolicyLoaded {
		return "", 0, false, nil
	}
	var b struct {
		PolicyHash string `json:"policy_hash"`
	}
	if err := json.Unmarshal(e.Body, &b); err != nil || b.PolicyHash == "" {
		return "", 0, false, fmt.Errorf("ledger seq %d: a policy_loaded record without a policy_hash", e.Seq)
	}
	return b.PolicyHash, e.Seq, true, nil
}
