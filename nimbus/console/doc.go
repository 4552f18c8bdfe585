// Package console is nimbus's read-only web console: a few server-rendered pages
// (html/template) with a little plain JavaScript, embedded in the binary, that show what
// the Server knows, for an operator who would rather look than read.
//
// # Pages
//
//   - / (the propagation matrix): objects × nodes, each cell coloured by the phase of the
//     object on the node (PROGRAMMED green, PENDING grey, FAILED red, STALE amber),
//     filterable by kind, tenant and phase, with a failing node's reason and message on
//     hover and on click. The page subscribes to /events, a server-sent-events stream fed
//     by the Server's status stream (WatchStatusLocal), and updates its cells in place.
//   - /nodes: every node the Server knows of, connected or stale, its agent's version, its
//     watermark, its last report and how many objects it reports FAILED.
//   - /object?key=Kind/tenant/namespace/name: one object's spec as YAML (as naplesctl get
//     -o yaml prints it), its generation and the generations its nodes report, and every
//     node's status.
//   - /flows: the latest flow records the agents' flow taps sent while a flows page was
//     open, as a table and as a graph of who talks to whom (denied edges red and dashed),
//     refreshed live.
//
// Nothing the console serves changes state: every handler only reads.
//
// # Limits
//
// The matrix shows at most Options.MaxObjects rows and Options.MaxNodes columns per
// page, with links to the next pages. At most Options.MaxClients event streams are open
// at once; one more is refused with 503. Each stream sends at most one update every
// Options.UpdateInterval, holding every change of an object since the last one as one
// (counted as coalesced). The flows page keeps the latest Options.MaxFlows records.
//
// # Access
//
// Serve serves the console on a listener of its own. With a TLS configuration it serves
// HTTPS under the same rules as nimbus's gRPC API: the client must present a certificate
// issued by one of nimbus's CAs, whatever its role, since every role may read. Without
// one it serves plain HTTP, which nimbus allows only with --insecure or on a loopback
// address.
package console
