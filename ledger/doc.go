// Package ledger is capkernel's append-only, hash-chained log of audit
// records, receipts and other security events, stored in bbolt.
//
// Every entry carries a 0-based sequence number, a kind, a time, the hash of
// the entry before it and a JSON object body. Its entry_hash is keyed
// BLAKE3 (key = DeriveKey("capkernel ledger v1 leaf")) over the RFC 8785
// canonical JSON of
//
//	{"body":…,"kind":…,"prev_hash":…,"seq":…,"time":…}
//
// so each entry commits to the whole history before it. The entry hash is
// also the leaf hash of the ledger's Merkle tree, whose interior nodes are
// NodeHash (key = DeriveKey("capkernel ledger v1 node")) over exactly the 64
// bytes of the two children.
//
// # Storage
//
// The caller owns the *bbolt.DB and calls this package inside its own
// transactions (group commit puts many Appends into one transaction).
// Init creates two buckets:
//
//   - "ledger": key = seq as 8 bytes big-endian; value = the record, the RFC
//     8785 canonical JSON of the entry including entry_hash:
//     {"body":…,"entry_hash":…,"kind":…,"prev_hash":…,"seq":…,"time":…}.
//     Because the stored bytes must be exactly canonical, Verify notices a
//     change to any byte of a record.
//   - "ledger_meta": key "head" = 8-byte big-endian entry count followed by
//     the 32 raw bytes of the last entry_hash, so Append needs no scan.
//
// Field formats: kind matches [a-z][a-z0-9_]* (at most 64 bytes); time is
// RFC 3339 in UTC with exactly nine fractional digits (TimeLayout); hashes
// are "blake3:<64 lowercase hex>"; seq is below 2^53, so it is exact as a
// JSON number in every language. None of these strings needs JSON escaping.
//
// Get and Scan only decode records; Verify is what checks hashes and links.
package ledger
