package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// flowCollector takes the flow records of the firewall whose maps are pinned in bpfDir,
// names them from the snapshot fw installed last and the links of view's namespace, and
// adds them to log.
type flowCollector struct {
	bpfDir, node string
	// sweep is how often the conntrack table is swept for idle connections.
	sweep  time.Duration
	fw     InstalledFirewall
	view   *KernelView
	log    *FlowLog
	logger *slog.Logger

	// names is the view of the snapshot names were last taken from, and links the names
	// of the namespace's links, read again when a record names an unknown one, at most
	// once per linkRefresh.
	names     *firewallView
	snap      *firewall.Snapshot
	linksRead time.Time
	// store is delphi, whose Endpoints name the peers and the networks; peers indexes
	// them by tenant and address, networks their Networks by their key's ID, as of
	// delphi's revision peersRev, read again at most once per linkRefresh.
	store     *delphi.Store
	peers     map[tenantAddr]*nimbusv1.ObjectKey
	networks  map[string]*nimbusv1.ObjectKey
	peersRev  uint64
	peersRead time.Time
}

// tenantAddr is an address in a tenant.
type tenantAddr struct {
	tenant string
	addr   netip.Addr
}

// peer returns the Endpoint of the tenant with the address, nil when delphi holds none.
func (c *flowCollector) peer(tenant, addr string) *nimbusv1.ObjectKey {
	a, err := netip.ParseAddr(addr)
	if err != nil || c.store == nil {
		return nil
	}
	c.readEndpoints()
	return c.peers[tenantAddr{tenant, a.Unmap()}]
}

// network returns the Network of the Endpoint, nil when delphi holds neither.
func (c *flowCollector) network(endpoint *nimbusv1.ObjectKey) *nimbusv1.ObjectKey {
	if endpoint == nil || c.store == nil {
		return nil
	}
	c.readEndpoints()
	return c.networks[endpoint.ID()]
}

// readEndpoints indexes delphi's Endpoints again when delphi changed, at most once per
// linkRefresh.
func (c *flowCollector) readEndpoints() {
	if _, rev := c.store.Resume(); c.peers == nil || (rev != c.peersRev && time.Since(c.peersRead) > linkRefresh) {
		c.peers, c.peersRev, c.peersRead = map[tenantAddr]*nimbusv1.ObjectKey{}, rev, time.Now()
		c.networks = map[string]*nimbusv1.ObjectKey{}
		for _, obj := range c.store.List(nimbusv1.Kind_KIND_ENDPOINT) {
			key := obj.Key()
			if n := linux.NetworkKeyOf(obj); n != nil {
				c.networks[key.ID()] = n
			}
			for _, ip := range obj.GetEndpoint().GetIps() {
				p, err := netip.ParsePrefix(ip)
				if err != nil {
					pa, err := netip.ParseAddr(ip)
					if err != nil {
						continue
					}
					p = netip.PrefixFrom(pa, pa.BitLen())
				}
				c.peers[tenantAddr{key.GetTenant(), p.Addr().Unmap()}] = key
			}
		}
	}
}

// linkRefresh bounds how often the collector reads the namespace's links again.
const linkRefresh = time.Second

// run takes the records until ctx ends, opening the pinned ring once the firewall pinned
// it. A batch is what the ring holds when the reader wakes, up to flowBatch records.
func (c *flowCollector) run(ctx context.Context) error {
	var r *fwbpf.FlowReader
	for {
		var err error
		r, err = fwbpf.OpenPinnedFlows(c.bpfDir)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reading the firewall's flow records: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Closing the reader ends a Read under way at once, and waits for a sweep under way.
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	defer r.Close()
	swept := make(chan []fwbpf.FlowRecord, 1)
	sweepDone := make(chan struct{})
	defer func() { <-sweepDone }()
	go func() {
		defer close(sweepDone)
		c.sweepConntrack(ctx, r, swept)
	}()
	batch := make([]*delphiv1.Flow, 0, flowBatch)
	for {
		select {
		case recs := <-swept:
			for _, rec := range recs {
				batch = append(batch, c.flow(ctx, rec))
			}
		default:
		}
		r.SetDeadline(time.Now().Add(min(c.sweep, time.Second))) // for what the sweep finds
		rec, err := r.Read()
		for err == nil {
			batch = append(batch, c.flow(ctx, rec))
			if len(batch) == flowBatch {
				break
			}
			r.SetDeadline(time.Now()) // the rest of what the ring holds now
			rec, err = r.Read()
		}
		if err != nil && !errors.Is(err, fwbpf.ErrNoRecord) {
			if ctx.Err() != nil || errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return fmt.Errorf("reading the firewall's flow records: %w", err)
		}
		lost, err := r.Lost()
		if err == nil {
			var suppressed uint64
			if suppressed, err = r.Suppressed(); err == nil {
				c.log.SetSuppressed(suppressed)
			}
		}
		if errors.Is(err, fwbpf.ErrReaderClosed) {
			return nil // ctx ended
		}
		if err != nil {
			return err
		}
		c.log.Add(batch, lost)
		c.log.SetRing(r.Pending())
		batch = make([]*delphiv1.Flow, 0, flowBatch) // the log keeps the records
	}
}

// sweepConntrack sweeps r's conntrack table every c.sweep until ctx ends, and sends the
// idle ends it finds to swept, which the reader names and logs.
func (c *flowCollector) sweepConntrack(ctx context.Context, r *fwbpf.FlowReader, swept chan<- []fwbpf.FlowRecord) {
	t := time.NewTicker(c.sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		recs, err := r.SweepConntrack()
		if errors.Is(err, fwbpf.ErrReaderClosed) {
			return
		}
		if err != nil {
			c.logger.Warn("sweeping the firewall's conntrack table for idle connections", "err", err)
		}
		if len(recs) == 0 {
			continue
		}
		select {
		case swept <- recs:
		case <-ctx.Done():
			return
		}
	}
}

// flow names the record.
func (c *flowCollector) flow(ctx context.Context, rec fwbpf.FlowRecord) *delphiv1.Flow {
	snap := c.fw.Snapshot()
	if snap == nil {
		snap = &firewall.Snapshot{}
	}
	if c.names == nil || snap != c.snap || (c.names.links[int(rec.Ifindex)] == "" && time.Since(c.linksRead) > linkRefresh) {
		links := c.names.linksOr(nil)
		if c.names == nil || time.Since(c.linksRead) > linkRefresh {
			if l, err := readLinkNames(ctx, c.view); err == nil {
				links, c.linksRead = l, time.Now()
			} else {
				c.logger.Debug("reading the links that name flow records", "err", err)
			}
		}
		c.names, c.snap = newFirewallView(snap, links), snap
	}
	f := c.names.flow(rec, c.node)
	if ep := f.GetEndpoint(); ep != nil {
		other := f.GetDestination()
		if f.GetDirection() == "ingress" {
			other = f.GetSource()
		}
		f.PeerEndpoint = c.peer(ep.GetTenant(), other)
		f.Network, f.PeerNetwork = c.network(ep), c.network(f.PeerEndpoint)
	}
	return f
}

// linksOr returns the view's links, or def for no view.
func (v *firewallView) linksOr(def map[int]string) map[int]string {
	if v == nil {
		return def
	}
	return v.links
}

// flow names a flow record of this node's firewall.
func (v *firewallView) flow(rec fwbpf.FlowRecord, node string) *delphiv1.Flow {
	f := &delphiv1.Flow{
		Time:      timestamppb.New(ktimeToWall(rec.Time)),
		Node:      node,
		Ifindex:   rec.Ifindex,
		Interface: v.links[int(rec.Ifindex)],
		Direction: firewall.DirName(rec.Dir),
		Rule:      rec.Rule,
		RuleName:  v.ruleName(rec.Rule),
		Bytes:     rec.Len,
		Verdict:   "allowed",
	}
	switch rec.Type {
	case fwbpf.FlowNew:
		f.Event = delphiv1.FlowEvent_FLOW_EVENT_STARTED
	case fwbpf.FlowDeny:
		f.Event, f.Verdict = delphiv1.FlowEvent_FLOW_EVENT_DENIED, "denied"
		f.Reason = map[uint8]string{fwbpf.ReasonPolicy: "policy", fwbpf.ReasonSpoofed: "spoofed",
			fwbpf.ReasonMalformed: "malformed", fwbpf.ReasonFragment: "fragment", fwbpf.ReasonVLAN: "vlan"}[rec.Reason]
	case fwbpf.FlowEnd:
		f.Event = delphiv1.FlowEvent_FLOW_EVENT_ENDED
		f.Reason = map[uint8]string{fwbpf.EndFIN: "fin", fwbpf.EndRST: "rst", fwbpf.EndIdle: "idle"}[rec.Reason]
	case fwbpf.FlowActive:
		f.Event = delphiv1.FlowEvent_FLOW_EVENT_ACTIVE
	}
	if rec.Type != fwbpf.FlowDeny {
		if rec.Start != 0 {
			f.StartTime = timestamppb.New(ktimeToWall(rec.Start))
		}
		f.InitiatorPackets, f.InitiatorBytes = rec.Packets[0], rec.Bytes[0]
		f.ResponderPackets, f.ResponderBytes = rec.Packets[1], rec.Bytes[1]
	}
	if info, ok := v.epByID[rec.Ep]; ok {
		f.Endpoint = info.Endpoint.Proto()
	} else if info, ok := v.epByIfindex[rec.Ifindex]; ok {
		f.Endpoint = info.Endpoint.Proto()
	}
	if r, ok := v.ruleByID[rec.Rule]; ok {
		f.Policy = r.Policy.Proto()
	}
	if rec.Family == 4 || rec.Family == 6 {
		f.Protocol = protocolName(rec.Family, rec.Proto)
		src, dst := netip.AddrFrom16(rec.Saddr), netip.AddrFrom16(rec.Daddr)
		if rec.Family == 4 {
			src, dst = netip.AddrFrom4([4]byte(rec.Saddr[:4])), netip.AddrFrom4([4]byte(rec.Daddr[:4]))
		}
		f.Source, f.Destination = src.String(), dst.String()
		f.SourcePort, f.DestinationPort = uint32(netOrder(rec.Sport)), uint32(netOrder(rec.Dport))
	}
	return f
}

// wallClock is the offset of wall time from the clock the firewall stamps its records
// with, kept from one conversion to the next so that the times of a connection's records
// agree to the nanosecond, and measured again when the two clocks moved apart by more than
// wallStep (the wall clock was set).
var wallClock struct {
	mu     sync.Mutex
	offset int64 // wall time less the firewall's clock, in nanoseconds
	set    bool
}

// wallStep is how far the wall clock may move from the firewall's before ktimeToWall
// measures its offset again.
const wallStep = 100 * time.Millisecond

// ktimeToWall converts a time of the clock the firewall stamps its records with
// (CLOCK_MONOTONIC nanoseconds) to wall time.
func ktimeToWall(t uint64) time.Time {
	now := time.Now()
	k, err := fwbpf.KtimeNow()
	if err != nil {
		return now
	}
	off := now.UnixNano() - int64(k)
	wallClock.mu.Lock()
	if d := off - wallClock.offset; !wallClock.set || d > int64(wallStep) || d < -int64(wallStep) {
		wallClock.offset, wallClock.set = off, true
	}
	off = wallClock.offset
	wallClock.mu.Unlock()
	return time.Unix(0, off+int64(t))
}

// netOrder returns the port whose bytes in network order the record holds.
func netOrder(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

// flowCollectorRun returns the agent part that takes the flow records of the firewall
// pinned in bpfDir into log, naming their peers from store's Endpoints.
func flowCollectorRun(store *delphi.Store, bpfDir, node string, sweep time.Duration, fw InstalledFirewall, view *KernelView, log *FlowLog, logger *slog.Logger) func(context.Context) error {
	c := &flowCollector{store: store, bpfDir: bpfDir, node: node, sweep: sweep, fw: fw, view: view, log: log, logger: logger}
	return c.run
}
