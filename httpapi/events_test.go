package httpapi_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// skewedClock is the kernel's clock in a test: the real time, moved on
// by Advance, so a token's expiry comes without waiting for it.
type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) Now() time.Time          { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Advance(d time.Duration) { c.skew.Add(int64(d)) }

// TestEventStreamEndsWithItsCredential: GET /v1/events verifies its
// credential again before each event and on each heartbeat. Once an
// approver's token is revoked, or expires (a real token of a 60 s TTL,
// the kernel's clock moved past it), the stream sends "event: ended" with
// the refusal and ends, and no event from then on reaches it: neither the
// next call's (heartbeat of an hour, so only the per-event check can stop
// it) nor, on an idle stream, anything (the heartbeat ends it). An
// auditor's stream open all along gets the next call's events, so they
// were emitted. The stream checked its token only at connect, and a
// revoked approver went on reading every approval request.
func TestEventStreamEndsWithItsCredential(t *testing.T) {
	const (
		beforeOp = "0190b3e4-0000-7000-8000-0000000be4e1"
		afterOp  = "0190b3e4-0000-7000-8000-0000000af7e1"
	)
	tests := []struct {
		name      string
		heartbeat time.Duration
		expire    bool // else revoke
		class     string
	}{
		{"revoked, the next event", time.Hour, false, captoken.CodeRevoked},
		{"revoked, idle until the heartbeat", 10 * time.Millisecond, false, captoken.CodeRevoked},
		{"expired, the next event", time.Hour, true, captoken.CodeInvalid},
		{"expired, idle until the heartbeat", 10 * time.Millisecond, true, captoken.CodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &skewedClock{}
			f := newAccessFixtureWith(t, kernel.Config{Now: clock.Now}, func(s *httpapi.Server) { httpapi.SetHeartbeat(s, tt.heartbeat) })
			approver, err := f.k.Mint(kernel.TokenRequest{AgentID: "person-leaving", Role: captoken.RoleApprover, TTLSeconds: 60})
			if err != nil {
				t.Fatal(err)
			}
			leaving, stopLeaving := f.events(t, approver.Token)
			defer stopLeaving()
			control, stopControl := f.events(t, f.auditor)
			defer stopControl()
			if r := f.call(t, f.a, "echo", `{"text":"before"}`, "", beforeOp); r.Status != kernel.StatusOK {
				t.Fatalf("echo: %+v", r.Error)
			}
			leaving.waitFor(t, beforeOp)

			if tt.expire {
				clock.Advance(60*time.Second + kernel.DefaultTokenLeeway + time.Second)
			} else if err := f.k.Revoke(context.Background(), approver.ID, "left the team"); err != nil {
				t.Fatal(err)
			}
			if _, err := f.k.VerifyBearer(approver.Token); err == nil {
				t.Fatal("the token still verifies")
			}
			if tt.heartbeat < time.Hour {
				// Idle: the heartbeat alone must end the stream.
				waitEnded(t, leaving)
			}
			if r := f.call(t, f.a, "echo", `{"text":"after"}`, "", afterOp); r.Status != kernel.StatusOK {
				t.Fatalf("echo: %+v", r.Error)
			}
			control.waitFor(t, afterOp)
			waitEnded(t, leaving)
			got := string(leaving.bytes())
			if strings.Contains(got, afterOp) {
				t.Errorf("the stream delivered an event after its token stopped verifying:\n%s", got)
			}
			if want := "event: ended\ndata: {\"error\":{\"class\":\"" + tt.class + "\""; !strings.Contains(got, want) {
				t.Errorf("the stream did not end with %q:\n%s", want, got)
			}
		})
	}
}

// waitEnded waits until the server has ended s.
func waitEnded(t *testing.T, s *stream) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream of a credential that no longer verifies is still open:\n%s", s.bytes())
	}
}

// TestClientEventsEndWithCredential: httpapi.Client's Events returns the
// refusal (401 token_revoked) when the server ends the stream of a
// revoked token, instead of an empty event or a clean end.
func TestClientEventsEndWithCredential(t *testing.T) {
	f := newAccessFixtureWith(t, kernel.Config{}, func(s *httpapi.Server) { httpapi.SetHeartbeat(s, 10*time.Millisecond) })
	approver, err := f.k.Mint(kernel.TokenRequest{AgentID: "person-leaving", Role: captoken.RoleApprover})
	if err != nil {
		t.Fatal(err)
	}
	c := &httpapi.Client{BaseURL: f.srv.URL, Credential: approver.Token}
	// The stream ends with the test at the latest, so a server that never
	// ends it fails the test rather than hanging its cleanup.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	var seen atomic.Int32
	go func() {
		done <- c.Follow(ctx, kernel.EventFilter{}, func() { close(ready) }, func(kernel.Event) error {
			seen.Add(1)
			return nil
		}, nil)
	}()
	<-ready
	if err := f.k.Revoke(context.Background(), approver.ID, "left the team"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ae *httpapi.APIError
		if !errors.As(err, &ae) || ae.Status != 401 || ae.Class != captoken.CodeRevoked {
			t.Fatalf("Follow ended with %v, want a 401 %s APIError", err, captoken.CodeRevoked)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow of a revoked token still runs")
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("Follow passed on %d events", n)
	}
}
