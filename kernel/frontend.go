package kernel

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/syscalls"
)

// AdminPrefix starts every admin credential, so a front end can tell one
// apart from a capability token (a compact JWS never starts with it).
const AdminPrefix = "ckadmin_"

// IsAdmin reports whether cred is the data dir's admin credential. The
// comparison is of digests, in constant time.
func (k *Kernel) IsAdmin(cred string) bool {
	if !strings.HasPrefix(cred, AdminPrefix) || k.settings.AdminCredentialHash == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(digest.Sum([]byte(cred))), []byte(k.settings.AdminCredentialHash)) == 1
}

// VerifyBearer verifies a capability token presented on its own, outside a
// call envelope: signature, issuer, audience, validity window and
// revocation. The error is a *captoken.Error.
func (k *Kernel) VerifyBearer(token string) (*captoken.Token, error) {
	return k.verifier.VerifyBearer(token, k.cfg.Now())
}

// Tools returns the definitions of the syscalls the capability token may
// call, in an LLM tool format (syscalls.Tools). A token that does not
// verify as a bearer credential is refused with a *captoken.Error.
func (k *Kernel) Tools(token, format string) (json.RawMessage, error) {
	tok, err := k.VerifyBearer(token)
	if err != nil {
		return nil, err
	}
	var defs []syscalls.Definition
	for _, d := range k.registry.List() {
		if tok.AllowsTool(d.ID) {
			defs = append(defs, d)
		}
	}
	return syscalls.Tools(defs, format)
}

// Refuse records a call a front end refuses before it reaches the pipeline
// (for example, a request body over the size limit) and returns its
// result: data is whatever of the envelope was received, class and msg the
// refusal. Like every call, it leaves an audit record and a receipt.
func (k *Kernel) Refuse(ctx context.Context, data []byte, class, msg string) *Result {
	c := &call{start: k.cfg.Now(), env: salvage(data), envHash: digest.Sum(data)}
	if !k.calls.enter() {
		return k.closingAnswer(c)
	}
	defer k.calls.leave()
	return k.deny(ctx, c, class, msg)
}

// MaxTokenTTL bounds the lifetime Mint gives a token.
const MaxTokenTTL = 90 * 24 * time.Hour

// validTTL reports whether ttl_seconds s is within 0..MaxTokenTTL (0: the
// default), compared in seconds: as a time.Duration a huge s wraps around
// to a small lifetime.
func validTTL(s int64) bool { return s >= 0 && s <= int64(MaxTokenTTL/time.Second) }

// TokenRequest asks for a capability token: what `kernelctl token mint`
// and POST /v1/tokens send. The JSON field names are the wire format.
type TokenRequest struct {
	AgentID    string             `json:"agent_id"`
	Tools      []string           `json:"tools"`
	FS         []captoken.FSRoot  `json:"fs,omitempty"`
	Net        []string           `json:"net,omitempty"`
	KV         []captoken.KVScope `json:"kv,omitempty"`
	Budgets    map[string]int64   `json:"budgets,omitempty"`
	Autonomy   string             `json:"autonomy,omitempty"`
	TTLSeconds int64              `json:"ttl_seconds,omitempty"` // default 3600; at most MaxTokenTTL
	// Role, "approver", "escalation" or "auditor", mints a role token for
	// the person AgentID names instead of an agent's token; it grants no
	// tools or scopes (an auditor's reads every record in full).
	Role string `json:"role,omitempty"`
	// Handles puts the token's sessions in handle mode (see Kernel.Handles).
	Handles bool `json:"handles,omitempty"`
}

// MintedToken is a token Mint made, with the claims a caller needs.
type MintedToken struct {
	Token     string              `json:"token"` // compact JWS
	ID        string              `json:"jti"`
	AgentID   string              `json:"agent_id"`
	ExpiresAt string              `json:"expires_at"` // RFC 3339, UTC
	Cap       captoken.Capability `json:"cap"`
}

// Mint signs a capability token for req with the kernel's issuer key. It
// refuses requests whose claims would not verify (see captoken.Claims.Validate),
// an fs root that is not an existing directory as the kernel sees it
// (rootDir: the kernel opens it at every fs call of the token) and one
// that reaches the kernel's own directories (checkRoots). Each root's
// path is minted with its links resolved, so that the token names the
// tree the root named when it was minted.
func (k *Kernel) Mint(req TokenRequest) (*MintedToken, error) {
	ttl := time.Duration(req.TTLSeconds) * time.Second
	switch {
	case req.AgentID == "":
		return nil, errors.New("mint: agent_id is required (the agent, or for a role token the person, the token is for)")
	case !validAgentID(req.AgentID):
		return nil, errors.New("mint: " + agentIDRule)
	case req.TTLSeconds == 0:
		ttl = time.Hour
	case !validTTL(req.TTLSeconds):
		return nil, fmt.Errorf("mint: ttl_seconds %d is outside 1..%d", req.TTLSeconds, int64(MaxTokenTTL/time.Second))
	}
	// A root the kernel cannot open as a directory would fail every fs
	// call of the token: said now, to whoever mints it.
	fsRoots := slices.Clone(req.FS)
	for i, r := range fsRoots {
		real, err := rootDir(r.Path)
		if err != nil {
			return nil, fmt.Errorf("mint: %w", err)
		}
		fsRoots[i].Path = real
	}
	// A root that reaches the kernel's own directories would be refused
	// at every call (private.go): said now, to whoever mints it.
	roots := make([]syscalls.RootSpec, 0, len(fsRoots))
	for _, r := range fsRoots {
		roots = append(roots, syscalls.RootSpec{Path: r.Path, Writable: r.Mode == "rw"})
	}
	if err := k.checkRoots(roots); err != nil {
		return nil, fmt.Errorf("mint: %w", err)
	}
	now := k.cfg.Now()
	tok, c, err := k.MintToken(captoken.Claims{
		Subject: req.AgentID, IssuedAt: now, NotBefore: now, Expiry: now.Add(ttl),
		Cap: captoken.Capability{Tools: req.Tools, FS: fsRoots, Net: req.Net, KV: req.KV, Budgets: req.Budgets, Autonomy: req.Autonomy, Role: req.Role, Handles: req.Handles},
	})
	if err != nil {
		return nil, fmt.Errorf("mint: %w", err)
	}
	return &MintedToken{Token: tok, ID: c.ID, AgentID: c.Subject, ExpiresAt: c.Expiry.UTC().Format(time.RFC3339), Cap: c.Cap}, nil
}

// globChars are the characters of a shell glob, which a root's path
// takes literally.
const globChars = "*?["

// rootDir checks that the absolute, clean path of an fs root is an
// existing directory as the kernel sees it (the file system and mount
// namespace of the kernel's process, with its permissions: what its
// workspaces open) and returns it with its links resolved. A root that
// is not absolute and clean is returned as given, for captoken's
// validation to refuse. A path holding a glob character that does not
// exist is explained: a root is one directory taken literally (ws/*
// would name a directory called "*"), never a pattern.
//
// Tokens minted before this check are not refused for it: a root that
// is missing at a call fails that call (scope_denied), as one that
// vanishes after minting does.
func rootDir(path string) (string, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return path, nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		if real, err := filepath.EvalSymlinks(path); err == nil {
			return real, nil
		}
		return path, nil
	case err == nil:
		return "", fmt.Errorf("fs root %s is not a directory: a root is a directory (the token's calls name files under it)", path)
	case errors.Is(err, fs.ErrNotExist) && strings.ContainsAny(path, globChars):
		return "", fmt.Errorf("fs root %s does not exist: a root is one directory taken literally, not a pattern (%s is no wildcard there); give the directory itself to grant everything under it", path, quoteGlob(path))
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("fs root %s does not exist where the kernel runs: a root must be an existing directory (make it first)", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is said once
	}
	return "", fmt.Errorf("fs root %s cannot be opened by the kernel: %w", path, err)
}

// quoteGlob names the glob characters in s.
func quoteGlob(s string) string {
	var q []string
	for _, c := range globChars {
		if strings.ContainsRune(s, c) {
			q = append(q, strconv.QuoteRune(c))
		}
	}
	return strings.Join(q, " and ")
}
