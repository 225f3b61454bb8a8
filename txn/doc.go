// Package txn runs capkernel's mutating syscalls as prepare / commit /
// rollback transactions over a bbolt file and the workspace file system.
//
// The life of one mutating call, as the kernel drives it:
//
//  1. Prepare, in one bbolt transaction: look up the idempotency key (a
//     finished twin is replayed, a running one is refused), check the
//     precondition refs held in bbolt (kv versions, ledger head), reserve the
//     token's budgets and store a durable Intent in state "prepared". Nothing
//     is written when any check fails.
//  2. Stage: the syscall writes new file contents to staging files beside
//     their targets (named .capk-stage-<operation_id>-<n>) and records
//     deletions and kv puts. Nothing is visible yet. The kernel then makes
//     the staged files durable with one syncfs(2) shared by every call
//     waiting (Syncer).
//  3. Commit, in one bbolt transaction shared with the call's ledger records:
//     the Intent moves to "decided" with the list of effects, the delta is
//     stored under commit_delta_id, kv puts are applied, budgets settle and
//     the idempotency entry takes the full result envelope.
//  4. Apply: staged files are renamed into place, deleted targets are moved
//     aside and removed, and the renames are made durable (Syncer again).
//     Then the Intent is removed (asynchronously: redoing an applied effect
//     is harmless).
//
// Rollback removes the staging files, the Intent and the idempotency entry
// (only committed outcomes are replayed; a rolled-back call had no effect and
// may be retried with the same key) and releases the reserved budget except
// the call itself.
//
// Recover, run at open before any call, redoes every decided Intent (renames
// of staging files that still exist, deletions of targets that still exist)
// and rolls back every prepared one. A multi-file commit is therefore all or
// nothing across a crash.
package txn
