package agent

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The reasons of the statuses of Trace objects.
const (
	// ReasonEndpointNotFound: an endpoint the Trace names is not in the node's store, or
	// its interface is not on the node.
	ReasonEndpointNotFound = "EndpointNotFound"
	// ReasonTracesOff: the agent runs its firewall without the checks of Trace packets
	// (--fw-traces=false).
	ReasonTracesOff = "TracesOff"
	// ReasonNoAddress: the endpoints have no addresses of one family to make the packet
	// with, or the source has no MAC address.
	ReasonNoAddress = "NoAddress"
)

// traceInjections are when the node of the source injects a trace's packet again after
// the first, while the packet left the node and its fate there is unknown: a node the
// packet reaches that has not installed the trace yet does not see the earlier ones.
// The other nodes report each stage once.
var traceInjections = []time.Duration{150 * time.Millisecond, 400 * time.Millisecond, time.Second}

// TraceOptions configures a TraceReconciler.
type TraceOptions struct {
	// Store holds the endpoints, networks and nodes a Trace names. Required.
	Store linux.OverlayStore
	// Firewall is the firewall whose datapath injects and observes the packets. Required.
	Firewall *linux.Firewall
	// View is the kernel view the bridges' forwarding and the links are read from.
	// Required.
	View *KernelView
	// Node is this host's node name.
	Node string
	// MaxTraces bounds the traces the node runs at once (1 to MaxTraces); one more is
	// FAILED with ReasonLimitExceeded. Default: DefaultMaxTraces.
	MaxTraces int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the reconciler's metrics. Default: none.
	Registerer prometheus.Registerer
}

// TraceReconciler runs the Trace objects on this node. Each node installs a Trace in the
// firewall's datapath, which then recognises its packet (by its tag and the nonce derived
// from the object's uid) at every endpoint's interface, and attaches the trace observers
// to the VXLAN devices and bridges of the networks of its endpoints; the node of the
// source endpoint makes the packet and injects it at the source's interface. Every
// observation the datapath reports becomes a TraceObservation, named from the firewall's
// snapshot and the store, in the object's status on this node (TraceOperational); the
// node of the source adds the bridge's forwarding decision, read from its FDB. After the
// Trace's timeout the node uninstalls it and reports done; deleting the object does too.
type TraceReconciler struct {
	opts TraceOptions
	log  *slog.Logger

	// mu guards every field below.
	mu sync.Mutex
	// runs are the Traces the node runs, by key; byID the same by trace id.
	runs map[nimbusv1.Key]*traceRun
	byID map[uint32]*traceRun
	// observers are the attached trace observers, by interface index.
	observers map[int]*traceObserver
	// enqueue enqueues a key for reconcile while the observer runs.
	enqueue func(nimbusv1.Key)
	// reader reads the datapath's observations, once a trace ran; nil before.
	reader *fwbpf.TraceReader
	// names names the datapath's endpoints and rules, from the snapshot snap.
	names *firewallView
	snap  *firewall.Snapshot
	// closed is set by Close.
	closed bool

	observations *prometheus.CounterVec
	lost         prometheus.CounterFunc
}

// traceObserver is an attachment of the trace observers to an interface, shared by the
// traces that need it.
type traceObserver struct {
	link    io.Closer
	network *nimbusv1.ObjectKey
	users   int
}

// traceRun is one Trace the node runs.
type traceRun struct {
	key       nimbusv1.Key
	uid       string
	gen       int64
	id        uint32
	nonce     uint64
	tenant    string
	spec      *nimbusv1.TraceSpec
	deadline  time.Time
	timer     *time.Timer
	observing []int
	// dst is the packet's destination address, and dstNet the destination's network
	// (nil for an address outside every network the node knows).
	dst    netip.Addr
	srcNet *nimbusv1.ObjectKey
	dstNet *nimbusv1.ObjectKey
	// atSource is set on the node of the source endpoint; source holds what it injects
	// (nil with spec.live, and on the other nodes).
	atSource bool
	source   *traceSource
	op       *nimbusv1.TraceOperational
	// seen are the stages reported, by stage, interface and action: each once.
	seen map[[3]uint32]bool
	// arrived is set on a node other than the source's once it saw a copy of the packet
	// come out of the tunnel. Until then it reports nothing: a copy that passed the
	// tunnel before the node installed the trace would show its later stages without
	// their start, and stand for the copy sent again after it.
	arrived bool
}

// traceSource is what the node of a trace's source injected.
type traceSource struct {
	ifindex  int
	frame    []byte
	tunneled bool
	timers   []*time.Timer
}

// NewTraceReconciler returns a TraceReconciler.
func NewTraceReconciler(opts TraceOptions) (*TraceReconciler, error) {
	if opts.Store == nil || opts.Firewall == nil || opts.View == nil {
		return nil, errors.New("trace: store, firewall and kernel view are required")
	}
	if opts.MaxTraces == 0 {
		opts.MaxTraces = DefaultMaxTraces
	}
	if opts.MaxTraces < 1 || opts.MaxTraces > MaxTraces {
		return nil, fmt.Errorf("trace: --max-traces %d: must be 1 to %d", opts.MaxTraces, MaxTraces)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &TraceReconciler{opts: opts, log: log, runs: map[nimbusv1.Key]*traceRun{}, byID: map[uint32]*traceRun{}, observers: map[int]*traceObserver{}}
	r.observations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "trace_observations_total",
		Help: "Observations of trace packets the node reported, by stage.",
	}, []string{"stage"})
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "traces",
		Help: "Trace objects the node runs, at most --max-traces.",
	}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(len(r.runs))
	})
	r.lost = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "trace_events_lost_total",
		Help: "Observations of trace packets the firewall had no room to report.",
	}, func() float64 {
		r.mu.Lock()
		rd := r.reader
		r.mu.Unlock()
		if rd == nil {
			return 0
		}
		n, _ := rd.Lost()
		return float64(n)
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{r.observations, running, r.lost} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("trace: registering metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Kind returns KIND_TRACE.
func (r *TraceReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_TRACE }

// Reconcile starts the Trace on this node, reports what the node saw of its packet, ends
// it after its timeout, and stops it when the object is gone or changed.
func (r *TraceReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	id := key.Key()
	r.mu.Lock()
	defer r.mu.Unlock()
	run := r.runs[id]
	if run != nil && (obj == nil || run.uid != obj.GetMeta().GetUid() || run.gen != obj.GetMeta().GetGeneration()) {
		r.stopLocked(run)
		delete(r.runs, id)
		run = nil
	}
	if obj == nil {
		return nil, nil
	}
	if run == nil {
		if r.closed {
			return nil, errors.New("trace: closed")
		}
		var err error
		if run, err = r.startLocked(ctx, id, obj); err != nil {
			return nil, err
		}
	}
	if !run.op.GetDone() && !time.Now().Before(run.deadline) {
		r.finishLocked(run)
	}
	return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Trace{Trace: proto.Clone(run.op).(*nimbusv1.TraceOperational)}}, nil
}

// traceTag returns the trace id and nonce of the Trace with the uid: the same on every
// node, and not guessable by a workload that does not know the uid.
func traceTag(uid string) (uint32, uint64) {
	sum := sha256.Sum256([]byte("naples-trace/" + uid))
	return binary.BigEndian.Uint32(sum[:4]) | 1, binary.BigEndian.Uint64(sum[4:12])
}

// startLocked starts the Trace obj on this node.
func (r *TraceReconciler) startLocked(ctx context.Context, id nimbusv1.Key, obj *nimbusv1.Object) (*traceRun, error) {
	m, spec, k := obj.GetMeta(), obj.GetTrace(), obj.Key()
	run := &traceRun{key: id, uid: m.GetUid(), gen: m.GetGeneration(), tenant: k.GetTenant(), spec: spec,
		op: &nimbusv1.TraceOperational{}, seen: map[[3]uint32]bool{}}
	run.id, run.nonce = traceTag(m.GetUid())
	start := m.GetUpdateTime().AsTime()
	if m.GetUpdateTime() == nil || time.Since(start) < 0 {
		start = time.Now()
	}
	run.deadline = start.Add(spec.TraceTimeout())
	if !time.Now().Before(run.deadline) {
		// The trace ended before this node heard of it (the agent restarted, say): it
		// has nothing to observe.
		run.op.Done = true
		r.runs[id] = run
		return run, nil
	}
	// Only traces installed in the datapath count: one that ended (kept, or applied by
	// hand and not deleted) holds nothing there.
	if n := len(r.byID); n >= r.opts.MaxTraces {
		return nil, hal.Errorf(ReasonLimitExceeded, "the node runs %d traces already, the most --max-traces allows", n)
	}
	if other := r.byID[run.id]; other != nil {
		return nil, hal.Errorf(hal.ReasonConflict, "trace %s has the same trace id %#x; apply this one again", other.key, run.id)
	}
	src, err := r.endpoint(k, "spec.source", spec.GetSource())
	if err != nil {
		return nil, err
	}
	run.srcNet = linux.NetworkKeyOf(src)
	var dstEP *nimbusv1.Object
	if spec.GetDestination() != "" {
		if dstEP, err = r.endpoint(k, "spec.destination", spec.GetDestination()); err != nil {
			return nil, err
		}
		run.dstNet = linux.NetworkKeyOf(dstEP)
	}
	srcIP, dstIP, err := traceAddresses(spec, src, dstEP)
	if err != nil {
		return nil, err
	}
	run.dst = dstIP
	if dstEP == nil {
		run.dstNet = r.networkOf(k.GetTenant(), k.GetNamespace(), dstIP)
	}
	run.atSource = src.GetEndpoint().GetNode() == r.opts.Node
	if err := r.install(run, srcIP, dstIP); errors.Is(err, fwbpf.ErrTracesOff) {
		return nil, hal.Errorf(ReasonTracesOff, "the node's agent runs its firewall without the checks of Trace packets (--fw-traces=false)")
	} else if err != nil {
		return nil, err
	}
	r.byID[run.id] = run
	r.runs[id] = run
	if err := r.ensureReaderLocked(); err != nil {
		r.stopLocked(run)
		delete(r.runs, id)
		return nil, err
	}
	r.observeNetworksLocked(ctx, run)
	key := id
	run.timer = time.AfterFunc(time.Until(run.deadline), func() { r.changed(key) })
	if run.atSource && !spec.GetLive() {
		if err := r.injectLocked(ctx, run, src, dstEP, srcIP, dstIP); err != nil {
			r.stopLocked(run)
			delete(r.runs, id)
			return nil, err
		}
	}
	r.log.Info("trace started", "key", id, "id", fmt.Sprintf("%#x", run.id), "source", spec.GetSource(), "destination", dstIP, "until", run.deadline)
	return run, nil
}

// install installs the trace in the firewall: its tag, or with spec.live the 5-tuple of
// the real packet to follow.
func (r *TraceReconciler) install(run *traceRun, src, dst netip.Addr) error {
	if !run.spec.GetLive() {
		if err := r.opts.Firewall.StartTrace(run.id, run.nonce); err != nil {
			return fmt.Errorf("installing trace %#x in the firewall: %w", run.id, err)
		}
		return nil
	}
	tuple := fwbpf.TraceTuple{Proto: unix.IPPROTO_TCP, Src: src, Dst: dst,
		SrcPort: uint16(run.spec.GetSourcePort()), DstPort: uint16(run.spec.GetDestinationPort())}
	if run.spec.TraceProtocol() == nimbusv1.TraceUDP {
		tuple.Proto = unix.IPPROTO_UDP
	}
	if err := r.opts.Firewall.StartLiveTrace(run.id, tuple); err != nil {
		return fmt.Errorf("installing live trace %#x in the firewall: %w", run.id, err)
	}
	return nil
}

// endpoint returns the Endpoint with the name in the tenant and namespace of the key.
func (r *TraceReconciler) endpoint(k *nimbusv1.ObjectKey, field, name string) (*nimbusv1.Object, error) {
	ep, ok := r.opts.Store.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ENDPOINT, k.GetTenant(), k.GetNamespace(), name))
	if !ok {
		return nil, hal.Errorf(ReasonEndpointNotFound, "%s %q: no such Endpoint in tenant %q, namespace %q", field, name, k.GetTenant(), k.GetNamespace())
	}
	return ep, nil
}

// traceAddresses returns the source and destination addresses of a trace's packet: of
// spec.family, or IPv4 when both have one, else IPv6.
func traceAddresses(spec *nimbusv1.TraceSpec, src, dst *nimbusv1.Object) (netip.Addr, netip.Addr, error) {
	addrs := func(obj *nimbusv1.Object) (v4, v6 netip.Addr) {
		for _, s := range obj.GetEndpoint().GetIps() {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			a = a.Unmap()
			if a.Is4() && !v4.IsValid() {
				v4 = a
			} else if a.Is6() && !v6.IsValid() {
				v6 = a
			}
		}
		return v4, v6
	}
	s4, s6 := addrs(src)
	var d4, d6 netip.Addr
	if dst != nil {
		d4, d6 = addrs(dst)
	} else if a, err := netip.ParseAddr(spec.GetDestinationAddress()); err == nil {
		if a = a.Unmap(); a.Is4() {
			d4 = a
		} else {
			d6 = a
		}
	}
	family := spec.GetFamily()
	if family == "" {
		family = nimbusv1.TraceIPv6
		if s4.IsValid() && d4.IsValid() {
			family = nimbusv1.TraceIPv4
		}
	}
	s, d := s6, d6
	if family == nimbusv1.TraceIPv4 {
		s, d = s4, d4
	}
	if !s.IsValid() || !d.IsValid() {
		return s, d, hal.Errorf(ReasonNoAddress, "the source %q and the destination have no %s addresses to make the packet with", spec.GetSource(), family)
	}
	return s, d, nil
}

// networkOf returns the key of the network of the tenant and namespace one of whose
// subnets holds the address, nil when none does.
func (r *TraceReconciler) networkOf(tenant, namespace string, a netip.Addr) *nimbusv1.ObjectKey {
	for _, k := range r.opts.Store.Keys(nimbusv1.Kind_KIND_NETWORK) {
		if k.Tenant != tenant || k.Namespace != namespace {
			continue
		}
		obj, ok := r.opts.Store.Get(k.Proto())
		if !ok {
			continue
		}
		for _, sn := range obj.GetNetwork().AllSubnets() {
			if p, err := netip.ParsePrefix(sn.GetCidr()); err == nil && p.Contains(a) {
				return k.Proto()
			}
		}
	}
	return nil
}

// endpointHolding returns the Endpoint attached to the network that holds the address,
// nil when none does.
func (r *TraceReconciler) endpointHolding(network *nimbusv1.ObjectKey, a netip.Addr) *nimbusv1.Object {
	for _, k := range r.opts.Store.Keys(nimbusv1.Kind_KIND_ENDPOINT) {
		if k.Tenant != network.GetTenant() {
			continue
		}
		obj, ok := r.opts.Store.Get(k.Proto())
		if !ok || !proto.Equal(linux.NetworkKeyOf(obj), network) {
			continue
		}
		for _, s := range obj.GetEndpoint().GetIps() {
			if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap() == a {
				return obj
			}
		}
	}
	return nil
}

// observeNetworksLocked attaches the trace observers to the VXLAN devices and bridges of
// the trace's networks that this node has.
func (r *TraceReconciler) observeNetworksLocked(ctx context.Context, run *traceRun) {
	links, err := r.opts.View.Links(ctx)
	if err != nil {
		r.log.Warn("reading the links to observe a trace at", "key", run.key, "err", err)
		return
	}
	byName := make(map[string]int, len(links))
	for _, l := range links {
		byName[l.Name] = int(l.Index)
	}
	for _, n := range []*nimbusv1.ObjectKey{run.srcNet, run.dstNet} {
		if n == nil {
			continue
		}
		for _, dev := range []struct {
			name    string
			gateway bool
		}{{linux.VXLANName(n.ID()), false}, {linux.BridgeName(n.ID()), true}} {
			index, ok := byName[dev.name]
			if !ok || slices.Contains(run.observing, index) {
				continue
			}
			o := r.observers[index]
			if o == nil {
				link, err := r.opts.Firewall.AttachTraceObserver(index, dev.gateway)
				if err != nil {
					r.log.Warn("attaching the trace observers", "interface", dev.name, "err", err)
					continue
				}
				o = &traceObserver{link: link, network: n}
				r.observers[index] = o
			}
			o.users++
			run.observing = append(run.observing, index)
		}
	}
}

// injectLocked makes the trace's packet and injects it at the source's interface.
func (r *TraceReconciler) injectLocked(ctx context.Context, run *traceRun, src, dst *nimbusv1.Object, srcIP, dstIP netip.Addr) error {
	spec := run.spec
	srcMAC, err := net.ParseMAC(src.GetEndpoint().GetMac())
	if err != nil {
		return hal.Errorf(ReasonNoAddress, "spec.source %q: the endpoint has no MAC address (spec.mac %q) to make the packet with", spec.GetSource(), src.GetEndpoint().GetMac())
	}
	// The packet goes to the destination's MAC in the source's network, to the
	// gateway's otherwise. An address in the source's network is the MAC of the
	// Endpoint that holds it, as the workload would learn it by ARP or neighbour
	// discovery, when one does.
	dstMAC := linux.GatewayMAC(run.srcNet.ID())
	if dst == nil && proto.Equal(run.dstNet, run.srcNet) {
		dst = r.endpointHolding(run.srcNet, run.dst)
	}
	if dst != nil && proto.Equal(run.dstNet, run.srcNet) {
		if mac, err := net.ParseMAC(dst.GetEndpoint().GetMac()); err == nil {
			dstMAC = mac
		}
	}
	links, err := r.opts.View.Links(ctx)
	if err != nil {
		return fmt.Errorf("reading the links: %w", err)
	}
	ifindex := 0
	for _, l := range links {
		if l.Name == src.GetEndpoint().GetInterface() {
			ifindex = int(l.Index)
		}
	}
	if ifindex == 0 {
		return hal.Errorf(ReasonEndpointNotFound, "spec.source %q: its interface %q is not on this node", spec.GetSource(), src.GetEndpoint().GetInterface())
	}
	pkt := fwbpf.TracePacket{ID: run.id, Nonce: run.nonce, SrcMAC: srcMAC, DstMAC: dstMAC, Src: srcIP, Dst: dstIP,
		SrcPort: uint16(spec.GetSourcePort()), DstPort: uint16(spec.GetDestinationPort()), PayloadSize: spec.TracePayload()}
	switch spec.TraceProtocol() {
	case nimbusv1.TraceTCP:
		pkt.Proto = unix.IPPROTO_TCP
	case nimbusv1.TraceUDP:
		pkt.Proto = unix.IPPROTO_UDP
	default:
		pkt.Proto = unix.IPPROTO_ICMP
		if srcIP.Is6() {
			pkt.Proto = unix.IPPROTO_ICMPV6
		}
	}
	if pkt.SrcPort == 0 && pkt.Proto != unix.IPPROTO_ICMP && pkt.Proto != unix.IPPROTO_ICMPV6 {
		pkt.SrcPort = uint16(32768 + run.id%28232)
	}
	frame, err := pkt.Frame()
	if err != nil {
		return hal.Errorf(hal.ReasonInvalid, "making the packet: %v", err)
	}
	run.source = &traceSource{ifindex: ifindex, frame: frame}
	what := fmt.Sprintf("%s %s > %s, %d bytes", spec.TraceProtocol(), netip.AddrPortFrom(srcIP, pkt.SrcPort), netip.AddrPortFrom(dstIP, pkt.DstPort), len(frame))
	if pkt.SrcPort == 0 {
		what = fmt.Sprintf("%s %s > %s, %d bytes", spec.TraceProtocol(), srcIP, dstIP, len(frame))
	}
	run.op.Packet = what
	now := time.Now()
	if err := r.opts.Firewall.InjectTrace(ifindex, frame); err != nil {
		return fmt.Errorf("injecting the packet at %s: %w", src.GetEndpoint().GetInterface(), err)
	}
	run.op.InjectedTime = timestamppb.New(now)
	r.addLocked(run, 0, &nimbusv1.TraceObservation{Stage: nimbusv1.TraceStage_TRACE_STAGE_INJECTED, Action: nimbusv1.TraceAction_TRACE_ACTION_FORWARDED,
		Endpoint: spec.GetSource(), Interface: src.GetEndpoint().GetInterface(), Network: run.srcNet.GetName(), Time: run.op.InjectedTime,
		Length: uint32(len(frame)), Message: fmt.Sprintf("injected %s at %s, as if %s sent it", what, src.GetEndpoint().GetInterface(), spec.GetSource())})
	return nil
}

// reinjectLocked schedules the packet's injections again, once it left the node.
func (r *TraceReconciler) reinjectLocked(run *traceRun) {
	s := run.source
	if s == nil || s.tunneled {
		return
	}
	s.tunneled = true
	for _, after := range traceInjections {
		s.timers = append(s.timers, time.AfterFunc(after, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.runs[run.key] != run || run.op.GetDone() {
				return
			}
			if err := r.opts.Firewall.InjectTrace(s.ifindex, s.frame); err != nil {
				r.log.Warn("injecting a trace's packet again", "key", run.key, "err", err)
			}
		}))
	}
}

// finishLocked ends the trace's observation on this node.
func (r *TraceReconciler) finishLocked(run *traceRun) {
	r.releaseLocked(run)
	run.op.Done = true
	r.log.Info("trace done", "key", run.key, "observations", len(run.op.GetObservations()))
}

// releaseLocked uninstalls the trace from the datapath and detaches the observers only
// it used.
func (r *TraceReconciler) releaseLocked(run *traceRun) {
	if run.timer != nil {
		run.timer.Stop()
	}
	if run.source != nil {
		for _, t := range run.source.timers {
			t.Stop()
		}
	}
	if r.byID[run.id] == run {
		delete(r.byID, run.id)
		if err := r.opts.Firewall.StopTrace(run.id); err != nil {
			r.log.Warn("uninstalling a trace", "key", run.key, "err", err)
		}
	}
	for _, index := range run.observing {
		o := r.observers[index]
		if o == nil {
			continue
		}
		if o.users--; o.users == 0 {
			o.link.Close()
			delete(r.observers, index)
		}
	}
	run.observing = nil
}

// stopLocked stops the trace; the caller forgets it.
func (r *TraceReconciler) stopLocked(run *traceRun) {
	r.releaseLocked(run)
}

// ensureReaderLocked opens the reader of the datapath's observations, and starts the
// goroutine that reads it, unless it runs.
func (r *TraceReconciler) ensureReaderLocked() error {
	if r.reader != nil {
		return nil
	}
	rd, err := r.opts.Firewall.TraceReader()
	if err != nil {
		return fmt.Errorf("reading the firewall's trace observations: %w", err)
	}
	r.reader = rd
	go r.read(rd)
	return nil
}

// read reads the datapath's observations until the reader is closed.
func (r *TraceReconciler) read(rd *fwbpf.TraceReader) {
	for {
		ev, err := rd.Read()
		if err != nil {
			if !errors.Is(err, ringbuf.ErrClosed) && !errors.Is(err, fwbpf.ErrReaderClosed) {
				r.log.Warn("reading trace observations", "err", err)
			}
			return
		}
		r.observe(ev)
	}
}

// observe adds the datapath's observation to its trace's.
func (r *TraceReconciler) observe(ev fwbpf.TraceEvent) {
	names := r.firewallNames()
	r.mu.Lock()
	defer r.mu.Unlock()
	run := r.byID[ev.ID]
	if run == nil || run.op.GetDone() {
		return
	}
	o := r.observation(run, ev, names)
	if !run.atSource && !run.arrived {
		if o.GetStage() != nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_IN {
			return
		}
		run.arrived = true
	}
	if !r.addLocked(run, ev.Ifindex, o) {
		return
	}
	if run.atSource {
		switch {
		case o.GetStage() == nimbusv1.TraceStage_TRACE_STAGE_SOURCE && o.GetAction() == nimbusv1.TraceAction_TRACE_ACTION_ALLOWED:
			r.forwardLocked(run, run.srcNet, ev.DstMAC, ev.Len, o.GetTime().AsTime())
		case o.GetStage() == nimbusv1.TraceStage_TRACE_STAGE_GATEWAY && o.GetAction() == nimbusv1.TraceAction_TRACE_ACTION_FORWARDED && run.source != nil:
			r.routeLocked(run, ev.Ifindex, o)
		case o.GetStage() == nimbusv1.TraceStage_TRACE_STAGE_ROUTED && r.observers[int(ev.Ifindex)] != nil:
			// Routed into another network's bridge, to the MAC of its next hop.
			r.forwardLocked(run, r.observers[int(ev.Ifindex)].network, ev.DstMAC, ev.Len, o.GetTime().AsTime())
		case o.GetAction() == nimbusv1.TraceAction_TRACE_ACTION_DELIVERED,
			o.GetAction() == nimbusv1.TraceAction_TRACE_ACTION_DENIED && o.GetStage() != nimbusv1.TraceStage_TRACE_STAGE_DESTINATION:
			run.op.Done = true
		case o.GetStage() == nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_OUT:
			r.reinjectLocked(run)
		}
	}
	if run.op.GetDone() {
		r.releaseLocked(run)
	}
	r.changedLocked(run.key)
}

// addLocked adds the observation unless the stage was reported at the interface with
// its action; it reports whether it did.
func (r *TraceReconciler) addLocked(run *traceRun, ifindex uint32, o *nimbusv1.TraceObservation) bool {
	k := [3]uint32{uint32(o.GetStage()), ifindex, uint32(o.GetAction())}
	if run.seen[k] {
		return false
	}
	run.seen[k] = true
	if len(run.op.Observations) >= nimbusv1.MaxTraceObservations {
		run.op.EventsLost++
		return false
	}
	run.op.Observations = append(run.op.Observations, o)
	r.observations.WithLabelValues(o.GetStage().StageName()).Inc()
	return true
}

// forwardLocked adds the bridge's forwarding decision for the packet, which the
// source's egress policy allowed at time at: where the network's bridge sends a frame
// for mac, of length bytes. It is read now, and stamped as what came right after.
func (r *TraceReconciler) forwardLocked(run *traceRun, network *nimbusv1.ObjectKey, mac net.HardwareAddr, length uint32, at time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := linux.TraceForwarding(ctx, r.opts.View, r.opts.Store, network.ID(), mac)
	o := &nimbusv1.TraceObservation{Stage: nimbusv1.TraceStage_TRACE_STAGE_FORWARD, Network: network.GetName(), Interface: f.Bridge,
		Time: timestamppb.New(at.Add(time.Microsecond)), Length: length}
	owner := ""
	if len(f.Endpoints) > 0 {
		owner = f.Endpoints[0].Name
		o.Endpoint = owner
	}
	switch {
	case err != nil:
		o.Action, o.Message = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED, "the bridge's forwarding could not be read: "+err.Error()
	case f.BridgeIndex == 0:
		o.Action, o.Reason = nimbusv1.TraceAction_TRACE_ACTION_DROPPED, "NoBridge"
		o.Message = fmt.Sprintf("network %s has no bridge on this node", network.GetName())
	case f.Gateway:
		o.Action = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED
		o.Message = fmt.Sprintf("%s is the bridge's own address: up to the gateway of network %s", mac, network.GetName())
	case f.Flooded:
		o.Action, o.Reason = nimbusv1.TraceAction_TRACE_ACTION_FLOODED, "NoFDBEntry"
		o.Message = fmt.Sprintf("bridge %s has no FDB entry for %s", f.Bridge, mac)
		if owner != "" {
			o.Message += fmt.Sprintf(" (endpoint %s's MAC)", owner)
		}
		o.Message += ": flooded to every port, and by the VXLAN device to every VTEP it replicates to"
	case length > f.PortMTU+bridgeFrameSlack:
		o.Action, o.Reason, o.Interface = nimbusv1.TraceAction_TRACE_ACTION_DROPPED, "MTU", f.Port
		o.Message = fmt.Sprintf("a frame of %d bytes does not fit the MTU %d of port %s: the bridge drops it", length, f.PortMTU, f.Port)
		run.op.Done = true
	case f.Tunnel:
		o.Action, o.Vtep, o.PeerNode = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED, f.VTEP.String(), f.Node
		o.Message = fmt.Sprintf("to VXLAN device %s, VTEP %s (node %s), by the FDB entry of endpoint %s", f.Port, f.VTEP, f.Node, owner)
	default:
		o.Action = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED
		o.Message = fmt.Sprintf("to port %s, by the FDB entry of endpoint %s", f.Port, owner)
	}
	r.addLocked(run, uint32(f.BridgeIndex), o)
}

// routeLocked adds the gateway's drop of the packet the source's node injected, which
// came up to the gateway as gw observed, when the kernel has no route for it: no stage
// observes that drop, which happens in the kernel's routing before any hook. It asks the
// kernel for the route from the packet's source to its destination, in from the bridge.
func (r *TraceReconciler) routeLocked(run *traceRun, ifindex uint32, gw *nimbusv1.TraceObservation) {
	src, ok := frameSource(run.source.frame)
	if !ok || !run.dst.IsValid() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	routed, err := linux.TraceRouted(ctx, r.opts.View, int32(ifindex), src, run.dst)
	if err != nil {
		r.log.Debug("looking up the route of a trace's packet", "trace", run.key, "err", err)
		return
	}
	if routed {
		return
	}
	o := &nimbusv1.TraceObservation{Stage: nimbusv1.TraceStage_TRACE_STAGE_GATEWAY, Action: nimbusv1.TraceAction_TRACE_ACTION_DROPPED,
		Reason: "NoRoute", Network: gw.GetNetwork(), Interface: gw.GetInterface(), Table: gw.GetTable(),
		Time: timestamppb.New(gw.GetTime().AsTime().Add(time.Microsecond)), Length: gw.GetLength(),
		Message: fmt.Sprintf("no route from %s to %s (tenant %s's table %d): the gateway drops it", src, run.dst, run.tenant, gw.GetTable())}
	r.addLocked(run, ifindex, o)
	run.op.Done = true
}

// frameSource returns the source address of the IPv4 or IPv6 packet in the Ethernet
// frame.
func frameSource(frame []byte) (netip.Addr, bool) {
	const eth = 14
	if len(frame) < eth {
		return netip.Addr{}, false
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case unix.ETH_P_IP:
		if len(frame) >= eth+20 {
			return netip.AddrFrom4([4]byte(frame[eth+12 : eth+16])), true
		}
	case unix.ETH_P_IPV6:
		if len(frame) >= eth+40 {
			return netip.AddrFrom16([16]byte(frame[eth+8 : eth+24])), true
		}
	}
	return netip.Addr{}, false
}

// bridgeFrameSlack is how much longer than its port's MTU a frame the bridge forwards may
// be: its Ethernet header and a VLAN tag (the kernel's is_skb_forwardable).
const bridgeFrameSlack = 14 + 4

// firewallNames returns the names of the firewall's endpoints and rules, from its
// current snapshot.
func (r *TraceReconciler) firewallNames() *firewallView {
	snap := r.opts.Firewall.Snapshot()
	if snap == nil {
		snap = &firewall.Snapshot{}
	}
	r.mu.Lock()
	names, have := r.names, r.snap
	r.mu.Unlock()
	if names != nil && have == snap {
		return names
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	links, err := readLinkNames(ctx, r.opts.View)
	if err != nil {
		r.log.Debug("reading the links that name trace observations", "err", err)
	}
	names = newFirewallView(snap, links)
	r.mu.Lock()
	r.names, r.snap = names, snap
	r.mu.Unlock()
	return names
}

// traceStages are the observation stages of the datapath's.
var traceStages = map[uint8]nimbusv1.TraceStage{
	fwbpf.TraceStageFromEndpoint: nimbusv1.TraceStage_TRACE_STAGE_SOURCE,
	fwbpf.TraceStageToEndpoint:   nimbusv1.TraceStage_TRACE_STAGE_DESTINATION,
	fwbpf.TraceStageTunnelOut:    nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_OUT,
	fwbpf.TraceStageTunnelIn:     nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_IN,
	fwbpf.TraceStageGatewayIn:    nimbusv1.TraceStage_TRACE_STAGE_GATEWAY,
	fwbpf.TraceStageGatewayOut:   nimbusv1.TraceStage_TRACE_STAGE_ROUTED,
}

// denyReasons name the reasons of the datapath's denials.
var denyReasons = map[uint8]string{fwbpf.ReasonPolicy: "Policy", fwbpf.ReasonSpoofed: "Spoofed",
	fwbpf.ReasonMalformed: "Malformed", fwbpf.ReasonFragment: "Fragment", fwbpf.ReasonVLAN: "VLAN"}

// observation names the datapath's observation ev of the trace.
func (r *TraceReconciler) observation(run *traceRun, ev fwbpf.TraceEvent, names *firewallView) *nimbusv1.TraceObservation {
	o := &nimbusv1.TraceObservation{Stage: traceStages[ev.Stage], Time: timestamppb.New(ktimeToWall(ev.Time)),
		Interface: names.links[int(ev.Ifindex)], Length: ev.Len}
	var ep *nimbusv1.Object
	info, ok := names.epByID[ev.Endpoint]
	if !ok {
		info, ok = names.epByIfindex[ev.Ifindex]
	}
	if ok {
		o.Endpoint = info.Endpoint.Name
		ep, _ = r.opts.Store.Get(info.Endpoint.Proto())
		o.Network = ep.GetEndpoint().GetNetwork()
	}
	if obs := r.observers[int(ev.Ifindex)]; obs != nil && o.Network == "" {
		o.Network = obs.network.GetName()
	}
	if rule, ok := names.ruleByID[ev.Rule]; ok && ev.Rule != 0 {
		o.Policy, o.Rule = rule.Policy.Proto(), fmt.Sprintf("%s[%d]", firewall.DirName(rule.Dir), rule.Index)
	}
	decided := func() string {
		switch {
		case o.Policy != nil:
			return fmt.Sprintf("rule %s of policy %s/%s", o.Rule, o.Policy.GetNamespace(), o.Policy.GetName())
		case ev.Verdict == fwbpf.TraceVerdictDenied:
			return "no rule allows it"
		case ev.Live:
			return "a real packet's verdict, which names only a denying rule"
		}
		return "no rule (the direction is open)"
	}
	forMe := ep != nil && slices.ContainsFunc(ep.GetEndpoint().GetIps(), func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Unmap() == run.dst
	})
	switch ev.Verdict {
	case fwbpf.TraceVerdictAllowed:
		o.Action = nimbusv1.TraceAction_TRACE_ACTION_ALLOWED
		o.Message = fmt.Sprintf("%s's egress policy allows it: %s", o.Endpoint, decided())
	case fwbpf.TraceVerdictDenied:
		o.Action, o.Reason = nimbusv1.TraceAction_TRACE_ACTION_DENIED, denyReasons[ev.Reason]
		side := "egress"
		if o.Stage == nimbusv1.TraceStage_TRACE_STAGE_DESTINATION {
			side = "ingress"
		}
		o.Message = fmt.Sprintf("%s's %s policy denies it: %s", o.Endpoint, side, decided())
		if o.Reason != "Policy" {
			o.Message = fmt.Sprintf("%s's firewall drops it (%s)", o.Endpoint, o.Reason)
		}
		if o.Stage == nimbusv1.TraceStage_TRACE_STAGE_DESTINATION && !forMe {
			o.Action, o.Reason = nimbusv1.TraceAction_TRACE_ACTION_FLOODED, ""
			o.Message = fmt.Sprintf("a copy reached %s, which it is not for", o.Endpoint)
		}
	case fwbpf.TraceVerdictDelivered:
		o.Action = nimbusv1.TraceAction_TRACE_ACTION_DELIVERED
		o.Message = fmt.Sprintf("delivered to %s at %s: its ingress policy allows it: %s", o.Endpoint, o.Interface, decided())
		if !forMe {
			o.Action = nimbusv1.TraceAction_TRACE_ACTION_FLOODED
			o.Message = fmt.Sprintf("a copy reached %s, which it is not for", o.Endpoint)
		}
	default:
		o.Action = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED
		switch o.Stage {
		case nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_OUT:
			o.Message = fmt.Sprintf("into VXLAN device %s of network %s", o.Interface, o.Network)
		case nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_IN:
			o.Message = fmt.Sprintf("received from the tunnel on VXLAN device %s of network %s", o.Interface, o.Network)
		case nimbusv1.TraceStage_TRACE_STAGE_GATEWAY:
			o.Table = linux.TenantTable(run.tenant)
			o.Message = fmt.Sprintf("up to the gateway of network %s, routed in tenant %s's table %d", o.Network, run.tenant, o.Table)
		case nimbusv1.TraceStage_TRACE_STAGE_ROUTED:
			o.Message = fmt.Sprintf("routed into network %s through bridge %s", o.Network, o.Interface)
		}
	}
	return o
}

// Sweep uninstalls the traces the datapath holds that the node does not run: those of an
// agent that stopped while they ran.
func (r *TraceReconciler) Sweep(ctx context.Context, enqueue func(key nimbusv1.Key)) error {
	ids, err := r.opts.Firewall.InstalledTraces()
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.byID[id] != nil {
			continue
		}
		if err := r.opts.Firewall.StopTrace(id); err != nil {
			return fmt.Errorf("uninstalling trace %#x: %w", id, err)
		}
		r.log.Info("uninstalled a trace no object runs", "id", fmt.Sprintf("%#x", id))
	}
	return nil
}

// Observe takes the function that enqueues keys, with which the trace's observations and
// timeouts are reported, until ctx ends.
func (r *TraceReconciler) Observe(ctx context.Context, enqueue func(key nimbusv1.Key), subscribed func()) error {
	r.mu.Lock()
	r.enqueue = enqueue
	r.mu.Unlock()
	subscribed()
	<-ctx.Done()
	r.mu.Lock()
	r.enqueue = nil
	r.mu.Unlock()
	return nil
}

// changed enqueues the key, so that its status is reported anew.
func (r *TraceReconciler) changed(key nimbusv1.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changedLocked(key)
}

// changedLocked is changed with r.mu held.
func (r *TraceReconciler) changedLocked(key nimbusv1.Key) {
	if r.enqueue != nil {
		r.enqueue(key)
	}
}

// Close stops every trace and the reader. It is safe to call twice.
func (r *TraceReconciler) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for k, run := range r.runs {
		r.stopLocked(run)
		delete(r.runs, k)
	}
	if r.reader != nil {
		r.reader.Close()
		r.reader = nil
	}
	return nil
}
