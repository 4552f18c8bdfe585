package agent

import (
	"log/slog"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux"
)

// indexes returns the delphi indexes the backend's reconcilers look objects up by.
func indexes() []delphi.Index { return linux.Indexes() }

// closingReconciler is a reconciler that holds kernel sockets until closed.
type closingReconciler interface {
	hal.Reconciler
	Close() error
}

// backend returns the reconcilers that program this host's kernel, in cfg.netns (nil: the
// agent's own network namespace), and a function that releases them.
func backend(store *delphi.Store, cfg Config, log *slog.Logger) ([]hal.Reconciler, func(), error) {
	var made []closingReconciler
	closeAll := func() {
		for _, r := range made {
			r.Close()
		}
	}
	for _, build := range []func() (closingReconciler, error){
		func() (closingReconciler, error) {
			return linux.NewRouteReconciler(linux.RouteOptions{Store: store, Namespace: cfg.netns, Logger: log})
		},
		func() (closingReconciler, error) {
			return linux.NewInterfaceReconciler(linux.InterfaceOptions{
				Store: store, Namespace: cfg.netns, StatsInterval: cfg.InterfaceStats, Logger: log,
			})
		},
		func() (closingReconciler, error) {
			return linux.NewNodeReconciler(linux.NodeOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, Logger: log})
		},
		func() (closingReconciler, error) {
			return linux.NewNetworkReconciler(linux.NetworkOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, Logger: log})
		},
		func() (closingReconciler, error) {
			return linux.NewEndpointReconciler(linux.EndpointOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, Logger: log})
		},
	} {
		r, err := build()
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		made = append(made, r)
	}
	recs := make([]hal.Reconciler, len(made))
	for i, r := range made {
		recs[i] = r
	}
	return recs, closeAll, nil
}
