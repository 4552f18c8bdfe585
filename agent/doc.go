// Package agent wires one host together: delphi, the nimbus client that fills it and the
// HAL that programs the kernel from it, with one lifecycle.
//
// The parts register their Prometheus metrics with one registry, together with the Go
// runtime's and the process's, and with Config.Metrics the agent serves it over HTTP on
// /metrics, beside two probes. /healthz answers 200 while every part runs, and 503 naming
// the part that stopped once one has, or once the agent is stopping. /readyz answers 200
// once the agent enforces its desired state: delphi holds a complete desired table
// (restored from the state directory, or synced with nimbus) and the HAL has reconciled
// every desired object at least once since the agent started, successfully or not;
// otherwise 503 with the reasons, one a line, such as "1234 desired objects not reconciled
// yet since start". A host whose nimbus is unreachable thus becomes ready on its restored
// state, while a host that starts empty stays unready until it has reached nimbus.
//
// With the firewall's flow records on, the agent keeps the latest in a FlowLog for the
// local API's Flows, and a FlowExportReconciler runs an exporter for each
// FlowExportPolicy of the node: a goroutine that follows the log and sends what its
// policy selects as IPFIX over UDP or as JSON lines, and never holds up the log's writer
// (docs/flows.md).
package agent
