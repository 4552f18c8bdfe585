package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/codec"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrInvalidOptions is wrapped by New when an option is missing or has an impossible
	// value.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrClosed is returned by the calls of a closed Client.
	ErrClosed = errors.New("controller client closed")
	// ErrNotFound is wrapped by the WaitError of an object that does not exist or was
	// deleted during the wait.
	ErrNotFound = errors.New("object not found")
	// ErrFailed is wrapped by the WaitError of an object a target node reported FAILED
	// at the generation waited for or a later one.
	ErrFailed = errors.New("programming failed")
)

// Defaults of Options.
const (
	// DefaultMaxBatchBytes is the default of Options.MaxBatchBytes.
	DefaultMaxBatchBytes = 4 << 20
	// DefaultMinBackoff and DefaultMaxBackoff are the defaults of Options.MinBackoff and
	// Options.MaxBackoff.
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second

	// maxRecvMsgSize bounds what the client receives in one message: the response of a
	// batch holds every stored object, a little more than the request, and a status frame
	// holds an object as large as nimbus takes with its status.
	maxRecvMsgSize = 64 << 20
)

// recvLimit returns the call option every call of the client carries, so that
// maxRecvMsgSize holds on a connection from Options.Conn too.
func recvLimit() grpc.CallOption { return grpc.MaxCallRecvMsgSize(maxRecvMsgSize) }

// Options configures a Client.
type Options struct {
	// Address is nimbus's address, "unix:///path" or "tcp://host:port", or a
	// comma-separated list of the addresses of nimbus replicas, of which the client uses one
	// that is ready and moves to another when it fails or stops serving. Required unless
	// Conn is set.
	Address string
	// TLS, when set, is the TLS configuration the client dials nimbus with: the CAs that
	// verify nimbus and a publisher certificate, which nimbus requires for everything a
	// controller calls. Default: nil, which dials plaintext.
	TLS *tls.Config
	// DialOptions are added to the client's gRPC dial options, after the ones it sets
	// itself, which they override. Default: none.
	DialOptions []grpc.DialOption
	// Conn, when set, is the connection to nimbus the client uses instead of dialing
	// Address; Address, TLS and DialOptions are then ignored, and Close leaves Conn open.
	// Calls then use Conn's codec, gRPC's proto codec unless Conn was made with another;
	// the client dials Address with the faster one nimbus's agents use. Default: nil,
	// which dials Address.
	Conn grpc.ClientConnInterface
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
	// MaxBatchBytes bounds the encoded size of the objects or keys sent in one ApplyBatch
	// or DeleteBatch call; Apply and Delete send more in several calls. An object larger
	// than that travels alone. Default: DefaultMaxBatchBytes (4 MiB). Negative values are
	// refused.
	MaxBatchBytes int
	// MinBackoff and MaxBackoff bound the delay before a broken status stream is opened
	// again: it starts at MinBackoff, doubles with each attempt that fails before the
	// stream is synced, up to MaxBackoff, and a random half of it is waited. Defaults:
	// DefaultMinBackoff (100ms) and DefaultMaxBackoff (30s).
	MinBackoff, MaxBackoff time.Duration
}

// withDefaults returns the options with every unset field at its default.
func (o Options) withDefaults() (Options, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.MaxBatchBytes < 0:
		return o, fmt.Errorf("MaxBatchBytes %d: must not be negative: %w", o.MaxBatchBytes, ErrInvalidOptions)
	case o.MaxBatchBytes == 0:
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		return o, fmt.Errorf("MaxBackoff %v: must not be below MinBackoff %v: %w", o.MaxBackoff, o.MinBackoff, ErrInvalidOptions)
	}
	return o, nil
}

// Client publishes objects into one nimbus and follows their status. Its methods may be
// called concurrently.
type Client struct {
	opts Options
	api  nimbusv1.NimbusClient
	log  *slog.Logger
	// conn is the connection the client dialed and closes; nil when Options.Conn is used.
	conn *grpc.ClientConn
	// done is closed by Close.
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// New returns a Client of the nimbus at Options.Address. It does not wait for nimbus: the
// connection is made, and made again when it breaks, as calls need it.
func New(opts Options) (*Client, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating controller client: %w", err)
	}
	c := &Client{opts: opts, done: make(chan struct{})}
	if opts.Conn != nil {
		c.api = nimbusv1.NewNimbusClient(opts.Conn)
		c.log = opts.Logger
		return c, nil
	}
	if opts.Address == "" {
		return nil, fmt.Errorf("creating controller client: Address is required: %w", ErrInvalidOptions)
	}
	addr, err := address.ParseList(opts.Address)
	if err != nil {
		return nil, fmt.Errorf("creating controller client: %w: %w", err, ErrInvalidOptions)
	}
	target, targetOptions := addr.GRPCTarget()
	dial := append(append([]grpc.DialOption{
		codec.Codec{}.DialOption(),
		grpc.WithTransportCredentials(pki.TransportCredentials(opts.TLS)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: opts.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: opts.MaxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, targetOptions...), opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("creating controller client of nimbus at %s: %w", addr, err)
	}
	c.conn, c.api = conn, nimbusv1.NewNimbusClient(conn)
	c.log = opts.Logger.With("nimbus", addr.String())
	return c, nil
}

// Close ends the client's status watches and waits, and closes the connection it dialed.
// It is safe to call more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		if c.conn != nil {
			c.closeErr = c.conn.Close()
		}
	})
	return c.closeErr
}

func (c *Client) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Apply creates or updates the objects, in order, and returns what nimbus stored for
// each, in the same order: the object with the fields nimbus assigns, and whether that
// changed or created it. Every object is checked first, and when one is invalid or a key
// appears twice, nothing is applied and the error, which wraps nimbusv1.ErrInvalid, names
// each bad entry by its index: `objects[3] (Route/default/default/x): spec.prefix ...`.
// The objects are then sent in ApplyBatch calls of at most Options.MaxBatchBytes each;
// when a call fails, the results of the calls before it are returned with an error that
// names the first object not applied, and wraps the call's gRPC status.
func (c *Client) Apply(ctx context.Context, objs ...*nimbusv1.Object) ([]*nimbusv1.ApplyResponse, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("applying objects: %w", ErrClosed)
	}
	var bad []error
	seen := make(map[string]int, len(objs))
	sizes := make([]int, len(objs))
	for i, o := range objs {
		if o == nil {
			bad = append(bad, fmt.Errorf("objects[%d]: %w", i, &nimbusv1.FieldError{Field: "object", Reason: "is required"}))
			continue
		}
		id := o.Key().ID()
		if err := o.Validate(); err != nil {
			bad = append(bad, fmt.Errorf("objects[%d] (%s): %w", i, id, err))
			continue
		}
		if j, ok := seen[id]; ok {
			bad = append(bad, fmt.Errorf("objects[%d] (%s): the key of objects[%d] again: %w", i, id, j, nimbusv1.ErrInvalid))
			continue
		}
		seen[id] = i
		sizes[i] = o.SizeVT()
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("checking objects, nothing applied: %w", errors.Join(bad...))
	}
	results := make([]*nimbusv1.ApplyResponse, 0, len(objs))
	for lo, hi := range chunks(sizes, c.opts.MaxBatchBytes) {
		resp, err := c.api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs[lo:hi]}, recvLimit())
		if err != nil {
			return results, fmt.Errorf("applying objects[%d:%d], %d of %d applied before: %w", lo, hi, lo, len(objs), err)
		}
		if len(resp.GetResults()) != hi-lo {
			return results, fmt.Errorf("applying objects[%d:%d]: nimbus answered %d results", lo, hi, len(resp.GetResults()))
		}
		results = append(results, resp.GetResults()...)
		c.log.Debug("objects applied", "objects", hi-lo, "revision", resp.GetRevision())
	}
	return results, nil
}

// List returns every object the filter selects with its status, in key order; Filter.Name
// is not used. It asks nimbus for one page after the other, each within nimbus's page
// size, so that a kind of many large objects is listed whole; each page is read at the
// store's revision of its time.
func (c *Client) List(ctx context.Context, f Filter) ([]*nimbusv1.ObjectWithStatus, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("listing objects: %w", ErrClosed)
	}
	resp, err := nimbusv1.ListAll(ctx, c.api, &nimbusv1.ListRequest{Kind: f.Kind, Tenant: f.Tenant, Namespace: f.Namespace}, recvLimit())
	if err != nil {
		return nil, fmt.Errorf("listing %s objects: %w", f.Kind.Name(), err)
	}
	return resp.GetItems(), nil
}

// Delete deletes the objects with the keys, in order, with the statuses reported for
// them, and returns for each, in the same order, whether it existed and the revision of
// its deletion. Absent objects are no error. Every key is checked first, and when one is
// invalid or appears twice, nothing is deleted and the error names each bad key by its
// index. The keys are then sent in DeleteBatch calls of at most Options.MaxBatchBytes
// each; when a call fails, the results of the calls before it are returned with an error
// that names the first key not deleted.
func (c *Client) Delete(ctx context.Context, keys ...*nimbusv1.ObjectKey) ([]*nimbusv1.DeleteResponse, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("deleting objects: %w", ErrClosed)
	}
	var bad []error
	seen := make(map[string]int, len(keys))
	sizes := make([]int, len(keys))
	for i, k := range keys {
		id := k.ID()
		if err := k.Validate(); err != nil {
			bad = append(bad, fmt.Errorf("keys[%d] (%s): %w", i, id, err))
			continue
		}
		if j, ok := seen[id]; ok {
			bad = append(bad, fmt.Errorf("keys[%d] (%s): the key of keys[%d] again: %w", i, id, j, nimbusv1.ErrInvalid))
			continue
		}
		seen[id] = i
		sizes[i] = k.SizeVT()
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("checking keys, nothing deleted: %w", errors.Join(bad...))
	}
	results := make([]*nimbusv1.DeleteResponse, 0, len(keys))
	for lo, hi := range chunks(sizes, c.opts.MaxBatchBytes) {
		resp, err := c.api.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: keys[lo:hi]}, recvLimit())
		if err != nil {
			return results, fmt.Errorf("deleting keys[%d:%d], %d of %d deleted before: %w", lo, hi, lo, len(keys), err)
		}
		if len(resp.GetResults()) != hi-lo {
			return results, fmt.Errorf("deleting keys[%d:%d]: nimbus answered %d results", lo, hi, len(resp.GetResults()))
		}
		results = append(results, resp.GetResults()...)
		c.log.Debug("objects deleted", "keys", hi-lo, "revision", resp.GetRevision())
	}
	return results, nil
}

// chunks yields the bounds [lo, hi) of consecutive entries, of the encoded sizes, whose
// encoding as a repeated field is at most max bytes; an entry larger than that is a chunk
// of its own.
func chunks(sizes []int, max int) func(yield func(lo, hi int) bool) {
	return func(yield func(lo, hi int) bool) {
		lo, total := 0, 0
		for i, n := range sizes {
			// A repeated message field: a one-byte tag, the length, the message.
			n += 1 + protowire.SizeVarint(uint64(n))
			if i > lo && total+n > max {
				if !yield(lo, i) {
					return
				}
				lo, total = i, 0
			}
			total += n
		}
		if lo < len(sizes) {
			yield(lo, len(sizes))
		}
	}
}
