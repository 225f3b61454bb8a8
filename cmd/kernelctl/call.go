package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

func callCmd() *cobra.Command {
	var t target
	var argsJSON, tokenFile, key, session string
	var async bool
	var kv, kvStr, pre []string
	cmd := &cobra.Command{
		Use:   "call TOOL --token FILE|- [--args JSON | --arg K=V ...] [--idempotency-key K] [--precondition REF=EXPECTED]... --server URL|--data DIR",
		Short: "Make one syscall; prints its result, exit 1 on an error result",
		Long: `call builds a call envelope for TOOL and sends it: agent_id and
capability_token_id come from the token, policy_hash from the kernel, and a
fresh operation_id is chosen. Arguments come from --args (a JSON object) or from
--arg K=V (V is taken as JSON when it parses as JSON, else as a string) and
--arg-str K=V (always a string).

Mutating syscalls need --idempotency-key: repeat the call with the same key and
the kernel replays the original outcome instead of acting twice.

--precondition takes REF=EXPECTED:
  fs:PATH=blake3:HEX   the file's content hash
  fs:PATH=absent       the file must not exist
  kv:KEY=N             the key's version (kv:KEY=absent: never written)
  ledger:head=N        the ledger's last seq

It prints the status, the error or the result, and the receipt id; --json
prints the whole result envelope. A call the kernel holds for an approval says
so on stderr at once (its operation and approval ids, and how to decide it),
then every 15 s while it waits; with --data of a stopped kernel, the kernel runs
in this process and serves its control socket meanwhile, so
"kernelctl approvals approve ID --data DIR" decides it from another terminal.
With --async (and --server, or --data of a running kernel) it prints only the
operation id: the call runs on in the kernel, waits there for an approval if it
needs one, and kernelctl wait OP prints its result.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := t.check("call"); err != nil {
				return err
			}
			if tokenFile == "" {
				return &usageError{errors.New("call: --token FILE (or - for stdin) is required")}
			}
			tok, err := readToken("--token", tokenFile)
			if err != nil {
				return err
			}
			args, err := buildArgs(argsJSON, kv, kvStr)
			if err != nil {
				return &usageError{err}
			}
			pcs, err := parsePreconditions(pre)
			if err != nil {
				return &usageError{err}
			}
			sub, jti, err := peekToken(tok)
			if err != nil {
				return err
			}
			env := kernel.Envelope{
				ToolID: a[0], Args: args, AgentID: sub, CapabilityToken: tok, CapabilityTokenID: jti,
				OperationID: uuid.Must(uuid.NewV7()).String(), IdempotencyKey: key, PreconditionRefs: pcs, TaskClass: "cli",
			}
			if session != "" {
				env.Provenance, _ = json.Marshal(map[string]string{"session_id": session})
			}
			var res *kernel.Result
			status := 0 // the HTTP status of the answer, over the API
			if t.remote() {
				// The capability token is the bearer: over the control socket
				// a request without one acts as the admin, whom calls refuse.
				c := t.client(tok)
				if env.PolicyHash, err = c.PolicyHash(cmd.Context()); err != nil {
					return err
				}
				raw, err := json.Marshal(&env)
				if err != nil {
					return err
				}
				if async {
					id, err := c.Start(cmd.Context(), raw)
					if err != nil {
						return err
					}
					if t.json {
						return printJSON(cmd.OutOrStdout(), map[string]string{"operation_id": id, "state": "running"})
					}
					fmt.Fprintln(cmd.OutOrStdout(), id)
					return nil
				}
				// A call held for an approval says so on stderr at once.
				stop := announceApproval(cmd.Context(), c, sub, env.OperationID, cmd.ErrOrStderr())
				res, status, err = c.Call(cmd.Context(), raw)
				stop()
				if err != nil {
					return err
				}
			} else {
				if async {
					return &usageError{errors.New("call --async needs a running kernel (--server URL, or --data DIR of a served kernel): a background call outlives this process only there")}
				}
				k, err := t.openKernel(cmd.Context())
				if err != nil {
					return err
				}
				defer k.Close()
				// The kernel lives in this process while the call runs: its
				// control socket lets an approver decide a held call with
				// kernelctl approvals approve --data, and tells this call.
				stop := func() {}
				if ctl, err := httpapi.ServeControl(k, t.data); err == nil {
					defer ctl.Close()
					if c, ok := httpapi.ControlClient(t.data); ok {
						c.Credential = tok
						stop = announceApproval(cmd.Context(), c, sub, env.OperationID, cmd.ErrOrStderr())
					}
				}
				env.PolicyHash = k.PolicyHash()
				res = k.Invoke(cmd.Context(), &env)
				stop()
			}
			if err := printResult(cmd, res, t.json); err != nil {
				return err
			}
			if res.Error != nil {
				return callFailed(res, status)
			}
			return nil
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&tokenFile, "token", "", "file holding the capability token (- for stdin)")
	cmd.Flags().StringVar(&argsJSON, "args", "", "arguments as one JSON object")
	cmd.Flags().StringArrayVar(&kv, "arg", nil, "argument K=V; V is JSON if it parses, else a string (repeatable)")
	cmd.Flags().StringArrayVar(&kvStr, "arg-str", nil, "argument K=V with V always a string (repeatable)")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "idempotency key (required for mutating syscalls)")
	cmd.Flags().StringArrayVar(&pre, "precondition", nil, "precondition REF=EXPECTED (repeatable)")
	cmd.Flags().StringVar(&session, "session", "", "session id for the provenance")
	cmd.Flags().BoolVar(&async, "async", false, "return at once with the operation id (Prefer: respond-async); kernelctl wait OP fetches the result")
	return cmd
}

func printResult(cmd *cobra.Command, r *kernel.Result, asJSON bool) error {
	if asJSON {
		return printJSON(cmd.OutOrStdout(), r)
	}
	w := cmd.OutOrStdout()
	replayed := ""
	if r.Replayed {
		replayed = " (replayed)"
	}
	fmt.Fprintf(w, "%s %s%s  tx=%s  mode=%s  risk=%.2f  operation=%s\n", r.ToolID, r.Status, replayed, r.TxOutcome, r.AutonomyMode, r.RiskScore, r.OperationID)
	if r.Error != nil {
		fmt.Fprintf(w, "error %s: %s\n", r.Error.Class, unstutter(r.Error.Message, "", r.Error.Class))
	} else if len(r.Result) > 0 {
		var v any
		if json.Unmarshal(r.Result, &v) == nil {
			printJSON(w, v)
		}
	}
	if r.CommitDeltaID != "" {
		fmt.Fprintf(w, "commit delta %s\n", r.CommitDeltaID)
	}
	if r.ReceiptID != "" {
		fmt.Fprintf(w, "receipt %s (ledger seq %d)\n", r.ReceiptID, r.LedgerSeq)
	}
	return nil
}

// buildArgs makes the args object from --args or --arg/--arg-str.
func buildArgs(raw string, kv, kvStr []string) (json.RawMessage, error) {
	if raw != "" {
		if len(kv)+len(kvStr) > 0 {
			return nil, errors.New("give --args or --arg, not both")
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &m); err != nil || m == nil {
			return nil, fmt.Errorf("--args: not a JSON object: %v", err)
		}
		return json.RawMessage(raw), nil
	}
	m := map[string]json.RawMessage{}
	for _, p := range kv {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--arg %q: want K=V", p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("--arg %q: argument %s is given twice", p, k)
		}
		if json.Valid([]byte(v)) {
			m[k] = json.RawMessage(v)
		} else {
			m[k], _ = json.Marshal(v)
		}
	}
	for _, p := range kvStr {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--arg-str %q: want K=V", p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("--arg-str %q: argument %s is given twice", p, k)
		}
		m[k], _ = json.Marshal(v)
	}
	return json.Marshal(m)
}

// parsePreconditions reads REF=EXPECTED specs (see callCmd).
func parsePreconditions(specs []string) ([]txn.Precondition, error) {
	var out []txn.Precondition
	for _, s := range specs {
		i := strings.LastIndex(s, "=")
		if i <= 0 {
			return nil, fmt.Errorf("--precondition %q: want REF=EXPECTED", s)
		}
		ref, want := s[:i], s[i+1:]
		p := txn.Precondition{Ref: ref}
		switch {
		case (strings.HasPrefix(ref, "fs:") || strings.HasPrefix(ref, "kv:")) && want == "absent":
			p.Absent = true
		case strings.HasPrefix(ref, "fs:"):
			p.Hash = want
		case strings.HasPrefix(ref, "kv:"), ref == "ledger:head":
			n, err := strconv.ParseUint(want, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("--precondition %q: %q is not a whole number", s, want)
			}
			if ref == "ledger:head" {
				p.Seq = &n
			} else {
				p.Version = &n
			}
		default:
			return nil, fmt.Errorf("--precondition %q: ref must start with fs:, kv: or be ledger:head", s)
		}
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("--precondition %q: %v", s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// peekToken reads sub and jti from a token's payload without verifying it:
// the kernel verifies; the client only fills the envelope.
func peekToken(tok string) (sub, jti string, err error) {
	var c struct {
		Sub string `json:"sub"`
		JTI string `json:"jti"`
	}
	err = peekPayload(tok, &c)
	return c.Sub, c.JTI, err
}

// peekPayload decodes a token's payload into v without verifying it.
func peekPayload(tok string, v any) error {
	if err := tokenForm(tok); err != nil {
		return fmt.Errorf("the token is not a compact JWS: %w", err)
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
	if err != nil {
		return fmt.Errorf("the token's payload: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("the token's payload: %v", err)
	}
	return nil
}

// handleMode reports whether tok's payload, unverified, puts it in
// handle mode (token mint --handles): it calls its syscalls only through
// a session's handles, never by name.
func handleMode(tok string) bool {
	var c struct {
		Cap struct {
			Handles bool `json:"handles"`
		} `json:"cap"`
	}
	return peekPayload(tok, &c) == nil && c.Cap.Handles
}

func toolsCmd() *cobra.Command {
	var t target
	var tokenFile, format string
	cmd := &cobra.Command{
		Use:   "tools --token FILE|- [--format openai|anthropic|mcp] --server URL|--data DIR",
		Short: "Print the syscall definitions a token may call, in an LLM's tool format",
		Long: `tools prints the definitions of the syscalls the token may call by name, in
the tool format of an LLM API. A token in handle mode (token mint --handles)
calls only through a session's handles, never by name: tools refuses it (exit 1)
and points to POST /v1/sessions/{id}/handles.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check("tools"); err != nil {
				return err
			}
			if tokenFile == "" {
				return &usageError{errors.New("tools: --token FILE is required")}
			}
			switch format {
			case syscalls.FormatOpenAI, syscalls.FormatAnthropic, syscalls.FormatMCP:
			default:
				return usagef("--format %q is not openai, anthropic or mcp", format)
			}
			tok, err := readToken("--token", tokenFile)
			if err != nil {
				return err
			}
			// The kernel lists the syscalls a handle-mode token covers by
			// name, and refuses them by name: a model given that list
			// would call only names that fail.
			if handleMode(tok) {
				return fmt.Errorf("--token %s is in handle mode (minted --handles): it calls its syscalls only through a session's handles, never by the names tools would list; get them with POST /v1/sessions/{id}/handles (docs/http.md) and call one with kernelctl call HANDLE --session ID", tokenFile)
			}
			var out json.RawMessage
			if t.remote() {
				out, err = t.client(tok).Tools(cmd.Context(), format)
			} else {
				k, kerr := t.openKernel(cmd.Context())
				if kerr != nil {
					return kerr
				}
				defer k.Close()
				out, err = k.Tools(tok, format)
			}
			if err != nil {
				return err
			}
			var v any
			if err := json.Unmarshal(out, &v); err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), v)
		},
	}
	t.addTarget(cmd, false)
	t.addPolicy(cmd)
	cmd.Flags().StringVar(&tokenFile, "token", "", "file holding the capability token (- for stdin)")
	cmd.Flags().StringVar(&format, "format", "openai", "openai, anthropic or mcp")
	return cmd
}
