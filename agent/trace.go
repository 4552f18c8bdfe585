package agent

import "github.com/naplesnet/naples/hal/linux/fwbpf"

// The limits of the Trace objects a node runs (trace_linux.go), and their defaults.
const (
	// DefaultMaxTraces is the default of TraceOptions.MaxTraces (--max-traces).
	DefaultMaxTraces = 16
	// MaxTraces is the most traces the firewall's datapath holds at once.
	MaxTraces = fwbpf.MaxTraces
)
