package firewall

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// ErrBadPorts is wrapped by the error of a rule's port that is neither a port from 1 to
// 65535 nor a range "low-high" of them.
var ErrBadPorts = errors.New(`not a port 1-65535 or a range "low-high"`)

// PortRange is an inclusive range of destination ports.
type PortRange struct {
	// Lo and Hi are the first and last port of the range.
	Lo, Hi uint16
}

// ParsePortRange parses a rule's port as the API spells it: a single port ("80") or a
// range ("8000-8080"), ports from 1 to 65535, low not above high.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, lerr := strconv.ParseUint(lo, 10, 16)
	h, herr := strconv.ParseUint(hi, 10, 16)
	if lerr != nil || herr != nil || l == 0 || l > h {
		return PortRange{}, fmt.Errorf("port %q: %w", s, ErrBadPorts)
	}
	return PortRange{Lo: uint16(l), Hi: uint16(h)}, nil
}

// String returns the range as the API spells it: "80" or "8000-8080".
func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return strconv.Itoa(int(r.Lo)) + "-" + strconv.Itoa(int(r.Hi))
}

// PortPrefix is an aligned block of 2^(16-Bits) destination ports: those whose leading
// Bits bits equal Port's. Bits 0 is every port, Bits 16 a single one.
type PortPrefix struct {
	// Port is the first port of the block; its trailing 16-Bits bits are zero.
	Port uint16
	// Bits is how many leading bits of a port the block fixes, 0 to 16.
	Bits int
}

// Last returns the last port of the block.
func (p PortPrefix) Last() uint16 {
	return p.Port | uint16(0xffff>>p.Bits)
}

// Contains reports whether the block holds every port of q.
func (p PortPrefix) Contains(q PortPrefix) bool {
	return p.Bits <= q.Bits && q.Port&^uint16(0xffff>>p.Bits) == p.Port
}

// String returns the block as a port range, "8000-8063", a single port, "80", or "any".
func (p PortPrefix) String() string {
	if p.Bits == 0 {
		return "any"
	}
	return PortRange{Lo: p.Port, Hi: p.Last()}.String()
}

// Prefixes splits the range into the fewest aligned blocks that together hold exactly its
// ports, in ascending order: at most 30 of them.
func (r PortRange) Prefixes() []PortPrefix {
	var out []PortPrefix
	lo, hi := uint32(r.Lo), uint32(r.Hi)
	for lo <= hi {
		// The largest block that starts at lo (lo's alignment) and ends by hi.
		size := uint32(1) << 16
		if lo != 0 {
			size = uint32(1) << bits.TrailingZeros32(lo)
		}
		for size > hi-lo+1 {
			size >>= 1
		}
		out = append(out, PortPrefix{Port: uint16(lo), Bits: 16 - bits.TrailingZeros32(size)})
		lo += size
	}
	return out
}
