package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

func tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Mint, inspect and revoke capability tokens"}
	cmd.AddCommand(tokenMintCmd(), tokenAttenuateCmd(), tokenInspectCmd(), tokenRevokeCmd())
	return cmd
}

func tokenMintCmd() *cobra.Command {
	var t target
	var agent, tools, autonomy, budgets string
	var fsRoots, net, kv []string
	var ttl time.Duration
	var approver, escalation, auditor, handles bool
	cmd := &cobra.Command{
		Use:   "mint --data DIR|--server URL --agent ID (--tools GLOBS [--fs PATH:r|rw]... [--net HOST[:PORT]]... [--kv KEYS:r|rw]... [--budget K=V,...] | --approver [--escalation] | --auditor) [--ttl 1h]",
		Short: "Mint a capability token; prints the compact token alone on stdout",
		Long: `mint signs a capability token with the kernel's issuer key.

  --tools 'fs.*,echo'            tool ids or globs ("*" all, "p.*" a prefix)
  --fs ./ws:rw --fs /data:r      file trees and their mode; relative paths are
                                 made absolute from the current directory; each
                                 an existing directory where the kernel runs
                                 (the kernel checks it and resolves its links),
                                 taken literally (no globs)
  --net api.example.com:443      host[:port] patterns ("*.example.com"; "*" every host)
  --kv 'a1/*:rw' --kv motd:r     keys of the kernel's kv store and their mode ("*"
                                 every key, "p*" a prefix); without --kv, none
  --budget calls=100,disk_write_bytes=1MiB,cpu_ms=5000,net_bytes=10MB
  --autonomy soft_gate           the most autonomous mode its calls may run in
  --ttl 1h                       lifetime (at most 90 days)
  --handles                      its sessions call tools only by per-session handles
                                 (POST /v1/sessions/{id}/handles), never by name
  --approver [--escalation]      an approver token for the person --agent names:
                                 it decides soft_gate calls (with --escalation
                                 escalated ones too) and grants no tools
  --auditor                      an auditor token for the person --agent names:
                                 it reads and exports every record of the history
                                 in full (arguments and results included), decides
                                 nothing and grants no tools

With --json it prints the token with its id, agent, expiry and grants.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check("token mint"); err != nil {
				return err
			}
			approver = approver || escalation
			switch {
			case agent == "":
				return &usageError{errors.New("token mint: --agent is required")}
			case approver && auditor:
				return &usageError{errors.New("token mint: --auditor and --approver are different roles; mint two tokens")}
			case (approver || auditor) && (tools != "" || len(fsRoots) > 0 || len(net) > 0 || len(kv) > 0 || budgets != "" || autonomy != ""):
				return &usageError{errors.New("token mint --approver/--auditor: a role token grants no --tools, --fs, --net, --kv, --budget or --autonomy")}
			case !approver && !auditor && tools == "":
				return &usageError{errors.New("token mint: --tools is required (or --approver or --auditor)")}
			}
			req := kernel.TokenRequest{AgentID: agent, Tools: splitList(tools), Net: net, Autonomy: autonomy, TTLSeconds: int64(ttl / time.Second), Handles: handles}
			switch {
			case escalation:
				req.Role = captoken.RoleEscalation
			case approver:
				req.Role = captoken.RoleApprover
			case auditor:
				req.Role = captoken.RoleAuditor
			}
			if ttl%time.Second != 0 || ttl <= 0 {
				return &usageError{fmt.Errorf("token mint: --ttl %s must be a positive whole number of seconds", ttl)}
			}
			if ttl > kernel.MaxTokenTTL {
				return usagef("--ttl %s is longer than a token may live (%s, 90 days)", ttl, kernel.MaxTokenTTL)
			}
			var err error
			if req.FS, err = parseFSRoots(fsRoots); err != nil {
				return &usageError{err}
			}
			if req.KV, err = parseKVScopes(kv); err != nil {
				return &usageError{err}
			}
			if req.Budgets, err = parseBudgets(budgets); err != nil {
				return &usageError{err}
			}
			var minted *kernel.MintedToken
			if t.remote() {
				c, err := t.adminClient()
				if err != nil {
					return err
				}
				minted, err = c.Mint(cmd.Context(), req)
				if err != nil {
					return err
				}
			} else {
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				// The kernel refuses only requests whose claims would not
				// verify: a usage error, as the API's 400 is.
				if minted, err = k.Mint(req); err != nil {
					return &usageError{err}
				}
			}
			if req.Role == "" && len(req.KV) == 0 && (minted.Cap.AllowsTool("kv.get") || minted.Cap.AllowsTool("kv.put")) {
				fmt.Fprintln(cmd.ErrOrStderr(), "kernelctl: note: the token grants kv tools but no --kv scopes, so every key is refused to it (scope_denied)")
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), minted)
			}
			fmt.Fprintln(cmd.OutOrStdout(), minted.Token)
			return nil
		},
	}
	t.addTarget(cmd, true)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&agent, "agent", "", "agent id (the token's sub)")
	cmd.Flags().StringVar(&tools, "tools", "", "comma-separated tool ids or globs")
	cmd.Flags().StringArrayVar(&fsRoots, "fs", nil, "file tree PATH:r or PATH:rw: an existing directory where the kernel runs (repeatable)")
	cmd.Flags().StringArrayVar(&net, "net", nil, "host[:port] pattern (repeatable)")
	cmd.Flags().StringArrayVar(&kv, "kv", nil, `kv keys KEYS:r or KEYS:rw: "*" every key, "p*" a prefix, else one key (repeatable)`)
	cmd.Flags().StringVar(&budgets, "budget", "", "budgets, e.g. calls=100,disk_write_bytes=1MiB")
	cmd.Flags().StringVar(&autonomy, "autonomy", "", "autonomy ceiling: autopilot, soft_gate, escalated or no_go")
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "lifetime")
	cmd.Flags().BoolVar(&handles, "handles", false, "handle mode: the token's calls address tools by per-session handles only")
	cmd.Flags().BoolVar(&approver, "approver", false, "mint an approver token (decides soft_gate calls)")
	cmd.Flags().BoolVar(&escalation, "escalation", false, "mint an approver token with the escalation role (decides escalated calls too)")
	cmd.Flags().BoolVar(&auditor, "auditor", false, "mint an auditor token: reads and exports every record in full, decides nothing, grants no tools")
	return cmd
}

func tokenAttenuateCmd() *cobra.Command {
	var t target
	var parentFile, agent, tools, autonomy, budgets string
	var fsRoots, net, kv []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "attenuate --data DIR|--server URL --parent FILE [--agent ID] [--tools GLOBS] [--fs PATH:r|rw]... [--net HOST[:PORT]]... [--kv KEYS:r|rw]... [--budget K=V,...] [--autonomy MODE] [--ttl D]",
		Short: "Sign a narrower child of a capability token, for a sub-agent; prints the child token on stdout",
		Long: `attenuate asks the kernel for a child of the token in --parent ("-" reads
stdin) that grants no more than it. Holding the parent is the authority: no
admin credential is needed. Each flag narrows one grant; a flag left out keeps
the parent's (a budget left out keeps the parent's limit). The lifetime is
--ttl, by default the parent's remaining lifetime up to an hour.

The kernel refuses any widening: a tool outside the parent's globs, a path
outside its roots or with a mode it lacks, a host outside its patterns, kv
keys outside its scopes or with a mode it lacks, a
budget above its limit, a more autonomous ceiling, a lifetime past its
expiry, more than 8 attenuations from the root. The child's calls count
against its own budgets and every ancestor's; revoking any ancestor revokes
it. The ledger records the child with its chain (kind token_attenuated).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check("token attenuate"); err != nil {
				return err
			}
			if parentFile == "" {
				return &usageError{errors.New("token attenuate: --parent FILE is required")}
			}
			if ttl < 0 || ttl%time.Second != 0 {
				return &usageError{fmt.Errorf("token attenuate: --ttl %s must be a positive whole number of seconds", ttl)}
			}
			parent, err := readToken("--parent", parentFile)
			if err != nil {
				return err
			}
			req := kernel.AttenuateRequest{Parent: parent, AgentID: agent, Tools: splitList(tools), Net: net, Autonomy: autonomy, TTLSeconds: int64(ttl / time.Second)}
			if req.FS, err = parseFSRoots(fsRoots); err != nil {
				return &usageError{err}
			}
			if req.KV, err = parseKVScopes(kv); err != nil {
				return &usageError{err}
			}
			if req.Budgets, err = parseBudgets(budgets); err != nil {
				return &usageError{err}
			}
			var child *kernel.MintedToken
			if t.remote() {
				child, err = t.client("").Attenuate(cmd.Context(), req)
			} else {
				var k *kernel.Kernel
				if k, err = t.openKernel(cmd.Context()); err != nil {
					return err
				}
				defer k.Close()
				child, err = k.Attenuate(cmd.Context(), req)
				var ae *kernel.AttenuateError
				if errors.As(err, &ae) && ae.Class == kernel.ErrInvalidArgs {
					err = &usageError{err}
				}
			}
			if err != nil {
				return err
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), child)
			}
			fmt.Fprintln(cmd.OutOrStdout(), child.Token)
			return nil
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&parentFile, "parent", "", `file holding the parent token ("-": stdin)`)
	cmd.Flags().StringVar(&agent, "agent", "", "the sub-agent's id, PARENT_AGENT/NAME (default: the parent's agent)")
	cmd.Flags().StringVar(&tools, "tools", "", "comma-separated tool ids or globs, within the parent's")
	cmd.Flags().StringArrayVar(&fsRoots, "fs", nil, "file tree PATH:r or PATH:rw inside a parent root: an existing directory where the kernel runs (repeatable)")
	cmd.Flags().StringArrayVar(&net, "net", nil, "host[:port] pattern within the parent's (repeatable)")
	cmd.Flags().StringArrayVar(&kv, "kv", nil, "kv keys KEYS:r or KEYS:rw within the parent's scopes (repeatable)")
	cmd.Flags().StringVar(&budgets, "budget", "", "budgets at most the parent's, e.g. calls=10")
	cmd.Flags().StringVar(&autonomy, "autonomy", "", "autonomy ceiling, at least as strict as the parent's")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, within the parent's (default: the parent's remaining lifetime, at most 1h)")
	return cmd
}

func tokenInspectCmd() *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:   "inspect TOKEN|FILE|- --data DIR|--server URL",
		Short: "Verify a capability token and print its claims, or why it is refused (exit 1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := t.check("token inspect"); err != nil {
				return err
			}
			tok, err := tokenArg(args[0])
			if err != nil {
				return err
			}
			var res httpapi.TokenInspection
			if t.remote() {
				if res, err = t.client("").InspectToken(cmd.Context(), tok); err != nil {
					return err
				}
			} else {
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				res = httpapi.Inspect(k, tok)
			}
			if t.json {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				printInspection(cmd, res)
			}
			if !res.Valid {
				return fmt.Errorf("the kernel refuses this token (%s): %s", res.Class, res.Reason)
			}
			return nil
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	return cmd
}

// unix formats Unix seconds as an RFC 3339 time in UTC.
func unix(sec int64) string { return time.Unix(sec, 0).UTC().Format(time.RFC3339) }

func printInspection(cmd *cobra.Command, res httpapi.TokenInspection) {
	if !res.Valid {
		return
	}
	c := res.Claims
	tw := newTable(cmd.OutOrStdout())
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("valid", "yes")
	row("jti", c.ID)
	row("sub (agent)", c.Subject)
	row("iss (issuer)", c.Issuer)
	row("aud (kernel)", c.Audience)
	row("issued", unix(c.IssuedAt))
	row("not before", unix(c.NotBefore))
	row("expires", unix(c.Expiry))
	if c.Cap.Role != "" {
		// A role token is a person's credential: what it may do is its
		// role, not grants (it has none).
		row("role", c.Cap.Role+" ("+roleMeaning[c.Cap.Role]+")")
		row("tools", "none (a role token grants no tools)")
	} else {
		row("tools", strings.Join(c.Cap.Tools, ", "))
	}
	for _, r := range c.Cap.FS {
		row("fs", r.Path+" ("+r.Mode+")")
	}
	for _, n := range c.Cap.Net {
		row("net", n)
	}
	for _, s := range c.Cap.KV {
		row("kv", s.Keys+" ("+s.Mode+")")
	}
	keys := make([]string, 0, len(c.Cap.Budgets))
	for k := range c.Cap.Budgets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		row("budget "+k, strconv.FormatInt(c.Cap.Budgets[k], 10))
	}
	if c.Cap.Autonomy != "" {
		row("autonomy ceiling", c.Cap.Autonomy)
	}
	if c.Cap.Parent != "" {
		row("parent", c.Cap.Parent)
	}
	if c.Cap.Handles {
		row("handles", "yes (its sessions call tools by per-session handles only, never by name)")
	}
	tw.Flush()
}

// roleMeaning says what a token of each role may do.
var roleMeaning = map[string]string{
	captoken.RoleApprover:   "decides soft_gate calls",
	captoken.RoleEscalation: "decides soft_gate and escalated calls",
	captoken.RoleAuditor:    "reads every record of the history in full, decides nothing",
}

func tokenRevokeCmd() *cobra.Command {
	var t target
	var reason string
	cmd := &cobra.Command{
		Use:   "revoke JTI|TOKEN|FILE --data DIR|--server URL [--reason TEXT]",
		Short: "Revoke a token (and every token attenuated from it); recorded in the ledger",
		Long: `revoke records the revocation of a token in the ledger; every later call
with it, or with a token attenuated from it, is refused with token_revoked.
Name the token by its jti (printed by token mint --json and token inspect), or
give the token itself, inline or as a file. A token nobody has used yet is
unknown to the kernel until then, so revoke cannot check that a jti was
issued; it refuses (exit 1) anything that is not a jti of the form the kernel
issues (a UUID).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := t.check("token revoke"); err != nil {
				return err
			}
			jti, err := revokeTarget(args[0])
			if err != nil {
				return err
			}
			if t.remote() {
				c, err := t.adminClient()
				if err != nil {
					return err
				}
				if err := c.Revoke(cmd.Context(), jti, reason); err != nil {
					return err
				}
			} else {
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				if err := k.Revoke(cmd.Context(), jti, reason); err != nil {
					return err
				}
			}
			if t.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"jti": jti, "revoked": true})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", jti)
			return nil
		},
	}
	t.addTarget(cmd, true)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the ledger)")
	return cmd
}

// revokeTarget returns the jti arg names: arg itself when it is a jti of
// the kernel's form (a UUID), else the jti of the token arg is or holds.
func revokeTarget(arg string) (string, error) {
	if u, err := uuid.Parse(arg); err == nil && len(arg) == 36 {
		// The kernel issues, and matches, the lower-case form only.
		if u.String() != arg {
			return "", fmt.Errorf("%q is not a token id: the kernel's are lower-case UUIDs (did you mean %s?)", arg, u)
		}
		return arg, nil
	}
	tok, err := tokenArg(arg)
	if err != nil {
		return "", fmt.Errorf("%q is not a token id: the kernel's are UUIDs (token mint --json and token inspect print them); give the jti, the token or a file holding it", arg)
	}
	_, jti, err := peekToken(tok)
	if err != nil {
		return "", fmt.Errorf("%s: %w", arg, err)
	}
	if jti == "" {
		return "", fmt.Errorf("%s: the token has no jti", arg)
	}
	return jti, nil
}

// tokenArg reads a token given inline, as a file, or on stdin ("-").
func tokenArg(arg string) (string, error) {
	if arg == "-" {
		return readSecret(arg)
	}
	if fi, err := os.Stat(arg); err == nil && fi.Mode().IsRegular() {
		return readSecret(arg)
	}
	if strings.Count(arg, ".") == 2 && !strings.ContainsAny(arg, " \t\n/") {
		return arg, nil
	}
	return "", fmt.Errorf("%q is neither a compact token nor a readable file", arg)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseKVScopes reads KEYS:r|rw specs (the last colon splits, so keys may
// hold colons).
func parseKVScopes(specs []string) ([]captoken.KVScope, error) {
	var out []captoken.KVScope
	for _, s := range specs {
		keys, mode, err := splitMode("--kv", "KEYS", s)
		if err != nil {
			return nil, err
		}
		if strings.Contains(keys, ":r,") || strings.Contains(keys, ":rw,") {
			return nil, fmt.Errorf("--kv %q: one scope per --kv; repeat the flag for more", s)
		}
		out = append(out, captoken.KVScope{Keys: keys, Mode: mode})
	}
	return out, nil
}

// splitMode splits the spec WHAT:r|rw of flag at its last colon.
func splitMode(flag, what, spec string) (string, string, error) {
	i := strings.LastIndex(spec, ":")
	if i <= 0 {
		return "", "", fmt.Errorf("%s %q: want %s:r or %s:rw", flag, spec, what, what)
	}
	if mode := spec[i+1:]; mode != "r" && mode != "rw" {
		return "", "", fmt.Errorf("%s %q: mode %q is not r or rw", flag, spec, mode)
	}
	return spec[:i], spec[i+1:], nil
}

// parseFSRoots reads PATH:r|rw specs; relative paths are made absolute
// from the current directory. Whether a root is an existing directory,
// and where its links lead, is the kernel's to say (kernel.Kernel.Mint,
// Attenuate): only it sees the file system its calls open, which through
// an SSH tunnel or from another mount namespace is not this one.
func parseFSRoots(specs []string) ([]captoken.FSRoot, error) {
	var out []captoken.FSRoot
	for _, s := range specs {
		path, mode, err := splitMode("--fs", "PATH", s)
		if err != nil {
			return nil, err
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("--fs %q: %v", s, err)
		}
		out = append(out, captoken.FSRoot{Path: abs, Mode: mode})
	}
	return out, nil
}

// parseBudgets reads k=v,... with sizes in bytes or KiB/MiB/GiB/KB/MB/GB.
func parseBudgets(s string) (map[string]int64, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]int64{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("--budget %q: want KEY=VALUE", p)
		}
		n, err := parseSize(v)
		if err != nil {
			return nil, fmt.Errorf("--budget %s: %v", k, err)
		}
		out[strings.TrimSpace(k)] = n
	}
	return out, nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a non-negative whole number (with an optional unit KiB, MiB, GiB, KB, MB, GB)", s)
	}
	return n * mult, nil
}
