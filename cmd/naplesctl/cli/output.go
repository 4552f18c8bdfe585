package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/client-go/util/jsonpath"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The formats of get's --output flag.
const (
	outputTable    = "table"
	outputWide     = "wide"
	outputName     = "name"
	outputJSON     = "json"
	outputYAML     = "yaml"
	outputJSONPath = "jsonpath"
	outputColumns  = "custom-columns"
)

// outputValues are the values of get's --output flag as help and shell completion show
// them; the last two take a template after the "=".
var outputValues = []string{outputTable, outputWide, outputName, outputJSON, outputYAML, outputJSONPath + "=", outputColumns + "="}

// Limits of what a table cell lists.
const (
	// maxCellItems is how many entries of a list (target nodes, addresses, next hops) a
	// cell of -o wide shows before "+N" says how many more there are.
	maxCellItems = 3
)

// output is a parsed --output flag of get.
type output struct {
	// format is one of the output* constants.
	format string
	// template is the parsed template of jsonpath=TEMPLATE.
	template *jsonpath.JSONPath
	// columns are the columns of custom-columns=HEADER:PATH,...
	columns []customColumn
}

// customColumn is one column of -o custom-columns: a header and the JSONPath that finds
// the cell's values in the object's JSON document.
type customColumn struct {
	header string
	path   *jsonpath.JSONPath
}

// parseOutput parses the value of --output. A bad value or template is a usage error
// (see Run) that names the flag and the value.
func parseOutput(s string) (output, error) {
	format, arg, hasArg := strings.Cut(s, "=")
	bad := func(why string) error { return exitstatus.Mark(fmt.Errorf("--output %q: %s", s, why)) }
	switch format {
	case outputTable, outputWide, outputName, outputJSON, outputYAML:
		if hasArg {
			return output{}, bad(format + " takes no template")
		}
		return output{format: format}, nil
	case outputJSONPath:
		if strings.TrimSpace(arg) == "" {
			return output{}, bad("want jsonpath=TEMPLATE, such as jsonpath={.meta.name}")
		}
		p, err := parseJSONPath(format, arg)
		if err != nil {
			return output{}, bad(err.Error())
		}
		return output{format: format, template: p}, nil
	case outputColumns:
		if strings.TrimSpace(arg) == "" {
			return output{}, bad("want custom-columns=HEADER:PATH,..., such as custom-columns=NAME:.meta.name,PREFIX:.spec.prefix")
		}
		o := output{format: format}
		for i, spec := range strings.Split(arg, ",") {
			header, path, ok := strings.Cut(spec, ":")
			if !ok || strings.TrimSpace(header) == "" || strings.TrimSpace(path) == "" {
				return output{}, bad(fmt.Sprintf("column %d %q: want HEADER:PATH, such as NAME:.meta.name", i+1, spec))
			}
			p, err := parseJSONPath(header, relaxedJSONPath(path))
			if err != nil {
				return output{}, bad(fmt.Sprintf("column %d %q: %v", i+1, spec, err))
			}
			o.columns = append(o.columns, customColumn{header: header, path: p})
		}
		return o, nil
	}
	return output{}, bad("want " + strings.Join(outputValues[:len(outputValues)-2], ", ") +
		", jsonpath=TEMPLATE or custom-columns=HEADER:PATH,...")
}

// parseJSONPath parses a JSONPath template as kubectl does: a key missing from an
// object gives nothing rather than an error, as fields left at their zero value are not
// written.
func parseJSONPath(name, template string) (*jsonpath.JSONPath, error) {
	p := jsonpath.New(name).AllowMissingKeys(true)
	if err := p.Parse(template); err != nil {
		return nil, fmt.Errorf("parsing the template: %w", err)
	}
	return p, nil
}

// relaxedJSONPath turns a column's path as kubectl takes it (".meta.name", "meta.name",
// "{.meta.name}") into a JSONPath template: "{.meta.name}".
func relaxedJSONPath(path string) string {
	path = strings.TrimSpace(path)
	if strings.HasPrefix(path, "{") && strings.HasSuffix(path, "}") {
		path = path[1 : len(path)-1]
	}
	if !strings.HasPrefix(path, ".") && !strings.HasPrefix(path, "[") {
		path = "." + path
	}
	return "{" + path + "}"
}

// printObjects prints items, all of kind, in format o. one tells that a single object
// was asked for by name: its JSON document is then the object rather than a list of
// objects, as in -o json.
func (c *cli) printObjects(kind nimbusv1.Kind, items []*nimbusv1.ObjectWithStatus, o output, one bool) error {
	switch o.format {
	case outputJSON, outputYAML:
		if one {
			return manifest.Encode(c.stdout, manifest.Format(o.format), items[0].GetObject(), items[0].GetStatus())
		}
		return manifest.EncodeList(c.stdout, manifest.Format(o.format), items)
	case outputJSONPath:
		var (
			raw json.RawMessage
			err error
		)
		if one {
			raw, err = manifest.Marshal(items[0].GetObject(), items[0].GetStatus())
		} else {
			raw, err = manifest.MarshalList(items)
		}
		if err != nil {
			return err
		}
		return c.executeJSONPath(o.template, raw)
	}
	if len(items) == 0 {
		fmt.Fprintln(c.stderr, "No resources found.")
		return nil
	}
	if o.format == outputName {
		for _, it := range items {
			fmt.Fprintln(c.stdout, ref(it.GetObject().Key()))
		}
		return nil
	}
	rows := [][]string{headerOf(kind, o)}
	for _, it := range items {
		row, err := c.rowOf(it, o)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	return (&alignedRows{w: c.stdout}).write(rows)
}

// executeJSONPath writes what the template p finds in the JSON document raw.
func (c *cli) executeJSONPath(p *jsonpath.JSONPath, raw json.RawMessage) error {
	data, err := jsonValue(raw)
	if err != nil {
		return err
	}
	if err := p.Execute(c.stdout, data); err != nil {
		return fmt.Errorf("--output jsonpath: %w", err)
	}
	return nil
}

// headerOf returns the header row of the table format o: table, wide or custom-columns.
func headerOf(kind nimbusv1.Kind, o output) []string {
	if o.format != outputColumns {
		return tableHeader(kind, o.format == outputWide)
	}
	headers := make([]string, len(o.columns))
	for i, col := range o.columns {
		headers[i] = col.header
	}
	return headers
}

// rowOf returns the cells of item's row in the table format o: table, wide or
// custom-columns.
func (c *cli) rowOf(item *nimbusv1.ObjectWithStatus, o output) ([]string, error) {
	if o.format != outputColumns {
		return c.tableRow(item, o.format == outputWide), nil
	}
	return columnCells(o.columns, item)
}

// columnCells returns the cells of item's row of -o custom-columns: each holds the values
// the column's path finds in the object's JSON document, separated by commas, or
// "<none>".
func columnCells(columns []customColumn, item *nimbusv1.ObjectWithStatus) ([]string, error) {
	raw, err := manifest.Marshal(item.GetObject(), item.GetStatus())
	if err != nil {
		return nil, err
	}
	data, err := jsonValue(raw)
	if err != nil {
		return nil, err
	}
	cells := make([]string, len(columns))
	for i, col := range columns {
		results, err := col.path.FindResults(data)
		if err != nil {
			return nil, fmt.Errorf("--output custom-columns: column %s of %s: %w", col.header, ref(item.GetObject().Key()), err)
		}
		var values []string
		for _, rs := range results {
			for _, r := range rs {
				values = append(values, oneLine(fmt.Sprint(r.Interface())))
			}
		}
		cells[i] = "<none>"
		if len(values) > 0 {
			cells[i] = strings.Join(values, ",")
		}
	}
	return cells, nil
}

// alignedRows writes rows of cells in columns three spaces apart, as a text/tabwriter
// table does, each cell escaped by Printable. It keeps the columns' widths from one write
// to the next, so that rows written later, as changes come in a watch, line up with
// those before them; a column only widens.
type alignedRows struct {
	w io.Writer
	// widths are the widths of the columns so far, in runes.
	widths []int
}

// alignedPadding is the number of spaces between columns.
const alignedPadding = 3

// write writes rows. The last cell of a row is not padded, and does not widen its
// column.
func (a *alignedRows) write(rows [][]string) error {
	for _, row := range rows {
		for i := range row {
			row[i] = Printable(row[i])
			if i == len(row)-1 {
				break
			}
			if i == len(a.widths) {
				a.widths = append(a.widths, 0)
			}
			a.widths[i] = max(a.widths[i], utf8.RuneCountInString(row[i]))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		for i, cell := range row {
			b.WriteString(cell)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", a.widths[i]-utf8.RuneCountInString(cell)+alignedPadding))
			}
		}
		b.WriteByte('\n')
	}
	if _, err := io.WriteString(a.w, b.String()); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}

// jsonValue decodes the JSON document raw for a JSONPath to walk: integers become int64
// (uint64 beyond its range), so that they print with every digit, other numbers float64.
func jsonValue(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	return numbers(v), nil
}

// numbers replaces the json.Numbers in v, as jsonValue describes.
func numbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(v.String(), 10, 64); err == nil {
			return u
		}
		f, _ := v.Float64()
		return f
	}
	return v
}

// tableHeader returns the columns of get's table of kind; wide adds TARGETS and the
// kind's summary columns.
func tableHeader(kind nimbusv1.Kind, wide bool) []string {
	h := []string{"NAME", "TENANT", "NAMESPACE", "GENERATION", "PROGRAMMED", "FAILED", "PENDING", "STALE", "AGE"}
	if wide {
		h = append(h, "NODES")
		h = append(h, summaries[kind].headers...)
	}
	return h
}

// tableRow returns the cells of item's row of get's table, as tableHeader names them.
func (c *cli) tableRow(item *nimbusv1.ObjectWithStatus, wide bool) []string {
	obj := item.GetObject()
	m, p := obj.GetMeta(), propagationOf(item, 0)
	age := "<unknown>"
	if m.GetCreateTime() != nil {
		age = humanDuration(c.now().Sub(m.GetCreateTime().AsTime()))
	}
	row := []string{
		m.GetName(), m.GetTenant(), m.GetNamespace(), strconv.FormatInt(m.GetGeneration(), 10),
		fmt.Sprintf("%d/%d", p.programmed, p.target), strconv.Itoa(p.failed), strconv.Itoa(p.pendingCount()),
		strconv.Itoa(p.stale), age,
	}
	if wide {
		nodes := "<all>"
		if len(m.GetNodes()) > 0 {
			nodes = cellList(m.GetNodes())
		}
		row = append(row, nodes)
		if s, ok := summaries[obj.Kind()]; ok {
			for _, cell := range s.cells(obj) {
				row = append(row, orNoneCell(oneLine(cell)))
			}
		}
	}
	return row
}

// summary is what -o wide adds for one kind: the headers of its columns, and the cells of
// an object of the kind.
type summary struct {
	headers []string
	cells   func(obj *nimbusv1.Object) []string
}

// summaries are the columns -o wide adds, per kind: what tells one object of the kind
// from another at a glance.
var summaries = map[nimbusv1.Kind]summary{
	nimbusv1.Kind_KIND_NODE: {[]string{"HOSTNAME", "VTEP"}, func(o *nimbusv1.Object) []string {
		s := o.GetNode()
		return []string{s.GetHostname(), s.GetVtepAddress()}
	}},
	nimbusv1.Kind_KIND_NETWORK: {[]string{"VNI", "SUBNETS", "MTU"}, func(o *nimbusv1.Object) []string {
		s := o.GetNetwork()
		var subnets []string
		if s.GetSubnet() != "" {
			subnets = append(subnets, s.GetSubnet())
		}
		for _, sn := range s.GetSubnets() {
			subnets = append(subnets, sn.GetCidr())
		}
		return []string{strconv.FormatUint(uint64(s.GetVni()), 10), cellList(subnets), uintCell(s.GetMtu())}
	}},
	nimbusv1.Kind_KIND_ENDPOINT: {[]string{"NETWORK", "NODE", "ADDRESSES", "MAC"}, func(o *nimbusv1.Object) []string {
		s := o.GetEndpoint()
		return []string{s.GetNetwork(), s.GetNode(), cellList(s.GetIps()), s.GetMac()}
	}},
	nimbusv1.Kind_KIND_SECURITY_GROUP: {[]string{"CIDRS"}, func(o *nimbusv1.Object) []string {
		return []string{cellList(o.GetSecurityGroup().GetCidrs())}
	}},
	nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY: {[]string{"GROUPS", "INGRESS", "EGRESS"}, func(o *nimbusv1.Object) []string {
		s := o.GetNetworkSecurityPolicy()
		return []string{cellList(s.GetAttachGroups()), strconv.Itoa(len(s.GetIngress())), strconv.Itoa(len(s.GetEgress()))}
	}},
	// A next hop is its gateway, "@" and its device when it names one: "10.0.0.1@eth1",
	// "@eth2".
	nimbusv1.Kind_KIND_ROUTE: {[]string{"TABLE", "PREFIX", "NEXTHOPS"}, func(o *nimbusv1.Object) []string {
		s := o.GetRoute()
		table := strconv.FormatUint(uint64(s.GetTable()), 10)
		if s.GetTenantTable() {
			table = "<tenant>"
		}
		var hops []string
		for _, h := range s.GetNexthops() {
			hop := h.GetGateway()
			if d := h.GetDevice(); d != "" {
				hop += "@" + d
			}
			hops = append(hops, hop)
		}
		return []string{table, s.GetPrefix(), cellList(hops)}
	}},
	// An Interface's device is the object's name unless spec.device names another.
	nimbusv1.Kind_KIND_INTERFACE: {[]string{"DEVICE", "MTU", "ADDRESSES"}, func(o *nimbusv1.Object) []string {
		s := o.GetInterface()
		device := s.GetDevice()
		if device == "" {
			device = o.GetMeta().GetName()
		}
		return []string{device, uintCell(s.GetMtu()), cellList(s.GetAddresses())}
	}},
	nimbusv1.Kind_KIND_FLOW_EXPORT_POLICY: {[]string{"FORMAT", "TARGETS"}, func(o *nimbusv1.Object) []string {
		s := o.GetFlowExportPolicy()
		return []string{s.ExportFormat(), cellList(s.GetTargets())}
	}},
	nimbusv1.Kind_KIND_TRACE: {[]string{"SOURCE", "DESTINATION", "PROTOCOL"}, func(o *nimbusv1.Object) []string {
		s := o.GetTrace()
		dst := s.GetDestination()
		if dst == "" {
			dst = s.GetDestinationAddress()
		}
		if p := s.GetDestinationPort(); p != 0 {
			dst += ":" + strconv.FormatUint(uint64(p), 10)
		}
		return []string{s.GetSource(), dst, s.TraceProtocol()}
	}},
}

// cellList joins items with commas for a table cell, the first maxCellItems of them and
// "+N" for the rest: "host-a,host-b,host-c,+2".
func cellList(items []string) string {
	if len(items) <= maxCellItems {
		return strings.Join(items, ",")
	}
	return strings.Join(items[:maxCellItems], ",") + ",+" + strconv.Itoa(len(items)-maxCellItems)
}

// uintCell is a number for a table cell, empty when it is 0 (unset).
func uintCell(n uint32) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(n), 10)
}

// orNoneCell returns s, or "<none>" when s is empty, as kubectl shows empty cells.
func orNoneCell(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
