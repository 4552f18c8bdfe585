//go:build !linux

package agent

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
)

// indexes returns no indexes: there is no backend to declare them.
func indexes() []delphi.Index { return nil }

// firewallLoad is nothing to load: there is no firewall but on Linux.
type firewallLoad struct{}

// loadFirewall loads nothing.
func loadFirewall(Config, *slog.Logger) *firewallLoad { return nil }

// close does nothing.
func (*firewallLoad) close() {}

// backend reports that only Linux hosts can be programmed.
func backend(*delphi.Store, Config, *KernelView, *firewallLoad, *slog.Logger, prometheus.Registerer) ([]hal.Reconciler, InstalledFirewall, func(), error) {
	return nil, nil, nil, errors.New("agent: the HAL programs Linux kernels only")
}
