package nimbusclient

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// FlowTapper serves the subscriptions nimbus sends on a flow tap (nimbus.flows.v1's
// FlowTap): the agent's flow log. The client opens the tap, sends its first message,
// naming the node, and hands the stream over; it opens it again with backoff when it
// ends, on the replica the watch is on.
type FlowTapper interface {
	// ServeFlowTap serves the subscriptions nimbus sends on the stream until it fails or
	// ctx ends, and returns why it ended. It must not send on the stream after it
	// returned.
	ServeFlowTap(ctx context.Context, stream grpc.BidiStreamingClient[flowsv1.FlowTapUp, flowsv1.FlowTapDown]) error
}

// tapRouted runs one flow tap on the replica route picks, served by Options.FlowTap; the
// tap ends with errMoved when nimbus asks the client to move. It calls taken once nimbus
// has taken the stream (its headers came).
func (c *Client) tapRouted(ctx context.Context, conn grpc.ClientConnInterface, taken func()) error {
	return c.routed(ctx, &c.endTap, "flow tap", func(ctx context.Context) error { return c.tap(ctx, conn, taken) })
}

// tap opens a flow tap, names the node and hands the stream to Options.FlowTap.
func (c *Client) tap(ctx context.Context, conn grpc.ClientConnInterface, taken func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := flowsv1.NewFlowsClient(conn).FlowTap(ctx, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("opening the flow tap: %w", err)
	}
	if err := stream.Send(&flowsv1.FlowTapUp{Node: c.opts.Node}); err != nil {
		_, err = stream.Recv() // the status nimbus ended the stream with
		return fmt.Errorf("opening the flow tap: %w", err)
	}
	if _, err := stream.Header(); err != nil {
		return fmt.Errorf("opening the flow tap: %w", err)
	}
	taken()
	c.log.Debug("flow tap open", "server", peerAddress(stream.Context()))
	if err := c.opts.FlowTap.ServeFlowTap(ctx, stream); err != nil {
		return fmt.Errorf("flow tap: %w", err)
	}
	return nil
}
