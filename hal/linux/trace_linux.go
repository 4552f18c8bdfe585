package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/fwbpf"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds what the agent's traces (agent/trace_linux.go) need of the kernel:
// the firewall's trace datapath, run in the firewall's namespace, and a bridge's
// forwarding decision for a MAC, read from its FDB.

// StartTrace makes the firewall recognise the packets of the trace with the id and nonce
// (fwbpf.Objects.StartTrace).
func (f *Firewall) StartTrace(id uint32, nonce uint64) error { return f.objs.StartTrace(id, nonce) }

// StartLiveTrace makes the firewall follow the next real packet of the tuple as the
// trace with the id (fwbpf.Objects.StartLiveTrace).
func (f *Firewall) StartLiveTrace(id uint32, t fwbpf.TraceTuple) error {
	return f.objs.StartLiveTrace(id, t)
}

// StopTrace makes the firewall forget the trace with the id; it is idempotent.
func (f *Firewall) StopTrace(id uint32) error { return f.objs.StopTrace(id) }

// TraceReader returns a reader of the observations of the firewall's trace packets.
func (f *Firewall) TraceReader() (*fwbpf.TraceReader, error) { return f.objs.TraceReader() }

// AttachTraceObserver attaches the firewall's trace observers to both tcx hooks of the
// interface with the index, in the firewall's namespace: the tunnel's for a VXLAN device,
// the gateway's for a bridge. Closing the result detaches them.
func (f *Firewall) AttachTraceObserver(ifindex int, gateway bool) (io.Closer, error) {
	var c io.Closer
	err := runInNamespace(f.ns, func() error {
		var err error
		c, err = f.objs.AttachTraceObserver(ifindex, gateway)
		return err
	})
	return c, err
}

// InjectTrace injects the frame at the interface with the index, in the firewall's
// namespace, as if the interface had received it.
func (f *Firewall) InjectTrace(ifindex int, frame []byte) error {
	return runInNamespace(f.ns, func() error { return f.objs.InjectTrace(ifindex, frame) })
}

// Forwarding is what a network's bridge does with a frame for a MAC address, as its FDB
// and links tell.
type Forwarding struct {
	// Bridge is the bridge's name, and BridgeIndex its index; zero when the network has
	// no bridge on this node.
	Bridge      string
	BridgeIndex int32
	// Gateway is set when the MAC is the bridge's own: the frame goes up to the host's
	// routing, the network's gateway.
	Gateway bool
	// Flooded is set when the bridge has no entry for the MAC: it floods the frame to
	// every port (and the VXLAN device sends it to every VTEP of its head-end
	// replication entries).
	Flooded bool
	// Port, PortIndex and PortMTU are the port the bridge's entry sends the frame to.
	Port      string
	PortIndex int32
	PortMTU   uint32
	// Tunnel is set when the port is the network's VXLAN device; VTEP is then the
	// destination of the device's entry for the MAC, and Node the node whose Node object
	// has that VTEP address.
	Tunnel bool
	VTEP   netip.Addr
	Node   string
	// Endpoints are the endpoints of the network with the MAC.
	Endpoints []nimbusv1.Key
}

// traceRouteTimeout bounds TraceRouted's wait for the kernel's answer.
const traceRouteTimeout = 5 * time.Second

// TraceRouted tells whether the kernel routes a packet from src to dst that came up from
// the bridge with index iif, as the network's gateway routes it: an input route lookup,
// through the policy rules and the tenant's table. It answers false for a packet the
// kernel would drop for want of a route (ENETUNREACH or EHOSTUNREACH), or at a rule or
// route that prohibits it (EACCES), as the rule that keeps a tenant's packets out of the
// host's tables does.
func TraceRouted(ctx context.Context, view *KernelView, iif int32, src, dst netip.Addr) (bool, error) {
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return false, fmt.Errorf("route lookup from %v to %v: want two addresses of one family", src, dst)
	}
	nl, release, err := view.writer(traceRouteTimeout)
	if err != nil {
		return false, fmt.Errorf("route lookup from %v to %v: %w", src, dst, err)
	}
	defer release()
	switch err := nl.Do(ctx, rtnl.RouteGetRequest(src, dst, iif)); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENETUNREACH), errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.EACCES):
		return false, nil
	default:
		return false, fmt.Errorf("route lookup from %v to %v: %w", src, dst, err)
	}
}

// TraceForwarding reads where the bridge of the network with the key ID sends a frame for
// mac, from the kernel's FDB and links through view, and names the endpoint that has the
// MAC and the node of the VTEP from store.
func TraceForwarding(ctx context.Context, view *KernelView, store OverlayStore, networkKeyID string, mac net.HardwareAddr) (Forwarding, error) {
	fw := Forwarding{}
	if len(mac) != 6 {
		return fw, fmt.Errorf("MAC %q: not an Ethernet address", mac)
	}
	m := [6]byte(mac)
	if keys, err := store.LookupKeys(EndpointMACIndex.Name, macIndexValue(networkKeyID, m)); err == nil {
		fw.Endpoints = keys
	}
	r := view.Read()
	defer r.Close()
	links, err := r.Links(ctx)
	if err != nil {
		return fw, fmt.Errorf("reading the links: %w", err)
	}
	byIndex := make(map[int32]rtnl.Link, len(links))
	name := BridgeName(networkKeyID)
	for _, l := range links {
		byIndex[l.Index] = l
		if l.Name == name {
			fw.Bridge, fw.BridgeIndex = l.Name, l.Index
		}
	}
	if fw.BridgeIndex == 0 {
		return fw, nil
	}
	if string(mac) == byIndex[fw.BridgeIndex].MAC {
		fw.Gateway = true
		return fw, nil
	}
	fdb, err := r.FDB(ctx)
	if err != nil {
		return fw, fmt.Errorf("reading the FDB: %w", err)
	}
	for _, e := range fdb {
		if e.HasMAC && e.MAC == m && e.Master == fw.BridgeIndex && e.Flags&unix.NTF_SELF == 0 {
			p := byIndex[e.Index]
			fw.Port, fw.PortIndex, fw.PortMTU, fw.Tunnel = p.Name, p.Index, p.MTU, p.Kind == "vxlan"
			break
		}
	}
	if fw.PortIndex == 0 {
		fw.Flooded = true
		return fw, nil
	}
	if !fw.Tunnel {
		return fw, nil
	}
	for _, e := range fdb {
		if e.HasMAC && e.MAC == m && e.Index == fw.PortIndex && e.Master == 0 && e.Dst.IsValid() {
			fw.VTEP = e.Dst
			break
		}
	}
	if fw.VTEP.IsValid() {
		fw.Node = nodeOfVTEP(store, fw.VTEP)
	}
	return fw, nil
}

// nodeOfVTEP returns the name of the node whose Node object has the VTEP address, ""
// when none does.
func nodeOfVTEP(store OverlayStore, vtep netip.Addr) string {
	for _, k := range store.Keys(nimbusv1.Kind_KIND_NODE) {
		if a, err := NodeVTEP(store, k.Name); err == nil && a == vtep {
			return k.Name
		}
	}
	return ""
}

// InstalledTraces returns the ids of the traces installed in the firewall's datapath,
// live ones included.
func (f *Firewall) InstalledTraces() ([]uint32, error) {
	var ids []uint32
	var id uint32
	var entry fwbpf.TraceEntry
	it := f.objs.Traces.Iterate()
	for it.Next(&id, &entry) {
		ids = append(ids, id)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the installed traces: %w", err)
	}
	var tuple fwbpf.CTKey
	var live struct{ ID, Seen uint32 } // struct fw_trace_live_value
	it = f.objs.TraceLive.Iterate()
	for it.Next(&tuple, &live) {
		ids = append(ids, live.ID)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the installed live traces: %w", err)
	}
	return ids, nil
}
