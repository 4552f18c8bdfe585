// Package address parses the addresses naples listens on and dials: "tcp://host:port" and
// "unix:///path/to/socket".
package address

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// ErrBadAddress is wrapped by every parse error.
var ErrBadAddress = errors.New("bad address")

// Address is a parsed listen or dial address.
type Address struct {
	// Network is "tcp" or "unix".
	Network string
	// Addr is host:port for tcp and the socket path for unix.
	Addr string
}

// Parse parses "tcp://host:port" or "unix:///path". A bare "host:port" is taken as tcp.
func Parse(s string) (Address, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		p := strings.TrimPrefix(s, "unix://")
		if p == "" || !filepath.IsAbs(p) {
			return Address{}, fmt.Errorf("address %q: unix socket path must be absolute (unix:///path): %w", s, ErrBadAddress)
		}
		return Address{Network: "unix", Addr: p}, nil
	case strings.HasPrefix(s, "tcp://"):
		s = strings.TrimPrefix(s, "tcp://")
	case strings.Contains(s, "://"):
		return Address{}, fmt.Errorf("address %q: scheme must be tcp:// or unix://: %w", s, ErrBadAddress)
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return Address{}, fmt.Errorf("address %q: %v: %w", s, err, ErrBadAddress)
	}
	return Address{Network: "tcp", Addr: s}, nil
}

// String returns the address in the form Parse reads.
func (a Address) String() string { return a.Network + "://" + a.Addr }

// GRPCTarget returns the target to hand grpc.NewClient.
func (a Address) GRPCTarget() string {
	if a.Network == "unix" {
		return "unix://" + a.Addr
	}
	return "passthrough:///" + a.Addr
}

// Listen listens on the address. For a unix socket it creates the directory and removes a
// stale socket file left by a previous process.
func (a Address) Listen(ctx context.Context) (net.Listener, error) {
	if a.Network == "unix" {
		if err := os.MkdirAll(filepath.Dir(a.Addr), 0o755); err != nil {
			return nil, fmt.Errorf("creating socket directory: %w", err)
		}
		if fi, err := os.Lstat(a.Addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if c, err := net.Dial("unix", a.Addr); err == nil {
				c.Close()
				return nil, fmt.Errorf("listening on %s: another process is serving it", a)
			}
			if err := os.Remove(a.Addr); err != nil {
				return nil, fmt.Errorf("removing stale socket %s: %w", a.Addr, err)
			}
		}
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, a.Network, a.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", a, err)
	}
	return l, nil
}
