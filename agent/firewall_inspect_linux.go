package agent

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// firewall reads the pinned maps and delphi once and answers Firewall from them.
func (i *Inspector) firewall(ctx context.Context, view delphiv1.FirewallView) (*delphiv1.FirewallResponse, error) {
	links, err := readLinkNames(ctx, i.view)
	if err != nil {
		return nil, err
	}
	var snap *firewall.Snapshot
	if i.fw != nil {
		snap = i.fw.Snapshot()
	}
	installed := snap != nil
	if !installed {
		snap = &firewall.Snapshot{}
	}
	p, err := fwbpf.OpenPinned(i.bpfDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"the firewall has not pinned its maps in %s (yet): %v", i.bpfDir, err)
	}
	if err != nil {
		return nil, err
	}
	defer p.Close()

	v := newFirewallView(snap, links)
	resp := &delphiv1.FirewallResponse{Node: i.node, BpfDir: i.bpfDir}
	if !installed {
		resp.Problems = append(resp.Problems, "the firewall has installed no snapshot yet, so no id in its maps is named")
	}
	for _, e := range snap.Problems {
		resp.Problems = append(resp.Problems, e.Error())
	}
	ps, err := p.Snapshot()
	if err != nil {
		return nil, err
	}
	resp.Snapshot = v.summary(ps)
	st, err := p.ProgramStats()
	if err != nil {
		return nil, err
	}
	caps := p.Capacities()
	resp.Stats = &delphiv1.FirewallStats{
		ConntrackCreated:         st.CTCreated,
		ConntrackDenied:          st.CTDeleted,
		NoSnapshotDrops:          st.NoSnapshotDrops,
		SpoofedDrops:             st.SpoofedDrops,
		FragmentUntrackedDrops:   st.FragUntrackedDrops,
		FragmentCapacity:         uint32(caps.Fragments),
		BadHeaderDrops:           st.BadHeaderDrops,
		ConntrackCapacity:        uint32(caps.Conntrack),
		RuleCountersCapacity:     uint32(caps.Rules),
		EndpointCountersCapacity: uint32(caps.Endpoints),
	}
	all := view == delphiv1.FirewallView_FIREWALL_VIEW_UNSPECIFIED
	tables := v.split(ps.Entries)
	if all || view == delphiv1.FirewallView_FIREWALL_VIEW_POLICY {
		epCounters, err := p.EndpointCounters()
		if err != nil {
			return nil, err
		}
		ruleCounters, err := p.RuleCounters()
		if err != nil {
			return nil, err
		}
		resp.Endpoints = v.endpoints(tables.endpoints, tables.sources, epCounters)
		resp.Subjects = v.subjects(tables)
		resp.Rules = v.rules(ruleCounters)
	}
	if all || view == delphiv1.FirewallView_FIREWALL_VIEW_IDENTITIES {
		resp.Scopes = v.scopes(tables.identities)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if all || view == delphiv1.FirewallView_FIREWALL_VIEW_CONNTRACK {
		conns, err := p.Conntrack()
		if err != nil {
			return nil, err
		}
		resp.Stats.ConntrackEntries = uint32(len(conns))
		resp.Connections = v.connections(conns, tables.endpoints)
	}
	resp.Problems = append(resp.Problems, tables.problems...)
	return resp, nil
}

// readLinkNames reads the links of view's namespace once and returns their names by
// index, the read bounded by ctx.
func readLinkNames(ctx context.Context, view *KernelView) (map[int]string, error) {
	links, err := view.Links(ctx)
	if err != nil {
		return nil, err
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[int(l.Index)] = l.Name
	}
	return names, nil
}

// scopedID is an identity of a tenant scope.
type scopedID struct {
	scope, id uint32
}

// firewallView names the ids of the pinned maps from the installed snapshot and the links
// of the namespace.
type firewallView struct {
	installed *firewall.Snapshot
	// links are the names of the namespace's links, by index.
	links map[int]string
	// epByID and epByIfindex are the snapshot's endpoints by endpoint id and interface.
	epByID      map[uint32]firewall.EndpointInfo
	epByIfindex map[uint32]firewall.EndpointInfo
	// ruleByID, subjectByID and identities are the snapshot's rules, subjects and
	// identities, by id.
	ruleByID    map[uint64]firewall.RuleInfo
	subjectByID map[uint32]firewall.SubjectInfo
	identities  map[scopedID]firewall.IdentityInfo
	// labels are the labels of each identity id, whatever its scope, for entries whose
	// scope is unknown; nil for an id two scopes give different labels.
	labels map[uint32][]string
	// tenants are the names of the tenant scopes.
	tenants map[uint32]string
}

// newFirewallView indexes the installed snapshot.
func newFirewallView(s *firewall.Snapshot, links map[int]string) *firewallView {
	v := &firewallView{
		installed:   s,
		links:       links,
		epByID:      map[uint32]firewall.EndpointInfo{},
		epByIfindex: map[uint32]firewall.EndpointInfo{},
		ruleByID:    map[uint64]firewall.RuleInfo{},
		subjectByID: map[uint32]firewall.SubjectInfo{},
		identities:  map[scopedID]firewall.IdentityInfo{},
		labels:      map[uint32][]string{},
		tenants:     map[uint32]string{},
	}
	for _, e := range s.Endpoints {
		v.epByID[e.ID] = e
		v.epByIfindex[e.Ifindex] = e
		v.tenants[e.Scope] = e.Endpoint.Tenant
	}
	for _, r := range s.Rules {
		v.ruleByID[r.ID] = r
	}
	for _, sub := range s.Subjects {
		v.subjectByID[sub.ID] = sub
	}
	for _, id := range s.Identities {
		v.identities[scopedID{id.Scope, id.ID}] = id
		v.tenants[id.Scope] = id.Tenant
		if have, ok := v.labels[id.ID]; !ok {
			v.labels[id.ID] = id.Labels
		} else if !slices.Equal(have, id.Labels) {
			v.labels[id.ID] = nil
		}
	}
	return v
}

// summary sums up the snapshot in place and compares it with the one the firewall
// installed.
func (v *firewallView) summary(ps fwbpf.PinnedSnapshot) *delphiv1.FirewallSnapshot {
	out := &delphiv1.FirewallSnapshot{
		Present:            ps.Present,
		Entries:            uint32(len(ps.Entries)),
		Capacity:           uint32(ps.Capacity),
		CompiledGeneration: v.installed.Gen,
	}
	want := make(map[firewall.Key]firewall.Value, len(v.installed.Entries))
	for _, e := range v.installed.Entries {
		want[e.Key] = e.Value
	}
	found := 0
	for _, e := range ps.Entries {
		if e.Key.Data[0] == firewall.TableEndpoint && out.Generation == 0 {
			out.Generation = e.Value.Gen
		}
		w, ok := want[e.Key]
		if ok {
			found++
		}
		if !ok || w != e.Value {
			out.StaleEntries++
		}
	}
	out.MissingEntries = uint32(len(want) - found)
	out.Current = ps.Present && out.StaleEntries == 0 && out.MissingEntries == 0
	if out.Generation == 0 && out.Current {
		// A snapshot without endpoints carries no generation; the installed one's is its own.
		out.Generation = v.installed.Gen
	}
	return out
}

// The layout of a snapshot key's data (docs/firewall.md, "Maps"): byte 0 is the table,
// multi-byte fields are big-endian, and the prefix length covers the fixed fields, then
// the address bits (identity) or the port bits (policy).
const (
	endpointKeyBits = 8 + 32
	identityKeyBits = 8 + 32 + 8
	policyKeyBits   = 8 + 32 + 8 + 8 + 32
)

// endpointEntry is an endpoint entry of the snapshot in place.
type endpointEntry struct {
	ifindex uint32
	value   firewall.Value
}

// identityEntry is an identity entry of the snapshot in place.
type identityEntry struct {
	scope  uint32
	prefix netip.Prefix
	id     uint32
}

// policyEntry is a policy entry of the snapshot in place.
type policyEntry struct {
	subject    uint32
	dir, class uint8
	identity   uint32
	ports      firewall.PortPrefix
	value      firewall.Value
}

// snapshotTables are the entries of the snapshot in place, decoded, by table, in the
// order of their keys.
type snapshotTables struct {
	endpoints  []endpointEntry
	identities []identityEntry
	policies   []policyEntry
	// sources are the source addresses of the guarded endpoints, by interface index, in
	// the order of their keys.
	sources map[uint32][]string
	// problems name the entries that could not be decoded.
	problems []string
}

// split decodes the entries of the snapshot in place.
func (v *firewallView) split(entries []firewall.Entry) snapshotTables {
	var t snapshotTables
	for _, e := range entries {
		k, d := e.Key, e.Key.Data
		switch {
		case d[0] == firewall.TableEndpoint && k.PrefixLen == endpointKeyBits:
			t.endpoints = append(t.endpoints, endpointEntry{ifindex: binary.BigEndian.Uint32(d[1:5]), value: e.Value})
			continue
		case d[0] == firewall.TableSource:
			if ifindex, src, ok := k.Source(); ok {
				if t.sources == nil {
					t.sources = map[uint32][]string{}
				}
				t.sources[ifindex] = append(t.sources[ifindex], src)
				continue
			}
		case d[0] == firewall.TableIdentity && k.PrefixLen >= identityKeyBits:
			if p, ok := identityPrefix(k); ok {
				t.identities = append(t.identities, identityEntry{scope: binary.BigEndian.Uint32(d[1:5]), prefix: p, id: e.Value.ID})
				continue
			}
		case d[0] == firewall.TablePolicy && k.PrefixLen >= policyKeyBits && k.PrefixLen <= policyKeyBits+16:
			t.policies = append(t.policies, policyEntry{
				subject:  binary.BigEndian.Uint32(d[1:5]),
				dir:      d[5],
				class:    d[6],
				identity: binary.BigEndian.Uint32(d[7:11]),
				ports:    firewall.PortPrefix{Port: binary.BigEndian.Uint16(d[11:13]), Bits: int(k.PrefixLen - policyKeyBits)},
				value:    e.Value,
			})
			continue
		}
		t.problems = append(t.problems, "snapshot entry "+firewall.DescribeEntry(e)+": not a key of the firewall's tables")
	}
	return t
}

// identityPrefix returns the prefix of an identity key; false when its family or length
// is not one.
func identityPrefix(k firewall.Key) (netip.Prefix, bool) {
	var a netip.Addr
	switch k.Data[5] {
	case 4:
		a = netip.AddrFrom4([4]byte(k.Data[6:10]))
	case 6:
		a = netip.AddrFrom16([16]byte(k.Data[6:22]))
	default:
		return netip.Prefix{}, false
	}
	p, err := a.Prefix(int(k.PrefixLen - identityKeyBits))
	return p, err == nil
}

// endpoints returns the endpoint entries, those the snapshot knows ordered by key, then
// the others by interface index.
func (v *firewallView) endpoints(entries []endpointEntry, sources map[uint32][]string, counters map[uint32]fwbpf.EndpointStats) []*delphiv1.FirewallEndpoint {
	out := make([]*delphiv1.FirewallEndpoint, 0, len(entries))
	for _, e := range entries {
		val := e.value
		ep := &delphiv1.FirewallEndpoint{
			Ifindex:          e.ifindex,
			Interface:        v.links[int(e.ifindex)],
			Id:               val.ID,
			Scope:            val.Scope,
			Tenant:           v.tenants[val.Scope],
			Subject:          val.Subject,
			IngressProtected: val.Flags&firewall.FlagIngress != 0,
			EgressProtected:  val.Flags&firewall.FlagEgress != 0,
			Generation:       val.Gen,
			Guarded:          val.Flags&firewall.FlagGuard != 0,
			Sources:          sources[e.ifindex],
		}
		if info, ok := v.epByID[val.ID]; ok {
			ep.Key = info.Endpoint.Proto()
		}
		if c, ok := counters[val.ID]; ok {
			ep.Counters = &nimbusv1.EndpointFirewallCounters{
				AllowedPackets: c.AllowedPackets, AllowedBytes: c.AllowedBytes,
				DeniedPackets: c.DeniedPackets, DeniedBytes: c.DeniedBytes,
				SpoofedPackets: c.SpoofedPackets, SpoofedBytes: c.SpoofedBytes,
			}
		}
		out = append(out, ep)
	}
	slices.SortStableFunc(out, func(a, b *delphiv1.FirewallEndpoint) int {
		switch {
		case a.GetKey() != nil && b.GetKey() != nil:
			return strings.Compare(a.GetKey().ID(), b.GetKey().ID())
		case a.GetKey() != nil:
			return -1
		case b.GetKey() != nil:
			return 1
		}
		return cmp.Compare(a.GetIfindex(), b.GetIfindex())
	})
	return out
}

// subjects returns the subjects of the endpoint and policy entries, ordered by id, with
// their policy entries. A subject's scope is that of the endpoint entries with it, or
// else that of its policies' tenant.
func (v *firewallView) subjects(t snapshotTables) []*delphiv1.FirewallSubject {
	byID := map[uint32]*delphiv1.FirewallSubject{}
	// scoped tells the subjects whose scope is known.
	scoped := map[uint32]bool{}
	for _, e := range t.endpoints {
		if id := e.value.Subject; id != 0 && byID[id] == nil {
			byID[id] = &delphiv1.FirewallSubject{Id: id, Scope: e.value.Scope, Tenant: v.tenants[e.value.Scope]}
			scoped[id] = true
		}
	}
	for _, e := range t.policies {
		if byID[e.subject] == nil {
			byID[e.subject] = &delphiv1.FirewallSubject{Id: e.subject}
		}
	}
	scopeOf := make(map[string]uint32, len(v.tenants))
	for scope, tenant := range v.tenants {
		scopeOf[tenant] = scope
	}
	for id, s := range byID {
		info, ok := v.subjectByID[id]
		if !ok {
			continue
		}
		for _, p := range info.Policies {
			s.Policies = append(s.Policies, p.Proto())
		}
		if scoped[id] || len(s.Policies) == 0 {
			continue
		}
		tenant := s.GetPolicies()[0].GetTenant()
		if scope, ok := scopeOf[tenant]; ok {
			s.Scope, s.Tenant = scope, tenant
			scoped[id] = true
		}
	}
	for _, e := range t.policies {
		s := byID[e.subject]
		s.Entries = append(s.Entries, v.policyEntry(e, s.GetScope(), scoped[s.Id]))
	}
	out := make([]*delphiv1.FirewallSubject, 0, len(byID))
	for _, s := range byID {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *delphiv1.FirewallSubject) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return out
}

// policyEntry describes a policy entry of a subject whose scope is known (scoped) or not.
func (v *firewallView) policyEntry(e policyEntry, scope uint32, scoped bool) *delphiv1.FirewallPolicyEntry {
	out := &delphiv1.FirewallPolicyEntry{
		Direction: firewall.DirName(e.dir),
		Class:     firewall.ClassName(e.class),
		Identity:  e.identity,
		AnyPeer:   e.identity == firewall.AnyIdentity,
		FirstPort: uint32(e.ports.Port),
		LastPort:  uint32(e.ports.Last()),
		Ports:     e.ports.String(),
		Verdict:   verdictName(e.value.Verdict),
		Rule:      e.value.Rule,
		RuleName:  v.ruleName(e.value.Rule),
	}
	if !out.AnyPeer {
		if id, ok := v.identities[scopedID{scope, e.identity}]; ok && scoped {
			out.Labels = id.Labels
		} else if !scoped {
			out.Labels = v.labels[e.identity]
		}
	}
	return out
}

// verdictName names a policy entry's verdict: "allow", "deny" or the number.
func verdictName(verdict uint32) string {
	switch verdict {
	case firewall.VerdictAllow:
		return "allow"
	case firewall.VerdictDeny:
		return "deny"
	}
	return strconv.FormatUint(uint64(verdict), 10)
}

// ruleName names the rule with the id: "NetworkSecurityPolicy/t/ns/name ingress[2]"; empty
// for 0 and ids the snapshot does not know.
func (v *firewallView) ruleName(id uint64) string {
	r, ok := v.ruleByID[id]
	if !ok {
		return ""
	}
	return fmt.Sprintf("%s %s[%d]", r.Policy, firewall.DirName(r.Dir), r.Index)
}

// rules returns the snapshot's rules with their counters, then the counters of rules it
// does not know, ordered by id.
func (v *firewallView) rules(counters map[uint64]fwbpf.RuleStats) []*delphiv1.FirewallRule {
	out := make([]*delphiv1.FirewallRule, 0, len(v.installed.Rules))
	for _, r := range v.installed.Rules {
		fr := &delphiv1.FirewallRule{
			Id:        r.ID,
			Direction: firewall.DirName(r.Dir),
			Index:     int32(r.Index),
			Name:      v.ruleName(r.ID),
			Action:    r.Action,
			Protocol:  r.Protocol,
			Ports:     r.Ports,
			Peers:     r.Peers,
		}
		fr.Policy = r.Policy.Proto()
		if c, ok := counters[r.ID]; ok {
			fr.Counted, fr.Packets, fr.Bytes = true, c.Packets, c.Bytes
		}
		out = append(out, fr)
	}
	var unknown []uint64
	for id := range counters {
		if _, ok := v.ruleByID[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	slices.Sort(unknown)
	for _, id := range unknown {
		c := counters[id]
		out = append(out, &delphiv1.FirewallRule{Id: id, Counted: true, Packets: c.Packets, Bytes: c.Bytes})
	}
	return out
}

// scopes returns the identities of the identity entries by tenant scope, those of known
// tenants first, by name, then by scope.
func (v *firewallView) scopes(entries []identityEntry) []*delphiv1.FirewallScope {
	prefixes := map[scopedID][]netip.Prefix{}
	for _, e := range entries {
		k := scopedID{e.scope, e.id}
		prefixes[k] = append(prefixes[k], e.prefix)
	}
	byScope := map[uint32]*delphiv1.FirewallScope{}
	for k, ps := range prefixes {
		s := byScope[k.scope]
		if s == nil {
			s = &delphiv1.FirewallScope{Scope: k.scope, Tenant: v.tenants[k.scope]}
			byScope[k.scope] = s
		}
		id := &delphiv1.FirewallIdentity{Id: k.id}
		if info, ok := v.identities[k]; ok {
			id.Labels = info.Labels
		}
		slices.SortFunc(ps, netip.Prefix.Compare)
		for _, p := range ps {
			id.Prefixes = append(id.Prefixes, p.String())
		}
		s.Identities = append(s.Identities, id)
	}
	out := make([]*delphiv1.FirewallScope, 0, len(byScope))
	for _, s := range byScope {
		slices.SortFunc(s.Identities, func(a, b *delphiv1.FirewallIdentity) int { return cmp.Compare(a.GetId(), b.GetId()) })
		out = append(out, s)
	}
	// Known tenants first, by name.
	unknown := func(s *delphiv1.FirewallScope) int {
		if s.GetTenant() == "" {
			return 1
		}
		return 0
	}
	slices.SortFunc(out, func(a, b *delphiv1.FirewallScope) int {
		return cmp.Or(cmp.Compare(unknown(a), unknown(b)), strings.Compare(a.GetTenant(), b.GetTenant()),
			cmp.Compare(a.GetScope(), b.GetScope()))
	})
	return out
}

// connections describes the live connections; the endpoint entries in place tell the
// endpoint of an interface.
func (v *firewallView) connections(conns []fwbpf.Connection, endpoints []endpointEntry) []*delphiv1.FirewallConnection {
	epOf := map[uint32]*nimbusv1.ObjectKey{}
	for _, e := range endpoints {
		if info, ok := v.epByID[e.value.ID]; ok {
			epOf[e.ifindex] = info.Endpoint.Proto()
		}
	}
	out := make([]*delphiv1.FirewallConnection, 0, len(conns))
	for _, c := range conns {
		fc := &delphiv1.FirewallConnection{
			Ifindex:         c.Ifindex,
			Interface:       v.links[int(c.Ifindex)],
			Endpoint:        epOf[c.Ifindex],
			Family:          uint32(c.Family),
			Protocol:        uint32(c.Proto),
			ProtocolName:    protocolName(c.Family, c.Proto),
			SourcePort:      uint32(c.Sport),
			DestinationPort: uint32(c.Dport),
			Direction:       firewall.DirName(c.Dir),
			Idle:            durationpb.New(c.Idle),
			ExpiresIn:       durationpb.New(max(c.Timeout-c.Idle, 0)),
			Closing:         c.Flags&fwbpf.CTClosing != 0,
			Replied:         c.Flags&fwbpf.CTReplied != 0,
			Generation:      c.Gen,
			Rule:            c.Rule,
			RuleName:        v.ruleName(c.Rule),
		}
		if c.Src.IsValid() {
			fc.Source, fc.Destination = c.Src.String(), c.Dst.String()
		}
		if fc.Endpoint == nil {
			if info, ok := v.epByIfindex[c.Ifindex]; ok {
				fc.Endpoint = info.Endpoint.Proto()
			}
		}
		out = append(out, fc)
	}
	return out
}

// protocolName names an IP protocol of the family: "tcp", "udp", "icmp", "icmpv6", or
// the number.
func protocolName(family, proto uint8) string {
	switch {
	case proto == unix.IPPROTO_TCP:
		return "tcp"
	case proto == unix.IPPROTO_UDP:
		return "udp"
	case proto == unix.IPPROTO_ICMP && family == 4:
		return "icmp"
	case proto == unix.IPPROTO_ICMPV6 && family == 6:
		return "icmpv6"
	}
	return strconv.Itoa(int(proto))
}
