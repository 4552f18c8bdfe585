package linux

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Reasons of the firewall's objects.
const (
	// ReasonCapacityExceeded: the object does not fit in a firewall map of the
	// configured capacity; its earlier version, if any, stays enforced.
	ReasonCapacityExceeded = "CapacityExceeded"
	// ReasonWaitingForSecurityGroup: a policy names a SecurityGroup that has no object
	// (on this node). The policy is enforced meanwhile, the name standing for a group of
	// no CIDRs, whose members are the endpoints that list it.
	ReasonWaitingForSecurityGroup = "WaitingForSecurityGroup"
)

// FirewallStore is what the firewall reads of delphi.
type FirewallStore interface {
	OverlayStore
	// List returns the desired objects of one kind, ordered by key.
	List(kind nimbusv1.Kind) []*nimbusv1.Object
	// Synced returns a channel that is closed once the desired table is complete.
	Synced() <-chan struct{}
}

// FirewallOptions configures a Firewall.
type FirewallOptions struct {
	// Store holds the desired Endpoint, SecurityGroup and NetworkSecurityPolicy objects.
	// Required.
	Store FirewallStore
	// Node is the name of this host's Node: its endpoints are the ones enforced here.
	// Required.
	Node string
	// Namespace is the network namespace of the endpoints' interfaces. Default: the
	// calling process's.
	Namespace *netns.NsHandle
	// View is Namespace's kernel view, shared with the reconcilers of the namespace, whose
	// link table the firewall reads the interfaces' indexes from. Default: a view of the
	// firewall's own.
	View *KernelView
	// Dir is the bpffs directory the maps and links are pinned in, so that enforcement
	// and connection tracking outlive the agent. Required.
	Dir string
	// Capacities are the sizes of the maps (fwbpf.Capacities for the defaults).
	Capacities fwbpf.Capacities
	// Objects are the programs and maps, loaded already by fwbpf.Open with Dir,
	// Capacities and Logger: the kernel's verifier takes a second or more, which a caller
	// may spend on something else meanwhile. NewFirewall takes them over, and closes them
	// when it fails. Default: nil, which loads them.
	Objects *fwbpf.Objects
	// StatsInterval is how often the statuses of policies and local endpoints are
	// refreshed with their counters. Default: 10s.
	StatsInterval time.Duration
	// GCInterval is how often expired connections are removed from the conntrack table.
	// Default: 10s.
	GCInterval time.Duration
	// Logger receives the firewall's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the firewall's metrics (see Firewall); Close unregisters them.
	// Default: none.
	Registerer prometheus.Registerer
}

// Firewall enforces SecurityGroup and NetworkSecurityPolicy objects on this node's
// endpoints with the eBPF programs of package fwbpf (see docs/firewall.md). One goroutine
// builds the snapshot from the store whenever something asks (firewall.Compile) and swaps
// it in whole; reconciles of policies and groups, and the endpoint reconciler when it
// attaches an interface, wait for a snapshot built after they asked.
type Firewall struct {
	objs  *fwbpf.Objects
	store FirewallStore
	node  string
	ns    *netns.NsHandle
	// links is the view's table of the namespace's links, whose indexes the snapshot
	// names; conn reads it afresh when the view's subscription does not keep it current.
	links *linkTable
	conn  *rtnlConn
	opts  FirewallOptions
	log   *slog.Logger

	// mu guards the fields below it.
	mu sync.Mutex
	// asked is the number of builds asked for, built the number of the last one started
	// that has ended; built is closed-and-replaced on every build's end.
	asked, built uint64
	wake         chan struct{}
	builtCh      chan struct{}
	buildErr     error
	// snap is the snapshot installed; accepted the policies it enforces, by key ID.
	snap     *firewall.Snapshot
	accepted map[string]*nimbusv1.Object
	// failed holds why the policies that did not fit were left out, by key ID.
	failed map[string]string
	// read holds the version (versionOf) of every object the last build read, and
	// readLocal the interface index of every local endpoint it found: a reconcile of an
	// object at that version needs no new build.
	read      nimbusv1.KeyMap[objectVersion]
	readLocal map[nimbusv1.Key]int32
	// attached holds the interface index each local endpoint's links were attached to,
	// or given this process's programs on, by this process, by endpoint key ID.
	attached map[string]int
	// installs counts the snapshots swapped in; overflows the builds that left a policy
	// out or installed nothing for want of room.
	installs, overflows uint64
	// collected is what the last conntrack collection found; gcExpired sums what all of
	// them removed.
	collected fwbpf.Collection
	gcExpired uint64
	// evicted is the conntrack evictions counted at the last collection: created, less
	// denied, expired and live; it never goes down.
	evicted uint64
	reg     prometheus.Registerer
	// buildTime observes how long each snapshot build took, from reading the store to
	// the swap.
	buildTime prometheus.Histogram

	cancel context.CancelFunc
	done   chan struct{}
}

// NewFirewall loads the programs and maps (reusing those pinned in opts.Dir) and starts
// the goroutine that builds snapshots once the store is synced.
func NewFirewall(opts FirewallOptions) (*Firewall, error) {
	if opts.Store == nil || opts.Node == "" || opts.Dir == "" {
		return nil, errors.New("firewall: FirewallOptions.Store, Node and Dir are required")
	}
	if opts.StatsInterval <= 0 {
		opts.StatsInterval = 10 * time.Second
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	conn, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Logger: opts.Logger})
	if err != nil {
		if opts.Objects != nil {
			opts.Objects.Close()
		}
		return nil, fmt.Errorf("firewall: opening netlink: %w", err)
	}
	objs := opts.Objects
	if objs == nil {
		if objs, err = fwbpf.Open(opts.Dir, opts.Capacities, opts.Logger); err != nil {
			conn.close()
			return nil, fmt.Errorf("firewall: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Firewall{
		objs: objs, store: opts.Store, node: opts.Node, ns: opts.Namespace, links: conn.view.links, conn: conn, opts: opts, log: opts.Logger,
		wake: make(chan struct{}, 1), builtCh: make(chan struct{}),
		accepted: map[string]*nimbusv1.Object{}, failed: map[string]string{},
		attached: map[string]int{},
		cancel:   cancel, done: make(chan struct{}),
		buildTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "naples_firewall_build_seconds",
			Help:    "How long a firewall snapshot build took, from reading the store to the swap.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(f); err != nil {
			cancel()
			conn.close()
			objs.Close()
			return nil, fmt.Errorf("firewall: registering metrics: %w", err)
		}
		f.reg = opts.Registerer
	}
	go f.run(ctx)
	return f, nil
}

// Close stops the firewall's goroutine and releases its handles. What it pinned stays:
// the programs keep enforcing the last snapshot.
func (f *Firewall) Close() error {
	f.cancel()
	<-f.done
	if f.reg != nil {
		f.reg.Unregister(f)
	}
	f.conn.close()
	return f.objs.Close()
}

// Objects returns the loaded programs and maps.
func (f *Firewall) Objects() *fwbpf.Objects { return f.objs }

// Snapshot returns the snapshot installed last, nil before the first.
func (f *Firewall) Snapshot() *firewall.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// run builds snapshots when asked, and collects expired connections, until ctx ends.
func (f *Firewall) run(ctx context.Context) {
	defer close(f.done)
	select {
	case <-ctx.Done():
		return
	case <-f.store.Synced():
	}
	gc := time.NewTicker(f.opts.GCInterval)
	defer gc.Stop()
	f.ask()
	for {
		select {
		case <-ctx.Done():
			return
		case <-gc.C:
			if err := f.collect(); err != nil {
				f.log.Warn("collecting expired connections", "err", err)
			}
			continue
		case <-f.wake:
		}
		f.mu.Lock()
		seq := f.asked
		f.mu.Unlock()
		err := f.build()
		if err != nil {
			f.log.Error("building the firewall snapshot", "err", err)
		}
		f.mu.Lock()
		f.built, f.buildErr = seq, err
		close(f.builtCh)
		f.builtCh = make(chan struct{})
		f.mu.Unlock()
	}
}

// ask asks for a build and returns its number.
func (f *Firewall) ask() uint64 {
	f.mu.Lock()
	f.asked++
	seq := f.asked
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return seq
}

// Changed asks for a snapshot to be built anew, without waiting for it: endpoints of
// other nodes changed, say, whose addresses are peers.
func (f *Firewall) Changed() { f.ask() }

// objectVersion is what tells one version of an object from another, as a build read
// it: its uid and generation. A uid as nimbus makes them, a UUID in lower case, is held
// as its 16 bytes; any other as the first 16 bytes of its SHA-256, which equal those of
// another uid only by a chance of 2^-128. 24 bytes, without a pointer, where a string
// of the uid and generation took 48 of its own.
type objectVersion struct {
	uid [16]byte
	gen int64
}

// versionOf returns the version of an object.
func versionOf(obj *nimbusv1.Object) objectVersion {
	m := obj.GetMeta()
	v := objectVersion{gen: m.GetGeneration()}
	if !parseUUID(&v.uid, m.GetUid()) {
		sum := sha256.Sum256([]byte(m.GetUid()))
		copy(v.uid[:], sum[:])
	}
	return v
}

// parseUUID sets uid to the bytes of s when s is a UUID in lower case
// ("0f8fad5b-d9cb-469f-a165-70867728950e") and tells whether it was.
func parseUUID(uid *[16]byte, s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		c := s[i]
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		default:
			return false
		}
		if n%2 == 0 {
			uid[n/2] = d << 4
		} else {
			uid[n/2] |= d
		}
		n++
	}
	return true
}

// current tells whether the last build read the object with the key at the version of
// obj (nil: read none), and, with ifindex > 0, found it a local endpoint on that
// interface; then a reconcile needs no new build.
func (f *Firewall) current(key nimbusv1.Key, obj *nimbusv1.Object, ifindex int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snap == nil || f.buildErr != nil {
		return false
	}
	have, ok := f.read.Get(key)
	if obj == nil {
		return !ok
	}
	if !ok || have != versionOf(obj) {
		return false
	}
	// A local endpoint is current only on the interface the build found it on, and any
	// other object only for a reconcile that found no interface.
	local, found := f.readLocal[key]
	return found == (ifindex > 0) && int(local) == max(ifindex, 0)
}

// syncFor waits for a build that read the object with the key at the version of obj
// (see current), asking for one when the last did not.
func (f *Firewall) syncFor(ctx context.Context, key nimbusv1.Key, obj *nimbusv1.Object, ifindex int) error {
	if f.current(key, obj, ifindex) {
		return nil
	}
	return f.sync(ctx)
}

// sync asks for a build and waits until one that started after the call has ended; it
// returns that build's error.
func (f *Firewall) sync(ctx context.Context) error {
	seq := f.ask()
	for {
		f.mu.Lock()
		built, err, ch := f.built, f.buildErr, f.builtCh
		f.mu.Unlock()
		if built >= seq {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.store.Synced():
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// build compiles the store's objects into a snapshot and installs it. A policy that makes
// the snapshot exceed a capacity is left out, at its last accepted version, and recorded
// in failed.
func (f *Firewall) build() error {
	start := time.Now()
	in, err := f.input()
	if err != nil {
		return err
	}
	f.mu.Lock()
	accepted := f.accepted
	f.mu.Unlock()

	snap := firewall.Compile(in)
	policies := in.Policies
	failed := map[string]string{}
	if need, ok := f.fits(snap); !ok {
		snap, policies, failed, err = f.fallback(in, accepted, need)
		if err != nil {
			f.mu.Lock()
			f.overflows++
			f.mu.Unlock()
			return err
		}
	}
	f.mu.Lock()
	last := f.snap
	f.mu.Unlock()
	// A change that leaves the snapshot as it is (an endpoint of a tenant no policy
	// protects, say) swaps nothing.
	same := last != nil && last.Gen == snap.Gen && slices.Equal(last.Entries, snap.Entries)
	if !same {
		if err := f.objs.Install(snap.Entries); err != nil {
			return err
		}
	}
	if err := f.syncCounters(snap); err != nil {
		f.log.Warn("making the firewall's counters", "err", err)
	}
	enforced := make(map[string]*nimbusv1.Object, len(policies))
	for _, p := range policies {
		enforced[keyIDOf(p)] = p
	}
	var read nimbusv1.KeyMap[objectVersion]
	for _, list := range [][]*nimbusv1.Object{in.Endpoints, in.Groups, in.Policies} {
		for _, o := range list {
			read.Set(o.TypedKey(), versionOf(o))
		}
	}
	readLocal := make(map[nimbusv1.Key]int32, len(in.Local))
	for _, l := range in.Local {
		// The key ID of a listed endpoint parses; were it not to, the endpoint would not
		// be found local, and its reconcile would only wait for another build.
		if k, err := nimbusv1.ParseKey(l.Endpoint); err == nil && read.Has(k) {
			readLocal[k] = int32(l.Ifindex)
		}
	}
	f.mu.Lock()
	f.snap, f.accepted, f.failed, f.read, f.readLocal = snap, enforced, failed, read, readLocal
	if !same {
		f.installs++
	}
	if len(failed) > 0 {
		f.overflows++
	}
	f.mu.Unlock()
	took := time.Since(start)
	f.buildTime.Observe(took.Seconds())
	f.log.Debug("firewall snapshot built", "took", took, "installed", !same, "generation", snap.Gen, "entries", len(snap.Entries),
		"endpoints", len(snap.Endpoints), "rules", len(snap.Rules), "failed", len(failed))
	return nil
}

// input reads what a snapshot is built from: the store's objects and the indexes of the
// interfaces of this node's endpoints, from the view's link table, which the endpoint
// reconciler reads them from too. A table that the view's subscription does not keep
// current (no observer watches links) is dumped afresh first (`ip link show`); the
// reader's timeout bounds the dump.
func (f *Firewall) input() (firewall.Input, error) {
	if !f.links.current() {
		if err := f.links.reload(context.Background(), f.conn); err != nil {
			return firewall.Input{}, fmt.Errorf("listing interfaces: %w", err)
		}
	}
	index := make(map[string]int, f.links.m.Len())
	for i, l := range f.links.m.All() {
		index[l.name] = int(i)
	}
	return firewall.InputOf(f.store, f.node, index), nil
}

// keyIDOf returns the key ID of an object.
func keyIDOf(obj *nimbusv1.Object) string { return obj.Key().ID() }

// fits tells whether the snapshot fits the maps; when not, it says what it needs.
func (f *Firewall) fits(s *firewall.Snapshot) (string, bool) {
	c := f.objs.Capacities()
	switch {
	case len(s.Entries) > c.Snapshot:
		return fmt.Sprintf("%d snapshot entries, more than the capacity of %d (--fw-snapshot-entries)", len(s.Entries), c.Snapshot), false
	case len(s.Rules) > c.Rules:
		return fmt.Sprintf("%d rule counters, more than the capacity of %d (--fw-rule-counters)", len(s.Rules), c.Rules), false
	case len(s.Endpoints) > c.Endpoints:
		return fmt.Sprintf("%d endpoint counters, more than the capacity of %d (--fw-endpoint-counters)", len(s.Endpoints), c.Endpoints), false
	}
	return "", true
}

// fallback builds a snapshot that fits: the policies that changed since the last
// accepted snapshot are taken back to their accepted version (or left out when new), and
// then added again one by one, in key order, as long as the snapshot still fits. It
// returns the policies it enforces and why each one left out did not fit.
func (f *Firewall) fallback(in firewall.Input, accepted map[string]*nimbusv1.Object, need string) (*firewall.Snapshot, []*nimbusv1.Object, map[string]string, error) {
	var base []*nimbusv1.Object
	var changed []*nimbusv1.Object
	for _, p := range in.Policies {
		id := keyIDOf(p)
		old, ok := accepted[id]
		if ok && old.GetMeta().GetGeneration() == p.GetMeta().GetGeneration() && old.GetMeta().GetUid() == p.GetMeta().GetUid() {
			base = append(base, p)
			continue
		}
		changed = append(changed, p)
		if ok {
			base = append(base, old)
		}
	}
	try := in
	try.Policies = base
	snap := firewall.Compile(try)
	if why, ok := f.fits(snap); !ok {
		return nil, nil, nil, fmt.Errorf("the firewall snapshot needs %s even without the policies changed since the last one (%s); the last snapshot stays", why, need)
	}
	failed := map[string]string{}
	for _, p := range changed {
		id := keyIDOf(p)
		next := slices.DeleteFunc(slices.Clone(base), func(o *nimbusv1.Object) bool { return keyIDOf(o) == id })
		next = append(next, p)
		try.Policies = next
		s := firewall.Compile(try)
		if why, ok := f.fits(s); !ok {
			msg := fmt.Sprintf("generation %d of this policy does not fit: the firewall would need %s", p.GetMeta().GetGeneration(), why)
			if _, had := accepted[id]; had {
				msg += fmt.Sprintf("; generation %d stays enforced", accepted[id].GetMeta().GetGeneration())
			} else {
				msg += "; it is not enforced"
			}
			failed[id] = msg
			continue
		}
		base, snap = next, s
	}
	return snap, base, failed, nil
}

// linkName returns the name the links of the endpoint with the key ID are pinned under.
func linkName(keyID string) string {
	h := fnv.New64a()
	h.Write([]byte(keyID))
	return fmt.Sprintf("ep-%016x", h.Sum64())
}

// AttachEndpoint attaches the firewall to the interface (with the index) of the local
// endpoint with the key, and waits until a snapshot that holds the endpoint is in place,
// so that the endpoint's traffic is filtered from its first packet. It returns the
// endpoint's firewall state and counters for its status.
func (f *Firewall) AttachEndpoint(ctx context.Context, key nimbusv1.Key, obj *nimbusv1.Object, ifindex int) (*nimbusv1.EndpointFirewall, error) {
	keyID := key.String()
	f.mu.Lock()
	had := f.attached[keyID]
	f.mu.Unlock()
	if had != ifindex || !f.objs.Attached(linkName(keyID), ifindex) {
		// Attach also replaces the programs a previous agent left with this one's.
		if err := runInNamespace(f.ns, func() error {
			_, err := f.objs.Attach(linkName(keyID), ifindex)
			return err
		}); err != nil {
			return nil, hal.Errorf(hal.ReasonKernelError, "%w", err)
		}
		f.mu.Lock()
		f.attached[keyID] = ifindex
		f.mu.Unlock()
	}
	if err := f.syncFor(ctx, key, obj, ifindex); err != nil {
		return nil, err
	}
	snap := f.Snapshot()
	i := slices.IndexFunc(snap.Endpoints, func(e firewall.EndpointInfo) bool { return e.Endpoint == key })
	if i < 0 || int(snap.Endpoints[i].Ifindex) != ifindex {
		return nil, hal.Errorf(hal.ReasonFailed, "the firewall snapshot does not hold interface %d yet", ifindex)
	}
	op := f.endpointOperational(snap.Endpoints[i])
	for _, r := range firewall.GroupRefs(obj) {
		if _, ok := f.store.Get(r.Group); !ok {
			// A warning, not a phase: the endpoint is programmed, and a member of the
			// group by its name (policies attached to it protect it). It is refreshed
			// with the counters, every StatsInterval.
			op.MissingGroups = append(op.MissingGroups, r.String())
		}
	}
	return op, nil
}

// DetachEndpoint removes the firewall from the interface of the endpoint with the key,
// which is not a local endpoint (any more); obj is its desired object, nil when it is
// gone. It asks for a new build, without waiting for it, when the last one did not read
// the endpoint as it is now: its addresses may be peers of policies.
func (f *Firewall) DetachEndpoint(key nimbusv1.Key, obj *nimbusv1.Object) error {
	keyID := key.String()
	err := f.objs.Detach(linkName(keyID))
	f.mu.Lock()
	delete(f.attached, keyID)
	f.mu.Unlock()
	if !f.current(key, obj, 0) {
		f.Changed()
	}
	return err
}

// endpointOperational returns the firewall's part of a local endpoint's status.
func (f *Firewall) endpointOperational(e firewall.EndpointInfo) *nimbusv1.EndpointFirewall {
	op := &nimbusv1.EndpointFirewall{
		IngressProtected: e.Flags&firewall.FlagIngress != 0,
		EgressProtected:  e.Flags&firewall.FlagEgress != 0,
		SourcesGuarded:   e.Flags&firewall.FlagGuard != 0,
	}
	if c, err := f.objs.EndpointCounters(e.ID); err == nil {
		op.Counters = &nimbusv1.EndpointFirewallCounters{
			AllowedPackets: c.AllowedPackets, AllowedBytes: c.AllowedBytes,
			DeniedPackets: c.DeniedPackets, DeniedBytes: c.DeniedBytes,
		}
		if op.SourcesGuarded {
			op.Counters.SpoofedPackets, op.Counters.SpoofedBytes = c.SpoofedPackets, c.SpoofedBytes
		}
	}
	return op
}

// syncCounters makes a counter entry for every rule and endpoint of the snapshot and
// removes those of rules and endpoints that are gone.
func (f *Firewall) syncCounters(s *firewall.Snapshot) error {
	rules := make([]uint64, 0, len(s.Rules))
	for _, r := range s.Rules {
		rules = append(rules, r.ID)
	}
	eps := make([]uint32, 0, len(s.Endpoints))
	for _, e := range s.Endpoints {
		eps = append(eps, e.ID)
	}
	return errors.Join(f.objs.KeepRuleCounters(rules), f.objs.KeepEndpointCounters(eps))
}

// collect removes the expired connections from the conntrack table.
func (f *Firewall) collect() error {
	c, err := f.objs.CollectConntrack()
	if err != nil {
		return err
	}
	st, err := f.objs.ProgramStats()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.collected = c
	f.gcExpired += uint64(c.Expired)
	if err == nil {
		// Created after the table was read count as live ones it did not see: an
		// over-count, which the next collection does not take back, so created is read
		// after the table.
		if gone := st.CTDeleted + f.gcExpired + uint64(c.Live); st.CTCreated > gone {
			f.evicted = max(f.evicted, st.CTCreated-gone)
		}
	}
	return err
}

// sweep removes the links of endpoints that are not local desired endpoints any more,
// and asks for a build.
func (f *Firewall) sweep() error {
	want := map[string]bool{}
	for _, ep := range f.store.List(nimbusv1.Kind_KIND_ENDPOINT) {
		if ep.GetEndpoint().GetNode() == f.node {
			want[linkName(keyIDOf(ep))] = true
		}
	}
	names, err := f.objs.Links()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if !want[n] {
			f.log.Info("removing the firewall from the interface of an endpoint that is gone", "link", n)
			errs = append(errs, f.objs.Detach(n))
		}
	}
	f.Changed()
	return errors.Join(errs...)
}

// policyReconciler reports NetworkSecurityPolicy objects programmed once a snapshot that
// enforces them is in place.
type policyReconciler struct{ f *Firewall }

// groupReconciler reports SecurityGroup objects programmed once a snapshot built from
// them is in place.
type groupReconciler struct{ f *Firewall }

var (
	_ hal.Reconciler = policyReconciler{}
	_ hal.Sweeper    = policyReconciler{}
	_ hal.Observer   = policyReconciler{}
	_ hal.Dependent  = policyReconciler{}
	_ hal.Reconciler = groupReconciler{}
)

// PolicyReconciler returns the reconciler of NetworkSecurityPolicy objects.
func (f *Firewall) PolicyReconciler() hal.Reconciler { return policyReconciler{f} }

// GroupReconciler returns the reconciler of SecurityGroup objects.
func (f *Firewall) GroupReconciler() hal.Reconciler { return groupReconciler{f} }

func (policyReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY }

// Reconcile waits for a snapshot built after the policy changed, and reports the
// policy's rule counters on this node, or why it does not fit.
func (r policyReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	f := r.f
	id := key.ID()
	if err := f.syncFor(ctx, key.Key(), obj, 0); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, nil
	}
	// It may wait for a newer build, one that read the groups as the store holds them.
	missing, err := f.missingGroups(ctx, obj)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	why, failed := f.failed[id]
	snap := f.snap
	f.mu.Unlock()
	if failed {
		f.log.Warn("policy does not fit the firewall's maps", "key", id, "reason", why)
		return nil, hal.Errorf(ReasonCapacityExceeded, "%s", why)
	}
	op := &nimbusv1.SecurityPolicyOperational{}
	k := key.Key()
	for _, e := range snap.Endpoints {
		if slices.Contains(e.Policies, k) {
			op.ProtectedEndpoints++
		}
	}
	for _, rule := range snap.Rules {
		if rule.Policy != k {
			continue
		}
		c, err := f.objs.RuleCounters(rule.ID)
		if err != nil || c.Packets == 0 {
			// A rule that has not been hit reports nothing: a policy of 10,000 rules would
			// carry 20,000 zeros otherwise.
			continue
		}
		op.Rules = append(op.Rules, &nimbusv1.PolicyRuleCounters{
			Direction: ruleDirection(rule.Dir), Index: uint32(rule.Index), Packets: c.Packets, Bytes: c.Bytes,
		})
	}
	slices.SortFunc(op.Rules, func(a, b *nimbusv1.PolicyRuleCounters) int {
		return cmp.Or(cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Index, b.Index))
	})
	data := &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_SecurityPolicy{SecurityPolicy: op}}
	if len(missing) > 0 {
		// Enforced all the same: leaving the policy out, or the endpoints that list a
		// missing attached group, would open what the policy closes.
		return data, hal.Pendingf(ReasonWaitingForSecurityGroup,
			"%s; meanwhile the policy is enforced as written: a missing group has no CIDRs, and its members are the endpoints that list it",
			firewall.DescribeMissing(key.GetTenant(), key.GetNamespace(), missing))
	}
	return data, nil
}

// missingGroups returns the fields of the object that name a SecurityGroup the store
// does not hold. When the last build did not read one of the groups as the store holds
// it now, it waits for a build that did, so that the status and the snapshot agree.
func (f *Firewall) missingGroups(ctx context.Context, obj *nimbusv1.Object) ([]firewall.GroupRef, error) {
	var missing []firewall.GroupRef
	stale := false
	for _, r := range firewall.GroupRefs(obj) {
		g, ok := f.store.Get(r.Group)
		if !ok {
			missing = append(missing, r)
		}
		if !stale && !f.current(r.Group.Key(), g, 0) {
			stale = true
		}
	}
	if stale {
		if err := f.sync(ctx); err != nil {
			return nil, err
		}
	}
	return missing, nil
}

// DependsOn returns SecurityGroup: a policy that names a missing group is PENDING until
// the group comes, and so is one whose group goes.
func (policyReconciler) DependsOn() []nimbusv1.Kind {
	return []nimbusv1.Kind{nimbusv1.Kind_KIND_SECURITY_GROUP}
}

// DependentsOf returns the policies that name the SecurityGroup with the key.
func (r policyReconciler) DependentsOf(key nimbusv1.Key) []nimbusv1.Key {
	keys, err := r.f.store.LookupKeys(PolicyGroupIndex.Name, key.String())
	if err != nil {
		r.f.log.Error("finding the policies that name a SecurityGroup", "key", key, "err", err)
		return nil
	}
	return keys
}

// PolicyGroupIndex lists a NetworkSecurityPolicy under the key ID of every SecurityGroup
// it names (firewall.GroupRefs).
var PolicyGroupIndex = delphi.Index{Name: "policy_group", Values: func(obj *nimbusv1.Object) []string {
	if obj.GetNetworkSecurityPolicy() == nil {
		return nil
	}
	var ids []string
	for _, r := range firewall.GroupRefs(obj) {
		ids = append(ids, r.Group.ID())
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}}

// ruleDirection returns a direction as the status names it.
func ruleDirection(dir uint8) nimbusv1.PolicyRuleCounters_Direction {
	if dir == firewall.DirEgress {
		return nimbusv1.PolicyRuleCounters_DIRECTION_EGRESS
	}
	return nimbusv1.PolicyRuleCounters_DIRECTION_INGRESS
}

// directionName returns the spec field of a direction.
func directionName(dir uint8) string {
	if dir == firewall.DirEgress {
		return "egress"
	}
	return "ingress"
}

// Sweep removes the firewall from interfaces of endpoints that are gone.
func (r policyReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	return r.f.sweep()
}

// Observe enqueues the policies and this node's endpoints every StatsInterval, so that
// their statuses carry fresh counters.
func (r policyReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	subscribed()
	t := time.NewTicker(r.f.opts.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, key := range r.f.store.Keys(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY) {
			enqueue(key)
		}
		if snap := r.f.Snapshot(); snap != nil {
			for _, e := range snap.Endpoints {
				enqueue(e.Endpoint)
			}
		}
	}
}

func (groupReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_SECURITY_GROUP }

// Reconcile waits for a snapshot built after the group changed.
func (r groupReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if err := r.f.syncFor(ctx, key.Key(), obj, 0); err != nil {
		return nil, err
	}
	return nil, nil
}

// The firewall's metrics, read from its maps at scrape time.
var (
	fwSnapshotEntries = prometheus.NewDesc("naples_firewall_snapshot_entries",
		"Entries of the firewall snapshot in place.", nil, nil)
	fwSnapshotCapacity = prometheus.NewDesc("naples_firewall_snapshot_capacity",
		"Entries a firewall snapshot may hold (--fw-snapshot-entries).", nil, nil)
	fwInstalls = prometheus.NewDesc("naples_firewall_snapshots_installed_total",
		"Firewall snapshots swapped in.", nil, nil)
	fwOverflows = prometheus.NewDesc("naples_firewall_capacity_exceeded_total",
		"Snapshot builds that left a policy out, or installed nothing, because a map was too small.", nil, nil)
	fwFailed = prometheus.NewDesc("naples_firewall_failed_policies",
		"Policies left out of the snapshot because a map is too small.", nil, nil)
	fwCTLive = prometheus.NewDesc("naples_firewall_conntrack_entries",
		"Live connections in the conntrack table at the last collection.", nil, nil)
	fwCTCreated = prometheus.NewDesc("naples_firewall_conntrack_created_total",
		"Connections the program started tracking.", nil, nil)
	fwCTDenied = prometheus.NewDesc("naples_firewall_conntrack_denied_total",
		"Tracked connections a new snapshot denied, cut off at their next packet.", nil, nil)
	fwCTExpired = prometheus.NewDesc("naples_firewall_conntrack_expired_total",
		"Expired connections the agent removed from the conntrack table.", nil, nil)
	fwCTEvicted = prometheus.NewDesc("naples_firewall_conntrack_evictions_total",
		"Connections evicted from the full conntrack table (created - denied - expired - live, at the last collection).", nil, nil)
	fwNoSnapshot = prometheus.NewDesc("naples_firewall_unknown_interface_drops_total",
		"Packets dropped because no snapshot held their interface.", nil, nil)
	fwSpoofed = prometheus.NewDesc("naples_firewall_spoofed_drops_total",
		"Frames dropped because a local endpoint sent them from a MAC or IP address that is not its own.", nil, nil)
	fwFragUntracked = prometheus.NewDesc("naples_firewall_fragment_untracked_drops_total",
		"Later fragments dropped because their datagram's first fragment was not seen, or its entry expired or was evicted from the full fragment table.", nil, nil)
	fwFragCapacity = prometheus.NewDesc("naples_firewall_fragment_capacity",
		"Fragmented datagrams whose first fragment's verdict the firewall keeps at once (--fw-fragment-entries).", nil, nil)
	fwBadHeaders = prometheus.NewDesc("naples_firewall_bad_header_drops_total",
		"Packets dropped for hostile headers: an IPv6 extension-header chain over its bounds, a first fragment too short for its L4 header, a later fragment overlapping it.", nil, nil)
	fwTraceStray = prometheus.NewDesc("naples_firewall_trace_stray_drops_total",
		"Trace packets of no trace the node runs (they came before it installed the trace, or after it ended) dropped before an endpoint received them.", nil, nil)
	fwRulePackets = prometheus.NewDesc("naples_firewall_rule_packets_total",
		"Packets of the connections a rule decided, in their original direction.", []string{"policy", "direction", "rule", "action"}, nil)
	fwRuleBytes = prometheus.NewDesc("naples_firewall_rule_bytes_total",
		"Bytes of the connections a rule decided, in their original direction.", []string{"policy", "direction", "rule", "action"}, nil)
	fwEndpointPackets = prometheus.NewDesc("naples_firewall_endpoint_packets_total",
		"Packets to and from a local endpoint, by verdict (allowed, denied, spoofed).", []string{"endpoint", "verdict"}, nil)
	fwEndpointBytes = prometheus.NewDesc("naples_firewall_endpoint_bytes_total",
		"Bytes to and from a local endpoint, by verdict (allowed, denied, spoofed).", []string{"endpoint", "verdict"}, nil)
)

// Describe sends the descriptions of the firewall's metrics.
func (f *Firewall) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fwSnapshotEntries, fwSnapshotCapacity, fwInstalls, fwOverflows, fwFailed, fwCTLive,
		fwCTCreated, fwCTDenied, fwCTExpired, fwCTEvicted, fwNoSnapshot, fwSpoofed, fwFragUntracked, fwFragCapacity, fwBadHeaders, fwTraceStray, fwRulePackets, fwRuleBytes, fwEndpointPackets, fwEndpointBytes} {
		ch <- d
	}
	f.buildTime.Describe(ch)
}

// Collect reads the firewall's metrics from its state and maps.
func (f *Firewall) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	snap, installs, overflows, failed, collected, expired, evicted := f.snap, f.installs, f.overflows, len(f.failed), f.collected, f.gcExpired, f.evicted
	f.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	f.buildTime.Collect(ch)
	gauge(fwSnapshotCapacity, float64(f.objs.Capacities().Snapshot))
	gauge(fwFragCapacity, float64(f.objs.Capacities().Fragments))
	counter(fwInstalls, installs)
	counter(fwOverflows, overflows)
	gauge(fwFailed, float64(failed))
	gauge(fwCTLive, float64(collected.Live))
	counter(fwCTExpired, expired)
	if st, err := f.objs.ProgramStats(); err == nil {
		counter(fwCTCreated, st.CTCreated)
		counter(fwCTDenied, st.CTDeleted)
		counter(fwNoSnapshot, st.NoSnapshotDrops)
		counter(fwSpoofed, st.SpoofedDrops)
		counter(fwFragUntracked, st.FragUntrackedDrops)
		counter(fwBadHeaders, st.BadHeaderDrops)
		counter(fwTraceStray, st.TraceStrayDrops)
	}
	counter(fwCTEvicted, evicted)
	if snap == nil {
		return
	}
	gauge(fwSnapshotEntries, float64(len(snap.Entries)))
	for _, r := range snap.Rules {
		if c, err := f.objs.RuleCounters(r.ID); err == nil {
			labels := []string{r.Policy.String(), directionName(r.Dir), strconv.Itoa(r.Index), r.Action}
			counter(fwRulePackets, c.Packets, labels...)
			counter(fwRuleBytes, c.Bytes, labels...)
		}
	}
	for _, e := range snap.Endpoints {
		if c, err := f.objs.EndpointCounters(e.ID); err == nil {
			ep := e.Endpoint.String()
			counter(fwEndpointPackets, c.AllowedPackets, ep, "allowed")
			counter(fwEndpointPackets, c.DeniedPackets, ep, "denied")
			counter(fwEndpointBytes, c.AllowedBytes, ep, "allowed")
			counter(fwEndpointBytes, c.DeniedBytes, ep, "denied")
			if e.Flags&firewall.FlagGuard != 0 {
				counter(fwEndpointPackets, c.SpoofedPackets, ep, "spoofed")
				counter(fwEndpointBytes, c.SpoofedBytes, ep, "spoofed")
			}
		}
	}
}
