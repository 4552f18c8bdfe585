package firewall

import (
	"bytes"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds what the tests share: builders of objects, a longest-prefix-match
// evaluator that reads a snapshot's entries the way the eBPF program reads the trie, and
// a reference evaluator that applies the design's semantics to the objects directly.

// IP protocol numbers of test packets.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoGRE    = 47
)

// endpointObj returns an Endpoint of the tenant in the default namespace.
func endpointObj(tenant, name string, ips []string, groups ...string) *nimbusv1.Object {
	return endpointIn(tenant, "", name, ips, groups...)
}

// endpointIn returns an Endpoint of the tenant in the namespace.
func endpointIn(tenant, namespace, name string, ips []string, groups ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Namespace: namespace, Name: name},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "net", Interface: name, Ips: ips, SecurityGroups: groups,
		}},
	}
}

// groupObj returns a SecurityGroup of the tenant in the default namespace.
func groupObj(tenant, name string, cidrs ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Name: name},
		Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: cidrs}},
	}
}

// r is a rule as tests write it: peers are group names, or CIDRs when they hold a '/'.
type r struct {
	action string // "allow" or "deny"
	proto  string
	ports  []string
	peers  []string
}

// ports is shorthand for a rule's port list.
func ports(p ...string) []string { return p }

// peers is shorthand for a rule's peer list.
func peers(p ...string) []string { return p }

// policyObj returns a NetworkSecurityPolicy of the tenant in the default namespace.
func policyObj(tenant, name string, attach []string, ingress, egress []r) *nimbusv1.Object {
	return policyIn(tenant, "", name, attach, ingress, egress)
}

// policyIn returns a NetworkSecurityPolicy of the tenant in the namespace; the peers of
// its ingress rules go to fromGroups and fromCidrs, those of its egress rules to toGroups
// and toCidrs.
func policyIn(tenant, namespace, name string, attach []string, ingress, egress []r) *nimbusv1.Object {
	spec := &nimbusv1.NetworkSecurityPolicySpec{AttachGroups: attach}
	convert := func(x r, in bool) *nimbusv1.PolicyRule {
		pr := &nimbusv1.PolicyRule{Protocol: x.proto, Ports: x.ports}
		switch x.action {
		case "allow":
			pr.Action = nimbusv1.PolicyRule_ACTION_ALLOW
		case "deny":
			pr.Action = nimbusv1.PolicyRule_ACTION_DENY
		}
		for _, p := range x.peers {
			switch {
			case strings.Contains(p, "/") && in:
				pr.FromCidrs = append(pr.FromCidrs, p)
			case strings.Contains(p, "/"):
				pr.ToCidrs = append(pr.ToCidrs, p)
			case in:
				pr.FromGroups = append(pr.FromGroups, p)
			default:
				pr.ToGroups = append(pr.ToGroups, p)
			}
		}
		return pr
	}
	for _, x := range ingress {
		spec.Ingress = append(spec.Ingress, convert(x, true))
	}
	for _, x := range egress {
		spec.Egress = append(spec.Egress, convert(x, false))
	}
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Namespace: namespace, Name: name},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: spec},
	}
}

// epKey returns the key ID of an Endpoint in the default namespace.
func epKey(tenant, name string) string {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ENDPOINT, tenant, "", name).ID()
}

// trie looks keys up in a snapshot's entries by longest prefix, as the kernel's LPM trie
// does: of the entries whose first PrefixLen bits equal the key's, the longest wins.
type trie struct {
	// byLen holds the entries by prefix length; lens are the lengths, longest first.
	byLen map[uint32]map[[24]byte]Value
	lens  []uint32
}

// newTrie indexes the entries and fails the test on two entries with the same key.
func newTrie(t testing.TB, entries []Entry) *trie {
	t.Helper()
	tr := &trie{byLen: map[uint32]map[[24]byte]Value{}}
	for _, e := range entries {
		m := tr.byLen[e.Key.PrefixLen]
		if m == nil {
			m = map[[24]byte]Value{}
			tr.byLen[e.Key.PrefixLen] = m
			tr.lens = append(tr.lens, e.Key.PrefixLen)
		}
		if masked := maskData(e.Key.Data, e.Key.PrefixLen); masked != e.Key.Data {
			t.Fatalf("entry %s has bits set beyond its prefix length", e.Key)
		}
		if _, dup := m[e.Key.Data]; dup {
			t.Fatalf("two entries with key %s", e.Key)
		}
		m[e.Key.Data] = e.Value
	}
	slices.Sort(tr.lens)
	slices.Reverse(tr.lens)
	return tr
}

// maskData clears the bits of d beyond the first n.
func maskData(d [24]byte, n uint32) [24]byte {
	for i := range d {
		switch bit := uint32(i) * 8; {
		case bit >= n:
			d[i] = 0
		case bit+8 > n:
			d[i] &= byte(0xff << (8 - (n - bit)))
		}
	}
	return d
}

// lookup returns the value of the longest entry matching the key.
func (tr *trie) lookup(k Key) (Value, bool) {
	for _, n := range tr.lens {
		if n > k.PrefixLen {
			continue
		}
		if v, ok := tr.byLen[n][maskData(k.Data, n)]; ok {
			return v, true
		}
	}
	return Value{}, false
}

// packet is what a verdict is asked for: a packet of a new connection on a local
// endpoint's interface, in a direction seen from the endpoint, with the peer's address.
type packet struct {
	ifindex uint32
	dir     uint8
	peer    netip.Addr
	proto   uint8
	port    uint16
}

func (p packet) String() string {
	return "if" + strconv.Itoa(int(p.ifindex)) + " " + DirName(p.dir) + " peer " + p.peer.String() +
		" proto " + strconv.Itoa(int(p.proto)) + " port " + strconv.Itoa(int(p.port))
}

// classOf returns the protocol class of an IP protocol number.
func classOf(proto uint8) uint8 {
	switch proto {
	case protoTCP:
		return ClassTCP
	case protoUDP:
		return ClassUDP
	case protoICMP, protoICMPv6:
		return ClassICMP
	}
	return ClassOther
}

// verdict is the decision on a packet: whether it passes and the rule counted, 0 for none.
type verdict struct {
	allow bool
	rule  uint64
}

// check decides on the first packet of a connection as the program's check does: the
// endpoint entry by ifindex (none: drop), open if its direction is not protected, the
// peer's identity in the endpoint's scope (0 when no prefix holds it), then the policy
// entries of the identity and of any identity; DENY if either denies, else ALLOW if either
// allows, else the default deny of a protected direction.
func (tr *trie) check(p packet) verdict {
	ep, ok := tr.lookup(EndpointKey(p.ifindex))
	if !ok {
		return verdict{}
	}
	bit := uint32(FlagIngress)
	if p.dir == DirEgress {
		bit = FlagEgress
	}
	if ep.Flags&bit == 0 {
		return verdict{allow: true}
	}
	var identity uint32
	if v, ok := tr.lookup(IdentityKey(ep.Scope, netip.PrefixFrom(p.peer, p.peer.BitLen()))); ok {
		identity = v.ID
	}
	class := classOf(p.proto)
	var port uint16
	if class == ClassTCP || class == ClassUDP {
		port = p.port
	}
	p1, ok1 := tr.lookup(PolicyKey(ep.Subject, p.dir, class, identity, port, 16))
	p2, ok2 := tr.lookup(PolicyKey(ep.Subject, p.dir, class, AnyIdentity, port, 16))
	switch {
	case ok1 && p1.Verdict == VerdictDeny:
		return verdict{rule: p1.Rule}
	case ok2 && p2.Verdict == VerdictDeny:
		return verdict{rule: p2.Rule}
	case ok1 && p1.Verdict == VerdictAllow:
		return verdict{allow: true, rule: p1.Rule}
	case ok2 && p2.Verdict == VerdictAllow:
		return verdict{allow: true, rule: p2.Rule}
	}
	return verdict{}
}

// world is the input indexed for the reference evaluator.
type world struct {
	in Input
	// endpoints are by key ID.
	endpoints map[string]*nimbusv1.Object
	// groupsOf are, by tenant and address, the key IDs of the groups listed by the
	// endpoints that have the address.
	groupsOf map[string]map[netip.Addr][]string
	// cidrs are the CIDRs of the SecurityGroups, by key ID.
	cidrs map[string][]netip.Prefix
	// policyKeys are the keys of the policies, in order; groupIDs caches groupID.
	policyKeys []*nimbusv1.ObjectKey
	groupIDs   map[[3]string]string
}

// groupID returns the key ID of the SecurityGroup an object of key k names.
func (w *world) groupID(k *nimbusv1.ObjectKey, name string) string {
	ck := [3]string{k.GetTenant(), k.GetNamespace(), name}
	id, ok := w.groupIDs[ck]
	if !ok {
		id = nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, k.GetTenant(), k.GetNamespace(), name).ID()
		w.groupIDs[ck] = id
	}
	return id
}

// newWorld indexes the input.
func newWorld(in Input) *world {
	w := &world{
		in:        in,
		endpoints: map[string]*nimbusv1.Object{},
		groupsOf:  map[string]map[netip.Addr][]string{},
		cidrs:     map[string][]netip.Prefix{},
		groupIDs:  map[[3]string]string{},
	}
	for _, o := range in.Policies {
		w.policyKeys = append(w.policyKeys, o.Key())
	}
	for _, o := range in.Endpoints {
		k := o.Key()
		w.endpoints[k.ID()] = o
		if w.groupsOf[k.GetTenant()] == nil {
			w.groupsOf[k.GetTenant()] = map[netip.Addr][]string{}
		}
		for _, ip := range o.GetEndpoint().GetIps() {
			a := netip.MustParseAddr(ip)
			for _, g := range o.GetEndpoint().GetSecurityGroups() {
				w.groupsOf[k.GetTenant()][a] = append(w.groupsOf[k.GetTenant()][a],
					nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, k.GetTenant(), k.GetNamespace(), g).ID())
			}
		}
	}
	for _, o := range in.Groups {
		for _, c := range o.GetSecurityGroup().GetCidrs() {
			w.cidrs[o.Key().ID()] = append(w.cidrs[o.Key().ID()], netip.MustParsePrefix(c))
		}
	}
	return w
}

// reference applies the design's semantics to the objects, independently of the compiler:
// it returns whether the packet passes and the ids of the rules that match it with the
// deciding action (the denying rules when denied, the allowing ones when allowed; none for
// an open direction or a default deny).
func (w *world) reference(local string, p packet) (allow bool, deciding []uint64) {
	ep := w.endpoints[local]
	epKey := ep.Key()
	// member reports whether the peer belongs to the group with key ID g: it is an
	// address of an endpoint of the local endpoint's tenant that lists g, or lies inside
	// one of g's CIDRs.
	member := func(g string) bool {
		if slices.Contains(w.groupsOf[epKey.GetTenant()][p.peer], g) {
			return true
		}
		for _, c := range w.cidrs[g] {
			if c.Contains(p.peer) {
				return true
			}
		}
		return false
	}
	var allows, denies []uint64
	protected := false
	for i, o := range w.in.Policies {
		k := w.policyKeys[i]
		spec := o.GetNetworkSecurityPolicy()
		attached := false
		for _, g := range spec.GetAttachGroups() {
			for _, eg := range ep.GetEndpoint().GetSecurityGroups() {
				attached = attached || w.groupID(k, g) == w.groupID(epKey, eg)
			}
		}
		if !attached {
			continue
		}
		rules := spec.GetIngress()
		if p.dir == DirEgress {
			rules = spec.GetEgress()
		}
		protected = protected || len(rules) > 0
		for j, rule := range rules {
			if !w.ruleMatches(k, p, rule, member) {
				continue
			}
			id := fnv64aStd(k.ID() + "|" + DirName(p.dir) + "|" + strconv.Itoa(j))
			if rule.GetAction() == nimbusv1.PolicyRule_ACTION_DENY {
				denies = append(denies, id)
			} else {
				allows = append(allows, id)
			}
		}
	}
	switch {
	case !protected:
		return true, nil
	case len(denies) > 0:
		return false, denies
	case len(allows) > 0:
		return true, allows
	}
	return false, nil
}

// ruleMatches reports whether a rule of the policy k matches the packet, with member
// telling whether the peer belongs to a group (by key ID).
func (w *world) ruleMatches(k *nimbusv1.ObjectKey, p packet, rule *nimbusv1.PolicyRule, member func(string) bool) bool {
	if rule.GetAction() == nimbusv1.PolicyRule_ACTION_UNSPECIFIED {
		return false
	}
	switch rule.GetProtocol() {
	case "tcp":
		if p.proto != protoTCP {
			return false
		}
	case "udp":
		if p.proto != protoUDP {
			return false
		}
	case "icmp":
		if p.proto != protoICMP && p.proto != protoICMPv6 {
			return false
		}
	}
	if len(rule.GetPorts()) > 0 {
		if p.proto != protoTCP && p.proto != protoUDP {
			return false
		}
		in := false
		for _, s := range rule.GetPorts() {
			lo, hi, ok := strings.Cut(s, "-")
			if !ok {
				hi = lo
			}
			l, _ := strconv.Atoi(lo)
			h, _ := strconv.Atoi(hi)
			in = in || (int(p.port) >= l && int(p.port) <= h)
		}
		if !in {
			return false
		}
	}
	groups, cidrs := rule.GetFromGroups(), rule.GetFromCidrs()
	if p.dir == DirEgress {
		groups, cidrs = rule.GetToGroups(), rule.GetToCidrs()
	}
	if len(groups) == 0 && len(cidrs) == 0 {
		return true
	}
	for _, g := range groups {
		if member(w.groupID(k, g)) {
			return true
		}
	}
	for _, c := range cidrs {
		if netip.MustParsePrefix(c).Contains(p.peer) {
			return true
		}
	}
	return false
}

// compareWithReference checks the snapshot's verdict on every packet against the
// reference's: the same decision, and a counted rule that is one of the deciding rules (0
// when there are none).
func compareWithReference(t *testing.T, w *world, s *Snapshot, tr *trie, local string, p packet) {
	t.Helper()
	got := tr.check(p)
	allow, deciding := w.reference(local, p)
	switch {
	case got.allow != allow:
		t.Errorf("%s %s: snapshot allows=%v, reference allows=%v (deciding rules %s)",
			local, p, got.allow, allow, ruleNames(s, deciding))
	case len(deciding) == 0 && got.rule != 0:
		t.Errorf("%s %s: counted rule %s, want none", local, p, ruleNames(s, []uint64{got.rule}))
	case len(deciding) > 0 && !slices.Contains(deciding, got.rule):
		t.Errorf("%s %s: counted rule %s, want one of %s",
			local, p, ruleNames(s, []uint64{got.rule}), ruleNames(s, deciding))
	}
}

// ruleNames returns the rules' "policy|dir|index" names, for messages.
func ruleNames(s *Snapshot, ids []uint64) string {
	var names []string
	for _, id := range ids {
		name := strconv.FormatUint(id, 16)
		for _, ri := range s.Rules {
			if ri.ID == id {
				name = ruleName(ri.Policy.String(), ri.Dir, ri.Index)
			}
		}
		names = append(names, name)
	}
	return "[" + strings.Join(names, " ") + "]"
}

// sortedEntriesOK reports whether the entries are sorted by data, then prefix length.
func sortedEntriesOK(entries []Entry) bool {
	return slices.IsSortedFunc(entries, func(a, b Entry) int {
		if d := bytes.Compare(a.Key.Data[:], b.Key.Data[:]); d != 0 {
			return d
		}
		return int(a.Key.PrefixLen) - int(b.Key.PrefixLen)
	})
}
