package txn

import (
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"
)

type kvValue struct {
	Version uint64          `json:"version"`
	Value   json.RawMessage `json:"value"`
}

func kvGet(tx *bbolt.Tx, key string) (kvValue, error) {
	var v kvValue
	raw := tx.Bucket(bucketKV).Get([]byte(key))
	if raw == nil {
		return v, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("txn: kv record %q: %w", key, err)
	}
	return v, nil
}

// KV reads the versioned key-value store. Version 0 means never written.
type KV struct {
	View func(func(*bbolt.Tx) error) error
}

// GetKV returns the value and version stored under key.
func (s KV) GetKV(key string) (json.RawMessage, uint64, bool, error) {
	var v kvValue
	err := s.View(func(tx *bbolt.Tx) error {
		var err error
		v, err = kvGet(tx, key)
		return err
	})
	if err != nil {
		return nil, 0, false, err
	}
	return v.Value, v.Version, v.Version > 0, nil
}

func putKV(tx *bbolt.Tx, key string, v kvValue) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketKV).Put([]byte(key), b)
}
