package firewall

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Label prefixes: a peer's identity is the set of labels of the prefixes holding it.
const (
	// LabelGroup precedes a SecurityGroup's key ID: the peer is an address of an Endpoint
	// that lists the group, or lies inside one of the group's CIDRs.
	LabelGroup = "group:"
	// LabelCIDR precedes a rule's CIDR in canonical form: the peer lies inside it.
	LabelCIDR = "cidr:"
)

// Input is what a snapshot is compiled from: every desired object of the three kinds the
// firewall reads, and the endpoints of this node it enforces them on.
type Input struct {
	// Endpoints are every desired Endpoint, of every node: their addresses identify peers.
	Endpoints []*nimbusv1.Object
	// Groups are every desired SecurityGroup.
	Groups []*nimbusv1.Object
	// Policies are every desired NetworkSecurityPolicy.
	Policies []*nimbusv1.Object
	// Local are this node's endpoints whose interfaces exist: the snapshot holds an
	// endpoint entry for each, and the policies and identities they need.
	Local []Local
}

// Local is an endpoint of this node and the interface its firewall is attached to.
type Local struct {
	// Endpoint is the Endpoint's key ID, as nimbusv1.ObjectKey.ID spells it.
	Endpoint string
	// Ifindex is the index of the endpoint's host-side interface.
	Ifindex uint32
}

// Entry is one key and value of a snapshot.
type Entry struct {
	Key   Key
	Value Value
}

// Snapshot is a compiled firewall: the entries of the LPM trie the program reads, and what
// they were made from, for counters, status and naplesctl.
type Snapshot struct {
	// Gen is the snapshot's generation, a hash of its entries (see generation); never 0.
	// It is the Gen of every endpoint entry.
	Gen uint32
	// Entries are the trie's entries, sorted by key data, then prefix length.
	Entries []Entry
	// Endpoints are the local endpoints that have an entry, by endpoint key ID.
	Endpoints []EndpointInfo
	// Identities are the peer identities of the tenants of the local endpoints, by tenant
	// and id.
	Identities []IdentityInfo
	// Rules are every rule of every policy that protects a local endpoint, by policy key
	// ID, direction and index: the agent makes a counter for each.
	Rules []RuleInfo
	// Subjects are the sets of policies protecting local endpoints, by id.
	Subjects []SubjectInfo
	// Problems are the parts of the objects the compiler could not read, each naming the
	// object, the field and the value. Validation at Apply refuses all of them, so they
	// only come from objects that bypassed it. An unreadable address or CIDR of an
	// endpoint or group is left out; a rule with any unreadable part is left out whole (it
	// matches nothing, while its direction stays protected).
	Problems []error
}

// EndpointInfo describes the entry of a local endpoint.
type EndpointInfo struct {
	// Endpoint is the Endpoint's key.
	Endpoint nimbusv1.Key
	// Ifindex is the index of its interface, the key of its entry.
	Ifindex uint32
	// ID is the endpoint id, the key of its counters.
	ID uint32
	// Scope is the endpoint's tenant scope: its peers are looked up in it.
	Scope uint32
	// Subject is the id of the set of policies protecting it; 0 for none.
	Subject uint32
	// Flags are the directions that policies protect (FlagIngress, FlagEgress).
	Flags uint32
	// Policies are the keys of the policies protecting it, sorted.
	Policies []nimbusv1.Key
}

// IdentityInfo describes a peer identity in one tenant's scope.
type IdentityInfo struct {
	// ID is the identity.
	ID uint32
	// Scope and Tenant are the tenant whose endpoints look its prefixes up.
	Scope  uint32
	Tenant string
	// Labels are its labels, sorted (see LabelGroup and LabelCIDR).
	Labels []string
	// Prefixes are the prefixes whose entries map to it, sorted.
	Prefixes []netip.Prefix
}

// RuleInfo describes one rule of a policy.
type RuleInfo struct {
	// ID is the rule id, the key of its counter and the Rule of the entries it decides.
	ID uint64
	// Policy is the policy's key.
	Policy nimbusv1.Key
	// Dir is DirIngress or DirEgress: the list of the policy spec the rule is in.
	Dir uint8
	// Index is the rule's position in that list.
	Index int
	// Action is "allow" or "deny" ("unspecified" for an unreadable rule).
	Action string
	// Protocol and Ports are the rule's, as written.
	Protocol string
	Ports    []string
	// Peers are the labels of the peers the rule names; none means any peer.
	Peers []string
}

// SubjectInfo describes a set of policies protecting local endpoints.
type SubjectInfo struct {
	// ID is the subject id.
	ID uint32
	// Policies are the policies' keys, sorted.
	Policies []nimbusv1.Key
}

// Compile builds the snapshot that enforces the policies on the local endpoints. It is a
// pure function of its input: the same objects, in any order, give the same snapshot. Each
// object's key is expected once in its list; with duplicates, the last one counts.
func Compile(in Input) *Snapshot {
	c := &compiler{
		snap:      &Snapshot{},
		endpoints: map[string]*endpoint{},
		groups:    map[string]*group{},
		attached:  map[string][]*policy{},
	}
	c.readEndpoints(in.Endpoints)
	c.readGroups(in.Groups)
	c.readPolicies(in.Policies)
	c.readLocal(in.Local)
	c.protect()
	c.collectRules()
	c.compileIdentities()
	c.compileEndpoints()
	s := c.snap
	// The endpoint and identity entries sort before the policy entries (their tables are
	// 1 and 2), which compilePolicies appends in order.
	slices.SortFunc(s.Entries, compareEntries)
	c.compilePolicies()
	// The source entries sort last (their table is 4); an address listed twice makes one.
	slices.SortFunc(c.sources, compareEntries)
	s.Entries = append(s.Entries, slices.CompactFunc(c.sources, func(a, b Entry) bool { return a.Key == b.Key })...)
	s.Gen = generation(s.Entries)
	for i := range s.Entries {
		if s.Entries[i].Key.Data[0] == TableEndpoint {
			s.Entries[i].Value.Gen = s.Gen
		}
	}
	return s
}

// compareEntries orders entries by key data, then prefix length.
func compareEntries(a, b Entry) int {
	if d := bytes.Compare(a.Key.Data[:], b.Key.Data[:]); d != 0 {
		return d
	}
	return cmp.Compare(a.Key.PrefixLen, b.Key.PrefixLen)
}

// compiler holds the state of one Compile.
type compiler struct {
	snap *Snapshot
	// endpoints and groups are by key ID.
	endpoints map[string]*endpoint
	groups    map[string]*group
	// policies are sorted by key ID; attached lists them by the key ID of each group they
	// attach to.
	policies []*policy
	attached map[string][]*policy
	// local are the local endpoints, by endpoint key ID.
	local []*localEndpoint
	// protecting are the policies protecting some local endpoint, by key ID.
	protecting []*policy
	// subjects are by id.
	subjects []*subject
	// scopes are the scope ids of the tenants of the local endpoints.
	scopes map[string]uint32
	// identities lists, per tenant and label, the identities whose labels hold it.
	identities map[string]map[string][]uint32
	// sources are the source entries of the guarded local endpoints, sorted.
	sources []Entry
}

// endpoint is what the compiler reads of an Endpoint.
type endpoint struct {
	// key is its key ID, which names it in the compiler's tables and ids; ref is its key.
	key    string
	ref    nimbusv1.Key
	tenant string
	// groups are the key IDs of its security groups, sorted.
	groups []string
	addrs  []netip.Addr
	// mac is its MAC, when hasMAC: a local endpoint with one is guarded, and may send
	// from its addresses and the prefixes of sources.
	mac     [6]byte
	hasMAC  bool
	sources []netip.Prefix
}

// group is what the compiler reads of a SecurityGroup.
type group struct {
	cidrs []netip.Prefix
}

// policy is what the compiler reads of a NetworkSecurityPolicy.
type policy struct {
	// key is its key ID, which names it in the compiler's tables and ids; ref is its key.
	key    string
	ref    nimbusv1.Key
	tenant string
	// rules are its rules by direction (DirIngress, DirEgress).
	rules [2][]*rule
}

// rule is one rule of a policy, read.
type rule struct {
	info RuleInfo
	// ok tells that every part of the rule could be read; a rule that is not ok matches
	// nothing.
	ok bool
	// deny is the rule's action.
	deny bool
	// classes are the protocol classes the rule matches.
	classes []uint8
	// ports are the destination port blocks it matches.
	ports []PortPrefix
	// peers are the labels of the peers it names; none means any peer.
	peers []string
	// rank is the rule's position in the order that decides which rule an entry names:
	// policy key ID, direction, index.
	rank int
}

// localEndpoint is a local endpoint and what protects it.
type localEndpoint struct {
	ep       *endpoint
	ifindex  uint32
	policies []*policy
	subject  *subject
	flags    uint32
}

// subject is a set of policies protecting local endpoints.
type subject struct {
	id       uint32
	name     string
	tenant   string
	policies []*policy
}

// problem records an unreadable field of an object.
func (c *compiler) problem(key, field, value, reason string) {
	c.snap.Problems = append(c.snap.Problems,
		fmt.Errorf("%s: %w", key, &nimbusv1.FieldError{Field: field, Value: value, Reason: reason}))
}

// groupKey returns the key ID of the SecurityGroup name refers to from an object of the
// tenant and namespace.
func groupKey(tenant, namespace, name string) string {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, tenant, namespace, name).ID()
}

// byKey sorts objects by key ID, keeping only the last object of each key, and returns the
// key IDs alongside.
func byKey(objs []*nimbusv1.Object, kind nimbusv1.Kind) ([]*nimbusv1.Object, []*nimbusv1.ObjectKey) {
	last := make(map[string]int, len(objs))
	for i, o := range objs {
		if o.Kind() == kind {
			last[o.Key().ID()] = i
		}
	}
	ids := make([]string, 0, len(last))
	for id := range last {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]*nimbusv1.Object, len(ids))
	keys := make([]*nimbusv1.ObjectKey, len(ids))
	for i, id := range ids {
		out[i] = objs[last[id]]
		keys[i] = out[i].Key()
	}
	return out, keys
}

// readEndpoints reads every Endpoint's tenant, groups and addresses.
func (c *compiler) readEndpoints(objs []*nimbusv1.Object) {
	objs, keys := byKey(objs, nimbusv1.Kind_KIND_ENDPOINT)
	for i, o := range objs {
		k := keys[i]
		spec := o.GetEndpoint()
		ep := &endpoint{key: k.ID(), ref: k.Key(), tenant: k.GetTenant()}
		for _, g := range spec.GetSecurityGroups() {
			ep.groups = append(ep.groups, groupKey(k.GetTenant(), k.GetNamespace(), g))
		}
		slices.Sort(ep.groups)
		ep.groups = slices.Compact(ep.groups)
		for j, s := range spec.GetIps() {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				c.problem(ep.key, fmt.Sprintf("spec.ips[%d]", j), s, "not an IP address")
				continue
			}
			ep.addrs = append(ep.addrs, a)
		}
		for j, s := range spec.GetAllowedSourcePrefixes() {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				c.problem(ep.key, fmt.Sprintf("spec.allowedSourcePrefixes[%d]", j), s, "not a CIDR prefix")
				continue
			}
			ep.sources = append(ep.sources, p.Masked())
		}
		if s := spec.GetMac(); s != "" {
			if hw, err := net.ParseMAC(s); err == nil && len(hw) == 6 {
				ep.mac, ep.hasMAC = [6]byte(hw), true
			} else {
				c.problem(ep.key, "spec.mac", s, "not an Ethernet MAC address")
			}
		}
		c.endpoints[ep.key] = ep
	}
}

// readGroups reads every SecurityGroup's CIDRs.
func (c *compiler) readGroups(objs []*nimbusv1.Object) {
	objs, keys := byKey(objs, nimbusv1.Kind_KIND_SECURITY_GROUP)
	for i, o := range objs {
		key := keys[i].ID()
		g := &group{}
		for j, s := range o.GetSecurityGroup().GetCidrs() {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				c.problem(key, fmt.Sprintf("spec.cidrs[%d]", j), s, "not a CIDR prefix")
				continue
			}
			g.cidrs = append(g.cidrs, p.Masked())
		}
		c.groups[key] = g
	}
}

// readPolicies reads every NetworkSecurityPolicy's attached groups and rules.
func (c *compiler) readPolicies(objs []*nimbusv1.Object) {
	objs, keys := byKey(objs, nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY)
	for i, o := range objs {
		k := keys[i]
		spec := o.GetNetworkSecurityPolicy()
		p := &policy{key: k.ID(), ref: k.Key(), tenant: k.GetTenant()}
		c.policies = append(c.policies, p)
		var attach []string
		for _, g := range spec.GetAttachGroups() {
			attach = append(attach, groupKey(k.GetTenant(), k.GetNamespace(), g))
		}
		slices.Sort(attach)
		for _, g := range slices.Compact(attach) {
			c.attached[g] = append(c.attached[g], p)
		}
		for j, r := range spec.GetIngress() {
			p.rules[DirIngress] = append(p.rules[DirIngress], c.readRule(k, DirIngress, j, r))
		}
		for j, r := range spec.GetEgress() {
			p.rules[DirEgress] = append(p.rules[DirEgress], c.readRule(k, DirEgress, j, r))
		}
	}
}

// readRule reads one rule of the policy k.
func (c *compiler) readRule(k *nimbusv1.ObjectKey, dir uint8, index int, r *nimbusv1.PolicyRule) *rule {
	key := k.ID()
	field := fmt.Sprintf("spec.%s[%d]", DirName(dir), index)
	out := &rule{
		ok: true,
		info: RuleInfo{
			Policy:   k.Key(),
			Dir:      dir,
			Index:    index,
			Protocol: r.GetProtocol(),
			Ports:    slices.Clone(r.GetPorts()),
		},
	}
	bad := func(f, value, reason string) {
		c.problem(key, field+f, value, reason)
		out.ok = false
	}
	switch r.GetAction() {
	case nimbusv1.PolicyRule_ACTION_ALLOW:
		out.info.Action = "allow"
	case nimbusv1.PolicyRule_ACTION_DENY:
		out.info.Action, out.deny = "deny", true
	default:
		out.info.Action = "unspecified"
		bad(".action", r.GetAction().String(), "must be ACTION_ALLOW or ACTION_DENY")
	}
	switch r.GetProtocol() {
	case "":
		out.classes = []uint8{ClassTCP, ClassUDP, ClassICMP, ClassOther}
	case "tcp":
		out.classes = []uint8{ClassTCP}
	case "udp":
		out.classes = []uint8{ClassUDP}
	case "icmp":
		out.classes = []uint8{ClassICMP}
	default:
		bad(".protocol", r.GetProtocol(), `must be "tcp", "udp", "icmp" or empty`)
	}
	if len(r.GetPorts()) == 0 {
		out.ports = []PortPrefix{{}}
	} else if p := r.GetProtocol(); p == "" || p == "icmp" {
		bad(".protocol", p, "ports need protocol tcp or udp")
	}
	for j, s := range r.GetPorts() {
		pr, err := ParsePortRange(s)
		if err != nil {
			bad(fmt.Sprintf(".ports[%d]", j), s, ErrBadPorts.Error())
			continue
		}
		out.ports = append(out.ports, pr.Prefixes()...)
	}
	// The peer of an ingress rule is the packet's source, that of an egress rule its
	// destination: the other fields name nothing the rule could match.
	groups, cidrs, gf, cf := r.GetFromGroups(), r.GetFromCidrs(), "fromGroups", "fromCidrs"
	og, oc, ogf, ocf := r.GetToGroups(), r.GetToCidrs(), "toGroups", "toCidrs"
	if dir == DirEgress {
		groups, cidrs, gf, cf, og, oc, ogf, ocf = og, oc, ogf, ocf, groups, cidrs, gf, cf
	}
	wrongSide := fmt.Sprintf("an %s rule names its peers in %s and %s", DirName(dir), gf, cf)
	for j, g := range og {
		bad(fmt.Sprintf(".%s[%d]", ogf, j), g, wrongSide)
	}
	for j, s := range oc {
		bad(fmt.Sprintf(".%s[%d]", ocf, j), s, wrongSide)
	}
	for _, g := range groups {
		out.peers = append(out.peers, LabelGroup+groupKey(k.GetTenant(), k.GetNamespace(), g))
	}
	for j, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			bad(fmt.Sprintf(".%s[%d]", cf, j), s, "not a CIDR prefix")
			continue
		}
		out.peers = append(out.peers, LabelCIDR+p.Masked().String())
	}
	out.info.Peers = slices.Clone(out.peers)
	return out
}

// readLocal reads the local endpoints, leaving out those with no Endpoint, no interface
// or an interface another endpoint already has.
func (c *compiler) readLocal(locals []Local) {
	locals = slices.Clone(locals)
	slices.SortFunc(locals, func(a, b Local) int {
		return cmp.Or(strings.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Ifindex, b.Ifindex))
	})
	byIfindex := map[uint32]string{}
	for _, l := range locals {
		ep := c.endpoints[l.Endpoint]
		switch {
		case ep == nil:
			c.problem(l.Endpoint, "local endpoint", strconv.FormatUint(uint64(l.Ifindex), 10), "no such Endpoint")
		case l.Ifindex == 0:
			c.problem(l.Endpoint, "local endpoint", "0", "no interface index")
		case len(c.local) > 0 && c.local[len(c.local)-1].ep == ep:
			c.problem(l.Endpoint, "local endpoint", strconv.FormatUint(uint64(l.Ifindex), 10),
				"the endpoint is local on another interface too")
		case byIfindex[l.Ifindex] != "":
			c.problem(l.Endpoint, "local endpoint", strconv.FormatUint(uint64(l.Ifindex), 10),
				"the interface is "+byIfindex[l.Ifindex]+"'s")
		default:
			byIfindex[l.Ifindex] = l.Endpoint
			c.local = append(c.local, &localEndpoint{ep: ep, ifindex: l.Ifindex})
		}
	}
}

// protect finds the policies protecting each local endpoint, the directions they protect
// and the subjects.
func (c *compiler) protect() {
	bySubject := map[string]*subject{}
	protecting := map[*policy]bool{}
	for _, l := range c.local {
		for _, g := range l.ep.groups {
			l.policies = append(l.policies, c.attached[g]...)
		}
		slices.SortFunc(l.policies, func(a, b *policy) int { return strings.Compare(a.key, b.key) })
		l.policies = slices.Compact(l.policies)
		if len(l.policies) == 0 {
			continue
		}
		keys := make([]string, len(l.policies))
		for i, p := range l.policies {
			keys[i] = p.key
			protecting[p] = true
			if len(p.rules[DirIngress]) > 0 {
				l.flags |= FlagIngress
			}
			if len(p.rules[DirEgress]) > 0 {
				l.flags |= FlagEgress
			}
		}
		name := strings.Join(keys, "\n")
		s := bySubject[name]
		if s == nil {
			s = &subject{name: name, tenant: l.ep.tenant, policies: l.policies}
			bySubject[name] = s
			c.subjects = append(c.subjects, s)
		}
		l.subject = s
	}
	names := make([]string, 0, len(c.subjects))
	for _, s := range c.subjects {
		names = append(names, s.name)
	}
	ids := ids32(names)
	for _, s := range c.subjects {
		s.id = ids[s.name]
	}
	slices.SortFunc(c.subjects, func(a, b *subject) int { return cmp.Compare(a.id, b.id) })
	for _, s := range c.subjects {
		// The policies of a subject are those its name joins, in order.
		info := SubjectInfo{ID: s.id, Policies: make([]nimbusv1.Key, len(s.policies))}
		for i, p := range s.policies {
			info.Policies[i] = p.ref
		}
		c.snap.Subjects = append(c.snap.Subjects, info)
	}
	for _, p := range c.policies {
		if protecting[p] {
			c.protecting = append(c.protecting, p)
		}
	}
}

// collectRules ranks the rules of the protecting policies and gives them ids.
func (c *compiler) collectRules() {
	var names []string
	for _, p := range c.protecting {
		for _, rules := range p.rules {
			for _, r := range rules {
				r.rank = len(names)
				names = append(names, ruleName(p.key, r.info.Dir, r.info.Index))
			}
		}
	}
	ids := ids64(slices.Clone(names))
	for _, p := range c.protecting {
		for _, rules := range p.rules {
			for _, r := range rules {
				r.info.ID = ids[ruleName(p.key, r.info.Dir, r.info.Index)]
				c.snap.Rules = append(c.snap.Rules, r.info)
			}
		}
	}
}

// ruleName is the string a rule's id is the hash of.
func ruleName(policy string, dir uint8, index int) string {
	return policy + "|" + DirName(dir) + "|" + strconv.Itoa(index)
}

// prefixLabels is a prefix of a tenant's identity table and the labels it gives itself.
type prefixLabels struct {
	prefix netip.Prefix
	labels []string
}

// compileIdentities computes the identities of the peers of the local endpoints' tenants
// and their entries. Only labels that a rule of a protecting policy names matter; the
// prefixes are every endpoint address with the labels of its groups that matter, every
// CIDR of a group that matters and every rule CIDR. A prefix's identity is the union of
// the labels of all prefixes of its tenant and family that hold it, itself included, so
// that the longest prefix holding an address gives all its labels.
func (c *compiler) compileIdentities() {
	var tenants []string
	for _, l := range c.local {
		tenants = append(tenants, l.ep.tenant)
	}
	c.scopes = ids32(tenants)

	// The labels that matter, by tenant.
	matter := map[string]map[string]bool{}
	for _, p := range c.protecting {
		for _, rules := range p.rules {
			for _, r := range rules {
				if !r.ok {
					continue
				}
				for _, l := range r.peers {
					if matter[p.tenant] == nil {
						matter[p.tenant] = map[string]bool{}
					}
					matter[p.tenant][l] = true
				}
			}
		}
	}
	if len(matter) == 0 {
		return
	}

	// The prefixes of each tenant with the labels each gives itself.
	own := map[string]map[netip.Prefix][]string{}
	add := func(tenant string, p netip.Prefix, label string) {
		m := own[tenant]
		if m == nil {
			m = map[netip.Prefix][]string{}
			own[tenant] = m
		}
		m[p] = append(m[p], label)
	}
	for _, ep := range c.endpoints {
		m := matter[ep.tenant]
		if m == nil {
			continue
		}
		for _, g := range ep.groups {
			if l := LabelGroup + g; m[l] {
				for _, a := range ep.addrs {
					add(ep.tenant, netip.PrefixFrom(a, a.BitLen()), l)
				}
			}
		}
	}
	for tenant, m := range matter {
		for l := range m {
			switch {
			case strings.HasPrefix(l, LabelGroup):
				if g := c.groups[strings.TrimPrefix(l, LabelGroup)]; g != nil {
					for _, p := range g.cidrs {
						add(tenant, p, l)
					}
				}
			case strings.HasPrefix(l, LabelCIDR):
				add(tenant, netip.MustParsePrefix(strings.TrimPrefix(l, LabelCIDR)), l)
			}
		}
	}

	// Walk each tenant's prefixes in order, a prefix after those holding it, with a
	// stack of the prefixes holding the current one.
	type identity struct {
		id     uint32
		tenant string
		name   string
		labels []string
		prefix []netip.Prefix
	}
	byName := map[string]map[string]*identity{} // by tenant, then name
	var all []*identity
	var names []string
	type prefixEntry struct {
		tenant string
		prefix netip.Prefix
		id     *identity
	}
	var entries []prefixEntry
	for tenant, m := range own {
		list := make([]prefixLabels, 0, len(m))
		for p, labels := range m {
			slices.Sort(labels)
			list = append(list, prefixLabels{p, slices.Compact(labels)})
		}
		slices.SortFunc(list, func(a, b prefixLabels) int { return a.prefix.Compare(b.prefix) })
		byName[tenant] = map[string]*identity{}
		var stack []prefixLabels
		for _, pl := range list {
			for len(stack) > 0 && !holds(stack[len(stack)-1].prefix, pl.prefix) {
				stack = stack[:len(stack)-1]
			}
			labels := pl.labels
			if len(stack) > 0 {
				labels = union(stack[len(stack)-1].labels, labels)
			}
			stack = append(stack, prefixLabels{pl.prefix, labels})
			name := strings.Join(labels, "\n")
			id := byName[tenant][name]
			if id == nil {
				id = &identity{tenant: tenant, name: name, labels: labels}
				byName[tenant][name] = id
				all = append(all, id)
				names = append(names, name)
			}
			id.prefix = append(id.prefix, pl.prefix)
			entries = append(entries, prefixEntry{tenant, pl.prefix, id})
		}
	}
	ids := ids32(names)
	for _, id := range all {
		id.id = ids[id.name]
	}
	for _, e := range entries {
		c.snap.Entries = append(c.snap.Entries, Entry{
			Key:   IdentityKey(c.scopes[e.tenant], e.prefix),
			Value: Value{ID: e.id.id},
		})
	}
	slices.SortFunc(all, func(a, b *identity) int {
		return cmp.Or(strings.Compare(a.tenant, b.tenant), cmp.Compare(a.id, b.id))
	})
	c.identities = map[string]map[string][]uint32{}
	for _, id := range all {
		n := id.id
		c.snap.Identities = append(c.snap.Identities, IdentityInfo{
			ID: n, Scope: c.scopes[id.tenant], Tenant: id.tenant, Labels: id.labels, Prefixes: id.prefix,
		})
		m := c.identities[id.tenant]
		if m == nil {
			m = map[string][]uint32{}
			c.identities[id.tenant] = m
		}
		for _, l := range id.labels {
			m[l] = append(m[l], n)
		}
	}
}

// holds reports whether p holds every address of q.
func holds(p, q netip.Prefix) bool {
	return p.Bits() <= q.Bits() && p.Contains(q.Addr())
}

// union returns the sorted union of two sorted string sets, sharing a when b adds
// nothing.
func union(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch d := strings.Compare(a[i], b[j]); {
		case d < 0:
			out = append(out, a[i])
			i++
		case d > 0:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	out = append(out, a[i:]...)
	out = append(out, b[j:]...)
	if len(out) == len(a) {
		return a
	}
	return out
}

// compilePolicies computes the policy entries of every subject, in key order. For every
// lookup (subject, direction, class, identity), the entries are the port blocks of the
// rules that match the identity (AnyIdentity: the rules that name no peer) and the class,
// each with the verdict of all the rules whose blocks hold it: DENY if any denies, naming
// the first that does, else ALLOW, naming the first that allows. Since the blocks holding
// a port are nested, the longest of them is held by all others, so its entry alone gives
// the verdict of all rules matching the port. Identities matched by the same rules share
// one computation.
func (c *compiler) compilePolicies() {
	rules := make([]*rule, len(c.snap.Rules))
	for _, p := range c.protecting {
		for _, dirRules := range p.rules {
			for _, r := range dirRules {
				rules[r.rank] = r
			}
		}
	}
	// lookups are the subject, direction and identities of each group of lookups, and
	// the blocks of each identity by class.
	type lookups struct {
		subject uint32
		dir     uint8
		ids     []uint32
		blocks  []*[ClassOther + 1][]block
	}
	var all []lookups
	n := 0
	for _, s := range c.subjects {
		for dir := range uint8(2) {
			// The ranks of the rules matching each identity, in rank order.
			matching := map[uint32][]int{}
			for _, p := range s.policies {
				for _, r := range p.rules[dir] {
					if !r.ok {
						continue
					}
					add := func(id uint32) {
						if m := matching[id]; len(m) == 0 || m[len(m)-1] != r.rank {
							matching[id] = append(m, r.rank)
						}
					}
					if len(r.peers) == 0 {
						add(AnyIdentity)
					}
					for _, l := range r.peers {
						for _, id := range c.identities[s.tenant][l] {
							add(id)
						}
					}
				}
			}
			l := lookups{subject: s.id, dir: dir, ids: make([]uint32, 0, len(matching))}
			for id := range matching {
				l.ids = append(l.ids, id)
			}
			slices.Sort(l.ids)
			// The blocks of each class, computed once for each set of matching rules.
			byRules := map[string]*[ClassOther + 1][]block{}
			for _, id := range l.ids {
				name := rankSet(matching[id])
				b := byRules[name]
				if b == nil {
					b = &[ClassOther + 1][]block{}
					for class := uint8(ClassTCP); class <= ClassOther; class++ {
						b[class] = closure(rules, matching[id], class)
					}
					byRules[name] = b
				}
				l.blocks = append(l.blocks, b)
				for _, cb := range b {
					n += len(cb)
				}
			}
			all = append(all, l)
		}
	}
	c.snap.Entries = slices.Grow(c.snap.Entries, n)
	for _, l := range all {
		for class := uint8(ClassTCP); class <= ClassOther; class++ {
			for i, id := range l.ids {
				for _, b := range l.blocks[i][class] {
					v := Value{Verdict: VerdictAllow}
					if b.deny >= 0 {
						v = Value{Verdict: VerdictDeny, Rule: rules[b.deny].info.ID}
					} else {
						v.Rule = rules[b.allow].info.ID
					}
					c.snap.Entries = append(c.snap.Entries, Entry{
						Key:   PolicyKey(l.subject, l.dir, class, id, b.port.Port, b.port.Bits),
						Value: v,
					})
				}
			}
		}
	}
}

// rankSet returns a name for a set of rule ranks.
func rankSet(ranks []int) string {
	b := make([]byte, 0, 4*len(ranks))
	for _, r := range ranks {
		b = binary.AppendUvarint(b, uint64(r))
	}
	return string(b)
}

// block is a port block of a lookup and the first denying and allowing rules whose
// blocks hold it, by rank, -1 for none.
type block struct {
	port        PortPrefix
	deny, allow int
}

// closure returns the blocks of the rules (ranks, ascending) that match the class, sorted
// by port and length, each with the first denying and allowing rules holding it. It sorts
// the blocks and walks them with a stack of the blocks holding the current one.
func closure(rules []*rule, ranks []int, class uint8) []block {
	var own []block
	for _, rank := range ranks {
		r := rules[rank]
		if !slices.Contains(r.classes, class) {
			continue
		}
		for _, p := range r.ports {
			b := block{port: p, deny: -1, allow: -1}
			if r.deny {
				b.deny = rank
			} else {
				b.allow = rank
			}
			own = append(own, b)
		}
	}
	if len(own) == 0 {
		return nil
	}
	slices.SortStableFunc(own, func(a, b block) int {
		return cmp.Or(cmp.Compare(a.port.Port, b.port.Port), cmp.Compare(a.port.Bits, b.port.Bits))
	})
	out := own[:0]
	var stack []block
	for i := 0; i < len(own); {
		// Merge the rules of one block: ranks ascend, so the first of each kind stays.
		b := own[i]
		for i++; i < len(own) && own[i].port == b.port; i++ {
			b.deny = firstRank(b.deny, own[i].deny)
			b.allow = firstRank(b.allow, own[i].allow)
		}
		for len(stack) > 0 && !stack[len(stack)-1].port.Contains(b.port) {
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 {
			top := stack[len(stack)-1]
			b.deny = firstRank(b.deny, top.deny)
			b.allow = firstRank(b.allow, top.allow)
		}
		stack = append(stack, b)
		out = append(out, b)
	}
	return out
}

// firstRank returns the lower of two ranks, -1 standing for none.
func firstRank(a, b int) int {
	if a < 0 || (b >= 0 && b < a) {
		return b
	}
	return a
}

// compileEndpoints makes the entry of every local endpoint and, for one with a MAC, the
// source entries of its MAC and addresses, in sources.
func (c *compiler) compileEndpoints() {
	keys := make([]string, len(c.local))
	for i, l := range c.local {
		keys[i] = l.ep.key
	}
	ids := ids32(keys)
	for _, l := range c.local {
		info := EndpointInfo{
			Endpoint: l.ep.ref,
			Ifindex:  l.ifindex,
			ID:       ids[l.ep.key],
			Scope:    c.scopes[l.ep.tenant],
			Flags:    l.flags,
		}
		if l.subject != nil {
			info.Subject = l.subject.id
		}
		for _, p := range l.policies {
			info.Policies = append(info.Policies, p.ref)
		}
		if l.ep.hasMAC {
			info.Flags |= FlagGuard
			c.sources = append(c.sources, Entry{Key: SourceMACKey(l.ifindex, l.ep.mac), Value: Value{ID: info.ID}})
			for _, a := range l.ep.addrs {
				c.sources = append(c.sources, Entry{Key: SourceKey(l.ifindex, a.Unmap()), Value: Value{ID: info.ID}})
			}
			for _, p := range l.ep.sources {
				c.sources = append(c.sources, Entry{Key: SourcePrefixKey(l.ifindex, p), Value: Value{ID: info.ID}})
			}
		}
		c.snap.Endpoints = append(c.snap.Endpoints, info)
		c.snap.Entries = append(c.snap.Entries, Entry{
			Key:   EndpointKey(l.ifindex),
			Value: Value{ID: info.ID, Subject: info.Subject, Flags: info.Flags, Scope: info.Scope},
		})
	}
}
