// Package delphi is the agent's local object store: the place where the desired state that
// nimbusclient receives meets the status that the HAL reports.
//
// Delphi keeps two tables on go-memdb. The desired table holds the objects targeted at this
// node, as nimbus sent them, together with the nimbus epoch and revision they correspond to.
// The status table holds, per object, the status the HAL reported for this node.
//
// Ownership is enforced by the API: each table has exactly one writer handle, claimed once
// (ClaimDesired, ClaimStatus); a second claim fails with ErrWriterClaimed. Readers need no
// handle and never lock: every read sees one committed state. Stored objects are immutable;
// callers must not modify what Get and List return.
//
// Subscribe delivers the keys that changed, in commit order and coalesced per key, so a slow
// consumer never loses the last state of a key: it reads the current state by key.
package delphi
