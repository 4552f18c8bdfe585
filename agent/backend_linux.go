package agent

import (
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux"
)

// indexes returns the delphi indexes the backend's reconcilers look objects up by.
func indexes() []delphi.Index { return linux.Indexes() }

// backend returns the reconcilers that program this host's kernel, in namespace ns (nil:
// the agent's own network namespace), and a function that releases them.
func backend(store *delphi.Store, ns *netns.NsHandle, log *slog.Logger) ([]hal.Reconciler, func(), error) {
	routes, err := linux.NewRouteReconciler(linux.RouteOptions{Store: store, Namespace: ns, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return []hal.Reconciler{routes}, func() { routes.Close() }, nil
}
