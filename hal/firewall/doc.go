// Package firewall computes what the eBPF firewall enforces: from the desired Endpoint,
// SecurityGroup and NetworkSecurityPolicy objects it builds a snapshot, the entries of
// the LPM trie the program looks endpoints, peer identities and policy verdicts up in,
// with deterministic ids, so that an agent that restarts builds the same snapshot. It is
// pure Go: the Linux backend (hal/linux) loads the program and writes the snapshot.
//
// # Compiling
//
// Compile takes every desired object of the three kinds and the endpoints of this node
// (Local) and returns a Snapshot: its entries, sorted, and what they were made from. A
// snapshot has three tables, told apart by the first byte of a key (layout.go):
//
//   - one endpoint entry per local endpoint, by interface index: its endpoint id, its
//     tenant's scope, its subject (the set of policies protecting it, 0 for none), the
//     directions those policies protect, and the snapshot's generation;
//   - identity entries, by tenant scope and address prefix: the identity of the peers the
//     prefix holds, the set of labels of every prefix holding them;
//   - policy entries, by subject, direction, protocol class, peer identity (or
//     AnyIdentity) and destination port block: ALLOW or DENY and the deciding rule.
//
// Names in objects (an endpoint's security groups, a policy's attached groups, a rule's
// groups) name SecurityGroups of the object's own tenant and namespace. A policy protects
// the local endpoints that list one of its attached groups. A peer's labels are
// "group:<SecurityGroup key ID>" for each group it belongs to (it is an address of an
// Endpoint of the tenant that lists the group, or lies inside one of the group's CIDRs)
// and "cidr:<prefix>" for each rule CIDR holding it; only labels that a rule of a policy
// protecting a local endpoint names are kept, so that objects that change no verdict
// change no entry. The peers of an ingress rule are its fromGroups and fromCidrs, those
// of an egress rule its toGroups and toCidrs; a rule naming none matches any peer. A name
// with no SecurityGroup object compiles as a group of no CIDRs, whose members are the
// endpoints that list it; GroupRefs lists the fields of an object that name groups, so
// that the agent can report the names that have none.
//
// A policy entry's verdict is that of every rule covering its key: DENY if any of them
// denies, else ALLOW. Because the port blocks of a lookup that hold one port are nested,
// the longest of them carries the verdict of all rules matching the port, and a longest
// prefix lookup is all the program does. Port ranges become aligned power-of-two blocks
// (PortRange.Prefixes); a rule with no ports has one block of every port.
//
// # Ids
//
// Ids are FNV-1a hashes of the strings that define them: scope of the tenant, endpoint id
// of the endpoint's key ID, identity of its sorted labels, subject of its sorted policy
// key IDs (all joined by "\n"), rule id (64 bits) of "policy key ID|ingress or
// egress|index". Collisions are resolved by linear probing in sorted order of the
// strings, skipping 0 and AnyIdentity. The generation is a hash of the entries with their
// Gen fields zero, so the same objects always give the same ids and generation, and an
// agent that restarts keeps every tracked connection valid.
//
// # Bad input
//
// Validation at Apply refuses what the compiler cannot read; objects that bypassed it
// still compile. Each unreadable part is reported in Snapshot.Problems; an unreadable
// address or CIDR of an endpoint or group is left out, and a rule with any unreadable
// part matches nothing while its direction stays protected.
package firewall
