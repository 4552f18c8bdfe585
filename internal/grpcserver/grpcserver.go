// Package grpcserver holds what the gRPC servers of naples, nimbus and the agent's local
// API, do alike.
package grpcserver

import (
	"context"

	"google.golang.org/grpc"
)

// Stop stops gs gracefully: it stops accepting connections and lets the running RPCs
// finish until ctx ends, then stops gs outright, which cancels the RPCs still running. It
// returns once gs has stopped, reporting whether ctx cut the drain short. Give it a
// context that ends after the drain timeout, not the one that asked for the stop.
func Stop(ctx context.Context, gs *grpc.Server) (cutShort bool) {
	drained := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(drained)
	}()
	select {
	case <-drained:
		return false
	case <-ctx.Done():
	}
	gs.Stop()
	<-drained
	return true
}
