package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/codec"
	"github.com/naplesnet/naples/internal/connfail"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of the global flags.
const (
	// DefaultServer is the nimbus address used when neither --server nor NAPLES_SERVER is set.
	DefaultServer = "unix:///run/naples/nimbus.sock"
	// ServerEnv names the environment variable that sets the default of --server.
	ServerEnv = "NAPLES_SERVER"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrNotFound is wrapped by the error of a get of an object nimbus does not have.
	ErrNotFound = errors.New("not found")
	// ErrProgrammingFailed is wrapped by the error of a wait that ends because a target
	// node reported FAILED at the generation waited for.
	ErrProgrammingFailed = errors.New("programming failed")
	// ErrWaitTimeout is wrapped by the error of a wait whose --timeout passed before every
	// target node reported PROGRAMMED.
	ErrWaitTimeout = errors.New("timed out")
	// ErrTraceDropped is wrapped by the error of a trace whose packet was denied or
	// dropped.
	ErrTraceDropped = errors.New("dropped")
	// ErrTraceTimedOut is wrapped by the error of a trace whose packet's fate was not
	// known when its time passed.
	ErrTraceTimedOut = errors.New("timed out")
)

// Run runs naplesctl with args, the command line without the program name, reading
// manifests given as "-" from stdin, writing results to stdout and notes to stderr, and
// reading the environment with getenv. What it writes goes through Printable. It returns
// the error that ends the command, which the caller prints, through Printable too; usage
// errors are returned too. A usage error (an unknown command or flag, a bad flag value or
// argument, flags that do not go together, TLS files that cannot be loaded, a manifest
// file that does not exist) is marked for exit status 2 (exitstatus.Of), any other for 1.
// diff returns ErrDiffers, which is no failure to print, when it found differences, and
// marks every failure for exit status 2.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) error {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, now: time.Now, terminal: isTerminal(stderr)}
	return c.run(ctx, args, getenv)
}

// cli is one invocation of naplesctl: its streams, clock and global flags.
type cli struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// now tells the time that AGE is counted to.
	now func() time.Time
	// terminal tells that stderr is a terminal, where apply --wait rewrites its progress
	// line in place; tick, when set, stands in for time.NewTicker in its progress.
	terminal bool
	tick     func(d time.Duration) (<-chan time.Time, func())
	// server is the --server flag.
	server string
	// tls holds the --tls-* and --insecure flags.
	tls tlsFlags
	// agent is the --agent flag; agentEnv tells that $NAPLES_AGENT set its default.
	agent    string
	agentEnv bool
	// recursive is the -R flag of a command that reads manifests (addRecursiveFlag).
	recursive bool
	// started is set when cobra has parsed the command line and runs a command: an error
	// before that is a usage error.
	started bool
}

// run builds the command tree and executes it with args. What it writes to stdout and
// stderr goes through Printable.
func (c *cli) run(ctx context.Context, args []string, getenv func(string) string) error {
	c.stdout, c.stderr = printable(c.stdout), printable(c.stderr)
	root := &cobra.Command{
		Use:   "naplesctl",
		Short: "naplesctl applies, gets and deletes naples desired-state objects in nimbus",
		Long: `naplesctl applies, gets and deletes naples desired-state objects in nimbus.

Objects are written as YAML or JSON manifests:

  kind: Route
  meta:
    name: to-dc2
    nodes: [host-a]
  spec:
    table: 100
    prefix: 198.51.100.0/24
    nexthops:
      - gateway: 10.10.0.2

Every global flag can also be set with the environment variable named after it in its
help ($NAPLES_ and the flag's name in upper case); the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	server := getenv(ServerEnv)
	if server == "" {
		server = DefaultServer
	}
	root.PersistentFlags().StringVar(&c.server, "server", server,
		"nimbus `address`, unix:///path or tcp://host:port, or a comma-separated list of the replicas' addresses ($"+ServerEnv+")")
	c.addAgentFlag(root, getenv)
	c.addTLSFlags(root, getenv)
	root.AddCommand(c.certsCommand(getenv))
	root.AddCommand(c.apiResourcesCommand(), c.explainCommand())
	c.addVersion(root)
	root.AddCommand(c.applyCommand(), c.getCommand(), c.deleteCommand(), c.describeCommand(), c.waitCommand(), c.delphiCommand(), c.dataplaneCommand(), c.bpfCommand(), c.flowsCommand(), c.monitorCommand(), c.traceCommand())
	root.AddCommand(c.diffCommand())
	c.addCompletions(root)

	if args == nil {
		args = []string{} // nil makes cobra read os.Args
	}
	root.SetArgs(args)
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	// Added now, once it has the streams, rather than when cobra executes, so that it
	// refuses a shell it does not know.
	root.InitDefaultCompletionCmd(args...)
	refuseUnknownSubcommands(root)
	c.markStart(root)
	err := root.ExecuteContext(ctx)
	if err != nil && !c.started {
		// Cobra refused the command line: an unknown command or flag, a flag value
		// that does not parse, arguments the command does not take.
		return exitstatus.Mark(err)
	}
	return err
}

// refuseUnknownSubcommands makes every command under cmd that only groups commands
// (delphi, bpf, completion) refuse an argument that names none of them as a usage error,
// as naplesctl itself does, where cobra would print its help and succeed: `naplesctl
// delphi lst` must not exit 0. Alone, such a command still prints its help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		if sub.HasSubCommands() && !sub.Runnable() {
			sub.Args = cobra.NoArgs
			sub.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
		refuseUnknownSubcommands(sub)
	}
}

// markStart makes every command of the tree under cmd set started when it runs.
func (c *cli) markStart(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			c.started = true
			return run(cmd, args)
		}
	}
	for _, sub := range cmd.Commands() {
		c.markStart(sub)
	}
}

// session is a connection to nimbus for one command.
type session struct {
	nimbus nimbusv1.NimbusClient
	conn   *grpc.ClientConn
	// addr is the address, or the replicas' addresses, of --server.
	addr address.List
	// tls tells whether the connection is TLS, not --insecure.
	tls bool
	// stderr receives the controller client's warnings: a status stream that broke and
	// is watched again, which a wait or a get --watch would otherwise keep quiet about,
	// and why the connection fails, for which its streams wait without a word.
	stderr io.Writer
	// stopConnLog ends the goroutine that writes why the connection fails, and
	// connLogged is closed when it has returned; nil until controller starts it.
	stopConnLog context.CancelFunc
	connLogged  chan struct{}
}

// connect returns a session with the server named by --server, or with one of the
// replicas it lists that is ready, picked at random: one that cannot be reached or does
// not serve yet is skipped. The
// connection is made by the first call; Close the session when done.
func (c *cli) connect() (*session, error) {
	addr, err := address.ParseList(c.server)
	if err != nil {
		return nil, exitstatus.Mark(fmt.Errorf("parsing --server: %w", err))
	}
	creds, err := c.transportCredentials()
	if err != nil {
		return nil, err
	}
	target, opts := addr.GRPCTarget()
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(creds), codec.Codec{}.DialOption())...)
	if err != nil {
		return nil, fmt.Errorf("connecting to nimbus at %s: %w", addr, err)
	}
	return &session{nimbus: nimbusv1.NewNimbusClient(conn), conn: conn, addr: addr, tls: !c.tls.insecure, stderr: c.stderr}, nil
}

// Close closes the connection.
func (s *session) Close() error {
	if s.stopConnLog != nil {
		s.stopConnLog()
		<-s.connLogged
	}
	return s.conn.Close()
}

// controller returns a controller client on the session's connection; Close it when done,
// before the session.
func (s *session) controller() (*controller.Client, error) {
	log := slog.New(slog.DiscardHandler)
	if s.stderr != nil {
		log = slog.New(warnings{w: s.stderr})
		if s.stopConnLog == nil {
			ctx, cancel := context.WithCancel(context.Background())
			s.stopConnLog, s.connLogged = cancel, make(chan struct{})
			go func() {
				defer close(s.connLogged)
				connfail.Log(ctx, s.conn, log, s.tls)
			}()
		}
	}
	kit, err := controller.New(controller.Options{Conn: s.conn, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("creating the controller client: %w", err)
	}
	return kit, nil
}

// warnings is a slog.Handler that writes the warnings and errors of the controller
// client on a line each, for an operator: "naplesctl: status stream ended; watching
// again (error: ..., in: 1.6s)". It drops everything below slog.LevelWarn.
type warnings struct {
	w     io.Writer
	attrs []slog.Attr
}

// Enabled tells whether level is a warning or worse.
func (warnings) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelWarn }

// Handle writes the record's message and attributes on one line.
func (h warnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("naplesctl: ")
	b.WriteString(r.Message)
	sep := " ("
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, "%s%s: %v", sep, a.Key, a.Value)
		sep = ", "
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if sep == ", " {
		b.WriteString(")")
	}
	b.WriteString("\n")
	_, err := io.WriteString(h.w, b.String())
	return err
}

// WithAttrs returns a handler that writes attrs with every record.
func (h warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnings{w: h.w, attrs: append(slices.Clip(h.attrs), attrs...)}
}

// WithGroup returns h: the controller client logs no groups.
func (h warnings) WithGroup(string) slog.Handler { return h }

// connectController returns a session, as connect does, and a controller client on it;
// call closeAll when done, which closes both.
func (c *cli) connectController() (sess *session, kit *controller.Client, closeAll func(), err error) {
	sess, err = c.connect()
	if err != nil {
		return nil, nil, nil, err
	}
	kit, err = sess.controller()
	if err != nil {
		sess.Close()
		return nil, nil, nil, err
	}
	return sess, kit, func() { kit.Close(); sess.Close() }, nil
}

// rpcError turns the error of a call into one that reads well: the server's message, which
// for a bad object names the field and the value, and the code when it adds something.
// The gRPC status stays reachable with status.FromError.
func (s *session) rpcError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &statusError{st: st, addr: s.addr, tls: s.tls}
}

// statusError is a gRPC status error of a call to the nimbus at addr.
type statusError struct {
	st   *status.Status
	addr address.List
	// tls tells whether naplesctl dialed with TLS, for the hint of a failed handshake.
	tls bool
}

// Error returns the server's message, with the address or the code where they help.
func (e *statusError) Error() string {
	switch e.st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition:
		return e.st.Message()
	case codes.Unavailable:
		if hint := pki.DialHint(e.st.Err(), e.tls); hint != "" {
			return fmt.Sprintf("nimbus at %s is unavailable: %s (%s)", e.addr, hint, e.st.Message())
		}
		return fmt.Sprintf("nimbus at %s is unavailable: %s", e.addr, e.st.Message())
	}
	return fmt.Sprintf("%s (%s)", e.st.Message(), e.st.Code())
}

// GRPCStatus returns the status, for status.FromError and status.Code.
func (e *statusError) GRPCStatus() *status.Status { return e.st }

// Is makes a call that ended because its context was canceled, an interrupt, count as
// context.Canceled, whichever call it was: gRPC reports it as a status of its own.
func (e *statusError) Is(target error) bool {
	return target == context.Canceled && e.st.Code() == codes.Canceled
}

// parseKind parses a kind given on the command line; its error, a usage error (see
// Run), lists the valid kinds with their short names.
func parseKind(s string) (nimbusv1.Kind, error) {
	kind, err := nimbusv1.ParseKind(s)
	if err != nil {
		names := make([]string, 0, len(nimbusv1.Kinds()))
		for _, k := range nimbusv1.Kinds() {
			names = append(names, k.Name()+" ("+k.ShortName()+")")
		}
		return kind, exitstatus.Mark(fmt.Errorf("%w (valid kinds: %s)", err, strings.Join(names, ", ")))
	}
	return kind, nil
}

// argKey returns the key of the object of kind called name, argument arg of the command
// line (KIND is argument 1), in tenant and namespace as the --tenant and --namespace
// flags give them. A name, tenant or namespace no object can have is a usage error (see
// Run) naming the argument or the flag: `argument 2: key.name "Web": ...`, `--tenant
// "Blue": ...`.
func argKey(kind nimbusv1.Kind, tenant, namespace, name string, arg int) (*nimbusv1.ObjectKey, error) {
	key := nimbusv1.NewKey(kind, tenant, namespace, name)
	err := key.Validate()
	if err == nil {
		return key, nil
	}
	var errs []error
	for _, fe := range fieldErrors(err) {
		var f *nimbusv1.FieldError
		if errors.As(fe, &f) && f.Field != "key.name" {
			errs = append(errs, &nimbusv1.FieldError{Field: "--" + strings.TrimPrefix(f.Field, "key."), Value: f.Value, Reason: f.Reason})
			continue
		}
		errs = append(errs, fmt.Errorf("argument %d: %w", arg, fe))
	}
	return nil, exitstatus.Mark(errors.Join(errs...))
}

// kindArg is how a kind is named in output: "route", "networksecuritypolicy".
func kindArg(k nimbusv1.Kind) string { return strings.ToLower(k.Name()) }

// ref is how an object is named in output: "route/to-dc2".
func ref(k *nimbusv1.ObjectKey) string { return kindArg(k.GetKind()) + "/" + k.GetName() }

// source is one object read from a manifest, with where it was read.
type source struct {
	file string
	// doc is the object's document number in file, from 1.
	doc int
	obj *nimbusv1.Object
}

// String names where the object was read: "route.yaml: document 2".
func (s source) String() string { return fmt.Sprintf("%s: document %d", s.file, s.doc) }

// readManifests reads every object of files, in order; "-" is stdin, and a directory
// stands for its manifest files (manifestPaths). With keyOnly it reads of each object
// only what names it (manifest.DecodeKeys).
func (c *cli) readManifests(files []string, keyOnly bool) ([]source, error) {
	decode, decodeFile := manifest.Decode, manifest.DecodeFile
	if keyOnly {
		decode, decodeFile = manifest.DecodeKeys, manifest.DecodeKeysFile
	}
	paths, err := c.manifestPaths(files)
	if err != nil {
		return nil, err
	}
	var srcs []source
	for _, f := range paths {
		var (
			objs []*nimbusv1.Object
			err  error
		)
		if f == "-" {
			objs, err = decode(c.stdin)
			if err != nil {
				err = fmt.Errorf("stdin: %w", err)
			}
			f = "stdin"
		} else {
			objs, err = decodeFile(f)
			if errors.Is(err, fs.ErrNotExist) {
				err = exitstatus.Mark(err) // -f names no file: a usage error
			}
		}
		if err != nil {
			return nil, err
		}
		for i, o := range objs {
			srcs = append(srcs, source{file: f, doc: i + 1, obj: o})
		}
	}
	if len(srcs) == 0 {
		names := slices.Clone(files)
		if i := slices.Index(names, "-"); i >= 0 {
			names[i] = "stdin" // as its other errors name it
		}
		return nil, fmt.Errorf("reading %s: no objects found", strings.Join(names, ", "))
	}
	return srcs, nil
}

// fieldErrors splits the joined error of a Validate into its field errors.
func fieldErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
