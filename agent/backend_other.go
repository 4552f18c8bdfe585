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

// backend reports that only Linux hosts can be programmed.
func backend(*delphi.Store, Config, *KernelView, *slog.Logger, prometheus.Registerer) ([]hal.Reconciler, InstalledFirewall, func(), error) {
	return nil, nil, nil, errors.New("agent: the HAL programs Linux kernels only")
}
