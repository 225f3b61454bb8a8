// Package tailpad keeps two empty pad keys at the end of an append-only
// bbolt bucket so that its pages fill.
//
// bbolt splits an overfull page so that the last page keeps at least
// three keys (node.splitIndex stops two keys before the end and, when
// all of them fit, takes one fewer). A bucket that grows by one value per
// transaction at its end therefore leaves every page two values short of
// what fits: half of each page for values of a quarter page, a seventh
// for values of a ninth. With two pad keys sorting after every real key,
// two of those three keys are the pads, and the pages before them hold as
// many values as fit.
//
// Readers of a padded bucket skip the pads (Is); a pad that holds a value
// was put there by someone else.
package tailpad

import (
	"bytes"

	"go.etcd.io/bbolt"
)

// keys are the pads: above every 8-byte big-endian number below 2^56 and
// every key of printable text.
var keys = [2][]byte{
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe},
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
}

// Ensure puts the pads, with empty values, in b if they are missing (a
// bucket from before them); call it in the transaction that appends.
func Ensure(b *bbolt.Bucket) error {
	for _, k := range keys {
		if b.Get(k) == nil {
			if err := b.Put(k, []byte{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Is reports whether key is a pad's key.
func Is(key []byte) bool {
	return bytes.Equal(key, keys[0]) || bytes.Equal(key, keys[1])
}
