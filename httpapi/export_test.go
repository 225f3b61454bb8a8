package httpapi

import "time"

// SetHeartbeat sets the GET /v1/events heartbeat of s, so a test sees a
// stream re-verify its credential without waiting 15 s.
func SetHeartbeat(s *Server, d time.Duration) { s.heartbeat = d }
