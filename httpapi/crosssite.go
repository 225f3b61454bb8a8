package httpapi

import (
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/capkernel/capkernel/kernel"
)

// Requests a web page could send. A page on another site can make a
// browser send a POST without a CORS preflight when its Content-Type is
// absent, text/plain, a form or multipart; any browser request of a
// state-changing method carries Origin (and Sec-Fetch-Site). So before any
// handler runs, a request of a method other than GET, HEAD or OPTIONS is
// refused:
//
//   - with 403 when it is cross-origin: Sec-Fetch-Site says so (cross-site
//     or same-site), or Origin is neither this server's own origin (its
//     Host), nor an origin added with AllowOrigins, nor (for a request
//     without Sec-Fetch-Site) a loopback origin on the port of the loopback
//     socket the request came in on;
//   - with 415 when it has a body (or declares a type) that is not
//     application/json.
//
// POST /v1/syscalls answers either refusal with a result envelope audited
// in the ledger, as every call is (permission_denied or invalid_args).

// AllowOrigins trusts the given origins ("scheme://host[:port]", e.g.
// "https://console.example.com") to send state-changing requests from a
// browser, beyond the server's own origin. Call it before serving.
func (s *Server) AllowOrigins(origins ...string) error {
	for _, o := range origins {
		if err := s.origins.AddTrustedOrigin(o); err != nil {
			return fmt.Errorf("httpapi: allowed origin %q: %w", o, err)
		}
	}
	return nil
}

// guard applies the rules above; it answers the request itself and returns
// false when the request is refused.
func (s *Server) guard(w http.ResponseWriter, r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	status, class, msg := 0, "", ""
	// The loopback exception is for clients that do not say where the
	// request comes from (non-browsers, browsers older than
	// Sec-Fetch-Site). A browser that says cross-site or same-site is
	// believed: a loopback origin on this port may be another server's
	// page, on another loopback address (127.0.0.2, [::1]) of that port.
	if err := s.origins.Check(r); err != nil && (r.Header.Get("Sec-Fetch-Site") != "" || !loopbackOrigin(r)) {
		status, class = http.StatusForbidden, kernel.ErrPermissionDenied
		msg = fmt.Sprintf("cross-origin request refused (Origin %q, Sec-Fetch-Site %q): only this server's own origin, configured origins and (from clients that send no Sec-Fetch-Site) loopback origins on its port may send %s requests",
			r.Header.Get("Origin"), r.Header.Get("Sec-Fetch-Site"), r.Method)
	} else if why := notJSON(r); why != "" {
		status, class, msg = http.StatusUnsupportedMediaType, kernel.ErrInvalidArgs, why
	}
	if status == 0 {
		return true
	}
	if r.Method == http.MethodPost && r.URL.Path == "/v1/syscalls" {
		// A call: refused like any other, with an audited envelope. The
		// body (within the envelope limit) is kept for the record's digest.
		data, _ := io.ReadAll(io.LimitReader(r.Body, s.k.MaxEnvelopeBytes()))
		writeResult(w, status, s.k.Refuse(r.Context(), data, class, msg))
		return false
	}
	writeError(w, status, class, msg)
	return false
}

// notJSON says why r's body may not be acted on, or "" when it may: a
// declared Content-Type must be application/json (parameters allowed,
// charset only utf-8), and a body needs one.
func notJSON(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" {
		return "" // what every client sends, without parsing it
	}
	if ct == "" {
		if r.ContentLength == 0 {
			return "" // no body: nothing a form could smuggle
		}
		return "Content-Type is missing; send the body as application/json"
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Sprintf("Content-Type %q does not parse: %v; send application/json", ct, err)
	}
	if mt != "application/json" {
		return fmt.Sprintf("Content-Type %q is not accepted; send application/json", mt)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fmt.Sprintf("charset %q is not accepted; JSON is UTF-8", cs)
	}
	return ""
}

// loopbackOrigin reports whether r came in on a loopback socket and its
// Origin is a loopback origin (localhost, 127.0.0.0/8, ::1) on that
// socket's port: the same server under another loopback name.
func loopbackOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	la, err := netip.ParseAddrPort(local.String())
	if err != nil || !la.Addr().Unmap().IsLoopback() {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return false
	}
	if u.Port() != fmt.Sprint(la.Port()) {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
