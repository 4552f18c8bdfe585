// Package hal programs the node from delphi: it turns desired objects into kernel state
// and reports, per object, whether that worked.
//
// The HAL is level-triggered. It never acts on an event: a change in delphi (or drift seen
// by an observer) only puts the object's key on a rate-limited work queue, and a worker
// handed that key reads the desired object from delphi and lets the kind's Reconciler make
// the kernel match it. Running a reconcile twice changes nothing. The queue never hands one
// key to two workers at once and coalesces repeated adds of a key, so a delete cannot
// overtake the add before it. A failed reconcile is retried with per-key exponential
// backoff under an overall rate limit, forever, and the object's status says why it is not
// programmed yet.
//
// The HAL is the only writer of delphi's status table; it claims that table's writer
// handle when it is built.
package hal
