package kernel

import (
	"encoding/json"
	"fmt"
	"sort"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/txn"
)

// TokenInfo is a capability token the kernel has seen in a call, with its
// budgets. The JSON field names are the wire format of the console's
// token list.
type TokenInfo struct {
	ID        string `json:"jti"`
	AgentID   string `json:"agent_id"`
	Parent    string `json:"parent,omitempty"` // the token it was attenuated from
	Role      string `json:"role,omitempty"`
	IssuedAt  int64  `json:"iat"`
	ExpiresAt int64  `json:"exp"`
	Revoked   bool   `json:"revoked"`
	// Limits are the token's own budgets; Used what has been charged to
	// them (calls of the token and of tokens attenuated from it); Left
	// what remains, never below 0. A budget without a limit is absent.
	Limits map[string]int64 `json:"limits,omitempty"`
	Used   map[string]int64 `json:"used,omitempty"`
	Left   map[string]int64 `json:"left,omitempty"`
}

// Tokens lists the capability tokens recorded in the ledger (a token is
// recorded the first time a call presents it: a minted token nobody used
// is not listed), ordered by issue time, newest first.
func (k *Kernel) Tokens() ([]TokenInfo, error) {
	var out []TokenInfo
	err := k.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketTokens).ForEach(func(jti, v []byte) error {
			var seen struct {
				Sub string `json:"sub"`
				Iat int64  `json:"iat"`
				Exp int64  `json:"exp"`
				Cap struct {
					Parent  string           `json:"parent"`
					Role    string           `json:"role"`
					Budgets map[string]int64 `json:"budgets"`
				} `json:"cap"`
			}
			if err := json.Unmarshal(v, &seen); err != nil {
				return fmt.Errorf("token record %s: %w", jti, err)
			}
			t := TokenInfo{ID: string(jti), AgentID: seen.Sub, Parent: seen.Cap.Parent, Role: seen.Cap.Role,
				IssuedAt: seen.Iat, ExpiresAt: seen.Exp, Limits: seen.Cap.Budgets}
			if len(t.Limits) > 0 {
				left, err := txn.Remaining(tx, []txn.Account{{TokenID: t.ID, Limits: t.Limits}})
				if err != nil {
					return err
				}
				t.Left, t.Used = left, map[string]int64{}
				for n, l := range t.Limits {
					t.Used[n] = l - left[n]
				}
			}
			out = append(out, t)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	k.mu.RLock()
	for i := range out {
		out[i].Revoked = k.revoked[out[i].ID]
	}
	k.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].IssuedAt != out[j].IssuedAt {
			return out[i].IssuedAt > out[j].IssuedAt
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
