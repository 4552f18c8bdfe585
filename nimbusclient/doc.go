// Package nimbusclient is the agent's side of the bus: it watches nimbus for the objects
// targeted at this node and writes them into delphi, and streams the status the HAL
// records in delphi back up to nimbus.
//
// The client is the only writer of delphi's desired table; it claims that table's writer
// handle when it is built. A watch starts with a snapshot that ends in SYNCED; the snapshot
// is committed to delphi as one transaction that also removes every local object the
// snapshot did not contain, so objects deleted while the agent was away do not linger.
// When a stream breaks the client reconnects with exponential backoff and jitter, and
// sends every status again on each new status stream.
package nimbusclient
