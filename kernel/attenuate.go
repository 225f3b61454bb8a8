package kernel

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/syscalls"
)

// KindTokenAttenuated is the ledger kind of the record of an attenuated
// token: its jti, agent, grants and chain of ancestors.
const KindTokenAttenuated = "token_attenuated"

// AttenuateRequest asks for a token narrower than Parent, for a sub-agent:
// what `kernelctl token attenuate` and POST /v1/tokens/attenuate send. An
// empty field keeps the parent's grant (tools, fs, net, kv, autonomy); a
// budget the request leaves out keeps the parent's limit; the lifetime is
// TTLSeconds, by default the parent's remaining lifetime up to an hour.
type AttenuateRequest struct {
	Parent     string             `json:"parent"` // the parent token, compact JWS
	AgentID    string             `json:"agent_id,omitempty"`
	Tools      []string           `json:"tools,omitempty"`
	FS         []captoken.FSRoot  `json:"fs,omitempty"`
	Net        []string           `json:"net,omitempty"`
	KV         []captoken.KVScope `json:"kv,omitempty"`
	Budgets    map[string]int64   `json:"budgets,omitempty"`
	Autonomy   string             `json:"autonomy,omitempty"`
	TTLSeconds int64              `json:"ttl_seconds,omitempty"`
	Handles    bool               `json:"handles,omitempty"` // handle mode; inherited from a parent in it
}

// An AttenuateError is a refused attenuation: Class is token_invalid or
// token_revoked when the parent does not verify, scope_denied when the
// child would grant more than the parent, invalid_args for a malformed
// request.
type AttenuateError struct {
	Class   string
	Message string
}

func (e *AttenuateError) Error() string { return "attenuate: " + e.Message }

// Attenuate signs a child of req.Parent that grants no more than it (see
// captoken.Narrows) and records it in the ledger with its chain. An fs
// root the request names must be an existing directory as the kernel
// sees it (invalid_args otherwise, as at Mint). Holding
// the parent is the authority to attenuate it: an agent delegates to a
// sub-agent without the admin credential. The child's calls are charged to
// its own budgets and to every ancestor's; revoking any ancestor refuses
// the child.
func (k *Kernel) Attenuate(ctx context.Context, req AttenuateRequest) (*MintedToken, error) {
	if req.Parent == "" {
		return nil, &AttenuateError{Class: ErrTokenInvalid, Message: "parent is required: the compact JWS of the token to narrow"}
	}
	parent, err := k.VerifyBearer(req.Parent)
	if err != nil {
		class := ErrTokenInvalid
		var te *captoken.Error
		if errors.As(err, &te) {
			class = te.Code
		}
		return nil, &AttenuateError{Class: class, Message: "parent token: " + err.Error()}
	}
	p := parent.Claims
	now := k.cfg.Now().Truncate(time.Second)
	exp := p.Expiry
	switch ttl := time.Duration(req.TTLSeconds) * time.Second; {
	case !validTTL(req.TTLSeconds):
		return nil, &AttenuateError{Class: ErrInvalidArgs, Message: fmt.Sprintf("ttl_seconds %d is outside 1..%d", req.TTLSeconds, int64(MaxTokenTTL/time.Second))}
	case req.TTLSeconds > 0:
		exp = now.Add(ttl)
	case now.Add(time.Hour).Before(exp):
		exp = now.Add(time.Hour)
	}
	child := captoken.Claims{
		Subject: req.AgentID, IssuedAt: now, NotBefore: now, Expiry: exp,
		Cap: captoken.Capability{
			Tools: req.Tools, FS: req.FS, Net: req.Net, KV: req.KV, Autonomy: req.Autonomy, Handles: req.Handles || p.Cap.Handles,
			Budgets: map[string]int64{}, Parent: p.ID,
			Ancestors: append(append([]captoken.Ancestor(nil), p.Cap.Ancestors...), captoken.AsAncestor(p)),
		},
	}
	if child.Subject == "" {
		child.Subject = p.Subject
	}
	if !validAgentID(child.Subject) {
		return nil, &AttenuateError{Class: ErrInvalidArgs, Message: agentIDRule}
	}
	if child.Cap.Tools == nil {
		child.Cap.Tools = p.Cap.Tools
	}
	if child.Cap.FS == nil {
		child.Cap.FS = p.Cap.FS
	}
	// Each root names the root token's root it lies in, which the kernel
	// opens it from (see captoken.FSRoot.Base).
	fs := make([]captoken.FSRoot, len(child.Cap.FS))
	var notDir error
	for i, r := range child.Cap.FS {
		r.Base = ""
		if req.FS != nil {
			// A root the request names must be a directory the kernel
			// can open (rootDir), as at Mint: refused below, after the
			// widenings, which say more. One inherited is the parent's,
			// refused at a call if it vanished since. Its links are
			// resolved when that keeps it in a parent root as spelled
			// that grants its mode, as the parent's were at Mint; else
			// it stays as spelled, for Narrows and the base check to
			// judge (a parent minted before roots were resolved may
			// write through a link root whose target lies in one of its
			// read-only roots).
			if real, err := rootDir(r.Path); err != nil {
				notDir = cmp.Or(notDir, err)
			} else if cover, ok := captoken.CoveringRoot(p.Cap.FS, captoken.FSRoot{Path: real, Mode: r.Mode}); ok && (r.Mode != "rw" || cover.Mode == "rw") {
				r.Path = real
			}
		}
		if cover, ok := captoken.CoveringRoot(p.Cap.FS, r); ok {
			r.Base = cover.BaseOrPath()
		}
		fs[i] = r
	}
	child.Cap.FS = fs
	if child.Cap.Net == nil {
		child.Cap.Net = p.Cap.Net
	}
	if child.Cap.KV == nil {
		child.Cap.KV = p.Cap.KV
	}
	if child.Cap.Autonomy == "" {
		child.Cap.Autonomy = p.Cap.Autonomy
	}
	for name, v := range p.Cap.Budgets {
		child.Cap.Budgets[name] = v
	}
	for name, v := range req.Budgets {
		child.Cap.Budgets[name] = v
	}
	if p.NotBefore.After(now) {
		child.NotBefore = p.NotBefore
	}
	if err := captoken.Narrows(p, child); err != nil {
		return nil, &AttenuateError{Class: ErrScopeDenied, Message: err.Error()}
	}
	// Narrows compares paths as spelled; the workspace takes a path's
	// mode from the real paths of its roots (syscalls.Workspace). This
	// gives a clear refusal now; the links resolved at each call (the
	// ancestors' fs roots the child carries) hold the child to it when a
	// link is made, or completed, later.
	childReal := realRoots(child.Cap.FS)
	if err := captoken.WritableWidening(realRoots(p.Cap.FS), childReal); err != nil {
		return nil, &AttenuateError{Class: ErrScopeDenied, Message: err.Error() + " (with links resolved)"}
	}
	if msg := unsteadyReadOnly(child.Cap.Ancestors, childReal); msg != "" {
		return nil, &AttenuateError{Class: ErrScopeDenied, Message: (&captoken.WideningError{Field: "fs", Reason: msg}).Error()}
	}
	if notDir != nil {
		return nil, &AttenuateError{Class: ErrInvalidArgs, Message: notDir.Error()}
	}
	tok, c, err := k.MintToken(child)
	if err != nil {
		return nil, &AttenuateError{Class: ErrInvalidArgs, Message: err.Error()}
	}
	if err := k.recordAttenuation(ctx, c, tok); err != nil {
		return nil, err
	}
	return &MintedToken{Token: tok, ID: c.ID, AgentID: c.Subject, ExpiresAt: c.Expiry.UTC().Format(time.RFC3339), Cap: c.Cap}, nil
}

// recordAttenuation appends the child's record to the ledger: who it is
// for, what it grants and its chain, so that the audit trail shows which
// token every later call of it descends from.
func (k *Kernel) recordAttenuation(ctx context.Context, c captoken.Claims, tok string) error {
	chain := make([]string, len(c.Cap.Ancestors))
	for i, a := range c.Cap.Ancestors {
		chain[i] = a.ID
	}
	body, err := json.Marshal(map[string]any{
		"jti": c.ID, "sub": c.Subject, "parent": c.Cap.Parent, "ancestors": chain,
		"iat": c.IssuedAt.Unix(), "nbf": c.NotBefore.Unix(), "exp": c.Expiry.Unix(),
		"cap": c.Cap, "token_hash": digest.Sum([]byte(tok)),
	})
	if err != nil {
		return err
	}
	return k.db.Update(ctx, func(tx *bbolt.Tx) error {
		_, err := ledger.Append(tx, KindTokenAttenuated, k.cfg.Now(), body)
		return abortIf(err)
	})
}

// realRoots returns roots with each path's links resolved
// (syscalls.ResolveLinks).
func realRoots(roots []captoken.FSRoot) []captoken.FSRoot {
	out := make([]captoken.FSRoot, len(roots))
	for i, r := range roots {
		r.Path = syscalls.ResolveLinks(r.Path)
		out[i] = r
	}
	return out
}

// unsteadyReadOnly says why a read-only root of one of ancestors cannot
// be held to where it is, for a child whose roots are childReal (links
// resolved), or returns "": its path passes a link that dangles (where it
// will lead is not known yet), or a link the child could remove
// (syscalls.RemovableLink: the path would then lead elsewhere while the
// ancestor keeps its directory open). The workspace resolves the
// ancestors' roots at each check (syscalls.OpenAttenuatedWorkspace);
// these two are what it could not follow.
func unsteadyReadOnly(ancestors []captoken.Ancestor, childReal []captoken.FSRoot) string {
	var writable []string
	for _, r := range childReal {
		if r.Mode == "rw" {
			writable = append(writable, r.Path)
		}
	}
	for _, a := range ancestors {
		for _, r := range a.FS {
			if r.Mode != "r" {
				continue
			}
			if link, dangles := syscalls.RemovableLink(r.Path, writable); link != "" {
				if dangles {
					return fmt.Sprintf("the read-only root %s of a token this one is attenuated from passes the link %s, which leads nowhere yet", r.Path, link)
				}
				return fmt.Sprintf("the read-only root %s of a token this one is attenuated from passes the link %s, which lies in a writable root of this token and could be removed", r.Path, link)
			}
		}
	}
	return ""
}
