package kernel

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/strictjson"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream"
)

// Config configures Open. Only DataDir is required; settings left zero come
// from the data dir's kernel.json, then from the defaults below. A relative
// DataDir or SandboxDir is resolved against the working directory at Open.
type Config struct {
	DataDir string
	// PolicyDir, when set, replaces the embedded default policy bundle.
	PolicyDir string
	// MaxEnvelopeBytes bounds an encoded call envelope (default 1 MiB).
	MaxEnvelopeBytes int64
	// MaxReadBytes bounds the bytes a read returns (default 1 MiB).
	MaxReadBytes int64
	// CallTimeout, if set, bounds the execution of every syscall whose
	// definition sets no timeout of its own and whose class Timeouts does
	// not name. Unset, the bound is by side-effect class: 60s for NONE,
	// READ and WRITE, 600s for EXECUTE and NETWORK.
	CallTimeout time.Duration
	// Timeouts overrides the execution bound of a side-effect class.
	Timeouts map[syscalls.SideEffect]time.Duration
	// CancelGrace is how long a cancelled or timed-out syscall may take to
	// return before the kernel abandons it and rolls back (default 30s).
	CancelGrace time.Duration
	// ApprovalTimeout is how long a soft_gate or escalated call waits for
	// a decision (default 5m).
	ApprovalTimeout time.Duration
	// ApprovalValidity is how long an allowed approval stays good for its
	// call's execution and commit (default 15m).
	ApprovalValidity time.Duration
	// SessionConcurrency caps the calls of one session (provenance
	// session_id) executing at once (default 4); SessionQueue more may
	// wait in line (default 64), and a call beyond that is refused with
	// concurrency_exceeded.
	SessionConcurrency int
	SessionQueue       int
	// TokenLeeway is the clock skew allowed on token exp/nbf (default 30s).
	TokenLeeway time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// StableCheckpointInterval is how often the latest ledger checkpoint
	// is marked stable, for outside witnesses (default 10s).
	StableCheckpointInterval time.Duration
	// NoSync turns off fsync of the bbolt file. For tests of non-durable
	// behaviour only; never in production.
	NoSync bool
	// Observer, if set, is told of every finished call and every group
	// commit, for metrics and traces (observe.go).
	Observer Observer

	// ExecEnvAllow lists the environment variable names a proc.exec call
	// may set (kernel.json: exec_env_allow). Default none: the sandbox's
	// environment is then PATH, HOME=/tmp and LANG=C.UTF-8 only.
	ExecEnvAllow []string
	// SandboxDir holds proc.exec's staging directories and proxy sockets
	// (default DataDir/sandbox). Stale ones are removed at Open.
	SandboxDir string
	// Bwrap is the bubblewrap binary (default "bwrap" in PATH); without it
	// proc.exec fails closed with execution_error "sandbox unavailable:
	// install bubblewrap".
	Bwrap string
	// ExecMaxOutput caps proc.exec's stdout and stderr, each (default 1 MiB).
	ExecMaxOutput int64
	// ExecProcesses is proc.exec's process limit (default 256).
	ExecProcesses int
	// FetchMaxBytes caps the response body net.fetch returns (default 1 MiB).
	FetchMaxBytes int64
	// NetLookup, when set, resolves host names for net.fetch and the
	// allowlist proxy instead of the system resolver (tests map names to
	// loopback with it). The SSRF guard applies to what it returns.
	NetLookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// FetchTLS, when set, is net.fetch's TLS client configuration.
	FetchTLS *tls.Config

	// MCPServers are the upstream MCP servers whose tools become the
	// syscalls mcp.<server>.<tool> (kernel.json: mcp_servers; see
	// docs/mcp.md). Nil takes kernel.json's.
	MCPServers map[string]upstream.Server
	// Logger receives warnings the kernel cannot put in a result (an
	// upstream tool left out of the table); default slog.Default().
	Logger *slog.Logger
	// Audit says what of each call's payload is kept and for how long
	// (kernel.json: audit; see AuditConfig). Nil takes kernel.json's.
	Audit *AuditConfig
}

// Defaults.
const (
	DefaultMaxEnvelopeBytes = 1 << 20
	DefaultMaxReadBytes     = 1 << 20
	DefaultCallTimeout      = 60 * time.Second
	DefaultTokenLeeway      = 30 * time.Second
	DefaultStableCheckpoint = 10 * time.Second
	DefaultLongCallTimeout  = 600 * time.Second // EXECUTE and NETWORK
	DefaultCancelGrace      = 30 * time.Second
	DefaultApprovalTimeout  = 5 * time.Minute
	DefaultApprovalValidity = 15 * time.Minute
	DefaultSessionLimit     = 4
	DefaultSessionQueue     = 64
)

// Files of a data dir.
const (
	ConfigFile     = "kernel.json"
	DBFile         = "kernel.db"
	IssuerKeyFile  = "keys/issuer.pem"
	ReceiptKeyFile = "keys/receipt.pem"
	// ReceiptPublicKeyFile is the public half of the receipt key (PKIX PEM),
	// which verifies receipts and ledger checkpoints; safe to hand out.
	ReceiptPublicKeyFile = "keys/receipt.pub"
	AdminFile            = "admin.token"
)

// settings is the data dir's kernel.json.
type settings struct {
	KernelID            string                     `json:"kernel_id"`
	Issuer              string                     `json:"issuer"`
	AdminCredentialHash string                     `json:"admin_credential_hash"`
	PolicyDir           string                     `json:"policy_dir,omitempty"`
	MaxEnvelopeBytes    int64                      `json:"max_envelope_bytes,omitempty"`
	MaxReadBytes        int64                      `json:"max_read_bytes,omitempty"`
	ExecEnvAllow        []string                   `json:"exec_env_allow,omitempty"`
	MCPServers          map[string]upstream.Server `json:"mcp_servers,omitempty"`
	Audit               *AuditConfig               `json:"audit,omitempty"`
}

// InitResult describes a data dir made by Init.
type InitResult struct {
	KernelID        string
	Issuer          string
	AdminCredential string // also in DataDir/admin.token (mode 0600)
}

// Init makes a new data dir: kernel id, issuer and receipt keys (Ed25519,
// PKCS #8 PEM), an admin credential and kernel.json. It refuses a dir that
// already holds a kernel. What it writes is durable when it returns: the
// files and their directories are fsynced, kernel.json last, so a power
// loss never leaves a kernel.json whose keys are lost (a ledger whose
// checkpoints no key on the disk verifies).
func Init(dir string) (*InitResult, error) {
	if _, err := os.Stat(filepath.Join(dir, ConfigFile)); err == nil {
		return nil, fmt.Errorf("init: %s already holds a kernel (%s exists)", dir, ConfigFile)
	}
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	id := "ck-" + uuid.NewString()
	res := &InitResult{KernelID: id, Issuer: "capkernel:" + id}
	for _, f := range []string{IssuerKeyFile, ReceiptKeyFile} {
		if err := writeNewKey(filepath.Join(dir, f)); err != nil {
			return nil, err
		}
	}
	receiptKey, err := LoadKey(filepath.Join(dir, ReceiptKeyFile))
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := ensurePublicKey(filepath.Join(dir, ReceiptPublicKeyFile), receiptKey); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	res.AdminCredential = AdminPrefix + base64.RawURLEncoding.EncodeToString(secret)
	if err := os.WriteFile(filepath.Join(dir, AdminFile), []byte(res.AdminCredential+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := syncPaths(dir, IssuerKeyFile, ReceiptKeyFile, ReceiptPublicKeyFile, AdminFile, "keys", "."); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	// The database is made here, before kernel.json: Open refuses a data
	// dir whose kernel.db is missing or empty (a lost file must not pass
	// for a new kernel's).
	if err := CreateDatabase(dir); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	s := settings{KernelID: id, Issuer: res.Issuer, AdminCredentialHash: digest.Sum([]byte(res.AdminCredential))}
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), append(b, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := syncPaths(dir, ConfigFile, "."); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	return res, nil
}

// CreateDatabase makes the empty database (kernel.db) of data dir dir,
// durably; it refuses a dir that has one. Init calls it; on its own it is
// for a data dir that an older build made without its database, and
// that was never opened (kernelctl init --database): Open refuses a
// missing kernel.db, which it cannot tell from a lost one.
func CreateDatabase(dir string) error {
	p := filepath.Join(dir, DBFile)
	if _, err := os.Stat(p); err == nil {
		return fmt.Errorf("%s exists", p)
	}
	db, err := store.Open(p, store.Options{})
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	return syncPaths(dir, DBFile, ".")
}

// syncPaths fsyncs each of names, files or directories under dir, in
// order.
func syncPaths(dir string, names ...string) error {
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("fsync %s: %w", f.Name(), err)
		}
	}
	return nil
}

func writeNewKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	defer f.Close()
	return pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// timeout is the execution bound of a syscall of class se that sets none.
func (c Config) timeout(se syscalls.SideEffect) time.Duration {
	if d := c.Timeouts[se]; d > 0 {
		return d
	}
	if c.CallTimeout > 0 {
		return c.CallTimeout
	}
	if se == syscalls.Execute || se == syscalls.Network {
		return DefaultLongCallTimeout
	}
	return DefaultCallTimeout
}

// ensurePublicKey writes the public half of key to path (PKIX PEM) unless
// the file is there already.
func ensurePublicKey(path string, key ed25519.PrivateKey) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("write the receipt public key: %w", err)
	}
	return nil
}

// ParsePublicKey parses an Ed25519 public key in PKIX PEM.
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, errors.New("not an Ed25519 public key")
	}
	return pub, nil
}

// LoadKey reads an Ed25519 private key in PKCS #8 PEM.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: not a PEM PRIVATE KEY", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an Ed25519 key", path)
	}
	return priv, nil
}

func loadSettings(dir string) (settings, error) {
	var s settings
	b, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return s, fmt.Errorf("%s is not a kernel data dir (no %s; run kernelctl init --data %s)", dir, ConfigFile, dir)
	}
	if err != nil {
		return s, err
	}
	if err := strictjson.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", filepath.Join(dir, ConfigFile), err)
	}
	if s.KernelID == "" || s.Issuer == "" {
		return s, fmt.Errorf("%s: kernel_id and issuer are required", filepath.Join(dir, ConfigFile))
	}
	return s, nil
}

// policyDir is the bundle dir kernel.json names for data dir dir: its
// policy_dir, resolved against dir when relative; "" when it names none.
func (s settings) policyDir(dir string) string {
	if s.PolicyDir == "" || filepath.IsAbs(s.PolicyDir) {
		return s.PolicyDir
	}
	return filepath.Join(dir, s.PolicyDir)
}

// PolicyDir returns the policy bundle dir Open loads for data dir dataDir
// when Config.PolicyDir is empty: kernel.json's policy_dir, resolved
// against dataDir (made absolute) when relative, or "" when it names none
// (the embedded default bundle). It fails when kernel.json cannot be read,
// and when policy_dir names no directory, naming the setting, its value
// and the path it resolves to, where Open's error named only ".".
func PolicyDir(dataDir string) (string, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", dataDir, err)
	}
	s, err := loadSettings(abs)
	if err != nil {
		return "", err
	}
	dir := s.policyDir(abs)
	if dir == "" {
		return "", nil
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		err = errors.New("no such directory")
	case err == nil && !fi.IsDir():
		err = errors.New("not a directory")
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
	}
	if err != nil {
		return "", fmt.Errorf("%s: policy_dir %q (%s, resolved against the data dir): %v; it names the policy bundle's directory", filepath.Join(abs, ConfigFile), s.PolicyDir, dir, err)
	}
	return dir, nil
}

// resolve fills unset fields from s and the defaults.
func (c Config) resolve(s settings) Config {
	if c.PolicyDir == "" {
		c.PolicyDir = s.policyDir(c.DataDir)
	} else if !filepath.IsAbs(c.PolicyDir) {
		c.PolicyDir = filepath.Join(c.DataDir, c.PolicyDir)
	}
	pick := func(v, fromFile, def int64) int64 {
		switch {
		case v > 0:
			return v
		case fromFile > 0:
			return fromFile
		}
		return def
	}
	c.MaxEnvelopeBytes = pick(c.MaxEnvelopeBytes, s.MaxEnvelopeBytes, DefaultMaxEnvelopeBytes)
	c.MaxReadBytes = pick(c.MaxReadBytes, s.MaxReadBytes, DefaultMaxReadBytes)
	if c.TokenLeeway <= 0 {
		c.TokenLeeway = DefaultTokenLeeway
	}
	if c.StableCheckpointInterval <= 0 {
		c.StableCheckpointInterval = DefaultStableCheckpoint
	}
	if c.CancelGrace <= 0 {
		c.CancelGrace = DefaultCancelGrace
	}
	if c.ApprovalTimeout <= 0 {
		c.ApprovalTimeout = DefaultApprovalTimeout
	}
	if c.ApprovalValidity <= 0 {
		c.ApprovalValidity = DefaultApprovalValidity
	}
	if c.SessionConcurrency <= 0 {
		c.SessionConcurrency = DefaultSessionLimit
	}
	if c.SessionQueue <= 0 {
		c.SessionQueue = DefaultSessionQueue
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ExecEnvAllow == nil {
		c.ExecEnvAllow = s.ExecEnvAllow
	}
	if c.SandboxDir == "" {
		c.SandboxDir = filepath.Join(c.DataDir, "sandbox")
	}
	if c.MCPServers == nil {
		c.MCPServers = s.MCPServers
	}
	if c.Audit == nil {
		c.Audit = s.Audit
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
