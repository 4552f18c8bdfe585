// Package cmdline parses the command lines of nimbus and naples-agent the way naplesctl
// parses its own, so that the three commands read as one product: GNU-style flags
// (--flag value, --flag=value, -h), help in cobra's layout (a description, Usage:, Flags:)
// on standard output when asked for, so that it can be piped into a pager or grep, and an
// environment variable for every flag, named in the help next to the flag.
//
// A flag's variable is the command's prefix and the flag's name in upper case with "-"
// written "_": nimbus's --data-dir is $NIMBUS_DATA_DIR. The command line wins over the
// environment, which wins over the default.
package cmdline

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/naplesnet/naples/internal/exitstatus"
)

// ErrUsage is wrapped by every error of a bad command line or environment variable; it is
// marked for exit status 2 (exitstatus.Of).
var ErrUsage = exitstatus.Mark(errors.New("usage"))

// ErrHelp is returned by Parse when -h or --help asked for the help, which it has printed.
var ErrHelp = pflag.ErrHelp

// noEnv names the flags no environment variable sets: they ask for something other than
// running the command.
var noEnv = map[string]bool{"help": true, "version": true}

// FlagSet is the flags of one command.
type FlagSet struct {
	*pflag.FlagSet
	// use is the synopsis line of the help, long the description above it.
	use, long string
	// prefix starts the name of every flag's environment variable.
	prefix string
	// out takes the errors, with the help after them; helpOut the help asked for.
	out, helpOut io.Writer
}

// New returns the flag set of the command whose synopsis is use ("nimbus [flags]") and
// whose description is long, with environment variables named prefix+FLAG, writing its
// errors to out and the help -h and --help ask for to standard output, as naplesctl does
// (SetHelpOutput changes it).
func New(use, long, prefix string, out io.Writer) *FlagSet {
	name, _, _ := strings.Cut(use, " ")
	fs := &FlagSet{FlagSet: pflag.NewFlagSet(name, pflag.ContinueOnError), use: use, long: long, prefix: prefix, out: out, helpOut: os.Stdout}
	fs.SetOutput(out)
	fs.SortFlags = true
	// pflag calls Usage only for -h and --help, with ContinueOnError.
	fs.Usage = func() { fs.printUsage(fs.helpOut) }
	return fs
}

// SetHelpOutput makes the help that -h and --help ask for go to w.
func (fs *FlagSet) SetHelpOutput(w io.Writer) { fs.helpOut = w }

// EnvName returns the environment variable that sets the flag name.
func (fs *FlagSet) EnvName(name string) string {
	return fs.prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Parse parses args, then sets every flag they did not set from its environment variable,
// read with getenv, when that is not empty. A bad flag, value, variable or argument is
// printed with the help and returned wrapping ErrUsage; -h and --help print the help and
// return ErrHelp. Positional arguments are refused: neither command takes any.
func (fs *FlagSet) Parse(args []string, getenv func(string) string) error {
	fs.VisitAll(func(f *pflag.Flag) {
		if !noEnv[f.Name] {
			f.Usage = withEnv(f.Usage, fs.EnvName(f.Name))
		}
	})
	if err := fs.singleDash(args); err != nil {
		return err
	}
	if err := fs.FlagSet.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ErrHelp
		}
		// With ContinueOnError pflag prints nothing of an error but the help.
		return fs.Fail(err.Error())
	}
	var envErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if envErr != nil || f.Changed || noEnv[f.Name] {
			return
		}
		name := fs.EnvName(f.Name)
		v := getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fs.Fail(fmt.Sprintf("invalid value %q of $%s (--%s): %v", v, name, f.Name, err))
		}
	})
	if envErr != nil {
		return envErr
	}
	if fs.NArg() > 0 {
		return fs.Fail(fmt.Sprintf("unexpected arguments: %q", fs.Args()))
	}
	return nil
}

// withEnv returns a flag's usage with its variable env added, before the default when the
// usage states it itself ("... (default 10s)"), as pflag puts the defaults it prints after
// the usage: every flag's help reads the same, what it does, its variable, its default.
func withEnv(usage, env string) string {
	note := " ($" + env + ")"
	i := strings.LastIndex(usage, " (default")
	if i < 0 || !strings.HasSuffix(usage, ")") || strings.Contains(usage[i+1:len(usage)-1], ")") {
		return usage + note
	}
	return usage[:i] + note + usage[i:]
}

// singleDash refuses a long flag written with one dash (-state-dir), which the commands
// took before they took GNU-style flags, with a message that says how to write it.
func (fs *FlagSet) singleDash(args []string) error {
	for _, a := range args {
		if a == "--" {
			return nil
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if fs.Lookup(name) != nil {
			return fs.Fail(fmt.Sprintf("flag %s: long flags take two dashes: --%s", a, a[1:]))
		}
	}
	return nil
}

// Fail prints msg and the help, and returns an error wrapping ErrUsage; the commands'
// checks of their flags' values call it.
func (fs *FlagSet) Fail(msg string) error {
	fmt.Fprintln(fs.out, msg)
	fs.printUsage(fs.out)
	return fmt.Errorf("parsing flags: %w: %s", ErrUsage, msg)
}

// printUsage writes the help to w in cobra's layout, as naplesctl's.
func (fs *FlagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  %s\n\nFlags:\n%s", strings.TrimSpace(fs.long), fs.use, fs.FlagUsages())
}
