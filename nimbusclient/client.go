package nimbusclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Store is what the client needs of delphi.
type Store interface {
	ClaimDesired() (*delphi.DesiredWriter, error)
	Resume() (epoch string, revision uint64)
	Status(key *nimbusv1.ObjectKey) (*nimbusv1.NodeStatus, bool)
	Subscribe(opts delphi.SubscribeOptions) (*delphi.Subscription, error)
}

var _ Store = (*delphi.Store)(nil)

// Options configures a Client.
type Options struct {
	// Node is this node's name; nimbus sends the objects targeted at it. Required.
	Node string
	// Address is nimbus's address, "unix:///path" or "tcp://host:port". Required.
	Address string
	// Store is the local delphi store. Required.
	Store Store
	// MinBackoff and MaxBackoff bound the delay between reconnects. Defaults: 100ms, 30s.
	MinBackoff, MaxBackoff time.Duration
	// HealthyAfter is how long a stream must stay up for the backoff to start over.
	// Default: 10s.
	HealthyAfter time.Duration
	// TLS, when set, is the TLS configuration the client dials nimbus with: the CAs that
	// verify nimbus and this node's client certificate, whose name must be Node for nimbus
	// to let the client watch and report; internal/pki's ClientConfig builds one.
	// Default: nil, which dials plaintext.
	TLS *tls.Config
	// DialOptions are added to the client's gRPC dial options, after the ones the client
	// sets itself.
	DialOptions []grpc.DialOption
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Client keeps delphi's desired table in step with nimbus and reports status upstream.
type Client struct {
	opts    Options
	target  string
	store   Store
	desired *delphi.DesiredWriter
	log     *slog.Logger
	// received counts watch events received, snapshots included.
	received atomic.Uint64
}

// EventsReceived returns how many watch events the client has received from nimbus,
// snapshot events and markers included.
func (c *Client) EventsReceived() uint64 { return c.received.Load() }

// New builds a client and claims delphi's desired writer.
func New(opts Options) (*Client, error) {
	if opts.Node == "" {
		return nil, errors.New("nimbusclient: Options.Node is required")
	}
	if opts.Store == nil {
		return nil, errors.New("nimbusclient: Options.Store is required")
	}
	addr, err := address.Parse(opts.Address)
	if err != nil {
		return nil, fmt.Errorf("nimbus address: %w", err)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.HealthyAfter <= 0 {
		opts.HealthyAfter = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	desired, err := opts.Store.ClaimDesired()
	if err != nil {
		return nil, err
	}
	return &Client{
		opts:    opts,
		target:  addr.GRPCTarget(),
		store:   opts.Store,
		desired: desired,
		log:     opts.Logger.With("nimbus", addr.String()),
	}, nil
}

// Run watches and reports until ctx ends, reconnecting whenever a stream breaks. It returns
// nil once ctx ends.
func (c *Client) Run(ctx context.Context) error {
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(pki.TransportCredentials(c.opts.TLS)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: c.opts.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: c.opts.MaxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, c.opts.DialOptions...)
	conn, err := grpc.NewClient(c.target, dial...)
	if err != nil {
		return fmt.Errorf("creating nimbus client: %w", err)
	}
	defer conn.Close()
	api := nimbusv1.NewNimbusClient(conn)

	var wg sync.WaitGroup
	wg.Go(func() { c.loop(ctx, "watch", func(ctx context.Context) error { return c.watch(ctx, api) }) })
	wg.Go(func() { c.loop(ctx, "status", func(ctx context.Context) error { return c.report(ctx, api) }) })
	wg.Wait()
	return nil
}

// loop runs one stream again and again with backoff until ctx ends.
func (c *Client) loop(ctx context.Context, stream string, run func(context.Context) error) {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	for {
		start := time.Now()
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) >= c.opts.HealthyAfter {
			b.reset()
		}
		delay := b.next()
		c.log.Warn("nimbus stream ended; reconnecting", "stream", stream, "err", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watch runs one Watch stream, committing what it receives to delphi.
func (c *Client) watch(ctx context.Context, api nimbusv1.NimbusClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	epoch, rev := c.store.Resume()
	stream, err := api.Watch(ctx, &nimbusv1.WatchRequest{Node: c.opts.Node, Epoch: epoch, Revision: rev}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("starting watch: %w", err)
	}
	var snapshot *delphi.DesiredTxn
	var keep map[string]bool
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receiving watch events: %w", err)
		}
		c.received.Add(1)
		switch ev.GetType() {
		case nimbusv1.WatchEvent_TYPE_PUT:
			if ev.GetSnapshot() {
				if snapshot == nil {
					snapshot, keep = &delphi.DesiredTxn{}, map[string]bool{}
				}
				snapshot.Put(ev.GetObject())
				keep[ev.GetObject().Key().ID()] = true
				continue
			}
			txn := &delphi.DesiredTxn{}
			txn.Put(ev.GetObject())
			txn.SetResume(ev.GetEpoch(), ev.GetRevision())
			if err := c.desired.Commit(txn); err != nil {
				return fmt.Errorf("storing %s: %w", ev.GetObject().Key().ID(), err)
			}
			c.log.Debug("object received", "key", ev.GetObject().Key().ID(), "revision", ev.GetRevision())
		case nimbusv1.WatchEvent_TYPE_DELETE:
			txn := &delphi.DesiredTxn{}
			txn.Delete(ev.GetKey())
			txn.SetResume(ev.GetEpoch(), ev.GetRevision())
			if err := c.desired.Commit(txn); err != nil {
				return fmt.Errorf("deleting %s: %w", ev.GetKey().ID(), err)
			}
			c.log.Debug("object deleted", "key", ev.GetKey().ID(), "revision", ev.GetRevision())
		case nimbusv1.WatchEvent_TYPE_SYNCED:
			if snapshot == nil {
				snapshot, keep = &delphi.DesiredTxn{}, map[string]bool{}
			}
			snapshot.DeleteOthers(keep)
			snapshot.SetResume(ev.GetEpoch(), ev.GetRevision())
			if err := c.desired.Commit(snapshot); err != nil {
				return fmt.Errorf("storing snapshot: %w", err)
			}
			c.desired.MarkSynced()
			c.log.Info("synced with nimbus", "objects", len(keep), "revision", ev.GetRevision(), "epoch", ev.GetEpoch())
			snapshot, keep = nil, nil
		case nimbusv1.WatchEvent_TYPE_BOOKMARK:
			txn := &delphi.DesiredTxn{}
			txn.SetResume(ev.GetEpoch(), ev.GetRevision())
			if err := c.desired.Commit(txn); err != nil {
				return fmt.Errorf("storing resume point: %w", err)
			}
		case nimbusv1.WatchEvent_TYPE_RESUMED:
			// delphi already holds the state as of this revision; only changes follow.
			c.desired.MarkSynced()
			c.log.Info("resumed watch", "revision", ev.GetRevision(), "epoch", ev.GetEpoch())
		}
	}
}

// report runs one ReportStatus stream: every status first, then each change.
func (c *Client) report(ctx context.Context, api nimbusv1.NimbusClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := api.ReportStatus(ctx, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("starting status stream: %w", err)
	}
	// A fresh subscription hands out every key first: all status goes up again. A key's
	// status also goes up again when its object changes, so a nimbus that lost an object
	// and got it back (an ephemeral restart) hears the status of the object it has now.
	sub, err := c.store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableStatus, delphi.TableDesired}})
	if err != nil {
		return fmt.Errorf("subscribing to status: %w", err)
	}
	defer sub.Close()
	for {
		// The stream's context ends when the connection breaks, even while idle.
		ids, err := sub.Next(stream.Context())
		if err != nil {
			return fmt.Errorf("waiting for status changes: %w", err)
		}
		for _, id := range ids {
			key, err := nimbusv1.ParseKeyID(id)
			if err != nil {
				continue
			}
			st, ok := c.store.Status(key)
			if !ok {
				continue
			}
			st = proto.CloneOf(st) // stored objects are immutable
			st.Node = c.opts.Node
			if err := stream.Send(&nimbusv1.StatusReport{Key: key, Status: st}); err != nil {
				if errors.Is(err, io.EOF) {
					_, err = stream.CloseAndRecv()
				}
				return fmt.Errorf("sending status of %s: %w", id, err)
			}
		}
	}
}
