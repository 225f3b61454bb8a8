package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// loadPublicKey reads the kernel's receipt public key from a PEM file
// (keys/receipt.pub) or a JWKS document holding one key.
func loadPublicKey(file string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(strings.TrimSpace(string(b)), "{") {
		pub, err := receipts.PublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return pub, nil
	}
	pub, err := kernel.ParsePublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return pub, nil
}

// trustedKey is the key checkpoints must be signed with: --pubkey if given,
// else the kernel's own (from the data dir, or the server's JWKS).
func trustedKey(ctx context.Context, h history, pubkeyFile string) (ed25519.PublicKey, error) {
	if pubkeyFile != "" {
		return loadPublicKey(pubkeyFile)
	}
	jwks, err := h.JWKS(ctx)
	if err != nil {
		return nil, err
	}
	return receipts.PublicKey(jwks)
}

// openTrusted opens --data/--server and the key its checkpoints must be
// signed with.
func (t *target) openTrusted(ctx context.Context, verb, pubkeyFile string) (history, ed25519.PublicKey, error) {
	h, err := t.openHistory(verb)
	if err != nil {
		return nil, nil, err
	}
	pub, err := trustedKey(ctx, h, pubkeyFile)
	if err != nil {
		h.Close()
		return nil, nil, err
	}
	return h, pub, nil
}

// printProof writes a verified proof's summary and its hashes.
func printProof(w io.Writer, summary string, hashes []string) {
	fmt.Fprintf(w, "%sproof (%d hashes):\n", summary, len(hashes))
	for _, h := range hashes {
		fmt.Fprintf(w, "  %s\n", h)
	}
}

// openSigned checks a checkpoint's signature with pub, under the key name
// sc.Origin, which must be the checkpoint's origin, and returns it.
func openSigned(sc kernel.SignedCheckpoint, pub ed25519.PublicKey) (ledger.Checkpoint, error) {
	v, err := ledger.NewCheckpointVerifier(sc.Origin, pub)
	if err != nil {
		return ledger.Checkpoint{}, err
	}
	cp, err := ledger.OpenCheckpoint([]byte(sc.Note), v)
	if err == nil && cp.Origin != sc.Origin {
		return ledger.Checkpoint{}, fmt.Errorf("checkpoint of origin %q signed under the key name %q", cp.Origin, sc.Origin)
	}
	return cp, err
}

func ledgerCheckpointCmd() *cobra.Command {
	var t target
	var stable bool
	var pubkeyFile, stateDir string
	cmd := &cobra.Command{
		Use:   "checkpoint --data DIR|--server URL [--stable]",
		Short: "Fetch the latest signed checkpoint, verify it, and prove it consistent with the last one seen",
		Long: `checkpoint fetches the kernel's latest signed checkpoint (--stable: the latest
one marked stable, the one witnesses share), checks its signature with the kernel's
key (--pubkey FILE to pin it) and, like rekor-cli loginfo, remembers it in
--state DIR, per origin and per signing key. On every later call it proves the
new checkpoint consistent with the ones remembered for its origin and its key:
another root for the same size or a failed consistency proof means the ledger
was rewritten, and a key seen under another origin signs another history under a
new name; either exits 1 without forgetting the old checkpoint. An older
checkpoint (--stable after the latest) must be proved a prefix of the one
remembered, which stays remembered.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			h, pub, err := t.openTrusted(ctx, "ledger checkpoint", pubkeyFile)
			if err != nil {
				return err
			}
			defer h.Close()
			sc, err := h.Checkpoint(ctx, stable)
			if err != nil {
				return err
			}
			cp, err := openSigned(sc, pub)
			if err != nil {
				return fmt.Errorf("checkpoint signature: %w", err)
			}
			consistency := "not remembered (--state \"\")"
			if stateDir != "" {
				st := checkpointState{dir: stateDir}
				var older bool
				if consistency, older, err = st.check(ctx, h, cp, pub); err != nil {
					return err
				}
				if !older {
					if err := st.save(cp, sc.Note, pub); err != nil {
						return err
					}
				}
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), struct {
					kernel.SignedCheckpoint
					Consistency string `json:"consistency"`
				}{sc, consistency})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "origin      %s\nsize        %d\nroot        %s\nnumber      %d\nsignature   ok (%s)\nconsistency %s\n\n%s",
				cp.Origin, cp.Size, digest.Format(cp.Root), sc.Number, sc.VerifierKey, consistency, sc.Note)
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().BoolVar(&stable, "stable", false, "the latest stable checkpoint (marked every few seconds) instead of the latest")
	cmd.Flags().StringVar(&pubkeyFile, "pubkey", "", "pin the kernel's receipt public key (PEM or JWKS) instead of asking the kernel")
	cmd.Flags().StringVar(&stateDir, "state", defaultStateDir(), "where seen checkpoints are remembered (empty: remember nothing)")
	return cmd
}

// signedRootAt returns the root of the tree of size entries, proven against
// the kernel's latest signed checkpoint: equal to it, or consistent with
// it. It returns that checkpoint too.
func signedRootAt(ctx context.Context, h history, pub ed25519.PublicKey, size uint64, root string) (ledger.Checkpoint, error) {
	sc, err := h.Checkpoint(ctx, false)
	if err != nil {
		return ledger.Checkpoint{}, err
	}
	cp, err := openSigned(sc, pub)
	if err != nil {
		return cp, fmt.Errorf("checkpoint signature: %w", err)
	}
	r, err := digest.Parse(root)
	if err != nil {
		return cp, fmt.Errorf("root of size %d: %w", size, err)
	}
	switch {
	case size == cp.Size:
		if r != cp.Root {
			return cp, fmt.Errorf("the root of size %d is %s but the signed checkpoint says %s", size, root, digest.Format(cp.Root))
		}
	case size > cp.Size:
		return cp, fmt.Errorf("tree size %d is beyond the latest checkpoint's %d; no signed root covers it yet", size, cp.Size)
	default:
		p, err := h.ProveConsistency(ctx, size, cp.Size)
		if err != nil {
			return cp, err
		}
		if err := p.VerifySizes(size, cp.Size, r, cp.Root); err != nil {
			return cp, fmt.Errorf("the root of size %d is not consistent with the signed checkpoint of size %d: %w", size, cp.Size, err)
		}
	}
	return cp, nil
}

func ledgerProveCmd() *cobra.Command {
	var t target
	var seq, size uint64
	var pubkeyFile string
	cmd := &cobra.Command{
		Use:   "prove --seq N [--size M] --data DIR|--server URL",
		Short: "Print and verify the inclusion proof of entry N, against the latest signed checkpoint",
		Long: `prove fetches the inclusion proof of entry --seq in the tree of --size entries
(default: the latest checkpoint's) and verifies it: against the checkpoint's signed
root, or, for another size, against that size's root after proving the root
consistent with the latest signed checkpoint. Exit 1 if anything fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("seq") {
				return &usageError{errors.New("ledger prove: --seq is required")}
			}
			ctx := cmd.Context()
			h, pub, err := t.openTrusted(ctx, "ledger prove", pubkeyFile)
			if err != nil {
				return err
			}
			defer h.Close()
			p, err := h.ProveInclusion(ctx, seq, size)
			if err != nil {
				return err
			}
			// Without --size the tree is the one the kernel names (its
			// latest checkpoint's, which signedRootAt proves); the entry
			// is always the one asked for.
			if size == 0 {
				size = p.TreeSize
			}
			cp, err := signedRootAt(ctx, h, pub, size, p.Root)
			if err != nil {
				return fmt.Errorf("inclusion proof NOT verified: %w", err)
			}
			root, _ := digest.Parse(p.Root)
			if err := p.Inclusion.VerifyAt(seq, size, root); err != nil {
				return fmt.Errorf("inclusion proof NOT verified: %w", err)
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			printProof(cmd.OutOrStdout(), fmt.Sprintf("entry %d (%s) is in the tree of %d entries, root %s\nverified against the checkpoint of %s, size %d\n",
				p.LeafIndex, p.LeafHash, p.TreeSize, p.Root, cp.Origin, cp.Size), p.Proof)
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().Uint64Var(&seq, "seq", 0, "the entry to prove")
	cmd.Flags().Uint64Var(&size, "size", 0, "the tree size to prove it in (default: the latest checkpoint's)")
	cmd.Flags().StringVar(&pubkeyFile, "pubkey", "", "pin the kernel's receipt public key (PEM or JWKS) instead of asking the kernel")
	return cmd
}

func ledgerConsistencyCmd() *cobra.Command {
	var t target
	var from, to uint64
	var pubkeyFile string
	cmd := &cobra.Command{
		Use:   "consistency --from M --to N --data DIR|--server URL",
		Short: "Print and verify the consistency proof between tree sizes M and N",
		Long: `consistency fetches the proof that the tree of M entries is a prefix of the tree
of N entries, proves N's root consistent with the latest signed checkpoint, and
verifies the proof. Exit 1 if anything fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("from") || !cmd.Flags().Changed("to") {
				return &usageError{errors.New("ledger consistency: --from and --to are required")}
			}
			ctx := cmd.Context()
			h, pub, err := t.openTrusted(ctx, "ledger consistency", pubkeyFile)
			if err != nil {
				return err
			}
			defer h.Close()
			p, err := h.ProveConsistency(ctx, from, to)
			if err != nil {
				return err
			}
			cp, err := signedRootAt(ctx, h, pub, to, p.Root2)
			if err != nil {
				return fmt.Errorf("consistency proof NOT verified: %w", err)
			}
			r1, err1 := digest.Parse(p.Root1)
			r2, err2 := digest.Parse(p.Root2)
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("consistency proof NOT verified: %w", err)
			}
			if err := p.Consistency.VerifySizes(from, to, r1, r2); err != nil {
				return fmt.Errorf("consistency proof NOT verified: %w", err)
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			printProof(cmd.OutOrStdout(), fmt.Sprintf("the tree of %d entries (root %s) is a prefix of the tree of %d (root %s)\nverified against the checkpoint of %s, size %d\n",
				p.Size1, p.Root1, p.Size2, p.Root2, cp.Origin, cp.Size), p.Proof)
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().Uint64Var(&from, "from", 0, "the smaller tree size")
	cmd.Flags().Uint64Var(&to, "to", 0, "the larger tree size")
	cmd.Flags().StringVar(&pubkeyFile, "pubkey", "", "pin the kernel's receipt public key (PEM or JWKS) instead of asking the kernel")
	return cmd
}
