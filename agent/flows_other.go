//go:build !linux

package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/naplesnet/naples/delphi"
)

// flowCollectorRun returns a part that fails: only Linux hosts have a firewall.
func flowCollectorRun(*delphi.Store, string, string, time.Duration, InstalledFirewall, *KernelView, *FlowLog, *slog.Logger) func(context.Context) error {
	return func(context.Context) error { return errors.New("flow records are read on Linux hosts only") }
}
