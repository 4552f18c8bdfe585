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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/codec"
	"github.com/naplesnet/naples/internal/connfail"
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
	// deleted during the wait, and by the error of NodeStatuses of an object that does
	// not exist.
	ErrNotFound = errors.New("object not found")
	// ErrFailed is wrapped by the WaitError of an object a target node reported FAILED
	// at the generation waited for or a later one.
	ErrFailed = errors.New("programming failed")
)

// Defaults of Options.
const (
	// DefaultMaxBatchBytes is the default of Options.MaxBatchBytes.
	DefaultMaxBatchBytes = 1 << 20
	// firstBatchShare is the share of Options.MaxBatchBytes the first ApplyBatch call of
	// ApplyWith carries at most: 1/8, then 1/4, 1/2 and the whole.
	firstBatchShare = 8
	// DryRunBatchBytes bounds the size of one ApplyBatch call of a dry run (see
	// ApplyOptions.DryRun), as Options.MaxBatchBytes does for an apply: nimbus takes
	// 16 MiB in one call, and the margin keeps the request within it.
	DryRunBatchBytes = 12 << 20
	// DefaultMinBackoff and DefaultMaxBackoff are the defaults of Options.MinBackoff and
	// Options.MaxBackoff.
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second

	// applyEntryOverhead and deleteEntryOverhead are what a batch's size counts for each
	// object or key beyond its encoding: its framing in the request and what its result
	// adds to the answer beyond the object (the uid, generation, revision, times,
	// defaulted tenant and namespace and flags of an apply, about 130 bytes).
	applyEntryOverhead  = 256
	deleteEntryOverhead = 32

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
	// the client dials Address with the faster one nimbus's agents use. Nor does the
	// client then warn of why Conn fails to connect, which its status watches and waits
	// wait for without a word: that is for Conn's owner to say. Default: nil, which
	// dials Address.
	Conn grpc.ClientConnInterface
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
	// MaxBatchBytes bounds the size of one ApplyBatch or DeleteBatch call: the encoded
	// objects or keys it carries, each counted with a margin for its framing and for what
	// its result adds to the answer (256 bytes an object, 32 a key). Apply and Delete send
	// more in several calls. An object larger than that travels alone. Default:
	// DefaultMaxBatchBytes (1 MiB, some 2,500 routes), a sixteenth of what nimbus takes
	// in one call, so that nimbus commits, and the agents start on, the first objects of
	// a large batch while the next are on their way; for that, too, Apply's first call
	// carries at most an eighth of it, and each next one twice the one before. Negative
	// values are refused.
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
	done chan struct{}
	// stopConnLog ends the goroutine that says why conn fails, and connLogged is closed
	// when it has returned; both nil when Options.Conn is used.
	stopConnLog context.CancelFunc
	connLogged  chan struct{}
	closeOnce   sync.Once
	closeErr    error
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
	// Status watches and waits wait for the connection, so they would not say why it
	// fails: this does, as a warning.
	ctx, cancel := context.WithCancel(context.Background())
	c.stopConnLog, c.connLogged = cancel, make(chan struct{})
	go func() {
		defer close(c.connLogged)
		connfail.Log(ctx, conn, c.log, opts.TLS != nil)
	}()
	return c, nil
}

// Close ends the client's status watches and waits, and closes the connection it dialed.
// It is safe to call more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		if c.conn != nil {
			c.stopConnLog()
			<-c.connLogged
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

// Apply applies the objects as ApplyWith does, with the default ApplyOptions: each result
// carries the stored object.
func (c *Client) Apply(ctx context.Context, objs ...*nimbusv1.Object) ([]*nimbusv1.ApplyResponse, error) {
	return c.ApplyWith(ctx, objs, ApplyOptions{})
}

// ApplyOptions configures ApplyWith.
type ApplyOptions struct {
	// OmitObjects asks nimbus to leave the stored objects out of its answers: each
	// result's Object then carries only meta.generation and meta.revision, which keeps
	// the answer to a large batch small. Default: false, each result carries the stored
	// object.
	OmitObjects bool
	// Applied, when set, is called after each ApplyBatch call nimbus answered, with the
	// index in objs of the call's first object and the call's results, in order, on the
	// goroutine that called ApplyWith and before the next call. An error it returns ends
	// ApplyWith, which returns it as it is. Default: nil.
	Applied func(first int, results []*nimbusv1.ApplyResponse) error
	// DryRun asks nimbus to check the objects as the apply would, cross-object checks
	// included, and to answer what it would do without storing anything: each result
	// says whether the object would be created, changed or left unchanged, and carries
	// the object as it would be stored, without what only a commit assigns (uid,
	// revision, times). A refusal is the one the apply would meet. The objects travel in
	// calls of up to DryRunBatchBytes, or Options.MaxBatchBytes when that is larger, so
	// that nimbus checks them against each other; objects of two calls are not checked
	// against each other, since the first call stores nothing. Default: false.
	DryRun bool
	// Validated tells that the caller has validated every object (Object.Validate), as
	// naplesctl does to name each bad field by the file and line it was read from:
	// ApplyWith does not validate them again, and nimbus validates them all the same.
	// Default: false, ApplyWith validates them.
	Validated bool
}

// ApplyWith creates or updates the objects, in order, and returns what nimbus stored for
// each, in the same order: the object with the fields nimbus assigns, and whether that
// changed or created it. Every object is checked first, and when one is invalid or a key
// appears twice, nothing is applied and the error, a *BatchError that matches
// nimbusv1.ErrInvalid, names each bad entry by its index: `objects[3]
// (Route/default/default/x): spec.prefix ...`. The objects are then sent in ApplyBatch
// calls of at most Options.MaxBatchBytes each; when a call fails, the results of the
// calls before it are returned with a *BatchError that names the objects of the call
// and, when nimbus refused some of them, each of those with its field.
func (c *Client) ApplyWith(ctx context.Context, objs []*nimbusv1.Object, opts ApplyOptions) ([]*nimbusv1.ApplyResponse, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("applying objects: %w", ErrClosed)
	}
	var bad checks
	seen := make(map[nimbusv1.Key]int, len(objs))
	for i, o := range objs {
		if o == nil {
			bad.add(i, fmt.Sprintf("objects[%d]", i), &nimbusv1.FieldError{Field: "object", Reason: "is required"})
			bad.entries[len(bad.entries)-1].Field = "" // the entry as a whole
			continue
		}
		at := func() string { return fmt.Sprintf("objects[%d] (%s)", i, o.Key().ID()) }
		if !opts.Validated {
			if err := o.Validate(); err != nil {
				bad.add(i, at(), err)
				continue
			}
		}
		key := o.TypedKey()
		if j, ok := seen[key]; ok {
			bad.add(i, at(), fmt.Errorf("the key of objects[%d] again: %w", j, nimbusv1.ErrInvalid))
			continue
		}
		seen[key] = i
	}
	if err := bad.err("checking objects, nothing applied"); err != nil {
		return nil, err
	}
	results := make([]*nimbusv1.ApplyResponse, 0, len(objs))
	batchBytes := c.opts.MaxBatchBytes
	if opts.DryRun {
		batchBytes = max(batchBytes, DryRunBatchBytes)
	}
	// The first calls are smaller, so that nimbus, and the nodes after it, start on the
	// first objects while the others are on their way; but for a dry run, whose objects
	// are checked against each other only within a call, and which no node waits for.
	// Each object's size is taken as its call is made up, not all before the first.
	first := batchBytes / firstBatchShare
	if opts.DryRun {
		first = batchBytes
	}
	size := func(i int) int { return objs[i].SizeVT() + applyEntryOverhead }
	for lo, hi := range chunks(len(objs), size, first, batchBytes) {
		req := &nimbusv1.ApplyBatchRequest{Objects: objs[lo:hi], OmitObjects: opts.OmitObjects, DryRun: opts.DryRun}
		resp, err := c.api.ApplyBatch(ctx, req, recvLimit())
		if err != nil {
			return results, callError(fmt.Sprintf("applying objects[%d:%d], %d of %d applied before", lo, hi, lo, len(objs)), "objects", lo, hi, err)
		}
		if len(resp.GetResults()) != hi-lo {
			return results, &BatchError{First: lo, End: hi, what: fmt.Sprintf("applying objects[%d:%d]", lo, hi),
				Err: fmt.Errorf("nimbus answered %d results", len(resp.GetResults()))}
		}
		results = append(results, resp.GetResults()...)
		c.log.Debug("objects applied", "objects", hi-lo, "revision", resp.GetRevision(), "dry_run", opts.DryRun)
		if opts.Applied != nil {
			if err := opts.Applied(lo, resp.GetResults()); err != nil {
				return results, err
			}
		}
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

// NodeStatuses returns the status of the object with the key on each of its target nodes
// that the filter selects (NODE_STATUS_FILTER_UNSPECIFIED: every one), in node name
// order; an entry without a status is a node that has reported nothing. Where the object
// status of List leaves nodes out, it lists every one. It asks nimbus for one page after
// the other with ListNodeStatuses, each read at the store's revision of its time. Its
// error wraps ErrNotFound when nimbus does not have the object.
func (c *Client) NodeStatuses(ctx context.Context, key *nimbusv1.ObjectKey, filter nimbusv1.NodeStatusFilter) ([]*nimbusv1.NodeStatusEntry, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("listing node statuses: %w", ErrClosed)
	}
	req := &nimbusv1.ListNodeStatusesRequest{Key: key, Filter: filter}
	var entries []*nimbusv1.NodeStatusEntry
	for {
		resp, err := c.api.ListNodeStatuses(ctx, req, recvLimit())
		if status.Code(err) == codes.NotFound {
			return nil, fmt.Errorf("listing the node statuses of %s: %w", key.ID(), ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("listing the node statuses of %s: %w", key.ID(), err)
		}
		entries = append(entries, resp.GetEntries()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return entries, nil
		}
	}
}

// Delete deletes the objects with the keys as DeleteWith does, with the default
// DeleteOptions.
func (c *Client) Delete(ctx context.Context, keys ...*nimbusv1.ObjectKey) ([]*nimbusv1.DeleteResponse, error) {
	return c.DeleteWith(ctx, keys, DeleteOptions{})
}

// DeleteOptions configures DeleteWith.
type DeleteOptions struct {
	// Deleted, when set, is called after each DeleteBatch call nimbus answered, with the
	// index in keys of the call's first key and the call's results, in order, on the
	// goroutine that called DeleteWith and before the next call. An error it returns ends
	// DeleteWith, which returns it as it is. Default: nil.
	Deleted func(first int, results []*nimbusv1.DeleteResponse) error
}

// DeleteWith deletes the objects with the keys, in order, with the statuses reported for
// them, and returns for each, in the same order, whether it existed and the revision of
// its deletion. Absent objects are no error. Every key is checked first, and when one is
// invalid or appears twice, nothing is deleted and the error, a *BatchError that matches
// nimbusv1.ErrInvalid, names each bad key by its index. The keys are then sent in
// DeleteBatch calls of at most Options.MaxBatchBytes each; when a call fails, the results
// of the calls before it are returned with a *BatchError that names the keys of the call.
func (c *Client) DeleteWith(ctx context.Context, keys []*nimbusv1.ObjectKey, opts DeleteOptions) ([]*nimbusv1.DeleteResponse, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("deleting objects: %w", ErrClosed)
	}
	var bad checks
	seen := make(map[string]int, len(keys))
	sizes := make([]int, len(keys))
	for i, k := range keys {
		id := k.ID()
		at := fmt.Sprintf("keys[%d] (%s)", i, id)
		if err := k.Validate(); err != nil {
			bad.add(i, at, err)
			continue
		}
		if j, ok := seen[id]; ok {
			bad.add(i, at, fmt.Errorf("the key of keys[%d] again: %w", j, nimbusv1.ErrInvalid))
			continue
		}
		seen[id] = i
		sizes[i] = k.SizeVT() + deleteEntryOverhead
	}
	if err := bad.err("checking keys, nothing deleted"); err != nil {
		return nil, err
	}
	results := make([]*nimbusv1.DeleteResponse, 0, len(keys))
	for lo, hi := range chunks(len(sizes), func(i int) int { return sizes[i] }, c.opts.MaxBatchBytes, c.opts.MaxBatchBytes) {
		resp, err := c.api.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: keys[lo:hi]}, recvLimit())
		if err != nil {
			return results, callError(fmt.Sprintf("deleting keys[%d:%d], %d of %d deleted before", lo, hi, lo, len(keys)), "keys", lo, hi, err)
		}
		if len(resp.GetResults()) != hi-lo {
			return results, &BatchError{First: lo, End: hi, what: fmt.Sprintf("deleting keys[%d:%d]", lo, hi),
				Err: fmt.Errorf("nimbus answered %d results", len(resp.GetResults()))}
		}
		results = append(results, resp.GetResults()...)
		c.log.Debug("objects deleted", "keys", hi-lo, "revision", resp.GetRevision())
		if opts.Deleted != nil {
			if err := opts.Deleted(lo, resp.GetResults()); err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// chunks yields the bounds [lo, hi) of consecutive entries of the n, of the encoded
// sizes size(i), whose encoding as a repeated field is at most first bytes for the first
// chunk, twice the bound of the one before for each next one, and max at most; an entry
// larger than its chunk's bound is a chunk of its own.
func chunks(n int, size func(i int) int, first, max int) func(yield func(lo, hi int) bool) {
	return func(yield func(lo, hi int) bool) {
		lo, total, bound := 0, 0, min(first, max)
		for i := range n {
			sz := size(i)
			// A repeated message field: a one-byte tag, the length, the message.
			sz += 1 + protowire.SizeVarint(uint64(sz))
			if i > lo && total+sz > bound {
				if !yield(lo, i) {
					return
				}
				lo, total, bound = i, 0, min(2*bound, max)
			}
			total += sz
		}
		if lo < n {
			yield(lo, n)
		}
	}
}
