// Package address parses the addresses naples listens on and dials: "tcp://host:port" and
// "unix:///path/to/socket", and lists of them: the replicas of one service, which a gRPC
// client reaches through [List.GRPCTarget].
package address

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
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

// GRPCTarget returns the target to hand grpc.NewClient. A tcp host name is resolved when
// it is dialed, and its addresses are tried in turn; [List.GRPCTarget] resolves it into
// all of them instead.
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

// List is one or more addresses of one service, such as the replicas of nimbus, each of
// which serves the same API.
type List []Address

// ParseList parses a comma-separated list of one or more addresses, each as Parse reads
// it: "unix:///run/naples/nimbus.sock" or "tcp://10.0.0.1:7000,tcp://10.0.0.2:7000". Unix
// and tcp addresses may be mixed. Spaces around an address are ignored; a unix socket
// path with a comma cannot be listed. An empty list, an empty element, a bad address and
// an address listed twice are errors naming the value.
func ParseList(s string) (List, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("address list %q: no address: %w", s, ErrBadAddress)
	}
	parts := strings.Split(s, ",")
	if len(parts) == 1 {
		a, err := Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		return List{a}, nil
	}
	l := make(List, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("address list %q: address %d is empty: %w", s, i+1, ErrBadAddress)
		}
		a, err := Parse(p)
		if err != nil {
			return nil, fmt.Errorf("address list %q: %w", s, err)
		}
		for _, b := range l {
			if b == a {
				return nil, fmt.Errorf("address list %q: %s is listed twice: %w", s, a, ErrBadAddress)
			}
		}
		l = append(l, a)
	}
	return l, nil
}

// String returns the list in the form ParseList reads.
func (l List) String() string {
	s := make([]string, len(l))
	for i, a := range l {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// listScheme is the gRPC resolver scheme of the target of a List of several addresses.
const listScheme = "naples-list"

// serviceConfig is the default gRPC service config of a List's target: the first-healthy
// policy (see firstHealthyBuilder), with the standard health service checked on every
// connection. Each client sends its calls to one address, chosen at random among those
// whose server is up and says SERVING for the whole server (service ""), and moves to
// another when its connection fails or its server stops serving: a server that is up but
// not ready is skipped rather than tried again and again. A server without the health
// service counts as healthy once connected.
const serviceConfig = `{"loadBalancingConfig": [{"` + firstHealthyName + `": {}}], "healthCheckConfig": {"serviceName": ""}}`

// GRPCTarget returns the target and the dial options to hand grpc.NewClient for a
// connection to the addresses of l. The client connects to every address and checks the
// health of each server; it sends its calls to one healthy server, chosen at random, and
// moves to another when that one's connection fails or it stops serving.
//
// One unix address is dialed as Address.GRPCTarget does. One tcp address is resolved by
// gRPC's dns resolver: a host name with several addresses (A and AAAA records, or
// /etc/hosts) stands for all of them, and is resolved again when a connection fails.
// Several addresses are a static list, each dialed on its own network, and a tcp host name
// in it is resolved when it is dialed. A list of several has no host name of its own: the
// TLS config should name the server (internal/pki's ClientConfig does), which is otherwise
// verified as "localhost". The options include a context dialer, which a later
// grpc.WithContextDialer would replace.
func (l List) GRPCTarget() (string, []grpc.DialOption) {
	opts := []grpc.DialOption{grpc.WithDefaultServiceConfig(serviceConfig)}
	switch {
	case len(l) == 1 && l[0].Network == "unix":
		return l[0].GRPCTarget(), opts
	case len(l) == 1:
		// Without this the dns resolver also looks up a service config in TXT records.
		return "dns:///" + l[0].Addr, append(opts, grpc.WithDisableServiceConfig())
	}
	endpoints := make([]resolver.Endpoint, len(l))
	for i, a := range l {
		endpoints[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a.String()}}}
	}
	return listScheme + ":///localhost", append(opts,
		grpc.WithResolvers(staticResolver{state: resolver.State{Endpoints: endpoints}}),
		grpc.WithContextDialer(dialAddress))
}

// dialAddress dials s, an address in the form Parse reads.
func dialAddress(ctx context.Context, s string) (net.Conn, error) {
	a, err := Parse(s)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, a.Network, a.Addr)
}

// staticResolver is the gRPC resolver and resolver builder of a List of several
// addresses: it hands the client state, the list, once, and never changes it.
type staticResolver struct {
	state resolver.State
}

// Build hands the list to cc.
func (r staticResolver) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	// An error here is the balancer refusing the list, which it reports to the RPCs itself.
	_ = cc.UpdateState(r.state)
	return staticResolver{}, nil
}

// Scheme returns the scheme of a List's target.
func (staticResolver) Scheme() string { return listScheme }

// ResolveNow does nothing: the list does not change.
func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}

// Close does nothing.
func (staticResolver) Close() {}
