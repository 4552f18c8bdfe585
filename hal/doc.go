// Package hal programs the node from the local object store: it turns desired objects into
// kernel state and reports, per object, whether that worked.
//
// The HAL is level-triggered. It never acts on an event: a change in the store (or drift
// seen by an observer) only puts the object's key on a rate-limited work queue, and a
// worker handed that key reads the desired object and lets the kind's Reconciler make the
// kernel match it. Running a reconcile twice changes nothing. The queue never hands one key
// to two workers at once and coalesces repeated adds of a key, so a delete cannot overtake
// the add before it. A failed reconcile is retried with per-key exponential backoff under
// an overall rate limit, forever, and the object's status says why it is not programmed
// yet: the reason of the *Error it failed with (Conflict, KernelError, ...).
//
// Backends read the kernel from a Mirror, not by asking it per object: an in-memory copy of
// the kernel objects of a kind, keyed by their kernel identity, filled by one dump, kept
// current by the backend's netlink subscription (its observer), and dumped afresh whenever
// that subscription starts over and at every resync. A reconcile compares the desired
// object with the mirror, so it costs one kernel write, or none when the kernel already
// matches. The mirror records the backend's own writes at once and applies the kernel's
// events in order; an event that predates one of the backend's writes is passed over until
// the write's echo arrives, so a lagging event does not take the mirror back to the state
// the write replaced.
//
// An object can wait for another: an endpoint for its network, say. Its reconcile then
// returns a pending error (Pendingf), which leaves it PENDING with a reason naming what it
// waits for, and it is not retried with backoff. Instead, a reconciler that is Dependent
// names the kinds its objects depend on and, for a key of those kinds, the keys that depend
// on it; the HAL enqueues those whenever such an object changes in the store and whenever
// one is PROGRAMMED after it was not, so the waiting object is reconciled the moment what
// it waits for is there. Observers enqueue what waits for kernel objects (a host
// interface that appears), and every resync reconciles everything once more.
//
// Sweepers remove kernel state that no desired object owns. They run only once the store
// says its desired table is complete (restored from disk, or synced with nimbus), so a
// fresh agent never removes what a previous one programmed before it knows what is meant
// to stay; then again at every resync. A sweep reads the kernel afresh (its mirror's
// Replace) and enqueues the objects whose kernel state changed without any event saying
// so; the resync also reconciles every key once more, as a further safety net.
//
// Observers watch the kernel and enqueue the keys whose state drifted; they never write
// the kernel themselves, so a worker and an observer cannot fight. An observer subscribes
// first and then dumps, so no change falls between the two. One that fails (a netlink
// socket that overflowed, say) is started again after a backoff, dumps again, and once it
// is subscribed again every object of its kind is reconciled, since changes may have been
// missed meanwhile.
//
// The HAL reads the store through Store, an interface of what it needs; the agent adapts
// its delphi store to it and claims that store's status writer, so the HAL is the one
// writer of status. Workers do not write statuses themselves: they hand them to one status writer,
// which records everything pending in one store transaction (at most Options.StatusBatch
// statuses, the latest of each key), so a bulk of reconciles costs a few transactions, not
// one each. Stats counts reconciles, failures and kernel writes per kind. Time comes from
// Options.Clock, so tests drive retries, resyncs and observer restarts with a fake clock.
//
// Ready tells whether the HAL has caught up since it started: the store's desired table is
// complete, and every desired object has been reconciled at least once, successfully or
// not (a FAILED object counts: its status says why, and its retries are no reason to
// wait). It tracks the keys it hears of from the feed and, once the table is complete,
// every key the table holds, until their first reconcile ends; a later change to an object
// reconciled before does not make it wait again, a new object does.
//
// # Metrics
//
// The HAL registers with Options.Registerer, and Close unregisters:
// naples_hal_reconciles_total, naples_hal_reconcile_errors_total and
// naples_hal_kernel_writes_total (kinds whose reconciler is a KernelWriteCounter), each by
// kind and read from Stats at scrape time; the histogram
// naples_hal_reconcile_duration_seconds by kind; naples_hal_queue_depth, the keys waiting
// for a worker; naples_hal_retries_total, keys put back after a backoff;
// naples_hal_unreconciled_objects, what Ready waits for; and naples_hal_status_commits_total
// and naples_hal_status_writes_total, the status writer's transactions and the statuses in
// them.
package hal
