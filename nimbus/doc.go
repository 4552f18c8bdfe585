// Package nimbus is the desired-state bus server: the authoritative store of the objects
// controllers publish, the per-node watch fan-out that carries them to the naples agents,
// and the intake of the status the agents report back.
//
// # Store
//
// Objects and node statuses live in go-memdb tables. Every change to an object (Apply that
// changes something, Delete of an existing object) takes the next value of a single
// monotonic revision counter, which the stored object carries in meta.revision. The counter
// is scoped by an epoch, a random 128-bit hex string made by New: a revision is only
// meaningful together with the epoch it was issued in. Stored objects are immutable: every
// write stores a fresh clone, so readers never lock and what Get, List and Watch hand out is
// never modified afterwards.
//
// Apply assigns uid, generation, revision and the times; whatever a client puts there is
// ignored. It stores an empty tenant or namespace as "default" and the target nodes sorted
// and without duplicates, so listing the same nodes in another order is no change. The generation starts at 1 and is bumped when the spec or the target nodes
// change; a change of labels only takes a revision but keeps the generation, and applying
// what is already stored changes nothing at all.
//
// # Watch
//
// A node's Watch first receives every object that targets it as PUT events marked snapshot,
// then SYNCED with the snapshot's revision, then one PUT or DELETE per committed change that
// concerns the node, in commit order. Registration and the snapshot read happen under the
// lock every commit holds while it hands its change to the watchers, so no change is missed
// or sent twice. Each change is built once per commit as an immutable value carrying its
// revision and is shared by every watcher; its wire form is encoded at most once, however
// many watchers send it.
//
// Commits never wait for watchers. Each watcher has a bounded buffer; a watcher whose buffer
// is full when a commit needs it is reset: its stream ends with codes.ResourceExhausted and
// the client must watch again, receiving a fresh snapshot. An idle watch receives a BOOKMARK
// with the current revision every Options.BookmarkInterval.
//
// # Status
//
// Agents stream NodeStatus reports with ReportStatus. A report is kept for the pair (object,
// node) while the object exists and targets the node. Get and List aggregate them into an
// ObjectStatus counting the nodes programmed and failed at the object's current generation.
//
// Because watch events are sent in their pre-encoded form, a Server must be served with
// Serve, which installs the codec that understands them, and not registered on a
// grpc.Server built elsewhere.
package nimbus
