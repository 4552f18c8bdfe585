package nimbusv1

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"
)

// The limits and defaults of a FlowExportPolicy's spec, which Validate enforces.
const (
	// MaxFlowExportTargets bounds spec.targets.
	MaxFlowExportTargets = 8
	// MinFlowExportInterval and MaxFlowExportInterval bound spec.interval and
	// spec.templateInterval.
	MinFlowExportInterval = time.Second
	MaxFlowExportInterval = time.Hour
	// DefaultFlowExportInterval is spec.interval when unset.
	DefaultFlowExportInterval = time.Minute
	// DefaultFlowExportTemplateInterval is spec.templateInterval when unset.
	DefaultFlowExportTemplateInterval = 10 * time.Minute
	// MaxFlowExportSampling bounds spec.sampling.
	MaxFlowExportSampling = 65535
	// maxFlowExportFile bounds the length of spec.file.
	maxFlowExportFile = 255
)

// The formats of a FlowExportPolicy.
const (
	// FlowExportIPFIX is IPFIX (RFC 7011) over UDP, spec.format's default.
	FlowExportIPFIX = "ipfix"
	// FlowExportJSON is JSON lines, one object per record, to a file or standard output.
	FlowExportJSON = "json"
)

// ExportFormat returns spec.format with its default: FlowExportIPFIX or FlowExportJSON.
func (s *FlowExportPolicySpec) ExportFormat() string {
	if s.GetFormat() == "" {
		return FlowExportIPFIX
	}
	return s.GetFormat()
}

// ExportInterval returns spec.interval, or DefaultFlowExportInterval when unset.
func (s *FlowExportPolicySpec) ExportInterval() time.Duration {
	if s.GetInterval() == nil {
		return DefaultFlowExportInterval
	}
	return s.GetInterval().AsDuration()
}

// ExportTemplateInterval returns spec.templateInterval, or
// DefaultFlowExportTemplateInterval when unset.
func (s *FlowExportPolicySpec) ExportTemplateInterval() time.Duration {
	if s.GetTemplateInterval() == nil {
		return DefaultFlowExportTemplateInterval
	}
	return s.GetTemplateInterval().AsDuration()
}

// flowExport checks a FlowExportPolicy's spec.
func (v *validator) flowExport(s *FlowExportPolicySpec) {
	for i, e := range s.GetEndpoints() {
		v.name(fmt.Sprintf("spec.endpoints[%d]", i), e, true)
	}
	for i, g := range s.GetSecurityGroups() {
		v.name(fmt.Sprintf("spec.securityGroups[%d]", i), g, true)
	}
	seen := map[string]string{}
	for i, verdict := range s.GetVerdicts() {
		f := fmt.Sprintf("spec.verdicts[%d]", i)
		switch verdict {
		case "allowed", "denied":
		default:
			v.add(f, verdict, `must be "allowed" or "denied"`)
			continue
		}
		if other, dup := seen[verdict]; dup {
			v.add(f, verdict, "repeats %s", other)
		}
		seen[verdict] = f
	}
	format := s.ExportFormat()
	switch format {
	case FlowExportIPFIX:
		if len(s.GetTargets()) == 0 {
			v.add("spec.targets", "", `at least one target ("host:port") is required with format "ipfix"`)
		}
		if s.GetFile() != "" {
			v.add("spec.file", s.GetFile(), `only format "json" writes to a file`)
		}
	case FlowExportJSON:
		if len(s.GetTargets()) > 0 {
			v.add("spec.targets", strings.Join(s.GetTargets(), ","), `format "json" writes to spec.file or standard output, not to targets`)
		}
		v.exportFile("spec.file", s.GetFile())
	default:
		v.add("spec.format", s.GetFormat(), `must be "ipfix", "json" or empty (ipfix)`)
	}
	if n := len(s.GetTargets()); n > MaxFlowExportTargets {
		v.add("spec.targets", strconv.Itoa(n)+" targets", "at most %d are allowed", MaxFlowExportTargets)
	}
	targets := map[string]string{}
	for i, t := range s.GetTargets() {
		f := fmt.Sprintf("spec.targets[%d]", i)
		if !v.exportTarget(f, t) {
			continue
		}
		if other, dup := targets[t]; dup {
			v.add(f, t, "repeats %s", other)
		}
		targets[t] = f
	}
	if s.GetInterval() != nil {
		v.exportInterval("spec.interval", s.GetInterval().AsDuration(), s.GetInterval().IsValid())
	}
	if s.GetTemplateInterval() != nil {
		v.exportInterval("spec.templateInterval", s.GetTemplateInterval().AsDuration(), s.GetTemplateInterval().IsValid())
	}
	if s.GetSampling() > MaxFlowExportSampling {
		v.add("spec.sampling", strconv.FormatUint(uint64(s.GetSampling()), 10), "must be between 0 and %d (0 and 1 export every connection)", MaxFlowExportSampling)
	}
}

// exportTarget checks a collector's address, "host:port" with a UDP port, and tells
// whether it is one.
func (v *validator) exportTarget(field, t string) bool {
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		v.add(field, t, `not "host:port": %s`, strings.TrimPrefix(err.Error(), "address "+t+": "))
		return false
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		v.add(field, t, "port %q: must be a number between 1 and 65535", port)
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			v.add(field, t, "host %q: must be a unicast address or a host name", host)
			return false
		}
		return true
	}
	if len(host) > 253 || !isHostName(host) {
		v.add(field, t, "host %q: neither an IP address nor a host name", host)
		return false
	}
	return true
}

// isHostName tells whether s is a DNS host name: labels of letters, digits and '-'
// separated by dots, with an optional final dot.
func isHostName(s string) bool {
	return isName(strings.ToLower(strings.TrimSuffix(s, ".")))
}

// exportInterval checks one of a FlowExportPolicy's intervals.
func (v *validator) exportInterval(field string, d time.Duration, valid bool) {
	if !valid || d < MinFlowExportInterval || d > MaxFlowExportInterval {
		v.add(field, d.String(), "must be between %v and %v", MinFlowExportInterval, MaxFlowExportInterval)
	}
}

// exportFile checks the file of format json: empty (standard output), or a clean
// relative path under the agent's export directory.
func (v *validator) exportFile(field, f string) {
	switch {
	case f == "":
	case len(f) > maxFlowExportFile:
		v.add(field, f, "longer than %d bytes", maxFlowExportFile)
	case path.IsAbs(f) || path.Clean(f) != f || f == "." || f == ".." || strings.HasPrefix(f, "../") || strings.ContainsAny(f, "\\\x00"):
		v.add(field, f, "must be a clean relative path inside the agent's --flow-export-dir (no leading '/', no '..')")
	}
}
