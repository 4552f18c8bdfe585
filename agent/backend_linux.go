package agent

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
)

// indexes returns the delphi indexes the backend's reconcilers look objects up by.
func indexes() []delphi.Index { return linux.Indexes() }

var _ InstalledFirewall = (*linux.Firewall)(nil)

// closingReconciler is a reconciler that holds kernel sockets until closed.
type closingReconciler interface {
	hal.Reconciler
	Close() error
}

// firewallLoad is the firewall's programs and maps, loading in the background.
type firewallLoad struct {
	done  chan struct{}
	objs  *fwbpf.Objects
	err   error
	taken bool
}

// loadFirewall starts loading the firewall's programs and maps (nil when cfg.BPFDir is
// empty): the kernel's verifier takes a second or more over them, which a restart spends
// while delphi restores the stored state rather than after it.
func loadFirewall(cfg Config, log *slog.Logger) *firewallLoad {
	if cfg.BPFDir == "" {
		return nil
	}
	l := &firewallLoad{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.objs, l.err = fwbpf.Open(cfg.BPFDir, fwbpf.Capacities(cfg.FirewallCapacities), log)
	}()
	return l
}

// take waits for the load and hands what it loaded over.
func (l *firewallLoad) take() (*fwbpf.Objects, error) {
	<-l.done
	l.taken = true
	return l.objs, l.err
}

// close waits for the load and closes what it loaded, unless it was taken.
func (l *firewallLoad) close() {
	if l == nil {
		return
	}
	<-l.done
	if !l.taken && l.objs != nil {
		l.objs.Close()
	}
}

// backend returns the reconcilers that program this host's kernel, in cfg.netns (nil: the
// agent's own network namespace), whose observers watch through view, that namespace's
// kernel view, the firewall among them, with the programs and maps of load (nil when
// cfg.BPFDir is empty, and no firewall), and a function that releases them.
func backend(store *delphi.Store, cfg Config, view *KernelView, load *firewallLoad, log *slog.Logger, reg prometheus.Registerer) ([]hal.Reconciler, InstalledFirewall, func(), error) {
	var made []closingReconciler
	var fw *linux.Firewall
	closeAll := func() {
		for _, r := range made {
			r.Close()
		}
		// After the endpoint reconciler, which uses it.
		if fw != nil {
			fw.Close()
		}
	}
	if load != nil {
		objs, err := load.take()
		if err == nil {
			fw, err = linux.NewFirewall(linux.FirewallOptions{
				Store: store, Node: cfg.Node, Namespace: cfg.netns, View: view, Dir: cfg.BPFDir, StatsInterval: cfg.FirewallStats, Logger: log, Registerer: reg,
				Capacities: fwbpf.Capacities(cfg.FirewallCapacities), Objects: objs,
			})
		} else {
			err = fmt.Errorf("firewall: %w", err)
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("starting the firewall (an empty --bpf-dir runs the agent without one): %w", err)
		}
	}
	for _, build := range []func() (closingReconciler, error){
		func() (closingReconciler, error) {
			return linux.NewRouteReconciler(linux.RouteOptions{Store: store, Namespace: cfg.netns, View: view, Logger: log})
		},
		func() (closingReconciler, error) {
			return linux.NewInterfaceReconciler(linux.InterfaceOptions{
				Store: store, Namespace: cfg.netns, View: view, StatsInterval: cfg.InterfaceStats, Logger: log,
				StateFile: filepath.Join(cfg.StateDir, "interfaces.json"),
			})
		},
		func() (closingReconciler, error) {
			return linux.NewNodeReconciler(linux.NodeOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, View: view, Logger: log})
		},
		func() (closingReconciler, error) {
			return linux.NewNetworkReconciler(linux.NetworkOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, View: view, Logger: log,
				BPFDir: cfg.BPFDir, GatewayBridges: cfg.GatewayBridges, GatewayCheckInterval: cfg.GatewayCheck, Registerer: reg, StateFile: filepath.Join(cfg.StateDir, "sysctls.json")})
		},
		func() (closingReconciler, error) {
			return linux.NewEndpointReconciler(linux.EndpointOptions{Store: store, Node: cfg.Node, Namespace: cfg.netns, View: view, Logger: log, Firewall: fw,
				StateFile: filepath.Join(cfg.StateDir, "endpoints.json")})
		},
	} {
		r, err := build()
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		made = append(made, r)
	}
	recs := make([]hal.Reconciler, 0, len(made)+2)
	for _, r := range made {
		recs = append(recs, r)
	}
	if fw == nil {
		return recs, nil, closeAll, nil
	}
	traces, err := NewTraceReconciler(TraceOptions{Store: store, Firewall: fw, View: view, Node: cfg.Node, MaxTraces: cfg.MaxTraces, Logger: log, Registerer: reg})
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	made = append(made, traces)
	recs = append(recs, fw.PolicyReconciler(), fw.GroupReconciler(), traces)
	return recs, fw, closeAll, nil
}
