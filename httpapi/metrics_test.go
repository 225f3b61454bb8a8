package httpapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/telemetry"
)

func TestMetricsAccess(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	ini, err := kernel.Init(data)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := telemetry.NewMetrics(reg)
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data, Observer: m, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	m.Watch(k)
	tok, err := k.Mint(kernel.TokenRequest{AgentID: "a1", Tools: []string{"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, access := range []string{MetricsAdmin, MetricsPublic} {
		api := New(k)
		api.ServeMetrics(reg, access)
		srv := httptest.NewServer(api)
		tests := []struct {
			cred string
			want int
		}{
			{"", map[string]int{MetricsAdmin: 401, MetricsPublic: 200}[access]},
			{tok.Token, map[string]int{MetricsAdmin: 403, MetricsPublic: 200}[access]},
			{ini.AdminCredential, 200},
		}
		for _, tt := range tests {
			req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
			if tt.cred != "" {
				req.Header.Set("Authorization", "Bearer "+tt.cred)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("%s metrics, credential %.12q: status %d, want %d", access, tt.cred, resp.StatusCode, tt.want)
			}
			if resp.StatusCode == 200 && !strings.Contains(string(body), "capkernel_ledger_entries") {
				t.Errorf("%s metrics: no capkernel_ledger_entries in\n%s", access, body)
			}
		}
		srv.Close()
	}
}
