package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

func ledgerCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ledger", Short: "Inspect, export and verify the ledger"}
	cmd.AddCommand(ledgerVerifyCmd(), ledgerHeadCmd(), ledgerTailCmd(), ledgerExportCmd(),
		ledgerCheckpointCmd(), ledgerProveCmd(), ledgerConsistencyCmd(), ledgerEraseCmd())
	return cmd
}

func ledgerVerifyCmd() *cobra.Command {
	var t target
	var exportFile, pubkeyFile, origin string
	cmd := &cobra.Command{
		Use:   "verify --data DIR|--server URL | --export FILE --pubkey FILE",
		Short: "Verify the whole ledger; exit 1 naming the first bad entry, node or checkpoint",
		Long: `verify recomputes every entry hash and link of the chain, rebuilds the Merkle
tree, checks every checkpoint's root and signature and every receipt's signature
and its match with the audit record it attests.

With --export FILE (an export of ledger export, "-" for standard input) and
--pubkey FILE (the kernel's keys/receipt.pub, or its JWKS from
/.well-known/jwks.json) it needs no data dir and no server: anyone holding the
public key can check the export. The origin (kernel id) is read from the
export's first checkpoint unless --origin names it; the key must have signed
every checkpoint either way.

The ledger is intact only if its latest checkpoint signs every entry (the
kernel signs one in every group commit): entries after it, or entries with
no checkpoint at all, fail as signed by nothing. verify prints that latest
checkpoint (size, root, origin): an export cut off after an earlier
checkpoint still verifies, so compare it with one you got independently
(ledger checkpoint remembers the last it saw).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var check kernel.LedgerCheck
			var err error
			if exportFile != "" {
				if t.data != "" || t.server != "" {
					return &usageError{errors.New("ledger verify: --export works offline; drop --data/--server")}
				}
				if pubkeyFile == "" {
					return &usageError{errors.New("ledger verify --export: give --pubkey FILE (keys/receipt.pub or the JWKS)")}
				}
				check, err = verifyExportFile(cmd, exportFile, pubkeyFile, origin)
			} else {
				var h history
				if h, err = t.openHistory("ledger verify"); err != nil {
					return err
				}
				defer h.Close()
				var total uint64
				if hd, err := h.Head(cmd.Context()); err == nil {
					total = hd.Size
				}
				p := newProgress(cmd.ErrOrStderr(), total)
				check, err = h.Verify(cmd.Context(), p.entry)
				p.done()
			}
			if err != nil {
				return err
			}
			if t.json {
				if err := printJSON(cmd.OutOrStdout(), check); err != nil {
					return err
				}
			}
			if !check.Intact {
				return fmt.Errorf("ledger TAMPERED: %s", check.Reason)
			}
			if !t.json {
				fmt.Fprintf(cmd.OutOrStdout(), "ledger intact: %d entries, %d checkpoints, root %s\n", check.Entries, check.Checkpoints, check.Root)
				if c := check.Latest; c != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "latest checkpoint: size %d, root %s, origin %s\n", c.Size, c.Root, c.Origin)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "verified: entry hashes, hash chain, Merkle tree, checkpoint signatures, receipt signatures and their audit records")
				if p := check.Payloads; p != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "audit payloads: %d records with commitments, %d parts open their commitments, %d parts not kept (commitments_only), %d records erased (%d erasure records)",
						p.Records, p.Opened, p.NotKept, p.Erased, p.ErasureRecords)
					if p.Absent > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), ", %d payloads not in the export", p.Absent)
					}
					fmt.Fprintln(cmd.OutOrStdout())
				}
			}
			return nil
		},
	}
	t.addTarget(cmd, true)
	cmd.Flags().StringVar(&exportFile, "export", "", "verify this export offline (\"-\" = standard input)")
	cmd.Flags().StringVar(&pubkeyFile, "pubkey", "", "the kernel's receipt public key: PEM (keys/receipt.pub) or JWKS, for --export")
	cmd.Flags().StringVar(&origin, "origin", "", "the kernel id the checkpoints must name (default: the export's first checkpoint's)")
	return cmd
}

// verifyExportFile verifies an export offline.
func verifyExportFile(cmd *cobra.Command, file, pubkeyFile, origin string) (kernel.LedgerCheck, error) {
	pub, err := loadPublicKey(pubkeyFile)
	if err != nil {
		return kernel.LedgerCheck{}, err
	}
	var r io.Reader = cmd.InOrStdin()
	var size int64
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return kernel.LedgerCheck{}, err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
		}
		r = f
	}
	br := bufio.NewReaderSize(r, 1<<20)
	if origin == "" {
		if origin, err = exportOrigin(br); err != nil {
			return kernel.LedgerCheck{}, fmt.Errorf("%s: %w (give --origin)", file, err)
		}
	}
	cr := &countingReader{r: br}
	p := newProgress(cmd.ErrOrStderr(), 0)
	p.bytes, p.totalBytes = &cr.n, size
	check, err := kernel.VerifyExport(cr, origin, pub, p.entry)
	p.done()
	return check, err
}

// exportOrigin reads, without consuming it, the origin of the first
// checkpoint line within the first MiB of an export (a kernel writes one
// after its first group commit, so it comes within the first lines).
func exportOrigin(br *bufio.Reader) (string, error) {
	b, err := br.Peek(br.Size())
	if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
		return "", err
	}
	for line := range bytes.Lines(b) {
		if !bytes.HasPrefix(line, []byte(`{"checkpoint":`)) {
			continue
		}
		var l struct {
			Checkpoint string `json:"checkpoint"`
		}
		if err := json.Unmarshal(line, &l); err != nil {
			return "", fmt.Errorf("checkpoint line: %w", err)
		}
		c, err := ledger.PeekCheckpoint([]byte(l.Checkpoint))
		if err != nil {
			return "", err
		}
		return c.Origin, nil
	}
	return "", errors.New("no checkpoint line in the first MiB to take the origin from")
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// progress draws a progress line on a terminal while a long ledger
// verifies; elsewhere it prints nothing.
type progress struct {
	w          io.Writer
	on         bool
	total      uint64 // entries expected, 0 if unknown
	bytes      *int64 // bytes read so far, with totalBytes, for an export
	totalBytes int64
	start      time.Time
	last       time.Time
	n          uint64
}

func newProgress(w io.Writer, total uint64) *progress {
	f, ok := w.(*os.File)
	on := ok && term.IsTerminal(int(f.Fd()))
	return &progress{w: w, on: on, total: total, start: time.Now()}
}

func (p *progress) entry(seq uint64) {
	p.n = seq + 1
	if !p.on || p.n%4096 != 0 || time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	pct := ""
	switch {
	case p.total > 0:
		pct = fmt.Sprintf("%5.1f%% ", 100*float64(p.n)/float64(p.total))
	case p.bytes != nil && p.totalBytes > 0:
		pct = fmt.Sprintf("%5.1f%% ", 100*float64(*p.bytes)/float64(p.totalBytes))
	}
	rate := float64(p.n) / time.Since(p.start).Seconds()
	fmt.Fprintf(p.w, "\rverifying: %s%d entries (%.0f/s)   ", pct, p.n, rate)
}

func (p *progress) done() {
	if p.on && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func ledgerHeadCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "head --data DIR|--server URL",
		Short: "Print the ledger's size and last entry hash",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger head")
			if err != nil {
				return err
			}
			defer h.Close()
			hd, err := h.Head(cmd.Context())
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), httpapi.HeadOf(hd))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "size %d\nhead %s\n", hd.Size, hd.Hash)
			return nil
		},
	}
	t.addTarget(cmd, true)
	return cmd
}

func ledgerTailCmd() *cobra.Command {
	var t target
	var n uint64
	var follow bool
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "tail [-n N] [-f] --data DIR|--server URL",
		Short: "Print the last entries; -f keeps printing new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger tail")
			if err != nil {
				return err
			}
			if follow && !t.remote() {
				h.Close()
				return fmt.Errorf("ledger tail -f: no kernel is running on %s: there is nothing to follow", t.data)
			}
			defer h.Close()
			ctx := cmd.Context()
			hd, err := h.Head(ctx)
			if err != nil {
				return err
			}
			from := uint64(0)
			if hd.Size > n {
				from = hd.Size - n
			}
			// The records are the stored bytes; printEntry makes the
			// summary lines terminal safe.
			out := bufio.NewWriter(rawOut(cmd))
			if !t.json {
				fmt.Fprintln(out, "SEQ\tTIME\tKIND\tHASH\tBODY")
			}
			for {
				err := h.Scan(ctx, from, func(e ledger.Entry) error {
					from = e.Seq + 1
					return printEntry(out, e, t.json)
				})
				if err != nil {
					return err
				}
				if err := out.Flush(); err != nil || !follow {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	t.addTarget(cmd, true)
	t.addReadToken(cmd)
	jsonShape(cmd, "one JSON object a line, an entry each (JSON Lines, as -f goes on printing them), not one document")
	cmd.Flags().Uint64VarP(&n, "lines", "n", 10, "how many of the last entries")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing entries as they are appended (polls --server)")
	cmd.Flags().DurationVar(&every, "poll", 500*time.Millisecond, "how often -f asks for new entries")
	return cmd
}

// printEntry writes one entry: its record (--json) or a summary line.
func printEntry(w io.Writer, e ledger.Entry, asJSON bool) error {
	if asJSON {
		return writeRecord(w, e)
	}
	// The body is JSON (no tab, newline or C0 control unescaped), but
	// C1 and bidirectional controls pass JSON as they are.
	_, err := fmt.Fprintf(terminalSafe{w}, "%d\t%s\t%-16s\t%s\t%s\n", e.Seq, clip(e.Time, 23), e.Kind, ellipsize(e.Hash, 20), ellipsize(string(e.Body), 120))
	return err
}

// writeRecord writes e as its canonical record (the stored bytes) and a
// newline.
func writeRecord(w io.Writer, e ledger.Entry) error {
	b, err := jcs.Marshal(e)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func ledgerExportCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "export --data DIR|--server URL > ledger.jsonl",
		Short: "Write every entry and checkpoint as JSON lines, for ledger verify --export",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := t.openHistory("ledger export")
			if err != nil {
				return err
			}
			defer h.Close()
			out := bufio.NewWriterSize(rawOut(cmd), 1<<20) // the stored bytes, which verify --export hashes
			if err := h.Export(cmd.Context(), out); err != nil {
				return err
			}
			return out.Flush()
		},
	}
	t.addTarget(cmd, true)
	t.addTokenFlag(cmd, "with --server: export with this auditor token file (every record in full, payloads included) instead of the admin credential; an agent's token is refused")
	return cmd
}
