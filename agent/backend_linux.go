package agent

import (
	"log/slog"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux"
)

// indexes returns the delphi indexes the backend's reconcilers look objects up by.
func indexes() []delphi.Index { return linux.Indexes() }

// backend returns the reconcilers that program this host's kernel, in cfg.netns (nil: the
// agent's own network namespace), and a function that releases them.
func backend(store *delphi.Store, cfg Config, log *slog.Logger) ([]hal.Reconciler, func(), error) {
	var recs []hal.Reconciler
	var closers []func() error
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	add := func(r hal.Reconciler, close func() error, err error) error {
		if err != nil {
			return err
		}
		recs = append(recs, r)
		closers = append(closers, close)
		return nil
	}
	routes, err := linux.NewRouteReconciler(linux.RouteOptions{Store: store, Namespace: cfg.netns, Logger: log})
	if err := add(routes, func() error { return routes.Close() }, err); err != nil {
		closeAll()
		return nil, nil, err
	}
	ifaces, err := linux.NewInterfaceReconciler(linux.InterfaceOptions{
		Store: store, Namespace: cfg.netns, StatsInterval: cfg.InterfaceStats, Logger: log,
	})
	if err := add(ifaces, func() error { return ifaces.Close() }, err); err != nil {
		closeAll()
		return nil, nil, err
	}
	return recs, closeAll, nil
}
