// Package deploy holds no code. Its tests check the Grafana dashboard of deploy/grafana,
// and the metrics deploy/README.md names, against the Go source of the module: every
// metric a panel queries must be one the binaries register, with the labels the panel
// uses, and counters and histograms must be queried the way they work. They check the
// systemd units of deploy/systemd too.
package deploy

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// dashboardFile is the dashboard the tests check, and moduleRoot the module whose source
// registers the metrics, both relative to this directory.
const (
	dashboardFile = "grafana/naples.json"
	moduleRoot    = ".."
)

// dashboard is what the tests read of a Grafana dashboard.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

// panel is a panel or a row, whose collapsed panels are in Panels.
type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	GridPos    gridPos     `json:"gridPos"`
	Datasource *datasource `json:"datasource"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"`
}

// gridPos is where a panel is: Grafana's grid is 24 columns wide.
type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// target is one query of a panel.
type target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *datasource `json:"datasource"`
}

// datasource names a data source.
type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// variable is a template variable.
type variable struct {
	Name       string      `json:"name"`
	Type       string      `json:"type"`
	Query      any         `json:"query"`
	Definition string      `json:"definition"`
	Datasource *datasource `json:"datasource"`
}

// wantDatasource is the data source of every query: the datasource variable.
var wantDatasource = datasource{Type: "prometheus", UID: "${datasource}"}

// readDashboard reads and decodes the dashboard; fields the types above leave out are
// ignored, as Grafana ignores fields it does not know.
func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels returns the panels and rows of d, those inside collapsed rows included.
func allPanels(d dashboard) []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// queries returns every PromQL expression of d, each named for error messages: the
// panels' targets and the template variables' queries.
func queries(d dashboard) map[string]target {
	q := map[string]target{}
	for _, p := range allPanels(d) {
		for _, t := range p.Targets {
			q[fmt.Sprintf("panel %d %q query %s", p.ID, p.Title, t.RefID)] = t
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			q[fmt.Sprintf("variable %q", v.Name)] = target{Expr: v.Definition}
		}
	}
	return q
}

func TestDashboardIsValid(t *testing.T) {
	d := readDashboard(t)
	if d.SchemaVersion < 39 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q: want schemaVersion 39 or later, a uid and a title", d.SchemaVersion, d.UID, d.Title)
	}
	var haveDatasource bool
	for _, v := range d.Templating.List {
		switch {
		case v.Name == "datasource":
			haveDatasource = v.Type == "datasource" && v.Query == "prometheus"
		case v.Type == "query" && (v.Datasource == nil || *v.Datasource != wantDatasource):
			t.Errorf("variable %q: datasource %v, want %v", v.Name, v.Datasource, wantDatasource)
		}
	}
	if !haveDatasource {
		t.Error(`no template variable "datasource" of type datasource for prometheus`)
	}

	ids := map[int]string{}
	var placed []panel
	for _, p := range allPanels(d) {
		if prev, ok := ids[p.ID]; ok || p.ID <= 0 {
			t.Errorf("panel %q: id %d is not positive or is also %q's", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %d %q: gridPos %+v is not inside the 24 columns", p.ID, p.Title, g)
		}
		for _, q := range placed {
			h := q.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panel %d %q (%+v) overlaps panel %d %q (%+v)", p.ID, p.Title, g, q.ID, q.Title, h)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %d %q has no query", p.ID, p.Title)
		}
		if p.Datasource == nil || *p.Datasource != wantDatasource {
			t.Errorf("panel %d %q: datasource %v, want %v", p.ID, p.Title, p.Datasource, wantDatasource)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if refs[q.RefID] || q.RefID == "" || q.Expr == "" {
				t.Errorf("panel %d %q: query %q is empty, or its refId is empty or repeated", p.ID, p.Title, q.RefID)
			}
			refs[q.RefID] = true
			if q.Datasource == nil || *q.Datasource != wantDatasource {
				t.Errorf("panel %d %q query %s: datasource %v, want %v", p.ID, p.Title, q.RefID, q.Datasource, wantDatasource)
			}
		}
	}
}

// Patterns of the parts of PromQL expressions the tests look at.
var (
	metricName = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b`)
	naplesName = regexp.MustCompile(`\bnaples_[a-zA-Z0-9_]+`)
	grouping   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	selector   = regexp.MustCompile(`\{([^}]*)\}`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	legendVar  = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	rangeFunc  = regexp.MustCompile(`\b(rate|irate|increase|histogram_quantile)\s*\(`)
	byLe       = regexp.MustCompile(`\bby\s*\([^)]*\ble\b`)
)

// histogramSuffixes are the series a histogram is exposed as.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// baseName returns the metric a series name belongs to in registered: the name itself,
// or for a histogram's series the histogram's name. ok is false when it belongs to none.
func baseName(name string, registered map[string][]string) (string, bool) {
	if _, ok := registered[name]; ok {
		return name, true
	}
	for _, s := range histogramSuffixes {
		if base, cut := strings.CutSuffix(name, s); cut {
			if _, ok := registered[base]; ok {
				return base, true
			}
		}
	}
	return "", false
}

func TestDashboardMetricsAreRegistered(t *testing.T) {
	registered, unresolved := moduleMetrics(t)
	if len(registered) == 0 {
		t.Fatalf("found no metric registered in the Go source under %s", moduleRoot)
	}
	hint := ""
	if len(unresolved) > 0 {
		hint = " (the test could not work out the names of the metrics defined at " + strings.Join(unresolved, ", ") + ")"
	}
	for name, q := range queries(readDashboard(t)) {
		for _, m := range naplesName.FindAllString(q.Expr, -1) {
			if _, ok := baseName(m, registered); !ok {
				t.Errorf("%s: metric %s is registered nowhere in the Go source%s", name, m, hint)
			}
		}
	}
}

func TestReadmeMetricsAreRegistered(t *testing.T) {
	registered, _ := moduleMetrics(t)
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	names := naplesName.FindAllString(string(b), -1)
	if len(names) == 0 {
		t.Fatal("README.md names no metric")
	}
	for _, m := range names {
		if _, ok := baseName(m, registered); !ok {
			t.Errorf("README.md: metric %s is registered nowhere in the Go source", m)
		}
	}
}

// Labels every series has, which the Go source does not declare: the scrape's, and a
// histogram bucket's.
var implicitLabels = []string{"instance", "job", "le"}

func TestDashboardLabelsExist(t *testing.T) {
	registered, _ := moduleMetrics(t)
	for name, q := range queries(readDashboard(t)) {
		allowed := slices.Clone(implicitLabels)
		naplesOnly := true
		for _, m := range metricName.FindAllString(stripStrings(q.Expr), -1) {
			if base, ok := baseName(m, registered); ok {
				allowed = append(allowed, registered[base]...)
			} else if strings.HasPrefix(m, "process_") || strings.HasPrefix(m, "go_") {
				naplesOnly = false
			}
		}
		if !naplesOnly {
			continue // the Go runtime's and process collectors' labels are not in the source
		}
		var used []string
		expr := stripStrings(q.Expr)
		for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" {
					used = append(used, l)
				}
			}
		}
		for _, s := range selector.FindAllStringSubmatch(q.Expr, -1) {
			for _, m := range matcher.FindAllStringSubmatch(s[1], -1) {
				used = append(used, m[1])
			}
		}
		for _, m := range legendVar.FindAllStringSubmatch(q.LegendFormat, -1) {
			used = append(used, m[1])
		}
		for _, l := range used {
			if !slices.Contains(allowed, l) {
				t.Errorf("%s: label %q is not a label of its metrics (%s)", name, l, strings.Join(allowed, ", "))
			}
		}
	}
}

func TestDashboardRatesCountersOnly(t *testing.T) {
	for name, q := range queries(readDashboard(t)) {
		expr := stripStrings(q.Expr)
		// spans are the arguments of rate, irate and increase.
		var spans [][2]int
		for _, loc := range rangeFunc.FindAllStringSubmatchIndex(expr, -1) {
			fn := expr[loc[2]:loc[3]]
			end := closingParen(expr, loc[1]-1)
			if end < 0 {
				t.Errorf("%s: %s( is not closed in %q", name, fn, q.Expr)
				continue
			}
			arg := expr[loc[1]:end]
			if fn == "histogram_quantile" {
				if !strings.Contains(arg, "_bucket") || !byLe.MatchString(arg) {
					t.Errorf("%s: histogram_quantile over %q, want the rate of _bucket series summed by le", name, arg)
				}
				continue
			}
			spans = append(spans, [2]int{loc[1], end})
			// Label names are in the selectors; what is left are the series and keywords.
			for _, m := range metricName.FindAllString(selector.ReplaceAllString(arg, ""), -1) {
				if isCounterSeries(m) || !strings.Contains(m, "_") {
					continue // a counter, or a keyword such as by
				}
				t.Errorf("%s: %s(%s): %s is not a counter (a name ending in _total, _bucket, _sum or _count)", name, fn, arg, m)
			}
		}
		for _, loc := range naplesName.FindAllStringIndex(expr, -1) {
			m := expr[loc[0]:loc[1]]
			inside := slices.ContainsFunc(spans, func(s [2]int) bool { return s[0] <= loc[0] && loc[1] <= s[1] })
			if isCounterSeries(m) && !inside {
				t.Errorf("%s: counter %s is queried raw, want it inside rate, irate or increase", name, m)
			}
		}
	}
}

// isCounterSeries reports whether a series of the name only ever grows: a counter's, or
// a histogram's bucket, sum or count.
func isCounterSeries(name string) bool {
	for _, s := range append([]string{"_total"}, histogramSuffixes...) {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// stringLiteral matches a PromQL string.
var stringLiteral = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// dashboardVariable matches a reference to a dashboard variable, such as $__rate_interval.
var dashboardVariable = regexp.MustCompile(`\$\{?[a-zA-Z0-9_]+\}?`)

// stripStrings replaces the strings of a PromQL expression with empty ones and removes
// its dashboard variables, so that neither is taken for a name.
func stripStrings(expr string) string {
	return dashboardVariable.ReplaceAllString(stringLiteral.ReplaceAllString(expr, `""`), "")
}

// closingParen returns the index of the parenthesis that closes the one at open, or -1.
func closingParen(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// promPackage is the import path of the Prometheus client.
const promPackage = "github.com/prometheus/client_golang/prometheus"

// moduleCache holds what registeredMetrics found in the module, which every test reads.
var moduleCache struct {
	sync.Mutex
	metrics    map[string][]string
	unresolved []string
}

// moduleMetrics returns registeredMetrics of the module, reading its source once.
func moduleMetrics(t *testing.T) (map[string][]string, []string) {
	t.Helper()
	moduleCache.Lock()
	defer moduleCache.Unlock()
	if moduleCache.metrics == nil {
		moduleCache.metrics, moduleCache.unresolved = registeredMetrics(t, moduleRoot)
	}
	return moduleCache.metrics, moduleCache.unresolved
}

// registeredMetrics returns the metrics the Go source of the module under root registers,
// each with its label names, and the positions of metric definitions whose name it could
// not work out. It reads every .go file but tests, outside testdata and other modules,
// and takes the metrics of prometheus.New{Counter,Gauge,Histogram,Summary}[Vec|Func]
// called with an Opts literal, and of prometheus.NewDesc; names are string constants,
// Namespace, Subsystem and Name joined as prometheus.BuildFQName joins them.
func registeredMetrics(t *testing.T, root string) (map[string][]string, []string) {
	t.Helper()
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	metrics := map[string][]string{}
	var unresolved []string
	fset := token.NewFileSet()
	for _, files := range dirs {
		var parsed []*ast.File
		for _, f := range files {
			file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("parsing %s: %v", f, err)
			}
			parsed = append(parsed, file)
		}
		// Package-level constants of the package, then per function its own.
		pkgConsts := map[string]string{}
		for _, file := range parsed {
			for _, decl := range file.Decls {
				if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
					addConsts(pkgConsts, g)
				}
			}
		}
		for _, file := range parsed {
			prom := importName(file, promPackage)
			if prom == "" {
				continue
			}
			for _, decl := range file.Decls {
				consts := pkgConsts
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
					consts = localConsts(pkgConsts, fn.Body)
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					name, labels, isMetric, ok := metricOf(call, prom, consts)
					switch {
					case !isMetric:
					case !ok:
						unresolved = append(unresolved, fset.Position(call.Pos()).String())
					default:
						metrics[name] = append(metrics[name], labels...)
					}
					return true
				})
			}
		}
	}
	sort.Strings(unresolved)
	return metrics, unresolved
}

// importName returns the name file imports path as, "" when it does not import it.
func importName(file *ast.File, path string) string {
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return filepath.Base(path)
		}
	}
	return ""
}

// addConsts adds the string constants of a const declaration to consts.
func addConsts(consts map[string]string, g *ast.GenDecl) {
	for _, spec := range g.Specs {
		vs := spec.(*ast.ValueSpec)
		for i, n := range vs.Names {
			if i < len(vs.Values) {
				if s, ok := stringValue(vs.Values[i], consts); ok {
					consts[n.Name] = s
				}
			}
		}
	}
}

// localConsts returns the package's constants with those a function body declares.
func localConsts(pkg map[string]string, body *ast.BlockStmt) map[string]string {
	consts := map[string]string{}
	for k, v := range pkg {
		consts[k] = v
	}
	ast.Inspect(body, func(n ast.Node) bool {
		if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.CONST {
			addConsts(consts, g)
		}
		return true
	})
	return consts
}

// stringValue evaluates e as a string constant: a literal, a constant, or a sum of them.
func stringValue(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	case *ast.ParenExpr:
		return stringValue(e.X, consts)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := stringValue(e.X, consts)
		b, ok2 := stringValue(e.Y, consts)
		return a + b, ok1 && ok2
	}
	return "", false
}

// fqName joins namespace, subsystem and name as prometheus.BuildFQName does.
func fqName(namespace, subsystem, name string) string {
	if name == "" {
		return ""
	}
	var parts []string
	for _, p := range []string{namespace, subsystem, name} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "_")
}

// metricOf returns the name and labels of the metric call defines, where prom is the
// name the Prometheus client is imported as. isMetric reports whether call defines a
// metric at all, ok whether its name could be worked out.
func metricOf(call *ast.CallExpr, prom string, consts map[string]string) (name string, labels []string, isMetric, ok bool) {
	sel, isSel := call.Fun.(*ast.SelectorExpr)
	if !isSel {
		return "", nil, false, false
	}
	if x, isIdent := sel.X.(*ast.Ident); !isIdent || x.Name != prom {
		return "", nil, false, false
	}
	fn := sel.Sel.Name
	switch {
	case fn == "NewDesc" && len(call.Args) >= 3:
		name, ok = descName(call.Args[0], prom, consts)
		labels, lok := stringSlice(call.Args[2], consts)
		return name, labels, true, ok && lok
	case strings.HasPrefix(fn, "New") && isMetricConstructor(strings.TrimPrefix(fn, "New")) && len(call.Args) >= 1:
		name, ok = optsName(call.Args[0], consts)
		if strings.HasSuffix(fn, "Vec") && len(call.Args) >= 2 {
			var lok bool
			labels, lok = stringSlice(call.Args[1], consts)
			ok = ok && lok
		}
		return name, labels, true, ok
	}
	return "", nil, false, false
}

// isMetricConstructor reports whether New+s makes a metric from an Opts.
func isMetricConstructor(s string) bool {
	for _, kind := range []string{"Counter", "Gauge", "Histogram", "Summary", "Untyped"} {
		if rest, ok := strings.CutPrefix(s, kind); ok && (rest == "" || rest == "Vec" || rest == "Func") {
			return true
		}
	}
	return false
}

// optsName returns the full name of the metric of an Opts literal.
func optsName(e ast.Expr, consts map[string]string) (string, bool) {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return "", false
	}
	fields := map[string]string{}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return "", false
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			return "", false
		}
		switch key.Name {
		case "Namespace", "Subsystem", "Name":
			s, ok := stringValue(kv.Value, consts)
			if !ok {
				return "", false
			}
			fields[key.Name] = s
		}
	}
	name := fqName(fields["Namespace"], fields["Subsystem"], fields["Name"])
	return name, name != ""
}

// descName returns the name given to NewDesc: a string constant or a BuildFQName call.
func descName(e ast.Expr, prom string, consts map[string]string) (string, bool) {
	if call, ok := e.(*ast.CallExpr); ok {
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "BuildFQName" || len(call.Args) != 3 {
			return "", false
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != prom {
			return "", false
		}
		var parts [3]string
		for i, a := range call.Args {
			s, ok := stringValue(a, consts)
			if !ok {
				return "", false
			}
			parts[i] = s
		}
		name := fqName(parts[0], parts[1], parts[2])
		return name, name != ""
	}
	s, ok := stringValue(e, consts)
	return s, ok && s != ""
}

// stringSlice evaluates a []string literal of constants, or nil.
func stringSlice(e ast.Expr, consts map[string]string) ([]string, bool) {
	if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
		return nil, true
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, false
	}
	var out []string
	for _, elt := range lit.Elts {
		s, ok := stringValue(elt, consts)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

func TestRegisteredMetricsFindsEveryForm(t *testing.T) {
	dir := t.TempDir()
	src := `package x

import prom "github.com/prometheus/client_golang/prometheus"

const pkgNS = "naples"

var d = prom.NewDesc("naples_x_desc_total", "help", []string{"a", "b"}, nil)

func f() {
	const sub = "x"
	prom.NewCounterVec(prom.CounterOpts{Namespace: pkgNS, Subsystem: sub, Name: "vec_total"}, []string{"kind"})
	prom.NewGaugeFunc(prom.GaugeOpts{Name: "naples_" + sub + "_func"}, nil)
	prom.NewDesc(prom.BuildFQName(pkgNS, sub, "fq"), "help", nil, nil)
	name := "dynamic"
	prom.NewGauge(prom.GaugeOpts{Name: name})
}
`
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// A test file's metrics are not registered by the binaries.
	if err := os.WriteFile(filepath.Join(dir, "x_test.go"), []byte("package x\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\nvar _ = prometheus.NewDesc(\"naples_test_only\", \"\", nil, nil)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, unresolved := registeredMetrics(t, dir)
	want := map[string][]string{
		"naples_x_desc_total": {"a", "b"},
		"naples_x_vec_total":  {"kind"},
		"naples_x_func":       nil,
		"naples_x_fq":         nil,
	}
	if len(got) != len(want) {
		t.Errorf("registeredMetrics found %v, want %v", got, want)
	}
	for name, labels := range want {
		if l, ok := got[name]; !ok || !slices.Equal(l, labels) {
			t.Errorf("registeredMetrics: %s has labels %v (found %v), want %v", name, l, ok, labels)
		}
	}
	if len(unresolved) != 1 || !strings.Contains(unresolved[0], "x.go:15") {
		t.Errorf("unresolved definitions %v, want the one at x.go:15", unresolved)
	}
}

// TestUnitsStopRestartingOnConfigErrors checks that every systemd unit restarts its
// service when it fails, but not when it exits with status 2, which the commands exit
// with when their command line or configuration is wrong (internal/exitstatus):
// restarting them would only fail again, forever.
func TestUnitsStopRestartingOnConfigErrors(t *testing.T) {
	units, err := filepath.Glob("systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in systemd/ (%v)", err)
	}
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string][]string{}
		section := ""
		for line := range strings.Lines(string(b)) {
			line = strings.TrimSpace(line)
			switch {
			case line == "" || strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "["):
				section = line
			default:
				k, v, _ := strings.Cut(line, "=")
				settings[section+k] = append(settings[section+k], v)
			}
		}
		if r := settings["[Service]Restart"]; !slices.Equal(r, []string{"on-failure"}) && !slices.Equal(r, []string{"always"}) {
			t.Errorf("%s: Restart=%v; want on-failure", unit, r)
		}
		var prevent []string
		for _, v := range settings["[Service]RestartPreventExitStatus"] {
			prevent = append(prevent, strings.Fields(v)...)
		}
		if !slices.Contains(prevent, "2") {
			t.Errorf("%s: RestartPreventExitStatus=%v; want it to hold 2, the exit status of a configuration error", unit, prevent)
		}
	}
}
