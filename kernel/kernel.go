// Package kernel is capkernel's syscall pipeline: every tool call of an
// agent enters through Invoke, which verifies the capability token, checks
// the tool and its resources against the token's scopes, asks the policy for
// an autonomy mode, runs mutating calls as prepare / commit / rollback
// transactions and appends an audit record and a signed receipt to the
// ledger — for every call, allowed or denied. invoke.go holds the pipeline.
package kernel

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/sandbox"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
	"github.com/capkernel/capkernel/upstream"
)

// Kernel is an open data dir serving calls. It is safe for concurrent use.
type Kernel struct {
	cfg     Config
	private []privateDir // the kernel's own directories, which no root may reach (private.go)
	// systemDirs are those every sandboxed run sees whole
	// (sandbox.SystemDirs), which none of private may lie in.
	systemDirs []string
	settings   settings
	db         *store.DB
	kv         syscalls.KVReader // the kv store as syscalls read it, made once (a call's would allocate)
	registry   *syscalls.Registry
	// upstreams are the connected upstream MCP servers (nil before Open
	// reaches them and after Close).
	upstreams  *upstream.Set
	policy     *policy.Engine
	issuer     ed25519.PrivateKey
	receiptPub ed25519.PublicKey // verifies the checkpoints, and so the receipts
	lw         *ledger.Writer    // every audit entry is appended through it (receipts.Logged)
	verifier   *captoken.Verifier
	locks      *pathLocks
	netTurns   netBudgetLocks // calls spending one net_bytes budget take turns (netbudget.go)
	syncer     *txn.Syncer
	finishing  sync.WaitGroup // finish calls whose Finish is not queued yet
	cpSigner   note.Signer    // signs the ledger checkpoints (receipt key, named by the kernel id)
	presigned  presigned      // the batch's checkpoint, signed beside its Work steps (sequencer's: batchWork, afterBatch)
	upgrading  bool           // upgrade's transactions run: no checkpoint (set and cleared around them, before any other write)

	stopStable chan struct{} // closed by Close to end stableLoop
	stableDone chan struct{} // closed when stableLoop has returned
	stopWatch  chan struct{} // closed by Close to end watchFailure

	events     *eventBus
	sessions   *sessions
	inflight   registry
	approvals  approvals
	held       inflightBytes // what calls hold from admission to record
	ops        operations
	background sync.WaitGroup // calls begun by Start
	calls      gate           // every call running, for Close
	sandbox    *sandbox.Sandbox

	mu         sync.RWMutex
	revoked    map[string]bool // jti -> revoked
	handles    *handles        // per-session tool handles (handles.go)
	seen       map[string]bool // jti -> token_first_seen recorded
	workspaces *workspaceCache // opened workspaces by root set (workspaces.go)

	// Recovered reports what Open's crash recovery did.
	Recovered txn.Recovered

	// Sequencer accounting, which the benchmarks report per call: group
	// commits, and the time the kernel's functions ran on the store's
	// sequencer (serial.go).
	commits atomic.Int64
	serial  atomic.Int64 // nanoseconds

	audit     *auditPolicy  // kernel.json audit: depth and retention (auditconfig.go)
	retention chan struct{} // closed by Close to end the retention loop (erase.go)
	retained  chan struct{} // closed when it has returned
}

var (
	bucketRevoked = []byte("revocations") // jti -> revocation record
	bucketTokens  = []byte("tokens")      // jti -> first-seen claims
)

// Open opens the data dir of cfg, recovers interrupted transactions, loads
// the policy bundle (recording it in the ledger) and returns a kernel ready
// for calls. A data dir is owned by one process at a time.
func Open(ctx context.Context, cfg Config) (*Kernel, error) {
	// Relative dirs are resolved now: the sandbox, which changes its
	// root, and anything run from another directory need absolute ones.
	for _, d := range []*string{&cfg.DataDir, &cfg.SandboxDir} {
		if *d == "" {
			continue
		}
		abs, err := filepath.Abs(*d)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", *d, err)
		}
		*d = abs
	}
	s, err := loadSettings(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cfg = cfg.resolve(s)
	audit, err := cfg.Audit.parse()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(cfg.DataDir, ConfigFile), err)
	}
	k := &Kernel{
		cfg: cfg, settings: s, locks: newPathLocks(),
		revoked: map[string]bool{}, seen: map[string]bool{}, handles: newHandles(), workspaces: newWorkspaceCache(MaxOpenRoots, MaxFamilyRoots),
		events: newEventBus(), sessions: newSessions(cfg.SessionConcurrency, cfg.SessionQueue),
		inflight: registry{calls: map[string]*inflight{}}, approvals: approvals{pending: map[string]*approval{}, byAgent: map[string]int{}, bytesByAgent: map[string]int64{}},
		ops: newOperations(), audit: audit,
	}
	if k.issuer, err = LoadKey(filepath.Join(cfg.DataDir, IssuerKeyFile)); err != nil {
		return nil, err
	}
	receiptKey, err := LoadKey(filepath.Join(cfg.DataDir, ReceiptKeyFile))
	if err != nil {
		return nil, err
	}
	k.receiptPub = receiptKey.Public().(ed25519.PublicKey)
	k.lw = ledger.NewWriter()
	if k.cpSigner, err = ledger.NewCheckpointSigner(s.KernelID, receiptKey); err != nil {
		return nil, err
	}
	if err := ensurePublicKey(filepath.Join(cfg.DataDir, ReceiptPublicKeyFile), receiptKey); err != nil {
		return nil, err
	}
	k.verifier = captoken.NewVerifier(captoken.VerifierConfig{
		Keys:     map[string]ed25519.PublicKey{captoken.KeyID(k.issuer.Public().(ed25519.PublicKey)): k.issuer.Public().(ed25519.PublicKey)},
		Issuer:   s.Issuer,
		Audience: s.KernelID,
		Leeway:   cfg.TokenLeeway,
		Revoked:  k.isRevoked,
	})
	k.registry = syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(k.registry); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.SandboxDir, 0o700); err != nil {
		return nil, err
	}
	// A killed kernel's sandbox staging: its processes died with it (see
	// package sandbox); what they wrote was never applied.
	if _, err := sandbox.CleanupStale(cfg.SandboxDir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if stale, _ := filepath.Glob(filepath.Join(cfg.SandboxDir, "capk-proxy-*")); len(stale) > 0 {
		for _, p := range stale {
			os.RemoveAll(p)
		}
	}
	k.private, k.systemDirs = privateDirs(cfg), sandbox.SystemDirs()
	k.sandbox = sandbox.New(sandbox.Options{Bwrap: cfg.Bwrap, StagingDir: cfg.SandboxDir})
	if err := syscalls.RegisterExec(k.registry, syscalls.ExecOptions{
		Sandbox: k.sandbox, EnvAllow: cfg.ExecEnvAllow, MaxOutput: cfg.ExecMaxOutput, Processes: cfg.ExecProcesses,
		ProxyDir: cfg.SandboxDir, Lookup: cfg.NetLookup,
	}); err != nil {
		return nil, err
	}
	if err := syscalls.RegisterFetch(k.registry, syscalls.FetchOptions{MaxBytes: cfg.FetchMaxBytes, Lookup: cfg.NetLookup, TLS: cfg.FetchTLS}); err != nil {
		return nil, err
	}
	if k.policy, err = policy.Load(ctx, cfg.PolicyDir); err != nil {
		return nil, err
	}
	if k.db, err = store.Open(filepath.Join(cfg.DataDir, DBFile), store.Options{
		MustExist: true, NoSync: cfg.NoSync, AfterBatch: k.afterBatch, BatchWork: k.batchWork, Observe: k.groupCommit,
		// Budget charges are coalesced per group commit: each token's
		// usage is decoded and stored once per transaction, not per call.
		BeginTx: txn.CacheBudgets, EndTx: txn.DiscardBudgets,
		BeforeCommit: func(tx *bbolt.Tx) error {
			defer k.onSequencer(time.Now())
			return txn.FlushBudgets(tx)
		},
	}); errors.Is(err, store.ErrNoFile) {
		return nil, fmt.Errorf("%w; this data dir holds kernel %s (%s): its idempotency keys, revocations, budgets and ledger are in %s, and a new one would run committed calls again and forget revoked tokens. Restore %s from a backup. (A data dir made by kernelctl init of a build before the database was made there, and never opened since, gets its empty one with kernelctl init --data %s --database.)",
			err, s.KernelID, ConfigFile, DBFile, DBFile, cfg.DataDir)
	} else if err != nil {
		return nil, err
	}
	k.kv = &txn.KV{View: k.db.View}
	k.syncer = txn.NewSyncer()
	// A closed workspace's roots are forgotten: the cache closes and
	// opens roots for as long as the kernel runs.
	k.workspaces.closing = func(w *syscalls.Workspace) { k.syncer.Forget(w.Roots()...) }
	k.locks.onWait = k.syncer.Hurry
	k.stopWatch = make(chan struct{})
	go k.watchFailure(k.stopWatch)
	if err := k.load(ctx); err != nil {
		k.Close()
		return nil, err
	}
	if err := k.markStable(ctx); err != nil {
		k.Close()
		return nil, fmt.Errorf("open: stable checkpoint: %w", err)
	}
	// Upstream servers last: their tools join a table that is complete
	// otherwise, and a failure here has nothing else to undo but Close.
	if k.upstreams, err = upstream.Start(ctx, k.registry, cfg.MCPServers, cfg.Logger); err != nil {
		k.Close()
		return nil, err
	}
	k.stopStable, k.stableDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(k.stableDone)
		k.stableLoop(cfg.StableCheckpointInterval, k.stopStable)
	}()
	if err := k.startRetention(ctx); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

// checkTail refuses a ledger with entries beyond its latest checkpoint:
// the kernel appends entries and the checkpoint over them in one
// transaction, so such entries were written by something else (appended
// to the file while the kernel was stopped), and the next group commit
// would sign them. A ledger with no checkpoint at all is one from before
// checkpoints, which the first commit signs over (ledger verify refuses
// it until then).
func checkTail(tx *bbolt.Tx) error {
	cp, err := ledger.LatestCheckpoint(tx)
	if errors.Is(err, ledger.ErrNoCheckpoint) {
		return nil
	}
	if err != nil {
		return err
	}
	h, err := ledger.HeadOf(tx)
	if err != nil {
		return err
	}
	if h.Size > cp.Size {
		return fmt.Errorf("the ledger holds %d entries but its latest checkpoint signs %d: entries %d..%d were not appended by this kernel (restore the data dir from a backup, or export and inspect them)",
			h.Size, cp.Size, cp.Size, h.Size-1)
	}
	return nil
}

// checkOwner refuses a ledger that is not this kernel's: its latest
// checkpoint names another origin, or its signature does not verify
// with this data dir's receipt key. Another kernel's kernel.db, put here
// by a mixed-up restore or copy, would otherwise be served: its
// idempotency keys, revocations and budgets applied to this kernel's
// tokens, and this kernel's records appended to the other's history and
// signed under this origin, damaging it for both. One signature check per
// open. A ledger without a checkpoint (none before checkpoints) has
// nothing to tell.
func (k *Kernel) checkOwner(tx *bbolt.Tx) error {
	cp, err := ledger.LatestCheckpoint(tx)
	if errors.Is(err, ledger.ErrNoCheckpoint) {
		return nil
	}
	if err != nil {
		return err
	}
	if cp.Origin != k.settings.KernelID {
		return fmt.Errorf("%s holds the ledger of kernel %q, and this data dir is kernel %s (%s): restore this kernel's %s, or serve that one's data dir", DBFile, cp.Origin, k.settings.KernelID, ConfigFile, DBFile)
	}
	v, err := ledger.NewCheckpointVerifier(k.settings.KernelID, k.receiptPub)
	if err != nil {
		return err
	}
	if _, err := ledger.OpenCheckpoint(cp.Signed, v); err != nil {
		return fmt.Errorf("the latest checkpoint of %s (#%d, size %d) does not verify with this data dir's receipt key %s (%w): the file or the key is another kernel's; restore the matching one", DBFile, cp.Num, cp.Size, ReceiptKeyFile, err)
	}
	return nil
}

// upgradeStep bounds what one transaction of upgrade moves: bbolt holds
// it in memory until the commit.
var upgradeStep = 20_000

// upgrade moves a file of an older build to the current storage layout in
// transactions of at most upgradeStep keys each (ledger.Move), once it
// has checked that every key can be moved and that the moved file will
// open (ledger.CheckMove), so that a file refused is left as its build
// left it: on a ledger of a million calls one transaction would hold
// gigabytes. A crash between steps leaves a file that the next Open goes
// on moving, and that readers refuse meanwhile. A ledger of layout 1, or
// made before the tree, is moved by load's own transaction (ledger.Init,
// then CheckTree), whole.
func (k *Kernel) upgrade(ctx context.Context) error {
	k.upgrading = true
	defer func() { k.upgrading = false }()
	var steps bool
	if err := k.db.View(func(tx *bbolt.Tx) error {
		var err error
		steps, err = ledger.CheckMove(tx)
		return err
	}); err != nil {
		return fmt.Errorf("open: upgrade the storage layout: %w", err)
	}
	for done := !steps; !done; {
		if err := k.db.Update(ctx, func(tx *bbolt.Tx) error {
			var err error
			done, err = ledger.Move(tx, upgradeStep)
			return abortIf(err)
		}); err != nil {
			return fmt.Errorf("open: upgrade the storage layout: %w", err)
		}
	}
	return nil
}

// load creates buckets, reads revocations, recovers and records the policy.
func (k *Kernel) load(ctx context.Context) error {
	if err := k.upgrade(ctx); err != nil {
		return err
	}
	err := k.db.Update(ctx, func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketRevoked, bucketTokens, bucketStable} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return store.Abort(err)
			}
		}
		if err := ledger.Init(tx); err != nil {
			return store.Abort(err)
		}
		if err := ledger.CheckTree(tx); errors.Is(err, ledger.ErrLayoutMismatch) {
			return store.Abort(fmt.Errorf("open: %w", err))
		} else if err != nil {
			return store.Abort(fmt.Errorf("open: the ledger does not match its last checkpoint: %w", err))
		}
		if err := checkTail(tx); err != nil {
			return store.Abort(fmt.Errorf("open: %w", err))
		}
		if err := k.checkOwner(tx); err != nil {
			return store.Abort(fmt.Errorf("open: %w", err))
		}
		if err := indexReceipts(tx); err != nil {
			return store.Abort(err)
		}
		return abortIf(txn.Init(tx))
	})
	if err != nil {
		return err
	}
	if err := k.db.View(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketRevoked).ForEach(func(j, _ []byte) error {
			k.revoked[string(j)] = true
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketTokens).ForEach(func(j, _ []byte) error {
			k.seen[string(j)] = true
			return nil
		})
	}); err != nil {
		return err
	}
	if k.Recovered, err = txn.Recover(ctx, k.db, k.auditRecovery); err != nil {
		return err
	}
	for _, c := range k.Recovered.Conflicts {
		why := "its target no longer holds the content it was staged against"
		switch {
		case c.Reason == txn.ConflictStaging:
			why = "its staging file does not hold the committed content (damaged after it was synced)"
		case c.Reason == txn.ConflictRefused && c.Op == txn.OpCleanup:
			why = "the file system refuses to remove this staging file; it is left"
		case c.Reason == txn.ConflictRefused:
			why = "the file system refuses it for good (" + c.Error + ")"
		}
		k.cfg.Logger.Warn("recovery did not apply a committed effect: "+why+" (kernelctl workspace verify names it)",
			"operation_id", c.OperationID, "op", c.Op, "root", c.Root, "path", c.Path, "reason", c.Reason, "want", c.Want, "found", c.Found, "error", c.Error)
	}
	body, _ := json.Marshal(map[string]any{"policy_hash": k.policy.Hash(), "files": k.policy.Files(), "kernel_id": k.settings.KernelID})
	return k.db.Update(ctx, func(tx *bbolt.Tx) error {
		e, err := ledger.Append(tx, ledger.KindPolicyLoaded, k.cfg.Now(), body)
		if err == nil {
			err = recordPolicyLoaded(tx, e)
		}
		return abortIf(err)
	})
}

// Close admits no more calls (one that comes is answered, unrecorded,
// that the kernel is closing), cancels the calls in flight
// (ErrKernelClosing) and waits for their records, then closes the
// upstream servers, waits for queued writes and closes the bbolt file and
// the workspaces. Calls made after Close fail.
func (k *Kernel) Close() error {
	k.calls.close(func() { k.inflight.cancelAll(ErrKernelClosing) })
	if k.upstreams != nil {
		k.upstreams.Close()
		k.upstreams = nil
	}
	if k.stopStable != nil {
		close(k.stopStable)
		<-k.stableDone
		k.stopStable = nil
	}
	k.stopRetention()
	if k.stopWatch != nil {
		close(k.stopWatch)
		k.stopWatch = nil
	}
	k.finishing.Wait()
	err := k.db.Close()
	if err == nil {
		k.syncer.Close()
	}
	if k.sandbox != nil {
		k.sandbox.Close()
	}
	k.workspaces.close()
	return err
}

// ID returns the kernel id (the audience of its capability tokens).
func (k *Kernel) ID() string { return k.settings.KernelID }

// PolicyHash returns the active policy bundle's hash.
func (k *Kernel) PolicyHash() string { return k.policy.Hash() }

// MaxEnvelopeBytes returns the size limit of an encoded call envelope.
func (k *Kernel) MaxEnvelopeBytes() int64 { return k.cfg.MaxEnvelopeBytes }

// Registry returns the syscall table.
func (k *Kernel) Registry() *syscalls.Registry { return k.registry }

// ReceiptKey returns the public key that verifies the kernel's receipts.
func (k *Kernel) ReceiptKey() ed25519.PublicKey { return bytes.Clone(k.receiptPub) }

// JWKS returns the JWKS document of the kernel's receipt key.
func (k *Kernel) JWKS() ([]byte, error) { return receipts.JWKS(k.receiptPub) }

// MintToken signs a capability token with the kernel's issuer key, filling
// iss, aud, iat and a fresh jti where they are empty. A jti given must be
// a UUID in canonical form, as the kernel's are (ErrNotTokenID): Revoke
// takes nothing else.
func (k *Kernel) MintToken(c captoken.Claims) (string, captoken.Claims, error) {
	if c.Issuer == "" {
		c.Issuer = k.settings.Issuer
	}
	if c.Audience == "" {
		c.Audience = k.settings.KernelID
	}
	if c.ID == "" {
		c.ID = newID()
	} else if !canonicalUUID(c.ID) {
		return "", c, fmt.Errorf("mint: jti %q: %w", c.ID, ErrNotTokenID)
	}
	now := k.cfg.Now()
	if c.IssuedAt.IsZero() {
		c.IssuedAt = now
	}
	if c.NotBefore.IsZero() {
		c.NotBefore = now
	}
	if c.Expiry.IsZero() {
		c.Expiry = now.Add(time.Hour)
	}
	t, err := captoken.Mint(k.issuer, c)
	return t, c, err
}

// ErrNotTokenID refuses a revocation of something that is not a token
// id: the kernel's jtis are UUIDs in canonical form, so a revocation of
// anything else would record a revocation that can never apply.
var ErrNotTokenID = errors.New("not a token id (the kernel's are UUIDs in canonical form: token mint --json and token inspect print them)")

// Revoke revokes the token jti: the revocation is stored and appended to
// the ledger in one transaction, and every later call with the token is
// refused with token_revoked. A jti that is not a UUID is ErrNotTokenID.
func (k *Kernel) Revoke(ctx context.Context, jti, reason string) error {
	if !canonicalUUID(jti) {
		return fmt.Errorf("revoke: %q: %w", jti, ErrNotTokenID)
	}
	now := k.cfg.Now()
	body, err := json.Marshal(map[string]string{"jti": jti, "reason": reason, "time": now.UTC().Format(ledger.TimeLayout)})
	if err != nil {
		return err
	}
	err = k.db.Update(ctx, func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketRevoked).Get([]byte(jti)) != nil {
			return nil
		}
		if err := tx.Bucket(bucketRevoked).Put([]byte(jti), body); err != nil {
			return store.Abort(err)
		}
		_, err := ledger.Append(tx, ledger.KindRevocation, now, body)
		return abortIf(err)
	})
	if err != nil {
		return fmt.Errorf("revoke %s: %w", jti, err)
	}
	k.mu.Lock()
	k.revoked[jti] = true
	k.mu.Unlock()
	k.handles.dropToken(jti)
	return nil
}

func (k *Kernel) isRevoked(jti string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.revoked[jti]
}

// View runs fn in a read-only transaction of the kernel's bbolt file, for
// inspection (ledger entries, stored operations and deltas).
func (k *Kernel) View(fn func(*bbolt.Tx) error) error { return k.db.View(fn) }

func abortIf(err error) error {
	if err == nil {
		return nil
	}
	return store.Abort(err)
}
