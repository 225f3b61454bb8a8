package captoken

import (
	"strings"
	"testing"
)

func TestAllowsHost(t *testing.T) {
	tests := []struct {
		net  []string
		host string
		port int
		want bool
	}{
		{[]string{"api.example.com:443"}, "api.example.com", 443, true},
		{[]string{"api.example.com:443"}, "api.example.com", 80, false},
		{[]string{"api.example.com:443"}, "API.Example.COM", 443, true},
		{[]string{"API.EXAMPLE.COM:443"}, "api.example.com", 443, true},
		{[]string{"api.example.com:443"}, "api.example.com.", 443, true},
		{[]string{"api.example.com:443"}, "api.example.com..", 443, false},
		{[]string{"api.example.com:443"}, "example.com", 443, false},
		{[]string{"api.example.com:443"}, "x.api.example.com", 443, false},
		{[]string{"example.com"}, "example.com", 1, true},
		{[]string{"example.com"}, "example.com", 65535, true},
		{[]string{"example.com"}, "example.com", 0, false},
		{[]string{"example.com"}, "example.com", 65536, false},
		{[]string{"example.com"}, "www.example.com", 443, false},

		{[]string{"*.example.com"}, "a.example.com", 443, true},
		{[]string{"*.example.com"}, "a.b.example.com", 443, true},
		{[]string{"*.example.com"}, "A.EXAMPLE.com", 443, true},
		{[]string{"*.example.com"}, "example.com", 443, false},
		{[]string{"*.example.com"}, "evilexample.com", 443, false},
		{[]string{"*.example.com"}, "a.evilexample.com", 443, false},
		{[]string{"*.example.com"}, ".example.com", 443, false},
		{[]string{"*.example.com"}, "example.com.evil.net", 443, false},
		{[]string{"*.example.com:8443"}, "a.example.com", 8443, true},
		{[]string{"*.example.com:8443"}, "a.example.com", 443, false},
		{[]string{"*.Example.com"}, "a.example.COM", 443, true},

		// Names outside ASCII match nothing: the Kelvin sign (U+212A) is
		// not 'k', though strings.ToLower would make it one.
		{[]string{"kelvin.example.com"}, "\u212aelvin.example.com", 443, false},
		{[]string{"*.example.com"}, "\u212a.example.com", 443, false},
		{[]string{"example.com"}, "exa mple.com", 443, false},
		{[]string{"example.com"}, "", 443, false},

		{[]string{"192.0.2.1"}, "192.0.2.1", 80, true},
		{[]string{"192.0.2.1:80"}, "192.0.2.1", 81, false},
		{[]string{"192.0.2.1"}, "192.0.2.10", 80, false},
		{[]string{"192.0.2.1"}, "::ffff:192.0.2.1", 80, false},
		{[]string{"*.0.2.1"}, "192.0.2.1", 80, false},
		{[]string{"[2001:db8::1]"}, "2001:db8::1", 443, true},
		{[]string{"[2001:db8::1]"}, "[2001:db8::1]", 443, true},
		{[]string{"[2001:db8::1]"}, "2001:db8:0:0:0:0:0:1", 443, true},
		{[]string{"[2001:db8::1]"}, "2001:DB8::1", 443, true},
		{[]string{"[2001:db8::1]:443"}, "2001:db8::1", 80, false},
		{[]string{"[2001:db8::1]"}, "2001:db8::2", 443, false},
		{[]string{"[2001:db8::1]"}, "fe80::1%eth0", 443, false},
		{[]string{"[2001:db8::1]"}, "[2001:db8::1", 443, false},
		{[]string{"example.com"}, "192.0.2.1", 443, false},
		{[]string{"example.com"}, "[example.com]", 443, false},
		{[]string{"192.0.2.1"}, "[192.0.2.1]", 443, false},
		{[]string{"192.0.2.1"}, "192.0.2.1.", 443, false},
		{[]string{"*.2.1"}, "192.0.2.1.", 443, false},
		{[]string{"*.2.1"}, "127.1", 443, false},

		{[]string{"a.example.com", "b.example.com:80"}, "b.example.com", 80, true},
		{[]string{"a.example.com", "b.example.com:80"}, "b.example.com", 443, false},
		{nil, "example.com", 443, false},
		// "*" matches every valid host on every port, and nothing invalid.
		{[]string{"*"}, "example.com", 443, true},
		{[]string{"*"}, "192.0.2.1", 8080, true},
		{[]string{"*"}, "exa mple.com", 443, false},
		{[]string{"*"}, "example.com", 0, false},
		// An invalid pattern (Validate refuses it) matches nothing.
		{[]string{"*:443"}, "example.com", 443, false},
		{[]string{"example.com:0"}, "example.com", 443, false},
	}
	for _, tt := range tests {
		c := Capability{Net: tt.net}
		if got := c.AllowsHost(tt.host, tt.port); got != tt.want {
			t.Errorf("net %q AllowsHost(%q, %d) = %v, want %v", tt.net, tt.host, tt.port, got, tt.want)
		}
	}
}

func TestHostPatternValid(t *testing.T) {
	for _, p := range []string{"example.com", "api.example.com:443", "*.example.com", "*.example.com:8443", "API.Example.com",
		"localhost", "_dmarc.example.com", "xn--bcher-kva.example", "192.0.2.1", "192.0.2.1:53", "[::1]", "[2001:db8::1]:8080", "*"} {
		if _, err := parseHostPattern(p); err != nil {
			t.Errorf("parseHostPattern(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", "*:443", "**", "*.", "*.*.example.com", "a.*.example.com", "example.*", "example.com.", ".example.com",
		"example..com", "example.com:", "example.com:0", "example.com:65536", "example.com:+80", "example.com:080",
		"example.com:http", "example.com:443:1", "::1", "2001:db8::1", "[::1", "[::1]x", "[192.0.2.1]", "[fe80::1%eth0]",
		"exa mple.com", "bücher.example", "*.2.1", "127.1", "a.0", "https://example.com", "example.com/path", "user@example.com"} {
		if _, err := parseHostPattern(p); err == nil {
			t.Errorf("parseHostPattern(%q) = nil, want an error", p)
		}
	}
}

func TestNamesHost(t *testing.T) {
	tests := []struct {
		net  []string
		host string
		port int
		want bool
	}{
		{[]string{"localhost"}, "localhost", 80, true},
		{[]string{"LocalHost:8080"}, "localhost.", 8080, true},
		{[]string{"localhost:8080"}, "localhost", 80, false},
		{[]string{"127.0.0.1"}, "127.0.0.1", 80, true},
		{[]string{"[::1]"}, "[::1]", 80, true},
		{[]string{"*"}, "localhost", 80, false},
		{[]string{"*"}, "127.0.0.1", 80, false},
		{[]string{"*.example.com"}, "a.example.com", 80, false},
		{[]string{"*", "a.example.com"}, "a.example.com", 80, true},
		{[]string{"example.com"}, "127.0.0.1", 80, false},
	}
	for _, tt := range tests {
		c := Capability{Net: tt.net}
		if got := c.NamesHost(tt.host, tt.port); got != tt.want {
			t.Errorf("net %q NamesHost(%q, %d) = %v, want %v", tt.net, tt.host, tt.port, got, tt.want)
		}
	}
	if !(Capability{Net: []string{"a.example.com", "*"}}).AllowsAnyHost() || (Capability{Net: []string{"*.example.com"}}).AllowsAnyHost() {
		t.Error("AllowsAnyHost")
	}
}

// A refused pattern's error names its real fault, with the offending
// character as a character.
func TestHostPatternFault(t *testing.T) {
	for _, tt := range []struct{ pattern, want string }{
		{"api.example.com.", `host "api.example.com." ends in a dot`},
		{"example.com.:443", `ends in a dot`},
		{"example..com", `has an empty label`},
		{".example.com", `has an empty label`},
		{strings.Repeat("a", 64) + ".com", `has a label longer than 63 bytes`},
		{"bücher.de", `host "bücher.de" has the character 'ü' (U+00FC)`},
		{"bücher.de", `xn--`},
		{"b\xfccher.de", `has the byte 0xfc, which is not UTF-8`},
		{"exa mple.com", `has the character ' '`},
		{"*.*.example.com", `host "*.example.com" has the character '*': a wildcard is only a whole first label`},
		{"127.1", `ends in an all-digit label`},
		{"a.0", `ends in an all-digit label`},
	} {
		_, err := parseHostPattern(tt.pattern)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseHostPattern(%q) = %v, want an error with %q", tt.pattern, err, tt.want)
		}
	}
}
