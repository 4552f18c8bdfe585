package firewall

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// errBadKey is wrapped by parseKey's errors.
var errBadKey = errors.New("not a firewall key")

// parseKey parses a key in the form Key.String writes (except the hex form of unknown
// keys). Numbers may be decimal or 0x-prefixed hex; a policy key's ports are "any", a port
// or a range that is one aligned block ("8000-8063", not "8000-8080").
func parseKey(s string) (Key, error) {
	words := strings.Fields(s)
	if len(words) == 0 {
		return Key{}, fmt.Errorf("key %q: %w", s, errBadKey)
	}
	fail := func(reason string, args ...any) (Key, error) {
		return Key{}, fmt.Errorf("key %q: %s: %w", s, fmt.Sprintf(reason, args...), errBadKey)
	}
	fields := map[string]string{}
	var bare []string
	for _, w := range words[1:] {
		name, value, ok := strings.Cut(w, "=")
		if !ok {
			bare = append(bare, w)
			continue
		}
		if _, dup := fields[name]; dup {
			return fail("%s given twice", name)
		}
		fields[name] = value
	}
	// want checks that exactly the named fields and bare words were given.
	want := func(nbare int, names ...string) error {
		if len(bare) != nbare {
			return fmt.Errorf("key %q: want %d bare word(s), have %d: %w", s, nbare, len(bare), errBadKey)
		}
		for _, n := range names {
			if _, ok := fields[n]; !ok {
				return fmt.Errorf("key %q: %s missing: %w", s, n, errBadKey)
			}
		}
		if len(fields) != len(names) {
			return fmt.Errorf("key %q: want only %s: %w", s, strings.Join(names, ", "), errBadKey)
		}
		return nil
	}
	num := func(name string) (uint32, error) {
		v, err := strconv.ParseUint(fields[name], 0, 32)
		if err != nil {
			return 0, fmt.Errorf("key %q: %s %q: not a 32-bit number: %w", s, name, fields[name], errBadKey)
		}
		return uint32(v), nil
	}
	switch words[0] {
	case "endpoint":
		if err := want(0, "ifindex"); err != nil {
			return Key{}, err
		}
		ifindex, err := num("ifindex")
		if err != nil {
			return Key{}, err
		}
		return EndpointKey(ifindex), nil
	case "identity":
		if err := want(1, "scope"); err != nil {
			return Key{}, err
		}
		scope, err := num("scope")
		if err != nil {
			return Key{}, err
		}
		p, err := netip.ParsePrefix(bare[0])
		if err != nil {
			// A bare address is its own full-length prefix.
			a, aerr := netip.ParseAddr(bare[0])
			if aerr != nil {
				return fail("%q: not a prefix or address", bare[0])
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		return IdentityKey(scope, p), nil
	case "policy":
		if err := want(0, "subject", "dir", "class", "identity", "ports"); err != nil {
			return Key{}, err
		}
		subject, err := num("subject")
		if err != nil {
			return Key{}, err
		}
		dir, ok := lookupName(dirNames, fields["dir"])
		if !ok {
			return fail("dir %q: want ingress or egress", fields["dir"])
		}
		class, ok := lookupName(classNames, fields["class"])
		if !ok {
			return fail("class %q: want tcp, udp, icmp or other", fields["class"])
		}
		identity := uint32(AnyIdentity)
		if fields["identity"] != "any" {
			if identity, err = num("identity"); err != nil {
				return Key{}, err
			}
		}
		ports := PortPrefix{}
		if fields["ports"] != "any" {
			r, err := parsePortBlock(fields["ports"])
			if err != nil {
				return fail("ports %q: %v", fields["ports"], err)
			}
			ports = r
		}
		return PolicyKey(subject, dir, class, identity, ports.Port, ports.Bits), nil
	}
	return fail("%q: want endpoint, identity or policy", words[0])
}

// parsePortBlock parses a port or range that is exactly one aligned block.
func parsePortBlock(s string) (PortPrefix, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, lerr := strconv.ParseUint(lo, 10, 16)
	h, herr := strconv.ParseUint(hi, 10, 16)
	if lerr != nil || herr != nil || l > h {
		return PortPrefix{}, errors.New(`want a port 0-65535 or a range "low-high"`)
	}
	blocks := PortRange{Lo: uint16(l), Hi: uint16(h)}.Prefixes()
	if len(blocks) != 1 {
		return PortPrefix{}, fmt.Errorf("not one aligned block of ports but %d", len(blocks))
	}
	return blocks[0], nil
}

// lookupName returns the number a name stands for in names.
func lookupName(names map[uint8]string, name string) (uint8, bool) {
	for n, s := range names {
		if s == name {
			return n, true
		}
	}
	return 0, false
}
