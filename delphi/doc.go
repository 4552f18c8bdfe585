// Package delphi is the agent's local object store: the place where the desired state that
// nimbusclient receives meets the status that the HAL reports.
//
// Delphi keeps two tables. The desired table holds the objects targeted at this node, as
// nimbus sent them, together with the nimbus epoch and revision they correspond to. Each
// commit publishes a new version of it, which shares with the one before all it did not
// change, so readers never lock and each read sees one committed state, as in go-memdb;
// but a version is a copy-on-write B-tree of records per index (github.com/tidwall/btree),
// not radix trees with a node, a leaf and a watch channel per entry, and a record holds
// its object in wire form, decoded for each reader, so an object costs a few hundred bytes
// rather than a few kilobytes. The status table holds, per object, the status the HAL
// reported for this node; statuses are many, small, rewritten on every reconcile and
// never kept on disk, so it is a map under a read-write mutex, and it too holds each
// status in wire form, its update time apart, decoded for each reader.
//
// Ownership is enforced by the API: each table has exactly one writer handle, claimed once
// (ClaimDesired, ClaimStatus); a second claim fails with ErrWriterClaimed. Readers need no
// handle: every read sees one committed state. Readers of the desired table never lock;
// readers of statuses wait at most for one status transaction to be applied in memory.
// Stored objects are immutable; callers must not modify what Get and List return, which
// readers may share.
//
// Besides by key and kind, the desired table is indexed the way its readers look things
// up, by indexes they declare themselves (Options.Indexes, read with Lookup): a reconciler that finds objects by a derived value
// declares the index with it, and a new kind adds its indexes without editing the store.
// References between objects resolve within the referring object's tenant and namespace,
// so reference indexes list scoped names, "tenant/namespace/name" (ScopedName).
//
// Subscribe delivers the keys that changed, in commit order and coalesced per key, so a slow
// consumer never loses the last state of a key: it reads the current state by key.
//
// With Options.Dir, the desired table and the resume point survive restarts. They are kept
// in a bbolt file, StateFile, as serialized objects keyed by key ID. Every DesiredWriter
// commit is one state-file commit (internal/statefile: a record of the file's log, or a
// bbolt transaction when large), written and synced before the change becomes visible in
// memory, so the file and the tables always agree and a crash leaves either the state before
// a commit or the state after it, never a mix: the stored revision always matches the stored
// objects. Open restores both and, when the file held anything, marks the store synced, so a
// rebooted host enforces its last known policy before nimbus is reachable. Restoring reads
// every page of the file; on Linux, Open then takes them out of the process's resident set
// again (they stay in the page cache), as commits read only a few. A file that cannot be
// read back fails Open with ErrCorrupt; Options.Discard starts over without it.
//
// # Metrics
//
// The store registers with Options.Registerer, and Close unregisters:
// naples_delphi_commit_duration_seconds and naples_delphi_commit_batch_size, histograms
// of the time each write transaction takes and of the objects it changed, both by
// table="desired"|"status"; naples_delphi_synced, 1 once the desired table is complete;
// and naples_delphi_objects{kind,phase}, the desired objects by kind and by the phase of
// their status for their current generation (PROGRAMMED, FAILED, or PENDING: a status
// that says so, none yet, or one for an older generation). The object counts are not kept
// up to date on every write: a scrape computes them in one pass over the desired table,
// looking up each object's status, and writers pay nothing for it.
package delphi
