// Package telemetrytest reads Prometheus metrics in tests, from a registry or from the text
// a /metrics endpoint serves, as one map keyed the way the text format names a series:
// name{label="value",...}.
package telemetrytest

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Values gathers g and returns the value of every counter, gauge and untyped series, and
// for every histogram its name_count and name_sum series, as the text format names them:
// name{label="value",...} with the labels sorted by name.
func Values(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := func(name string) string {
				if len(labels) == 0 {
					return name
				}
				return name + "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[series(f.GetName())] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[series(f.GetName())] = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				out[series(f.GetName())] = m.GetUntyped().GetValue()
			case m.GetHistogram() != nil:
				out[series(f.GetName()+"_count")] = float64(m.GetHistogram().GetSampleCount())
				out[series(f.GetName()+"_sum")] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// Parse reads the Prometheus text format, as /metrics serves it, and returns the value
// of every series line, keyed as it is written: name{label="value",...}. Comment lines
// are skipped; a line it cannot read fails the test.
func Parse(t testing.TB, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("metrics line %q: want a series and a value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// Get returns the status code and body of a GET of url, such as a /readyz or /metrics
// endpoint, or fails the test.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}
