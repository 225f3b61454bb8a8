// Package txn runs capkernel's mutating syscalls as prepare / commit /
// rollback transactions over a bbolt file and the workspace file system.
//
// The life of one mutating call, as the kernel drives it:
//
//  1. Prepare, in one bbolt transaction: look up the idempotency key (a
//     finished twin is replayed, a running one is refused), check the
//     precondition refs held in bbolt (kv versions, ledger head), reserve the
//     token's budgets and store a durable Intent in state "prepared". Nothing
//     is written when any check fails. The intent is encoded before the
//     transaction (Prepare.Encode), so the store's sequencer only writes it.
//  2. Stage: the syscall writes new file contents to staging files beside
//     their targets (named .capk-stage-<operation_id>-<n>) and records
//     deletions and kv puts. Nothing is visible yet. Every staging file is
//     a new inode (see "No recycled inodes" below). The kernel then makes
//     the staged files durable with one syncfs(2) shared by every call
//     waiting (Syncer.Sync).
//  3. Commit, in one bbolt transaction shared with the call's ledger records:
//     the Intent moves to "decided" with the list of effects, the delta is
//     stored under commit_delta_id, kv puts are applied, budgets settle and
//     the idempotency entry takes the full result envelope. The decided
//     intent is encoded before the transaction (Decide); the transaction
//     adds only the commit sequence number it assigns.
//  4. Apply: staged files are renamed into place, deleted targets are
//     removed where they are, and the changes are made durable
//     (Syncer.SyncLater, after the answer). Then the Intent is removed
//     (Finish, in the next transaction that commits anyway: redoing an
//     applied effect is harmless).
//
// # Ordering
//
// The durability points of a call, and why each comes where it does:
//
//   - Staged content is durable before the commit is (the Sync of step 2
//     starts after the last staging write and ends before step 3 is
//     queued): a durable decided intent names staging files whose content
//     and names are durable, so recovery can always redo it.
//   - What Apply will need is there before the commit (staging refuses
//     the call otherwise: see applicable.go and room.go), so that an
//     agent cannot make the kernel fail stop: no step of Apply needs a
//     directory entry that staging did not check the file system can
//     take. A rename onto an existing name reuses its entry, a delete
//     removes entries where they are (moving it aside first would need a
//     new entry, which a full file system refuses), and a rename onto a
//     new name or a mkdir is staged only while the file system can take
//     the blocks its directory grows by. A rename or mkdir refused all
//     the same (the file system filled meanwhile) changed nothing, and
//     recovery reports it as a ConflictRefused rather than failing.
//   - The commit is durable before the answer (bbolt fdatasync).
//   - The renames of step 4 are durable before the Intent's removal is
//     queued: the SyncLater round starts after the renames, and Finish is
//     queued from its callback. Until then a crash leaves the intent
//     decided and recovery redoes it (Redo checks every target's
//     pre-image, so a redo is harmless wherever the rename did land).
//     SyncLater starts no round of its own: it rides with the round that
//     the next call's Sync of step 2 starts (one syncfs for one call's
//     renames and another's staged files), or one that a call waiting for
//     this call's path locks hurries, or one after LaterDelay.
//   - The path locks are held until Finish is queued, and Finish
//     (store.UpdateLazy) commits no later than any write queued after it:
//     in the transaction of the first request the store takes after it,
//     ahead of that request, or in an earlier one. A later commit on the
//     same paths is queued after the locks are released, so it lands after
//     Finish in Finish's transaction or in a later one, and recovery never
//     redoes an earlier call (an unconditional mkdir, say) over a later
//     one's effect.
//   - Every syncfs of a file system goes through one descriptor, opened
//     before anything was staged there (Stage has the Syncer Watch a root
//     before its first staging file; recovery opens one with each root)
//     and kept for the Syncer's life. Linux reports a writeback error to
//     syncfs only through a descriptor opened before the error, once per
//     open file: a descriptor opened per round would return 0 after
//     another process's syncfs (a sandboxed `sync -f`) consumed the error,
//     and the commit would follow content that never reached the disk.
//   - An effect in a directory on another mount than the top of its root
//     (a file system mounted below the root, Effect.Mounted), which the
//     root's syncfs does not reach, is made durable by fsync instead, at
//     the same points: fs.write's staging file and its directory before
//     the commit, the directory after Apply's or Redo's change, each
//     through a descriptor opened before the change (see mounted.go).
//     Redo decides which effects lie on another mount when it redoes
//     them, not from the intent (a mount may have come or gone since, and
//     intents decided before Effect.Mounted do not say), and fsyncs the
//     file a write put there too, since its staging file may never have
//     been fsynced.
//     proc.exec writes nothing there (its staging pool is at the top of
//     the root: see Stage.WriteFrom).
//
// # No recycled inodes
//
// A staging file is always a new inode, although reusing the inodes that
// writes replace would save ~165 µs of CPU per write on ext4 without a
// journal (each create there scans the recently freed inodes). A replaced
// inode may still be reached by a process that holds it open with O_PATH,
// which no lease or lock reports and /proc/self/fd/N reopens; reused for
// another path (another workspace's file), it would hand that process the
// new content. The kernel cannot know that no such holder exists, so it
// never reuses an inode.
//
// Rollback removes the staging files, the Intent and the idempotency entry
// (only committed outcomes are replayed; a rolled-back call had no effect and
// may be retried with the same key) and releases the reserved budget except
// the call itself.
//
// Recover, run at open before any call, redoes every decided Intent (renames
// of staging files that still exist, deletions of targets that still exist
// and are still what was deleted, unless a later effect of the same intent
// replaced them: a proc.exec delta that turns a directory into a file, or
// a file into a directory, deletes the path and then makes it) and rolls
// back every prepared one. A multi-file commit is therefore all or
// nothing across a crash. A delete of a tree stopped part way leaves a
// directory, which the redo's pre-image check (anything but a regular
// file) accepts, and the redo removes the rest; an intent decided by a
// build that moved deleted entries aside first (Effect.Stage, a
// TrashPrefix name) is finished the same way, its trash removed.
package txn
