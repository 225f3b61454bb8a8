package mcpgateway

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
)

// Confirmer lets the gateway put a call that waits for an approval to the
// user of its MCP session, through the client (elicitation). The kernel
// in this process is one (ConfirmerOf); a gateway without one leaves every
// approval to the approvers.
type Confirmer interface {
	// Watch delivers the approval requests of session's calls as the
	// kernel makes them, until stop is called.
	Watch(session string) (requests <-chan kernel.ApprovalRequest, stop func())
	// ConfirmInSession records the session user's decision, as
	// kernel.Kernel.ConfirmInSession.
	ConfirmInSession(id, token, session, decision, reason string) (kernel.ApprovalRequest, error)
}

// ConfirmerOf is the Confirmer of an in-process kernel.
func ConfirmerOf(k *kernel.Kernel) Confirmer { return kernelConfirmer{k} }

type kernelConfirmer struct{ k *kernel.Kernel }

func (c kernelConfirmer) Watch(session string) (<-chan kernel.ApprovalRequest, func()) {
	sub := c.k.Subscribe(kernel.EventFilter{SessionID: session, Kinds: []string{kernel.EventConfirmationRequested}}, 64)
	out := make(chan kernel.ApprovalRequest, 64)
	go func() {
		defer close(out)
		for e := range sub.C {
			if e.Approval != nil {
				out <- *e.Approval
			}
		}
	}()
	return out, sub.Close
}

func (c kernelConfirmer) ConfirmInSession(id, token, session, decision, reason string) (kernel.ApprovalRequest, error) {
	return c.k.ConfirmInSession(id, token, session, decision, reason)
}

// noInRequestElicitation is the first protocol version in which a server
// may not send elicitation/create while serving a request. Versions are
// dates, which compare as strings.
const noInRequestElicitation = "2026-07-28"

// Elicitation answers and what they decide.
const (
	elicitAllow = "allow"
	elicitDeny  = "deny"
)

// confirmable reports whether the gateway may ask req's client: it has a
// Confirmer, the client declared the elicitation capability (form), and
// the session's protocol lets a server send elicitation/create while it
// serves a request. Protocol 2026-07-28 does not (a tool asks through an
// input_required result and the client's retry, SEP-2322), which the
// gateway does not do yet: there the call waits for an approver.
func (g *Gateway) confirmable(req *mcp.CallToolRequest) bool {
	if g.confirmer == nil || req.Session == nil {
		return false
	}
	ip := req.Session.InitializeParams()
	if ip == nil || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil || ip.ProtocolVersion >= noInRequestElicitation {
		return false
	}
	el := ip.Capabilities.Elicitation
	return el.Form != nil || el.URL == nil
}

// confirmInSession watches for the approval request of operation op in
// session and, when the policy lets the session's user decide it, asks the
// user through the client and records the answer. It returns a stop that
// ends the watch (and an open question) and waits for it. The operation id
// is the gateway's, set on the envelope, so only this call's approval is
// asked about.
func (g *Gateway) confirmInSession(ctx context.Context, req *mcp.CallToolRequest, session, op string) (stop func()) {
	reqs, unwatch := g.confirmer.Watch(session)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case ar, ok := <-reqs:
				if !ok {
					return
				}
				if ar.OperationID != op || !ar.SessionConfirm {
					continue
				}
				g.ask(ctx, req, session, ar)
				return
			}
		}
	}()
	return func() { cancel(); unwatch(); <-done }
}

// ask puts approval ar to the user and records a clear answer: accept
// with "allow" allows, accept with "deny" or decline denies. A dismissed
// question (cancel), or a client that fails to ask, leaves the approval
// to the approvers: the call waits on, as it would without a client that
// can ask.
func (g *Gateway) ask(ctx context.Context, req *mcp.CallToolRequest, session string, ar kernel.ApprovalRequest) {
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
		Mode:    "form",
		Message: confirmMessage(ar),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"decision": map[string]any{"type": "string", "enum": []string{elicitAllow, elicitDeny}, "title": "Decision",
					"description": "allow runs the call once, as shown; deny refuses it"},
				"reason": map[string]any{"type": "string", "title": "Reason", "description": "recorded in the audit log"},
			},
			"required": []string{"decision"},
		},
	})
	if err != nil || res == nil {
		return
	}
	decision, reason := "", ""
	switch res.Action {
	case "accept":
		decision, _ = res.Content["decision"].(string)
		reason, _ = res.Content["reason"].(string)
	case "decline":
		decision = elicitDeny
	}
	if decision != elicitAllow && decision != elicitDeny {
		return
	}
	if reason == "" {
		reason = "answered through the MCP client (elicitation)"
	}
	// A refusal (the approver decided first, the policy changed) is in
	// the ledger; the call goes on with whatever decision stands.
	_, _ = g.confirmer.ConfirmInSession(ar.ID, g.token, session, decision, reason)
}

// confirmMessage is what the user reads: the tool, a summary of the
// arguments, what it would change and why it needs a decision.
func confirmMessage(ar kernel.ApprovalRequest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Allow %s (%s) for agent %s?\n", ar.ToolID, ar.SideEffect, ar.AgentID)
	fmt.Fprintf(&b, "Call: %s\n", ar.InputSummary)
	if len(ar.ProjectedEffects) > 0 {
		fmt.Fprintf(&b, "Effects: %s\n", strings.Join(ar.ProjectedEffects, "; "))
	}
	fmt.Fprintf(&b, "Risk %.2f: %s\n", ar.RiskScore, strings.Join(ar.RiskBasis, "; "))
	fmt.Fprintf(&b, "Approval %s, decide by %s.", ar.ID, ar.DecideBy)
	return b.String()
}

// newOperationID names a call before the kernel sees it, so its approval
// request can be told apart from the session's other calls.
func newOperationID() string { return uuid.Must(uuid.NewV7()).String() }
