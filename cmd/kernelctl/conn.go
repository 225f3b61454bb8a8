package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/receipts"
)

// target is where a verb acts: a data dir (the kernel opened in this
// process, read-only for reads, or, when a kernel is running on it, that
// kernel through its control socket) or a running server.
type target struct {
	data      string
	server    string
	adminFile string
	json      bool
	cmd       *cobra.Command
	// socket is the control socket client of the kernel running on data,
	// set by check.
	socket *httpapi.Client
	// serverFrom and credFrom name where --server and the admin
	// credential came from (a flag or an environment variable), for errors.
	serverFrom, credFrom string
	// readToken is --token of the history verbs: a token file to read
	// with instead of the admin credential (addReadToken).
	readToken string
	// policy is --policy of the verbs that may open the kernel in this
	// process (addPolicy).
	policy string
}

// addPolicy adds --policy to a verb that opens a stopped kernel's data dir
// in this process (openKernel).
func (t *target) addPolicy(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.policy, "policy", "", "with --data of a stopped kernel: the policy bundle dir to run it under, relative to the working directory "+
		"(default: kernel.json's policy_dir, else the embedded bundle, which must be the policy the kernel last ran under)")
}

// addReadToken adds --token to a history verb: read as an auditor (every
// record in full) or as an agent (its own records in full, the public
// part of the others') instead of as the admin.
func (t *target) addReadToken(cmd *cobra.Command) {
	t.addTokenFlag(cmd, "with --server: read with this token file (an auditor token reads everything; an agent's token its own records in full, others' public parts) instead of the admin credential")
}

// addTokenFlag adds --token, described by help, to a verb that reads
// with a token file instead of the admin credential.
func (t *target) addTokenFlag(cmd *cobra.Command, help string) {
	cmd.Flags().StringVar(&t.readToken, "token", "", help)
}

// Environment variables the target flags fall back on.
const (
	envData   = "CAPKERNEL_DATA"
	envServer = "CAPKERNEL_SERVER"
	envAdmin  = "CAPKERNEL_ADMIN_TOKEN"
)

// addTarget adds --data and --server (and, for a server, the credential
// flags) to cmd.
func (t *target) addTarget(cmd *cobra.Command, credentials bool) {
	t.cmd = cmd
	cmd.Flags().StringVar(&t.data, "data", "", "kernel data dir; a running kernel's is reached through its control socket (default: env "+envData+")")
	cmd.Flags().StringVar(&t.server, "server", "", "URL of a running kernel, e.g. http://127.0.0.1:7070 (default: env "+envServer+")")
	if credentials {
		cmd.Flags().StringVar(&t.adminFile, "admin-token", "", "file holding the admin credential, for --server (default: env "+envAdmin+", the credential itself)")
	}
	addJSON(cmd, &t.json)
}

// given reports whether --data or --server was given on the command line.
func (t *target) given() bool {
	return t.cmd != nil && (t.cmd.Flags().Changed("data") || t.cmd.Flags().Changed("server"))
}

// check requires exactly one of --data and --server, each from its flag
// or else its environment variable (a flag beats the environment: with
// --data, CAPKERNEL_SERVER is ignored), and finds the control socket of
// a kernel running on --data.
func (t *target) check(verb string) error {
	t.serverFrom = "--server"
	if !t.given() {
		d, s := os.Getenv(envData), os.Getenv(envServer)
		if d != "" && s != "" {
			return &usageError{fmt.Errorf("%s: %s and %s are both set: give --data DIR or --server URL to choose", verb, envData, envServer)}
		}
		t.data, t.server = d, s
		t.serverFrom = "env " + envServer
	}
	switch {
	case t.data == "" && t.server == "":
		return &usageError{fmt.Errorf("%s: give --data DIR or --server URL (or set %s or %s)", verb, envData, envServer)}
	case t.data != "" && t.server != "":
		return &usageError{fmt.Errorf("%s: give --data DIR or --server URL, not both", verb)}
	}
	if t.server != "" {
		if err := checkServerURL(t.serverFrom, t.server); err != nil {
			return err
		}
	}
	if t.data != "" {
		if c, ok := httpapi.ControlClient(t.data); ok {
			t.socket = c
		}
	}
	if t.policy != "" && t.remote() {
		where := "the kernel at " + t.server
		if t.socket != nil {
			where = "the kernel serving " + t.data
		}
		return usagef("%s --policy: %s runs under the policy it was started with; --policy chooses the bundle of a stopped kernel opened in this process", verb, where)
	}
	return nil
}

// checkServerURL checks that server, given by from (a flag or an
// environment variable), is the URL of a kernel: http or https and a
// host. A HOST:PORT, as --listen takes, is a usage error suggesting
// http://HOST:PORT, where it failed later in the URL parser or the
// transport with errors that named neither from nor the cause.
func checkServerURL(from, server string) error {
	u, err := url.Parse(server)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return nil
	}
	hint := "e.g. http://127.0.0.1:7070"
	if !strings.Contains(server, "://") {
		hint = "did you mean http://" + server + "?"
	}
	return usagef("%s %q is not a kernel's URL: it needs the scheme http:// or https:// and a host (%s)", from, server, hint)
}

// remote reports whether the verb acts through the API: on --server, or
// on the kernel running on --data through its control socket.
func (t *target) remote() bool { return t.server != "" || t.socket != nil }

// adminCredential returns the admin credential for --server; over the
// control socket none is needed (the socket's permission is the
// credential) and it returns "".
func (t *target) adminCredential() (string, error) {
	if t.socket != nil {
		return "", nil
	}
	var cred string
	switch {
	case t.adminFile != "":
		t.credFrom = "--admin-token " + t.adminFile
		if looksLikeAdmin(t.adminFile) {
			return "", &usageError{errors.New("--admin-token takes the path of a file holding the admin credential, not the credential itself (that goes in env " + envAdmin + ")")}
		}
		c, err := readSecret(t.adminFile)
		if err != nil {
			return "", fmt.Errorf("--admin-token: %w", err)
		}
		cred = c
	case os.Getenv(envAdmin) != "":
		t.credFrom = "env " + envAdmin
		cred = strings.TrimSpace(os.Getenv(envAdmin))
		if !looksLikeAdmin(cred) {
			if fi, err := os.Stat(cred); err == nil && fi.Mode().IsRegular() {
				return "", &usageError{fmt.Errorf("%s holds a path (%s); it takes the credential itself: export %s=$(cat %s), or give --admin-token %s", envAdmin, cred, envAdmin, cred, cred)}
			}
		}
	default:
		return "", &usageError{fmt.Errorf("%s needs the admin credential: --admin-token FILE or env %s (or --data DIR of the running kernel: its control socket needs none)", t.server, envAdmin)}
	}
	if !looksLikeAdmin(cred) {
		what := "it does not start with " + kernel.AdminPrefix
		if strings.Count(cred, ".") == 2 {
			what = "it is a capability token (a JWS), not the admin credential"
		}
		return "", &usageError{fmt.Errorf("%s is not an admin credential: %s (the admin credential is in DATA/%s)", t.credFrom, what, kernel.AdminFile)}
	}
	return cred, nil
}

// looksLikeAdmin reports whether s has the form of an admin credential.
func looksLikeAdmin(s string) bool { return strings.HasPrefix(s, kernel.AdminPrefix) }

// client returns an API client carrying cred: of --server, or of the
// control socket.
func (t *target) client(cred string) *httpapi.Client {
	if t.socket != nil {
		c := *t.socket
		c.Credential = cred
		return &c
	}
	return &httpapi.Client{BaseURL: t.server, Credential: cred}
}

// adminClient returns an API client carrying the admin credential.
func (t *target) adminClient() (*httpapi.Client, error) {
	cred, err := t.adminCredential()
	if err != nil {
		return nil, err
	}
	return t.client(cred), nil
}

// openKernel opens the kernel of --data in this process, under the policy
// bundle of --policy or else the data dir's (choosePolicy).
func (t *target) openKernel(ctx context.Context) (*kernel.Kernel, error) {
	cfg := kernel.Config{DataDir: t.data}
	var err error
	if cfg.PolicyDir, err = t.choosePolicy(); err != nil {
		return nil, err
	}
	k, err := kernel.Open(ctx, cfg)
	if err != nil && strings.Contains(err.Error(), "is locked by another process") {
		return nil, fmt.Errorf("%w; a kernel is serving %s without a control socket (%s): run this verb with --server URL", err, t.data, httpapi.ControlSocket)
	}
	if err == nil {
		go exitOnFailStop(k)
	}
	return k, err
}

// choosePolicy returns the policy bundle dir to open --data under ("" the
// embedded default bundle). --policy is the operator's choice, taken as
// given. Without it the bundle is the data dir's (kernel.json's policy_dir,
// else the embedded one), and it must be the one the kernel last ran under,
// by the ledger's last policy_loaded record: serve --policy is kept nowhere
// but in that record, and a verb that silently decided calls under another
// bundle (the default, typically) would drop the operator's rules. A data
// dir that cannot be opened read-only here is left to kernel.Open, which
// says why; one kept in an older storage layout, which only Open moves to
// the current one, is opened unchecked once, and so is one without a
// ledger yet. One a kernel holds is refused.
func (t *target) choosePolicy() (string, error) {
	if t.policy != "" {
		return bundleDir("--policy", t.policy)
	}
	dir, err := kernel.PolicyDir(t.data)
	if err != nil {
		return "", err
	}
	want, err := policy.Hash(dir)
	if err != nil {
		return "", err
	}
	in, err := kernel.OpenInspector(t.data)
	if errors.Is(err, kernel.ErrLocked) {
		return "", fmt.Errorf("%w; a kernel is serving %s without a control socket (%s): run this verb with --server URL", err, t.data, httpapi.ControlSocket)
	} else if err != nil {
		return dir, nil
	}
	defer in.Close()
	if _, err := in.Head(); err != nil {
		// No ledger yet: a data dir kernelctl init made and no kernel opened.
		return dir, nil
	}
	last, seq, found, err := in.LastPolicy()
	if err != nil {
		return "", fmt.Errorf("reading the policy the kernel last ran under: %w", err)
	}
	if !found || last == want {
		return dir, nil
	}
	which := "the embedded default bundle (" + kernel.ConfigFile + " names no policy_dir)"
	if dir != "" {
		which = "the bundle " + dir + " (policy_dir in " + kernel.ConfigFile + ")"
	}
	return "", fmt.Errorf("the kernel on %s last ran under policy %s (ledger seq %d) and this verb would load %s, %s: refused, so that no call is decided under another policy. "+
		"Give the bundle the kernel ran under with --policy DIR (kernelctl policy hash DIR prints a bundle's hash) or name it in policy_dir of %s; "+
		"to change the policy, give the new bundle with --policy once: later verbs follow the policy the ledger last recorded",
		t.data, last, seq, want, which, filepath.Join(t.data, kernel.ConfigFile))
}

// history is what the read verbs need, from a data dir or a server.
type history interface {
	Head(ctx context.Context) (ledger.Head, error)
	Scan(ctx context.Context, from uint64, fn func(ledger.Entry) error) error
	ScanViews(ctx context.Context, from uint64, fn func(kernel.EntryView) error) error
	Entries(ctx context.Context, from uint64, limit int) ([]ledger.Entry, error)
	Receipt(ctx context.Context, id string) (*kernel.ReceiptInfo, error)
	Receipts(ctx context.Context, f kernel.ReceiptFilter) ([]kernel.ReceiptInfo, error)
	JWKS(ctx context.Context) ([]byte, error)
	Verify(ctx context.Context, progress func(seq uint64)) (kernel.LedgerCheck, error)
	Checkpoint(ctx context.Context, stable bool) (kernel.SignedCheckpoint, error)
	ProveInclusion(ctx context.Context, seq, size uint64) (*kernel.InclusionResponse, error)
	ProveConsistency(ctx context.Context, from, to uint64) (*kernel.ConsistencyResponse, error)
	Bundle(ctx context.Context, receiptID string) (*receipts.Logged, error)
	Export(ctx context.Context, w io.Writer) error
	ReplayVerify(ctx context.Context) (*kernel.ReplayReport, error)
	ReplayShow(ctx context.Context, key, agent string) ([]kernel.ReplayHistory, error)
	Close() error
}

// openHistory opens --data read-only, or a client of --server with the
// admin credential.
func (t *target) openHistory(verb string) (history, error) {
	if err := t.check(verb); err != nil {
		return nil, err
	}
	if t.socket != nil {
		return remoteHistory{t.client("")}, nil
	}
	if t.data != "" {
		in, err := kernel.OpenInspector(t.data)
		if err != nil {
			return nil, err
		}
		return localHistory{in}, nil
	}
	if t.readToken != "" {
		tok, err := readToken("--token", t.readToken)
		if err != nil {
			return nil, err
		}
		return remoteHistory{t.client(tok)}, nil
	}
	// Public reads (head, checkpoint, proofs, JWKS) need no credential:
	// without one, the endpoints that do need it say so.
	cred, err := t.adminCredential()
	var ue *usageError
	if errors.As(err, &ue) && t.adminFile == "" && os.Getenv(envAdmin) == "" {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return remoteHistory{t.client(cred)}, nil
}

type localHistory struct{ in *kernel.Inspector }

func (l localHistory) Head(context.Context) (ledger.Head, error) { return l.in.Head() }
func (l localHistory) Scan(_ context.Context, from uint64, fn func(ledger.Entry) error) error {
	return l.in.Scan(from, fn)
}
func (l localHistory) ScanViews(_ context.Context, from uint64, fn func(kernel.EntryView) error) error {
	return l.in.ScanViews(from, kernel.AccessAll, fn)
}
func (l localHistory) Entries(_ context.Context, from uint64, limit int) ([]ledger.Entry, error) {
	return l.in.Entries(from, limit)
}
func (l localHistory) Receipt(_ context.Context, id string) (*kernel.ReceiptInfo, error) {
	return l.in.Receipt(id)
}
func (l localHistory) Receipts(_ context.Context, f kernel.ReceiptFilter) ([]kernel.ReceiptInfo, error) {
	return l.in.Receipts(f)
}
func (l localHistory) JWKS(context.Context) ([]byte, error) { return l.in.JWKS() }
func (l localHistory) Verify(_ context.Context, progress func(uint64)) (kernel.LedgerCheck, error) {
	return l.in.Verify(progress)
}
func (l localHistory) Checkpoint(_ context.Context, stable bool) (kernel.SignedCheckpoint, error) {
	return l.in.Checkpoint(stable)
}
func (l localHistory) ProveInclusion(_ context.Context, seq, size uint64) (*kernel.InclusionResponse, error) {
	return l.in.ProveInclusion(seq, size)
}
func (l localHistory) ProveConsistency(_ context.Context, from, to uint64) (*kernel.ConsistencyResponse, error) {
	return l.in.ProveConsistency(from, to)
}
func (l localHistory) Bundle(_ context.Context, id string) (*receipts.Logged, error) {
	return l.in.Bundle(id)
}
func (l localHistory) Export(_ context.Context, w io.Writer) error { return l.in.Export(w) }
func (l localHistory) Close() error                                { return l.in.Close() }
func (l localHistory) ReplayVerify(context.Context) (*kernel.ReplayReport, error) {
	return l.in.ReplayVerify()
}
func (l localHistory) ReplayShow(_ context.Context, key, agent string) ([]kernel.ReplayHistory, error) {
	return l.in.ReplayShow(key, agent)
}

type remoteHistory struct{ c *httpapi.Client }

func (r remoteHistory) Head(ctx context.Context) (ledger.Head, error) {
	h, err := r.c.Head(ctx)
	return ledger.Head{Size: h.Size, Hash: h.Hash}, err
}
func (r remoteHistory) Scan(ctx context.Context, from uint64, fn func(ledger.Entry) error) error {
	return r.c.Scan(ctx, from, fn)
}
func (r remoteHistory) ScanViews(ctx context.Context, from uint64, fn func(kernel.EntryView) error) error {
	return r.c.ScanViews(ctx, from, fn)
}
func (r remoteHistory) Entries(ctx context.Context, from uint64, limit int) ([]ledger.Entry, error) {
	p, err := r.c.Entries(ctx, from, limit)
	out := make([]ledger.Entry, len(p.Entries))
	for i, v := range p.Entries {
		out[i] = v.Entry
	}
	return out, err
}
func (r remoteHistory) Receipt(ctx context.Context, id string) (*kernel.ReceiptInfo, error) {
	return r.c.Receipt(ctx, id)
}
func (r remoteHistory) Receipts(ctx context.Context, f kernel.ReceiptFilter) ([]kernel.ReceiptInfo, error) {
	return r.c.Receipts(ctx, f)
}
func (r remoteHistory) JWKS(ctx context.Context) ([]byte, error) { return r.c.JWKS(ctx) }
func (r remoteHistory) Verify(ctx context.Context, _ func(uint64)) (kernel.LedgerCheck, error) {
	return r.c.VerifyLedger(ctx)
}
func (r remoteHistory) Checkpoint(ctx context.Context, stable bool) (kernel.SignedCheckpoint, error) {
	return r.c.Checkpoint(ctx, stable)
}
func (r remoteHistory) ProveInclusion(ctx context.Context, seq, size uint64) (*kernel.InclusionResponse, error) {
	return r.c.ProveInclusion(ctx, seq, size)
}
func (r remoteHistory) ProveConsistency(ctx context.Context, from, to uint64) (*kernel.ConsistencyResponse, error) {
	return r.c.ProveConsistency(ctx, from, to)
}
func (r remoteHistory) Bundle(ctx context.Context, id string) (*receipts.Logged, error) {
	return r.c.Bundle(ctx, id)
}

func (r remoteHistory) Export(ctx context.Context, w io.Writer) error { return r.c.Export(ctx, w) }
func (r remoteHistory) ReplayVerify(ctx context.Context) (*kernel.ReplayReport, error) {
	return r.c.ReplayVerify(ctx)
}
func (r remoteHistory) ReplayShow(ctx context.Context, key, agent string) ([]kernel.ReplayHistory, error) {
	return r.c.ReplayShow(ctx, key, agent)
}
func (r remoteHistory) Close() error { return nil }

// readSecret reads a credential or token file ("-" is standard input),
// trimmed of surrounding white space.
func readSecret(path string) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// printJSON writes v as indented JSON. Both print <, > and & as they are
// (encoding/json escapes them for HTML pages, which a terminal or a file
// is not: a fetched page's markup would be unreadable), and escape what a
// terminal acts on (jsonSafe).
func printJSON(w io.Writer, v any) error { return encodeJSON(w, v, "  ") }

// printJSONLine writes v as one line of JSON.
func printJSONLine(w io.Writer, v any) error { return encodeJSON(w, v, "") }

func encodeJSON(w io.Writer, v any, indent string) error {
	enc := json.NewEncoder(jsonSafe{w})
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	return enc.Encode(v)
}

// exitOnFailStop ends the process with status 1 when k fails stop (a
// durability failure), as kernelctl serve does: no call is answered after
// it, and the next start recovers from what is durable.
func exitOnFailStop(k *kernel.Kernel) {
	<-k.Failed()
	fmt.Fprintf(os.Stderr, "kernelctl: durability failure: %v\nkernelctl: exiting; the next start recovers\n", k.Err())
	os.Exit(1)
}
