package httpapi

import "time"

// SetHeartbeat sets the GET /v1/events heartbeat of s, so a test sees a
// stream re-verify its credential without waiting 15 s.
func SetHeartbeat(s *Server, d time.Duration) { s.heartbeat = d }

// SetEventStreamLimits sets the GET /v1/events bounds of s (per agent, in
// all), so a test reaches them with a few streams.
func SetEventStreamLimits(s *Server, perAgent, total int) {
	s.streams.perAgent, s.streams.max = perAgent, total
}
