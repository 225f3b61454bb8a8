package kernel

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/syscalls"
)

// decideDelta is the policy's decision on what c changed beyond what its
// arguments name (a syscall whose Reach is the workspace: proc.exec's
// delta), which the decision before it ran could not see: c's policy
// input with a resource for each path it staged (op write, for a made
// directory too, or delete). A delta the policy refuses (a secret path)
// or decides stricter than the mode the call ran under (a write under a
// sensitive path by an autopilot call, a deleted directory by one a plain
// approver allowed), or that a session's user may not confirm when one
// confirmed the call, is refused, policy_denied: nothing of it is applied.
// A decision that fails refuses it too.
func (k *Kernel) decideDelta(ctx context.Context, c *call, touched []*syscalls.Resource) (class, msg string) {
	if len(touched) == 0 {
		return "", ""
	}
	if c.input == nil {
		return ErrInternal, "the command's changes cannot be decided: the call has no policy input"
	}
	in := *c.input
	in.Resources = slices.Clone(in.Resources)
	for _, r := range touched {
		in.Resources = append(in.Resources, policy.Resource{
			Kind: "fs", Op: string(r.Access), Path: r.Rel, RealPath: r.Real, Root: r.RootPath, IsDir: r.IsDir, Exists: r.Exists,
		})
	}
	d, err := k.policy.Decide(ctx, &in)
	if err != nil {
		return ErrPolicyDenied, "deciding the command's changes: " + err.Error() + "; nothing of them is applied"
	}
	if c.approval != nil && c.approval.Channel == ChannelSession && d.AutonomyMode != policy.Autopilot && !d.SessionConfirm {
		// Confirmed by the session's user, as the policy let the call
		// be; its changes the policy keeps for an approver (a sensitive
		// path), as it would an fs.write of them.
		return ErrPolicyDenied, fmt.Sprintf("the policy decides the command's changes %s (%s) and does not let the session confirm them, as it did the call: nothing of them is applied",
			d.AutonomyMode, strings.Join(d.RiskBasis, "; "))
	}
	if d.AutonomyMode != policy.NoGo && policy.Stricter(d.AutonomyMode, c.res.AutonomyMode) == c.res.AutonomyMode {
		return "", ""
	}
	return ErrPolicyDenied, fmt.Sprintf("the policy decides the command's changes %s (%s), stricter than the %s the call ran under: nothing of them is applied",
		d.AutonomyMode, strings.Join(d.RiskBasis, "; "), c.res.AutonomyMode)
}
