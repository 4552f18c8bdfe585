// Package controller is the kit a controller uses to publish desired state into nimbus
// and follow how far it has come.
//
// A Client talks to one nimbus. Apply and Delete write many objects in few calls: they
// check every object (or key) first and refuse the whole call, naming the bad entries,
// when one is invalid or a key appears twice, then send ApplyBatch or DeleteBatch calls
// of at most Options.MaxBatchBytes of encoded objects each, in order. Each call is atomic
// on the server; a call that fails leaves the ones before it applied, and the error, a
// *BatchError, says which entries were not, and which of them nimbus refused, by index
// and field. ApplyWith and DeleteWith do the same with options: a callback after each
// call, and answers without the stored objects.
//
// WatchStatus follows the propagation status of the objects a Filter selects over
// nimbus's status stream and hands every change to a Reactor: OnStatus with the object
// and its status, as Get returns them, whenever either changed, and OnDelete when the
// object was deleted. When the stream breaks, as it does when nimbus restarts, the
// client reconnects with exponential backoff and jitter. Nimbus then sends the current
// state again; the client compares it with what it already delivered and calls OnStatus
// only for the objects that differ, and OnDelete for the ones that are gone, so a
// reactor sees each change once, and a reconnect costs it only what changed meanwhile.
// A Reactor that also implements SyncReactor hears OnSynced once it has been told the
// whole state of the selection, after the first connection and after each reconnect.
//
// Wait builds on WatchStatus: it returns once every target object is PROGRAMMED on every
// node it targets at the generation waited for, waits on through FAILED statuses that
// the node's agent retries, and fails as soon as a node reports a terminal FAILED (one no
// retry mends, NodeStatus.terminal), with that node's reason and message, or when an
// object is not found.
//
// Each node's status of an object carries the node's operational data, typed
// (NodeStatus.operational_data): PolicyRuleHits sums a policy's rule hits over the nodes,
// and NodeOperational returns what one node reports.
//
// Nimbus coalesces status: a reactor is not called for every report a node makes, but
// with the latest status of an object when it is sent, at most every few milliseconds
// per object. Objects and statuses handed to a reactor are shared with the client, which
// compares them with later ones: a reactor must not modify them.
package controller
