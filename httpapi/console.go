package httpapi

import "net/http"

// ServeConsole serves the operator's console h (package console) under
// /console/.
func (s *Server) ServeConsole(h http.Handler) {
	s.mux.Handle("/console/", h)
	s.mux.Handle("GET /console", h)
}
