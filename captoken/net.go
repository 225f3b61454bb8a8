package captoken

import (
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"
)

// AllowsHost reports whether c grants reaching host on port.
//
// Each Net pattern is host[:port]. The host part is one of
//   - a DNS name, "api.example.com", matching that name only;
//   - "*." and a DNS name, "*.example.com", matching every name one or more
//     labels below it ("a.example.com", "a.b.example.com") but neither the
//     name itself nor names that merely end in it ("evilexample.com");
//   - an IPv4 literal, "192.0.2.1", or a bracketed IPv6 literal,
//     "[2001:db8::1]", matching that address only (no name, wildcard or
//     IPv4-mapped form of it);
//   - "*", matching every host (a valid name or IP literal) on every port:
//     the grant proc.exec's "full" network posture requires.
//
// DNS names are ASCII (IDNs in their xn-- form) and compared
// case-insensitively; a single trailing dot on host is ignored. A pattern
// without a port matches any port; one with a port matches only that port.
// host may be bracketed if it is an IPv6 literal. A port outside 1–65535,
// a host with a zone, and a host that is neither an IP literal nor an
// ASCII DNS name match nothing. A DNS name may not end in an all-digit
// label, since resolvers may read such a name ("127.1") as an address.
func (c Capability) AllowsHost(host string, port int) bool {
	allowed, _ := c.matchHost(host, port)
	return allowed
}

// matchHost reports whether a pattern of c allows host on port, and
// whether one that does names it explicitly (an IP literal equal to it or
// a DNS name, not a wildcard, equal to it).
func (c Capability) matchHost(host string, port int) (allowed, named bool) {
	if port < 1 || port > 65535 {
		return false, false
	}
	inner, bracketed := strings.CutPrefix(host, "[")
	if bracketed {
		if host, bracketed = strings.CutSuffix(inner, "]"); !bracketed {
			return false, false
		}
	}
	addr, err := netip.ParseAddr(host)
	isAddr := err == nil
	if isAddr && addr.Zone() != "" || bracketed && !(isAddr && addr.Is6()) {
		return false, false
	}
	name := lowerASCII(strings.TrimSuffix(host, "."))
	if !isAddr && validDNSName(name) != nil {
		return false, false
	}
	for _, s := range c.Net {
		p, err := parseHostPattern(s)
		if err != nil || (p.port != 0 && p.port != port) {
			continue
		}
		switch {
		case p.any:
			allowed = true
		case isAddr:
			if p.addr == addr {
				return true, true
			}
		case p.addr.IsValid():
			// An IP pattern matches no name.
		case p.wildcard:
			if len(name) > len(p.name)+1 && strings.HasSuffix(name, "."+p.name) {
				allowed = true
			}
		case name == p.name:
			return true, true
		}
	}
	return allowed, false
}

// hostPattern is a parsed Capability.Net entry.
type hostPattern struct {
	addr     netip.Addr // the IP literal, if the pattern is one
	name     string     // the lower-case DNS name, without "*." if wildcard
	wildcard bool       // the pattern was "*." + name
	any      bool       // the pattern was "*"
	port     int        // 0 for any port
}

// NamesHost reports whether a pattern of c that allows host on port names
// it explicitly: an IP literal equal to host, or a DNS name (not a
// wildcard) equal to host. The SSRF guards of net.fetch and of the
// allowlist proxy let a call reach loopback, private, link-local or
// metadata addresses only for such hosts; "*" and "*.example.com" never
// grant them.
func (c Capability) NamesHost(host string, port int) bool {
	_, named := c.matchHost(host, port)
	return named
}

// AllowsAnyHost reports whether c holds the pattern "*".
func (c Capability) AllowsAnyHost() bool {
	for _, s := range c.Net {
		if s == "*" {
			return true
		}
	}
	return false
}

func parseHostPattern(s string) (hostPattern, error) {
	var p hostPattern
	if s == "*" {
		p.any = true
		return p, nil
	}
	host, port, hasPort := s, "", false
	if inner, ok := strings.CutPrefix(s, "["); ok {
		end := strings.IndexByte(inner, ']')
		if end < 0 {
			return p, fmt.Errorf("net pattern %q has no closing bracket", s)
		}
		host = inner[:end]
		if rest := inner[end+1:]; rest != "" {
			port, hasPort = strings.CutPrefix(rest, ":")
			if !hasPort {
				return p, fmt.Errorf("net pattern %q has text after the bracket", s)
			}
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return p, fmt.Errorf("net pattern %q does not bracket an IPv6 address without zone", s)
		}
		p.addr = a
	} else {
		host, port, hasPort = strings.Cut(s, ":")
		if strings.Contains(port, ":") {
			return p, fmt.Errorf("net pattern %q: write IPv6 literals in brackets", s)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			p.addr = a
		} else {
			p.name, p.wildcard = strings.CutPrefix(lowerASCII(host), "*.")
			if err := validDNSName(p.name); err != nil {
				return p, fmt.Errorf("net pattern %q: %w", s, err)
			}
		}
	}
	if hasPort {
		n, err := parsePort(port)
		if err != nil {
			return p, fmt.Errorf("net pattern %q: %w", s, err)
		}
		p.port = n
	}
	return p, nil
}

// parsePort accepts decimal 1–65535 without sign or leading zeros.
func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
		}
		n = n*10 + int(s[i]-'0')
	}
	if n > 65535 {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	return n, nil
}

// validDNSName accepts lower-case ASCII names of at most 253 bytes made of
// 1–63 byte labels of letters, digits, '-' and '_' (the latter appears in
// service names such as _dmarc), with no trailing dot and a last label
// that is not all digits. Its error names the first fault found, the
// offending character as a character (not a byte of its UTF-8 form).
func validDNSName(s string) error {
	if s == "" || len(s) > 253 {
		return fmt.Errorf("host %q is not a DNS name of 1 to 253 bytes", s)
	}
	if strings.HasSuffix(s, ".") {
		return fmt.Errorf("host %q ends in a dot: write the name without it (a host called with one trailing dot matches the name without it)", s)
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return fmt.Errorf("host %q has an empty label (two dots in a row, or a leading dot)", s)
		}
		if len(label) > 63 {
			return fmt.Errorf("host %q has a label longer than 63 bytes", s)
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return badHostChar(s, label[i:])
			}
		}
	}
	if last := s[strings.LastIndexByte(s, '.')+1:]; strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("host %q ends in an all-digit label, which resolvers may read as an IPv4 address", s)
	}
	return nil
}

// badHostChar is the error for host s whose first character outside a DNS
// name's alphabet starts rest.
func badHostChar(s, rest string) error {
	r, size := utf8.DecodeRuneInString(rest)
	switch {
	case r == utf8.RuneError && size == 1:
		return fmt.Errorf("host %q has the byte 0x%02x, which is not UTF-8; only ASCII letters, digits, '-' and '_' are allowed", s, rest[0])
	case r >= utf8.RuneSelf:
		return fmt.Errorf("host %q has the character %q (U+%04X); only ASCII letters, digits, '-' and '_' are allowed: write an internationalised name in its xn-- (punycode) form", s, r, r)
	case r == '*':
		return fmt.Errorf("host %q has the character '*': a wildcard is only a whole first label, \"*.example.com\", or the pattern \"*\"", s)
	}
	return fmt.Errorf("host %q has the character %q; only ASCII letters, digits, '-' and '_' are allowed", s, r)
}

// lowerASCII lower-cases ASCII letters only. strings.ToLower would also fold
// non-ASCII letters (the Kelvin sign becomes 'k'), making names that DNS
// keeps distinct compare equal.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
