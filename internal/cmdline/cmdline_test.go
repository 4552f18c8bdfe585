package cmdline

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestHelpNamesVariablesBeforeDefaults shows every flag's variable right after what the
// flag does and before its default, whether pflag prints the default or the usage
// states it, and once.
func TestHelpNamesVariablesBeforeDefaults(t *testing.T) {
	var out bytes.Buffer
	fs := New("cmd [flags]", "cmd does things.", "CMD_", io.Discard)
	fs.SetHelpOutput(&out)
	fs.String("plain", "", "a `name` without a default")
	fs.Int("counted", 7, "`items` to keep")
	fs.Func("stated", "a `duration` to wait (default 10s)", func(string) error { return nil })
	fs.Func("noted", "an `address` (with --counted; default the first one)", func(string) error { return nil })
	fs.Func("nested", "a `level`: low or high (default low (quiet))", func(string) error { return nil })
	if err := fs.Parse([]string{"--help"}, func(string) string { return "" }); err != ErrHelp {
		t.Fatalf("Parse(--help) = %v, want ErrHelp", err)
	}
	for _, want := range []string{
		"a name without a default ($CMD_PLAIN)\n",
		"items to keep ($CMD_COUNTED) (default 7)\n",
		"a duration to wait ($CMD_STATED) (default 10s)\n",
		"an address (with --counted; default the first one) ($CMD_NOTED)\n",
		"a level: low or high (default low (quiet)) ($CMD_NESTED)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not say %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "($CMD_"); n != 5 {
		t.Errorf("help names %d variables, want 5, once each:\n%s", n, out.String())
	}
}

// TestHelpOutput sends the help -h and --help ask for to the help output alone, and a bad
// flag's error, with the help, to the error output alone.
func TestHelpOutput(t *testing.T) {
	for _, tt := range []struct {
		args          []string
		wantHelp, err string
	}{
		{[]string{"--help"}, "Usage:\n  cmd [flags]\n", ""},
		{[]string{"-h"}, "Usage:\n  cmd [flags]\n", ""},
		{[]string{"--no-such-flag"}, "", "unknown flag: --no-such-flag\ncmd does things.\n\nUsage:\n  cmd [flags]\n"},
	} {
		var help, errs bytes.Buffer
		fs := New("cmd [flags]", "cmd does things.", "CMD_", &errs)
		fs.SetHelpOutput(&help)
		fs.Bool("verbose", false, "say more")
		err := fs.Parse(tt.args, func(string) string { return "" })
		if (tt.err == "") != (err == ErrHelp) || !strings.Contains(help.String(), tt.wantHelp) || (tt.wantHelp == "") != (help.Len() == 0) ||
			!strings.HasPrefix(errs.String(), tt.err) || (tt.err == "") != (errs.Len() == 0) {
			t.Errorf("Parse(%q) = %v, help output %q, error output %q; want the help %q, the errors %q", tt.args, err, help.String(), errs.String(), tt.wantHelp, tt.err)
		}
	}
}
