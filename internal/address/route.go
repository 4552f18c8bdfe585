package address

import (
	"context"
	"sync"
)

// Route is what a call tells the balancer of a List's target (see List.GRPCTarget) about
// where it should go, and what it learns of where it went. Hand it to the call's context
// with WithRoute.
type Route struct {
	// Avoid, when it is the address calls go to, moves them: this call and the ones after
	// it go to another address whose server is ready, when there is one. An address is
	// named as in the List, "tcp://host:port" or "unix:///path".
	Avoid string
	// Prefer is the address to move to when moving off Avoid, if its server is ready;
	// otherwise the one ranked first among the others, as after a failure.
	Prefer string

	// mu guards chosen.
	mu sync.Mutex
	// chosen is the address the call was last sent to.
	chosen string
}

// routeKey is the context key of a call's Route.
type routeKey struct{}

// WithRoute returns ctx with r, for the balancer to read when it picks where the call
// goes.
func WithRoute(ctx context.Context, r *Route) context.Context {
	return context.WithValue(ctx, routeKey{}, r)
}

// routeFrom returns the Route of a call's context, or nil.
func routeFrom(ctx context.Context) *Route {
	if ctx == nil {
		return nil
	}
	r, _ := ctx.Value(routeKey{}).(*Route)
	return r
}

// Chosen returns the address the balancer sent the call to, in the form of the List;
// empty before it picked one.
func (r *Route) Chosen() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chosen
}

// setChosen records the address the call was sent to.
func (r *Route) setChosen(addr string) {
	r.mu.Lock()
	r.chosen = addr
	r.mu.Unlock()
}
