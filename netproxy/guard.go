package netproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// Guard dials TCP connections for the kernel (net.fetch's HTTP client and
// the allowlist proxy's Options.Dial) and refuses, on the address actually
// dialed, loopback, private, link-local, metadata and other special-purpose
// addresses, and every address of the kernel host's own interfaces (a
// service listening on all interfaces is as near as one on loopback),
// unless Explicit says the host was named explicitly by the capability
// token. The check runs in the dialer's Control hook, after
// resolution, on the IP the socket is about to connect to, so a DNS name
// that resolves (or rebinds) to such an address is refused like the
// address itself.
type Guard struct {
	// Explicit reports whether host:port (the name or literal the caller
	// asked for) is named explicitly by the token; nil means never.
	Explicit func(host string, port int) bool
	// Lookup resolves a host name; nil uses net.DefaultResolver. Tests and
	// kernels with their own resolver set it.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// Timeout bounds one dial (default 10 s).
	Timeout time.Duration
}

// ErrSpecialAddress is the error a Guard returns for a refused address.
var ErrSpecialAddress = errors.New("address in a loopback, private, link-local, metadata or other special-purpose range")

// AddrError says which address a Guard refused for which host.
type AddrError struct {
	Host string
	Addr netip.Addr
	// Own: Addr is an address of one of the kernel host's interfaces.
	Own bool
}

func (e *AddrError) Error() string {
	what := ErrSpecialAddress.Error()
	if e.Own {
		what = "an address of the kernel host's own interfaces"
	}
	return fmt.Sprintf("%s resolves to %s: %s, which only a token pattern naming %s (or the address) explicitly may reach", e.Host, e.Addr, what, e.Host)
}

func (e *AddrError) Unwrap() error { return ErrSpecialAddress }

// metadata lists cloud metadata addresses outside the link-local range.
var metadata = []netip.Addr{
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
}

// specialPrefixes are the ranges of the IANA special-purpose address
// registries (RFC 6890) that are not globally reachable, beyond those the
// netip predicates in Special cover, and the prefixes that translate or
// tunnel to IPv4 by an embedding Special does not decode (which may reach
// the IPv4 specials).
var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation (TEST-NET-1, RFC 5737)
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast (deprecated, RFC 7526)
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation (TEST-NET-2)
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation (TEST-NET-3)
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64 (RFC 8215): its embedding is the network's choice
	netip.MustParsePrefix("100::/64"),        // discard-only (RFC 6666)
	netip.MustParsePrefix("2001::/32"),       // Teredo tunnels to IPv4
	netip.MustParsePrefix("2001:2::/48"),     // benchmarking
	netip.MustParsePrefix("2001:10::/28"),    // ORCHID (deprecated)
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("2002::/16"),       // 6to4 tunnels to IPv4
	netip.MustParsePrefix("3fff::/20"),       // documentation (RFC 9637)
	netip.MustParsePrefix("5f00::/16"),       // SRv6 SIDs (RFC 9602)
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated)
}

// nat64 is NAT64's well-known prefix (RFC 6052), whose addresses embed an
// IPv4 address in their last 32 bits.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// embedded returns the IPv4 address a reaches: a itself unmapped if a is
// IPv4-mapped, the address a NAT64 address (in the well-known prefix)
// embeds, else a.
func embedded(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return a
}

// Special reports whether a is an address the guard refuses by default:
// unspecified, loopback, private (RFC 1918, unique local), link-local
// (169.254/16 holds the cloud metadata endpoint), multicast, broadcast,
// carrier-grade NAT, documentation, benchmarking, discard-only, site-local
// and reserved ranges, the local-use NAT64, 6to4 and Teredo prefixes, and
// known metadata addresses. IPv4-mapped IPv6 addresses, and addresses in
// NAT64's well-known prefix 64:ff9b::/96 (what DNS64 answers for an
// IPv4-only name on an IPv6-only host), are judged by the IPv4 address
// they embed.
func Special(a netip.Addr) bool {
	a = embedded(a)
	if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	for _, m := range metadata {
		if a == m {
			return true
		}
	}
	for _, p := range specialPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// LookupCost is what a DNS lookup of host costs a byte budget: the bytes
// of the name, the payload a lookup carries to whoever serves the name's
// zone, resolved or not (chosen data, for a name under a wildcard
// pattern). As for the proxy's bytes, the protocol's own framing (the
// query's header, the resolver's packets) is not counted: what a budget
// bounds is the data that leaves.
func LookupCost(host string) int64 { return int64(len(host)) }

type lookupChargeKey struct{}

// WithLookupCharge returns a ctx for Guard.DialContext carrying charge:
// before it resolves a host name (not an IP literal), the Guard calls
// charge(LookupCost(host)), and an error from it refuses the dial with
// that error, nothing resolved. The proxy and net.fetch charge lookups to
// their byte budgets this way.
func WithLookupCharge(ctx context.Context, charge func(n int64) error) context.Context {
	return context.WithValue(ctx, lookupChargeKey{}, charge)
}

// ownAddr reports whether a is an address of one of this host's
// interfaces. The interfaces are listed at every dial: addresses come and
// go (DHCP, containers' veths), and one netlink dump costs little next to
// a connect.
func ownAddr(a netip.Addr) (bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, fmt.Errorf("listing the host's own addresses: %w", err)
	}
	// Through NAT64, the IPv4 address embedded is the one reached.
	a, v4 := a.Unmap().WithZone(""), embedded(a)
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && (b.Unmap() == a || b.Unmap() == v4) {
				return true, nil
			}
		}
	}
	return false, nil
}

// DialContext connects to addr ("host:port") over TCP, refusing special
// addresses for hosts not named explicitly. Each resolved address is tried
// in turn; the refusal of one is the error when none connects.
func (g *Guard) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", portStr, err)
	}
	explicit := g.Explicit != nil && g.Explicit(host, port)
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		if charge, ok := ctx.Value(lookupChargeKey{}).(func(int64) error); ok {
			if err := charge(LookupCost(host)); err != nil {
				return nil, err
			}
		}
		lookup := g.Lookup
		if lookup == nil {
			lookup = func(ctx context.Context, h string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			}
		}
		if addrs, err = lookup(ctx, host); err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("%s: no addresses", host)
		}
	}
	timeout := g.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	d := &net.Dialer{
		Timeout: timeout,
		// The check on the dialed IP: whatever resolved it, this is the
		// address the socket connects to.
		ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dialing %q: %w", address, err)
			}
			if explicit {
				return nil
			}
			if Special(ap.Addr()) {
				return &AddrError{Host: host, Addr: ap.Addr().Unmap()}
			}
			// Fails closed: an address not known not to be the host's
			// own is not dialed.
			own, err := ownAddr(ap.Addr())
			if err != nil {
				return err
			}
			if own {
				return &AddrError{Host: host, Addr: ap.Addr().Unmap(), Own: true}
			}
			return nil
		},
	}
	if network == "" {
		network = "tcp"
	}
	var first error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, network, netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}
