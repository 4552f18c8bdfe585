package address

import (
	"math/rand/v2"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	// Registers the client side of the health service, which healthCheckConfig turns on.
	_ "google.golang.org/grpc/health"
	"google.golang.org/grpc/resolver"
)

// firstHealthyName is the name of the gRPC load-balancing policy of a List's target.
const firstHealthyName = "naples_first_healthy"

func init() {
	balancer.Register(firstHealthyBuilder{})
}

// firstHealthyBuilder builds the first-healthy policy: one pick_first child per address,
// each connected and health-checked (when the service config asks for health checks),
// and every call sent to one child that is ready and healthy. The policy prefers the
// child it sends to already; when that one is not ready and healthy it moves to the ready
// one first in an order drawn at random for each client, so clients spread over the
// addresses. A call whose Route (WithRoute) avoids that child moves it to another ready
// one, the one the Route prefers if it can. A server that accepts connections but reports NOT_SERVING is skipped, which
// pick_first alone, staying on the first address it connects to, does not do. When no
// server is healthy and none is being connected to, calls go to one that is connected
// but not serving, so that they fail with what that server says (such as why it is not
// ready) rather than with a bare health-check failure.
type firstHealthyBuilder struct{}

// Name returns firstHealthyName.
func (firstHealthyBuilder) Name() string { return firstHealthyName }

// Build builds the policy over endpointsharding, as gRPC's round_robin is.
func (firstHealthyBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &firstHealthy{rank: map[string]float64{}, connected: map[balancer.SubConn]bool{}}
	b.Balancer = endpointsharding.NewBalancer(stateFilter{ClientConn: cc, b: b}, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	return b
}

// firstHealthy is the first-healthy policy of one client.
type firstHealthy struct {
	balancer.Balancer

	// mu guards rank, current and connected.
	mu sync.Mutex
	// rank is the client's random order of the endpoints, by endpointKey: lower first.
	rank map[string]float64
	// current is the key of the endpoint calls go to; empty before one is ready.
	current string
	// connected holds the connections that are up, healthy or not.
	connected map[balancer.SubConn]bool
}

// UpdateClientConnState ranks the endpoints it has not seen, and hands them to the
// children with their health listeners enabled.
func (b *firstHealthy) UpdateClientConnState(ccs balancer.ClientConnState) error {
	b.mu.Lock()
	for _, e := range ccs.ResolverState.Endpoints {
		if k := endpointKey(e); k != "" {
			if _, ok := b.rank[k]; !ok {
				b.rank[k] = rand.Float64()
			}
		}
	}
	b.mu.Unlock()
	return b.Balancer.UpdateClientConnState(balancer.ClientConnState{
		ResolverState: pickfirst.EnableHealthListener(ccs.ResolverState),
	})
}

// endpointKey names an endpoint by its first address.
func endpointKey(e resolver.Endpoint) string {
	if len(e.Addresses) == 0 {
		return ""
	}
	return e.Addresses[0].Addr
}

// stateFilter is the client connection endpointsharding reports to. It replaces the
// round-robin picker over every ready child with the picker of the one child chosen.
type stateFilter struct {
	balancer.ClientConn
	b *firstHealthy
}

// UpdateState reports the chosen child ready when one is, and the children's aggregate
// state otherwise; when that is a failure, calls go to a connection that is up but not
// healthy, if there is one.
func (f stateFilter) UpdateState(s balancer.State) {
	switch s.ConnectivityState {
	case connectivity.Ready:
		if p := f.b.choose(endpointsharding.ChildStatesFromPicker(s.Picker)); p != nil {
			s.Picker = p
		}
	case connectivity.TransientFailure:
		if sc := f.b.anyConnected(); sc != nil {
			s.Picker = subConnPicker{sc}
		}
	}
	f.ClientConn.UpdateState(s)
}

// NewSubConn makes a connection for a child and follows whether it is up.
func (f stateFilter) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	var sc balancer.SubConn
	listener := opts.StateListener
	opts.StateListener = func(s balancer.SubConnState) {
		f.b.setConnected(sc, s.ConnectivityState == connectivity.Ready)
		listener(s)
	}
	sc, err := f.ClientConn.NewSubConn(addrs, opts)
	return sc, err
}

// setConnected records whether sc is up.
func (b *firstHealthy) setConnected(sc balancer.SubConn, up bool) {
	if sc == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if up {
		b.connected[sc] = true
	} else {
		delete(b.connected, sc)
	}
}

// anyConnected returns a connection that is up, or nil.
func (b *firstHealthy) anyConnected() balancer.SubConn {
	b.mu.Lock()
	defer b.mu.Unlock()
	for sc := range b.connected {
		return sc
	}
	return nil
}

// subConnPicker sends every call over one connection.
type subConnPicker struct{ sc balancer.SubConn }

// Pick returns the connection.
func (p subConnPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{SubConn: p.sc}, nil
}

// choose returns the picker of the children that are ready: calls go to the current one
// while it is ready, else to the ready one ranked first, unless their Route moves them
// (see routePicker). It returns nil when no child is ready.
func (b *firstHealthy) choose(children []endpointsharding.ChildState) balancer.Picker {
	ready := map[string]balancer.Picker{}
	for i := range children {
		c := &children[i]
		if c.State.ConnectivityState == connectivity.Ready {
			ready[endpointKey(c.Endpoint)] = c.State.Picker
		}
	}
	if len(ready) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := ready[b.current]; !ok {
		b.current = b.firstLocked(ready, "")
	}
	return &routePicker{b: b, ready: ready}
}

// firstLocked returns the key of the ready child ranked first, leaving out skip; empty
// when there is none. b.mu is held.
func (b *firstHealthy) firstLocked(ready map[string]balancer.Picker, skip string) string {
	best := ""
	for k := range ready {
		if k != skip && (best == "" || b.rank[k] < b.rank[best]) {
			best = k
		}
	}
	return best
}

// routePicker sends a call to the current child, one of the children that were ready
// when it was made. A call whose Route avoids the current child moves it: to the child
// the Route prefers when that one is ready, else to the one ranked first among the
// others; the calls after it go there too.
type routePicker struct {
	b     *firstHealthy
	ready map[string]balancer.Picker
}

// Pick picks the current child, or moves it first as the call's Route asks, and records
// in the Route where the call goes.
func (p *routePicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	r := routeFrom(info.Ctx)
	b := p.b
	b.mu.Lock()
	key := b.current
	if _, ok := p.ready[key]; !ok {
		// A newer picker moved to a child this one does not know: keep to this one's.
		key = b.firstLocked(p.ready, "")
	}
	if r != nil && r.Avoid != "" && r.Avoid == key {
		next := r.Prefer
		if _, ok := p.ready[next]; !ok || next == r.Avoid {
			next = b.firstLocked(p.ready, r.Avoid)
		}
		if next != "" {
			key, b.current = next, next
		}
	}
	b.mu.Unlock()
	if r != nil {
		r.setChosen(key)
	}
	return p.ready[key].Pick(info)
}
