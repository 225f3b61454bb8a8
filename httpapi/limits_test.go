package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// TestBodyOverLimitIs413: every endpoint that reads a JSON body answers
// one over its 1 MiB limit with 413 invalid_args, as docs/http.md says.
// POST /v1/approvals/{id} answered it 400.
func TestBodyOverLimitIs413(t *testing.T) {
	f := newAccessFixture(t)
	big := `{"decision":"allow","reason":"` + strings.Repeat("r", 2<<20) + `"}`
	tests := []struct {
		name, path, cred string
	}{
		{"decide", "/v1/approvals/x", f.approver},
		{"inspect", "/v1/tokens/inspect", ""},
		{"attenuate", "/v1/tokens/attenuate", f.a.token},
		{"mint", "/v1/tokens", f.admin},
		{"revoke", "/v1/tokens/" + f.a.jti + "/revoke", f.admin},
		{"erase", "/v1/admin/ledger/erase", f.admin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.srv.URL+tt.path, strings.NewReader(big))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if tt.cred != "" {
				req.Header.Set("Authorization", "Bearer "+tt.cred)
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb httpapi.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatalf("status %d, answer is not an error body: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != http.StatusRequestEntityTooLarge || eb.Error.Class != kernel.ErrInvalidArgs {
				t.Fatalf("status %d %+v, want 413 %s", resp.StatusCode, eb.Error, kernel.ErrInvalidArgs)
			}
		})
	}
}
