package nimbusv1

import (
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
)

// validFlowExport returns a FlowExportPolicy that Validate accepts.
func validFlowExport() *Object {
	return &Object{
		Meta: &ObjectMeta{Name: "to-collector"},
		Spec: &Object_FlowExportPolicy{FlowExportPolicy: &FlowExportPolicySpec{
			Endpoints: []string{"web"}, SecurityGroups: []string{"db"}, Verdicts: []string{"denied"},
			Targets: []string{"192.0.2.10:4739", "collector.example.net:2055", "[2001:db8::1]:4739"},
		}},
	}
}

func TestValidateFlowExportPolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(s *FlowExportPolicySpec)
		want   string // "" means valid; otherwise the exact error text
	}{
		{name: "valid", mutate: func(*FlowExportPolicySpec) {}},
		{name: "intervals at their bounds", mutate: func(s *FlowExportPolicySpec) {
			s.Interval, s.TemplateInterval = durationpb.New(time.Second), durationpb.New(time.Hour)
		}},
		{name: "json to stdout", mutate: func(s *FlowExportPolicySpec) { s.Format, s.Targets = "json", nil }},
		{name: "json to a file", mutate: func(s *FlowExportPolicySpec) { s.Format, s.Targets, s.File = "json", nil, "flows/web.jsonl" }},
		{name: "no targets", mutate: func(s *FlowExportPolicySpec) { s.Targets = nil },
			want: `spec.targets "": at least one target ("host:port") is required with format "ipfix"`},
		{name: "too many targets", mutate: func(s *FlowExportPolicySpec) {
			s.Targets = nil
			for p := range MaxFlowExportTargets + 1 {
				s.Targets = append(s.Targets, "192.0.2.1:"+string(rune('1'+p)))
			}
		}, want: `spec.targets "9 targets": at most 8 are allowed`},
		{name: "target without port", mutate: func(s *FlowExportPolicySpec) { s.Targets[0] = "192.0.2.10" },
			want: `spec.targets[0] "192.0.2.10": not "host:port": missing port in address`},
		{name: "target port", mutate: func(s *FlowExportPolicySpec) { s.Targets[1] = "collector:70000" },
			want: `spec.targets[1] "collector:70000": port "70000": must be a number between 1 and 65535`},
		{name: "target port 0", mutate: func(s *FlowExportPolicySpec) { s.Targets[1] = "collector:0" },
			want: `spec.targets[1] "collector:0": port "0": must be a number between 1 and 65535`},
		{name: "target host", mutate: func(s *FlowExportPolicySpec) { s.Targets[0] = "no_such host:4739" },
			want: `spec.targets[0] "no_such host:4739": host "no_such host": neither an IP address nor a host name`},
		{name: "target unspecified", mutate: func(s *FlowExportPolicySpec) { s.Targets[0] = "0.0.0.0:4739" },
			want: `spec.targets[0] "0.0.0.0:4739": host "0.0.0.0": must be a unicast address or a host name`},
		{name: "target repeated", mutate: func(s *FlowExportPolicySpec) { s.Targets[2] = s.Targets[0] },
			want: `spec.targets[2] "192.0.2.10:4739": repeats spec.targets[0]`},
		{name: "interval too short", mutate: func(s *FlowExportPolicySpec) { s.Interval = durationpb.New(time.Millisecond) },
			want: `spec.interval "1ms": must be between 1s and 1h0m0s`},
		{name: "interval absurd", mutate: func(s *FlowExportPolicySpec) { s.Interval = durationpb.New(1000 * time.Hour) },
			want: `spec.interval "1000h0m0s": must be between 1s and 1h0m0s`},
		{name: "interval negative", mutate: func(s *FlowExportPolicySpec) { s.Interval = durationpb.New(-time.Minute) },
			want: `spec.interval "-1m0s": must be between 1s and 1h0m0s`},
		{name: "template interval zero", mutate: func(s *FlowExportPolicySpec) { s.TemplateInterval = durationpb.New(0) },
			want: `spec.templateInterval "0s": must be between 1s and 1h0m0s`},
		{name: "verdict", mutate: func(s *FlowExportPolicySpec) { s.Verdicts = []string{"allowed", "dropped", "allowed"} },
			want: "spec.verdicts[1] \"dropped\": must be \"allowed\" or \"denied\"\nspec.verdicts[2] \"allowed\": repeats spec.verdicts[0]"},
		{name: "format", mutate: func(s *FlowExportPolicySpec) { s.Format = "netflow" },
			want: `spec.format "netflow": must be "ipfix", "json" or empty (ipfix)`},
		{name: "json with targets", mutate: func(s *FlowExportPolicySpec) { s.Format, s.Targets = "json", s.Targets[:1] },
			want: `spec.targets "192.0.2.10:4739": format "json" writes to spec.file or standard output, not to targets`},
		{name: "ipfix with a file", mutate: func(s *FlowExportPolicySpec) { s.File = "flows.jsonl" },
			want: `spec.file "flows.jsonl": only format "json" writes to a file`},
		{name: "json file absolute", mutate: func(s *FlowExportPolicySpec) { s.Format, s.Targets, s.File = "json", nil, "/etc/passwd" },
			want: `spec.file "/etc/passwd": must be a clean relative path inside the agent's --flow-export-dir (no leading '/', no '..')`},
		{name: "json file escapes", mutate: func(s *FlowExportPolicySpec) { s.Format, s.Targets, s.File = "json", nil, "../x" },
			want: `spec.file "../x": must be a clean relative path inside the agent's --flow-export-dir (no leading '/', no '..')`},
		{name: "sampling", mutate: func(s *FlowExportPolicySpec) { s.Sampling = 1 << 20 },
			want: `spec.sampling "1048576": must be between 0 and 65535 (0 and 1 export every connection)`},
		{name: "endpoint name", mutate: func(s *FlowExportPolicySpec) { s.Endpoints = []string{"Web"} },
			want: `spec.endpoints[0] "Web": must be lower-case letters, digits, '-' and '.', at most 253 characters`},
		{name: "group name", mutate: func(s *FlowExportPolicySpec) { s.SecurityGroups = []string{""} },
			want: `spec.securityGroups[0] "": is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validFlowExport()
			tc.mutate(o.GetFlowExportPolicy())
			err := o.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("Validate() = %q\nwant           %q", got, tc.want)
			}
		})
	}
}

func TestFlowExportDefaults(t *testing.T) {
	s := &FlowExportPolicySpec{}
	if s.ExportFormat() != FlowExportIPFIX || s.ExportInterval() != time.Minute || s.ExportTemplateInterval() != 10*time.Minute {
		t.Errorf("defaults = %q, %v, %v; want ipfix, 1m, 10m", s.ExportFormat(), s.ExportInterval(), s.ExportTemplateInterval())
	}
	if k, err := ParseKind("flow-export-policies"); err != nil || k != Kind_KIND_FLOW_EXPORT_POLICY {
		t.Errorf("ParseKind(flow-export-policies) = %v, %v", k, err)
	}
	if !strings.Contains(validFlowExport().TypedKey().String(), "FlowExportPolicy/") {
		t.Errorf("key %s does not name the kind", validFlowExport().TypedKey())
	}
}

func TestFlowExportOperationalMap(t *testing.T) {
	op := &OperationalData{Kind: &OperationalData_FlowExport{FlowExport: &FlowExportOperational{
		RecordsSelected: 10, RecordsDropped: 2, Connections: 3,
		Targets: []*FlowExportTarget{
			{Target: "192.0.2.10:4739", RecordsSent: 8, MessagesSent: 2},
			{Target: "collector:4739", Errors: 4, LastError: "connection refused"},
		},
	}}}
	want := map[string]string{
		"recordsSelected": "10", "recordsDropped": "2", "connections": "3",
		"192.0.2.10:4739.recordsSent": "8", "192.0.2.10:4739.messagesSent": "2", "192.0.2.10:4739.errors": "0",
		"collector:4739.recordsSent": "0", "collector:4739.messagesSent": "0", "collector:4739.errors": "4",
		"collector:4739.lastError": "connection refused",
	}
	if got := op.Map(); !maps.Equal(got, want) {
		t.Errorf("Map() = %v\nwant    %v", got, want)
	}
}
