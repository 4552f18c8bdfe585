package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/nimbus"
)

// addLimitFlags adds the flags of nimbus's limits (docs/limits.md) to fs, setting l.
func addLimitFlags(fs *cmdline.FlagSet, l *nimbus.Limits) {
	for _, f := range []struct {
		name, usage string
		v           *int
		def         int
	}{
		{"max-streams-per-node", "Watch, ReportStatus and FlowTap `streams` each that one node certificate may have open", &l.NodeStreams, nimbus.DefaultNodeStreams},
		{"max-streams-per-publisher", "Watch, WatchStatus and ObserveFlows `streams` each that one publisher certificate may have open", &l.PublisherStreams, nimbus.DefaultPublisherStreams},
		{"stream-starts-per-node", fmt.Sprintf("Watch and ReportStatus `streams` that one node certificate may start per second, %d seconds' worth at once", nimbus.StreamStartBurstSeconds), &l.NodeStreamStarts, nimbus.DefaultNodeStreamStarts},
		{"stream-starts-per-publisher", fmt.Sprintf("Watch and WatchStatus `streams` that one publisher certificate may start per second, %d seconds' worth at once", nimbus.StreamStartBurstSeconds), &l.PublisherStreamStarts, nimbus.DefaultPublisherStreamStarts},
		{"status-report-bytes-per-second", "`bytes` of status reports one node certificate may send per second over all its streams; beyond, its streams wait", &l.StatusReportBytesPerSecond, nimbus.DefaultStatusReportBytesPerSecond},
		{"status-report-burst-bytes", "`bytes` of status reports one node certificate may send at once before --status-report-bytes-per-second holds it back", &l.StatusReportBurstBytes, nimbus.DefaultStatusReportBurstBytes},
		{"max-object-bytes", "`bytes` an object may have as sent to Apply; larger ones are refused", &l.ObjectBytes, nimbus.DefaultObjectBytes},
		{"list-page-bytes", "`bytes` of one List page; a page always holds one object at least", &l.ListPageBytes, nimbus.DefaultListPageBytes},
		{"max-status-message-bytes", "`bytes` a node status's message may have; longer ones are cut and marked", &l.StatusMessageBytes, nimbus.DefaultStatusMessageBytes},
		{"max-status-reason-bytes", "`bytes` a node status's reason may have; longer ones are cut and marked", &l.StatusReasonBytes, nimbus.DefaultStatusReasonBytes},
		{"max-status-operational-entries", "operational `entries` a node status may have; the ones after, in key order, are dropped", &l.StatusOperationalEntries, nimbus.DefaultStatusOperationalEntries},
		{"max-status-operational-key-bytes", "`bytes` an operational key may have; entries with longer ones are dropped", &l.StatusOperationalKeyBytes, nimbus.DefaultStatusOperationalKeyBytes},
		{"max-status-operational-value-bytes", "`bytes` an operational value may have; longer ones are cut and marked", &l.StatusOperationalValueBytes, nimbus.DefaultStatusOperationalValueBytes},
		{"max-status-operational-bytes", "`bytes` of a node status's operational keys and values together, entries beyond dropped, and of its encoded typed operational data, whose lists keep the first entries that fit", &l.StatusOperationalBytes, nimbus.DefaultStatusOperationalBytes},
		{"status-details-bytes", "`bytes` of node messages and operational data one object's status carries in Get, List and WatchStatus; further nodes go without", &l.StatusDetailsBytes, nimbus.DefaultStatusDetailsBytes},
		{"status-watermark-moves", fmt.Sprintf("`moves` of its status watermark one node may make per second, %d seconds' worth at once; beyond, its reports from the move on are held and applied later, with its latest watermark", nimbus.StatusWatermarkMoveBurstSeconds), &l.StatusWatermarkMoves, nimbus.DefaultStatusWatermarkMoves},
		{"max-flow-observers", "ObserveFlows `streams` open at once, those of peer replicas included; one more is refused", &l.FlowObservers, nimbus.DefaultFlowObservers},
		{"flow-observer-buffer", "flow `records` queued for one ObserveFlows stream; those that come while it is full are dropped for it alone and reported as lost_nimbus", &l.FlowObserverBuffer, nimbus.DefaultFlowObserverBuffer},
		{"status-nodes", "node statuses, and pending `nodes`, one object's status lists in Get, List and WatchStatus; the counts count every node", &l.StatusNodes, nimbus.DefaultStatusNodes},
	} {
		*f.v = f.def
		fs.Func(f.name, fmt.Sprintf("%s (default %d)", f.usage, f.def), func(s string) error {
			n, err := strconv.Atoi(s)
			switch {
			case err != nil:
				return fmt.Errorf("%q: want a whole number: %w", s, err)
			case n < 1:
				return fmt.Errorf("%d: must be at least 1", n)
			}
			*f.v = n
			return nil
		})
	}
	for _, f := range []struct {
		name, usage string
		v           *time.Duration
		def         time.Duration
	}{
		{"refusal-delay", fmt.Sprintf("wait `duration` before answering a stream refused for its certificate's count or rate of streams, up to %d refusals of a certificate at once", nimbus.MaxHeldRefusals), &l.RefusalDelay, nimbus.DefaultRefusalDelay},
		{"refusal-log-interval", "log a refused stream, call or TLS handshake at most once per client and `interval`, counting the rest", &l.RefusalLogInterval, nimbus.DefaultRefusalLogInterval},
	} {
		durationFlag(fs, f.name, f.usage, f.v, f.def, 0)
	}
}

// durationFlag adds a flag of a duration above min to fs, setting v, which starts at def.
func durationFlag(fs *cmdline.FlagSet, name, usage string, v *time.Duration, def, min time.Duration) {
	*v = def
	fs.Func(name, fmt.Sprintf("%s (default %v)", usage, def), func(s string) error {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return fmt.Errorf("%q: want a duration such as %v: %w", s, def, err)
		case d <= 0:
			return fmt.Errorf("%v: must be positive", d)
		case d < min:
			return fmt.Errorf("%v: must be %v at least", d, min)
		}
		*v = d
		return nil
	})
}
