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
// so each entry commits to the whole history before it.
//
// # Merkle tree, proofs and checkpoints
//
// Over the entries, in sequence order, lies a Merkle tree of the shape of
// RFC 9162 §2.1: the leaf of entry seq is its entry hash, an interior node
// is NodeHash (keyed BLAKE3, key = DeriveKey("capkernel ledger v1 node"))
// over exactly the 64 bytes of its two children, and the empty tree's root
// is Hasher.EmptyRoot (keyed BLAKE3 with the node key over no bytes). Hasher is
// this tree's hasher for github.com/transparency-dev/merkle, whose proof
// and compact packages compute the proofs (InclusionProof,
// ConsistencyProof; VerifyInclusion, VerifyConsistency) and roots (Root).
//
// A checkpoint is a C2SP tlog-checkpoint (origin, tree size, root) signed
// as a C2SP signed note with Ed25519 (NewCheckpointSigner, SignCheckpoint,
// OpenCheckpoint). WriteCheckpoint, run at the end of each group-commit
// transaction, stores one whenever the size has changed; all are kept.
// CheckTree, run when the database is opened, rebuilds the tree's right
// edge and compares it with the latest checkpoint. VerifyWith checks
// entries, tree and checkpoints; Export writes entries and checkpoints as
// JSON lines that VerifyExport checks offline. FORMATS-merkle.md specifies
// all of this byte for byte.
//
// # Storage
//
// The caller owns the *bbolt.DB and calls this package inside its own
// transactions (group commit puts many Appends into one transaction).
// Init creates four buckets:
//
//   - "ledger": key = seq as 8 bytes big-endian; value = the record, the RFC
//     8785 canonical JSON of the entry including entry_hash:
//     {"body":…,"entry_hash":…,"kind":…,"prev_hash":…,"seq":…,"time":…},
//     stored packed (internal/jsonpack; loadRecord gives the JSON back
//     byte for byte, and returns the JSON of records stored before packing
//     as is). Because the record must be exactly canonical, Verify notices
//     a change to any byte of a stored value.
//   - "ledger_meta": key "head" = 8-byte big-endian entry count followed by
//     the 32 raw bytes of the last entry_hash, so Append needs no scan;
//     key "tree_layout" = the key layout of "ledger_tree", one byte 0x02
//     (absent: layout 1, the level-major keys of files written before).
//   - "ledger_tree": the hash of every perfect subtree of the Merkle tree,
//     written by Append as it completes: key = completion position (8
//     bytes big-endian, (i+1)·2^l − 1, the last entry the node covers) ||
//     level (1 byte), value = 32 raw bytes; node (l, i) covers entries
//     [i·2^l, (i+1)·2^l) and level 0 holds the entry hashes. Keys ascend in
//     the order appends complete nodes, so a transaction's nodes go to the
//     bucket's tail. A root or proof reads O(log n) of them. Init builds
//     this bucket once for a ledger made before it existed, and rewrites a
//     layout-1 tree under layout-2 keys (read-only transactions read
//     both).
//   - "ledger_checkpoints": key = 8-byte big-endian counter from 0, value =
//     a signed checkpoint note, stored packed (loadCheckpoint); sizes never
//     decrease with the counter.
//
// Field formats: kind matches [a-z][a-z0-9_]* (at most 64 bytes); time is
// RFC 3339 in UTC with exactly nine fractional digits (TimeLayout); hashes
// are "blake3:<64 lowercase hex>"; seq is below 2^53, so it is exact as a
// JSON number in every language. None of these strings needs JSON escaping.
//
// Get and Scan only decode records; Verify is what checks hashes and links.
// Verification work that needs one record only (decoding, hashing,
// checking a checkpoint signature) runs on all cores.
package ledger
