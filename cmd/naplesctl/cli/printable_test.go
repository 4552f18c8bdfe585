package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// wantPrintable fails the test when out holds a byte below 0x20 other than newline and
// tab, DEL, a C1 control character or a byte that is not UTF-8: anything a terminal
// would act on.
func wantPrintable(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r <= 0x9f) || r == utf8.RuneError {
			t.Errorf("%s holds %U at byte %d:\n%q", what, r, i, out)
			return
		}
	}
}

func TestPrintable(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain text, ünïcode, 日本", "plain text, ünïcode, 日本"},
		{"lines\n\tand tabs", "lines\n\tand tabs"},
		{"\x1b[2J", `\x1b[2J`},
		{"a\rb\x00c\x07d\x7fe", `a\rb\x00c\ad\u007fe`},
		{"tag \U000e0001 character", `tag \udb40\udc01 character`},
		{"\u009b31m", `\u009b31m`},
		{"right\u202eto left", `right\u202eto left`},
		{"bad \xff byte", `bad \xff byte`},
		{`a \ backslash`, `a \ backslash`},
	} {
		got := Printable(tt.in)
		if got != tt.want {
			t.Errorf("Printable(%q) = %q, want %q", tt.in, got, tt.want)
		}
		wantPrintable(t, "Printable's result", got)
	}
}

// TestOutputEscapesControlCharacters has a node report, through a real nimbus, a status
// whose reason, message and operational data hold terminal escapes (clear the screen,
// set the window title, a C1 CSI, a carriage return): get, describe, wait's progress and
// its error show them escaped, and write nothing a terminal would act on.
func TestOutputEscapesControlCharacters(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")))
	const hostile = "\x1b[2J\x1b]0;owned\x07 \u009b31m red\rspoofed\x7f"
	e.reportStatus("to-dc2", &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: failed,
		Reason: "Kernel\x1b[5mError", Message: hostile,
		Operational: map[string]string{"key\x1b[8m": "value\x1b[0m\u202e", "plain": hostile}})
	e.reportStatus("to-dc2", &nimbusv1.NodeStatus{Node: "host-b", ObservedGeneration: 1, Phase: failed, Terminal: true,
		Reason: "InvalidSpec", Message: hostile})

	describe := e.ok("describe", "route", "to-dc2")
	wantPrintable(t, "describe", describe)
	for _, want := range []string{`\x1b[2J\x1b]0;owned\a \u009b31m red spoofed\u007f`, `Kernel\x1b[5mError (retrying)`,
		`key\x1b[8m:`, `value\x1b[0m\u202e`, "InvalidSpec (terminal)", `\x1b[2J\x1b]0;owned\a \u009b31m red\rspoofed\u007f`} {
		if !strings.Contains(describe, want) {
			t.Errorf("describe does not show %s:\n%s", want, describe)
		}
	}
	wantPrintable(t, "get", e.ok("get", "routes"))
	// JSON escapes C0 itself; what it leaves (DEL, C1) is escaped the way JSON does, so
	// the output still reads as JSON, with the status as reported.
	out := e.ok("get", "route", "to-dc2", "-o", "json")
	wantPrintable(t, "get -o json", out)
	var doc struct {
		Status struct {
			Nodes []struct{ Message string }
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Status.Nodes) != 2 || doc.Status.Nodes[0].Message != hostile {
		t.Errorf("get -o json reads back as %+v, %v; want the message as reported:\n%s", doc, err, out)
	}

	_, stderr, err := e.run("", "wait", "route", "to-dc2", "--timeout", "5s")
	wantPrintable(t, "wait's progress", stderr)
	if err == nil || !strings.Contains(stderr, `\x1b[2J`) {
		t.Fatalf("wait on a terminal failure: %v; progress:\n%s", err, stderr)
	}
	wantPrintable(t, "wait's error, as main prints it", Printable(err.Error()))
}
