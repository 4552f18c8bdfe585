// Package linux is the HAL's Linux backend: reconcilers that program the kernel through
// netlink, each bound to one network namespace.
//
// Everything the backend creates is marked so that it can be found again: routes carry the
// route protocol RouteProtocol ("naples" in /etc/iproute2/rt_protos terms), and a route is
// identified by its table, destination and metric, typed values derived from the parsed
// object (an IPv6 route with metric 0 is the kernel's metric 1024). A restarted agent
// therefore adopts what a previous one created instead of creating twins, and kernel state
// that naples did not create is never modified or removed, in either family. The store the
// reconcilers read must declare the indexes Indexes returns, by which they find the object
// that owns a kernel route.
//
// The route reconciler reads the kernel from a hal.Mirror of every route in its namespace
// (`ip route show table all`): one dump fills it, the observer's route subscription keeps
// it current, and the observer's start (also after an overflow) and every sweep dump
// again. A reconcile compares with the mirror and writes only what differs: `ip route
// replace` over a naples route, `ip route add` where the mirror holds none, so that a route
// someone else just added, which the mirror has not heard of yet, fails the write instead
// of being overwritten; deletes name protocol 241, which the kernel matches, so they never
// remove a foreign route either.
//
// # The overlay
//
// Three reconcilers make the overlay, VXLAN networks that span nodes. The node reconciler
// (NodeReconciler) programs nothing: it reports this host's Node PROGRAMMED once an
// interface holds its VTEP address (spec.vtepAddress; at once when it has none), PENDING
// with ReasonWaitingForAddress until then, and the other nodes PROGRAMMED. The network
// reconciler (NetworkReconciler) gives every Network a bridge, which holds its gateway
// addresses, and a VXLAN device, a port of the bridge, with head-end replication to the
// other nodes that have endpoints in the network; it routes each subnet through the bridge
// in its tenant's policy-routing table (TenantTable), which rules send what enters through
// the bridge to, so that networks of one tenant route to each other and never to another
// tenant's; the programs of package gwbpf on the bridge mark what comes up from it with
// the tenant's mark, by which the host's own answers (echo replies, ICMP errors, TCP
// resets) route in the tenant's table too (GatewayMark). The endpoint reconciler (EndpointReconciler) attaches a local endpoint's host
// interface to its network's bridge, as a port that does not learn, with the static FDB
// entry of the endpoint's MAC on it, and makes a remote endpoint reachable through the
// tunnel to its node's VTEP: static FDB entries of its MAC on the VXLAN device and the
// bridge, and a permanent neighbour on the bridge for each of its addresses. A bridge's
// entry that moves to another port (by hand, say) is put back on the port of the
// endpoint that owns the MAC. Objects that
// wait for another (a network for this host's Node, an endpoint for its network) are
// PENDING, and the HAL reconciles them when that one comes (hal.Dependent).
//
// The overlay's kernel objects are named and marked after the key ID K of the object that
// owns them. A network's devices are BridgeName(K) and VXLANName(K), "nbr" and "nvx"
// followed by 8 hex digits of the SHA-256 of K, the same on every node; every link the
// overlay creates has the alias OwnerAlias(K), "naples:K" (`ip link set DEV alias`), and a
// link of such a name without the alias is someone else's: the network is FAILED with
// reason hal.ReasonConflict and the link left alone. Overlay routes and the rules of a
// network's bridge carry protocol 242 (OverlayRouteProtocol), not 241, so the route
// reconciler never sweeps them. Endpoints create no link: their FDB entries and neighbours
// are the static and permanent ones on a network's devices, and an interface is theirs
// while it is a port of a network's bridge.
//
// # Interfaces
//
// The interface reconciler (InterfaceReconciler) programs Interface objects, host NICs
// that someone else created and that naples never creates or deletes: their
// administrative state, MTU and addresses. The addresses it adds carry address protocol
// 242 (AddressProtocol, the kernel's IFA_PROTO), so a restarted agent recognises them and
// never removes an address it did not add; one that an object lists and someone else
// added is left alone, and the object is FAILED with reason hal.ReasonConflict, as is an
// object that names a link naples created for another object. Every StatsInterval its
// observer refreshes the links' counters, which the objects' statuses report.
//
// # The reconcilers in brief
//
// Each reconciler's logic, in at most 100 words; its type's documentation says the rest.
//
// RouteReconciler: a Route is its prefix in its table with its next hops and metric,
// protocol 241. Compare with the route mirror; replace a naples route that differs, add
// where the table holds none (so a foreign route fails the write, never is overwritten),
// delete by protocol. Sweep removes protocol-241 routes no Route owns.
//
// InterfaceReconciler: an Interface is a host NIC naples never creates: set its admin
// state and MTU, add the listed addresses with address protocol 242, remove the
// protocol-242 addresses it no longer lists. An address someone else added, or a link
// another object's devices hold, is a Conflict. Status carries the link's state and
// counters, refreshed every StatsInterval.
//
// NodeReconciler: programs nothing. This host's Node is PROGRAMMED once a local address
// equals its VTEP address (PENDING, WaitingForAddress, until then); other Nodes are
// PROGRAMMED. The observer enqueues this host's Node when that address comes or goes.
//
// NetworkReconciler: a Network is a bridge and a VXLAN port with deterministic names and
// an owner alias, the gateway addresses on the bridge, one head-end replication entry per
// other node with endpoints in it, and per subnet a route in its tenant's table with the
// rules that send the bridge's traffic there. Its MTU is spec.mtu or the underlay's less
// VXLAN's overhead. The gateway's answers (network_gateway_linux.go) add the gwbpf marks,
// one fwmark rule per family and the reflect sysctls while any gateway exists. Waits for
// this host's Node; a foreign link of its names, or a VNI taken, is a Conflict.
//
// EndpointReconciler: a local Endpoint's host interface becomes a non-learning port of its
// network's bridge with the static FDB entry of its MAC, and gets the firewall attached;
// a remote one gets static FDB entries towards its node's VTEP on the VXLAN device and
// bridge and a permanent neighbour per address. Waits for its network (and, remote, its
// node's VTEP). Of two endpoints claiming one MAC, address or interface, the holder keeps
// it; the other is a Conflict. Releasing an interface puts its MTU back.
//
// Firewall (policies, groups, endpoints' programs): one goroutine compiles every policy,
// group and endpoint into a snapshot (identities, rules, per-endpoint policy) and swaps it
// into the pinned eBPF maps whole; a policy or group is PROGRAMMED once a snapshot that
// enforces it is in place. A policy naming a missing group is PENDING
// (WaitingForSecurityGroup). Endpoints' statuses carry their counters, policies' their
// rule hits.
//
// # Reading and writing the kernel
//
// Every reconciler reads the kernel from mirrors (hal.Mirror) of the objects it cares
// for, each loaded by one dump over a socket of its own (started over when the kernel
// reports it interrupted by a change), kept current by the notifications its observer
// hears, which it decodes as the dumps are decoded, and dumped afresh when the observer
// starts (also after an overflow) and at every sweep. The observers of one namespace
// hear the kernel through one KernelView, the reconcilers' View option: one
// subscription, which reads notifications many to a recvmmsg, and a queue per observer
// of the groups it watches.
//
// The kernel tables that several reconcilers read are the view's, held once per
// namespace (kview_table_linux.go): the links first, keyed by interface index, found by
// name, by owner alias and (networks' bridges) by their tenant's GatewayMark through
// the table's indexes; the interface, endpoint and network reconcilers read them there,
// the route reconciler a next hop's device by name, and the firewall's input the
// indexes of the endpoints' interfaces (dumping the table afresh only when no
// subscription keeps it current). No reconciler keeps a link mirror
// of its own. The view loads a table with one dump when its subscription starts (also
// after an overflow), keeps it current from the subscription before it hands the
// notifications on, and queues each change, computed once, to every reconciler that
// reads the table, between the notifications its observer watches; a reconciler writes
// through the table naming itself (hal.Mirror.ExpectBy), so that the echo of its write
// is its own and another reconciler still hears of the change. A sweep, and the
// interface reconciler's refresh of counters, dump the table afresh, and every reader
// hears of what the dump found changed.
// The network reconciler reads what one network needs through the tables' indexes
// (hal.Index: addresses and routes by interface, rules by input interface, head-end
// replication entries by VXLAN device), never by a walk of a whole table. The sockets, requests and messages are package rtnl's; this
// package holds what they mean.
//
// The view's tables beside the links, each a viewTable of its own key and value in a
// file of its own:
//
//   - routes (kview_routes_linux.go): every IPv4 and IPv6 route of every table but
//     cached ones, keyed by table, destination and metric (routeID), holding the
//     protocol, the next hops, the preferred source, the output interface and the
//     scope; found by protocol (the sweep of naples's routes), by output interface and
//     by preferred source, and counted by the links their IPv4 next hops go through,
//     which tells the route reconciler's observer when the kernel may have flushed some
//     without a word. The route reconciler reads and writes them there, and the network
//     reconciler its overlay routes (those of OverlayRouteProtocol).
//   - addresses (kview_addrs_linux.go): every IPv4 and IPv6 address of every link, keyed
//     by link index and address with prefix length (addrKey), holding its flags,
//     protocol and whether it has a peer; found by link, by address and by protocol. The node reconciler finds
//     its VTEP address there; the interface reconciler reads and writes a link's
//     addresses there, and the network reconciler a bridge's gateway addresses (and
//     finds the underlay by the VTEP address).
//   - rules (kview_rules_linux.go): the IPv4 and IPv6 policy-routing rules that select
//     packets by their input interface or their whole firewall mark alone, keyed by
//     those selectors, priority and action (ruleKey), holding the protocol; found by
//     input interface. The network reconciler reads and writes its rules (those of the
//     overlay's shape) there.
//   - neighbours (kview_neigh_linux.go): the static FDB entries without a VLAN (a
//     device's own, keyed by device and MAC, holding the remote VTEP; a bridge's,
//     keyed by bridge and MAC, holding the port), the VXLAN devices' head-end
//     replication entries (keyed by device and destination, found by device) and the
//     permanent IP neighbours (keyed by device and IP, holding the MAC), two viewTables
//     of their own keys fed by the same notifications, each loaded by a dump of its
//     own. The endpoint reconciler reads and writes the static entries and the
//     neighbours there, and the network reconciler its head-end replication entries.
//
// Readers outside the reconcilers (the agent's `dataplane` view) read the namespace
// through a KernelRead (kview_read_linux.go): links, bridge ports and addresses from the
// view's tables while an observer keeps them current, by a dump otherwise, every dump
// of one reading on one socket. FDB entries and neighbours are dumped, since their
// tables hold the kinds the reconcilers write alone.
//
// Writes go to the kernel through a batcher (rtnl.Batcher), one netlink socket per
// KernelView (and Timeout) that the reconcilers sharing it write through: a writer
// goroutine sends every request pending whenever it is free, many in one sendmsg, each
// with its own sequence number and NLM_F_ACK, and each caller gets the kernel's answer
// to its own request, so that concurrent reconciles share system calls and a write the
// kernel refuses fails only its own reconcile.
//
// Every netlink request is bounded by the reconciler's Timeout option and checks its
// context first, so a stuck kernel fails a reconcile, which is retried, instead of
// pinning a worker or blocking shutdown; a request whose context ends before it is sent
// is not sent.
package linux
